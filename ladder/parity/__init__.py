"""Tensor-level parity between the reference and a port, and the port's weights loaded back.

`side` runs inside each side's environment (standard library and numpy: the adapter convention);
`runs` executes the sides through ladder's normal run path; `compare` reads what they wrote and names
the first tensor that differs. ladder itself never imports a framework here: numpy only.
"""
