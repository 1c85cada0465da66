"""Parity, PyTorch side: run the original repo's main() with dropout off and save its weights.

Usage: python3 examples/classifier/parity/torch_side.py OUT.npz [train.py args]
Writes the initial and final weights (torch names) so jax_side.py can start
from the same init and compare the weights after the whole run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1] / "repo"))

import torch  # noqa: E402

import model as model_module  # noqa: E402
import train  # noqa: E402

_built: list[torch.nn.Module] = []


def _mlp_without_dropout(*args: object, **kwargs: object) -> torch.nn.Module:
    m = model_module.MLP(*args, **{**kwargs, "dropout": 0.0})
    _built.append(m)
    init = {f"init/{k}": v.detach().cpu().numpy().copy() for k, v in m.state_dict().items()}
    _built.append(init)  # type: ignore[arg-type]
    return m


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    train.MLP = _mlp_without_dropout
    train.main(argv)
    model, init = _built
    final = {f"final/{k}": v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    np.savez(out, **init, **final)


if __name__ == "__main__":
    main()
