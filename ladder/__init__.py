"""ladder: evidence that a ported ML training repo still computes what the original computed."""

__version__ = "0.1.0"
