"""Parity, JAX side: start the JAX port from the torch init (dropout off) and compare final weights.

Usage: /tmp/envs/jax/bin/python examples/classifier/parity/jax_side.py TORCH.npz [train.py args]
The printed log lines can be compared with torch_side.py's line by line;
the last line reports the max |diff| of the final weights against torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1] / "ports" / "jax"))

import jax.numpy as jnp  # noqa: E402

import model as model_module  # noqa: E402
import train  # noqa: E402

_final: list[dict] = []


def torch_to_flax(w: dict[str, np.ndarray], prefix: str) -> dict:
    params = {}
    for name in ("fc1", "fc2", "head"):
        params[name] = {
            "kernel": jnp.asarray(w[f"{prefix}/{name}.weight"].T),
            "bias": jnp.asarray(w[f"{prefix}/{name}.bias"]),
        }
    for name in ("norm1", "norm2"):
        params[name] = {
            "scale": jnp.asarray(w[f"{prefix}/{name}.weight"]),
            "bias": jnp.asarray(w[f"{prefix}/{name}.bias"]),
        }
    return params


def main() -> None:
    weights = dict(np.load(sys.argv[1]))
    argv = sys.argv[2:]

    class TorchInitMLP(model_module.MLP):
        def init(self, *args: object, **kwargs: object) -> dict:  # type: ignore[override]
            return {"params": torch_to_flax(weights, "init")}

    original_step = train.make_train_step

    def recording_step(*args: object, **kwargs: object):  # noqa: ANN202
        step = original_step(*args, **kwargs)

        def wrapped(params, opt_state, x, y, key):  # noqa: ANN001, ANN202
            out = step(params, opt_state, x, y, key)
            _final[:] = [out[0]]
            return out

        return wrapped

    train.MLP = lambda *a, **k: TorchInitMLP(*a, **{**k, "dropout": 0.0})
    train.make_train_step = recording_step
    train.main(argv)

    expected = torch_to_flax(weights, "final")
    diffs = {
        f"{layer}.{leaf}": float(jnp.abs(_final[0][layer][leaf] - expected[layer][leaf]).max())
        for layer in expected
        for leaf in expected[layer]
    }
    print(f"parity max_abs_diff_final_weights={max(diffs.values()):.3e} per_param={diffs}")


if __name__ == "__main__":
    main()
