"""Which rows of matmul + layer norm disagree with the float32 reference, per config and shape: a
debugging probe for a wrong_result a sweep recorded. Prints, per case, the relative error and the
ranges of rows whose largest error exceeds 0.1 (the outputs are around 1).

    python3 bench/probes/ln_row_errors.py SHAPE [SHAPE ...] --config JSON [--config JSON ...]

Each config is merged over the gpu-mosaic default at each shape; '{}' is the default itself.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import kernels  # noqa: E402
from kernels.lowering import Platform  # noqa: E402


def ranges(rows: np.ndarray) -> str:
    """'a-b, c-d' for sorted row indices."""
    if rows.size == 0:
        return "none"
    cuts = np.nonzero(np.diff(rows) != 1)[0]
    starts, ends = np.r_[rows[0], rows[cuts + 1]], np.r_[rows[cuts], rows[-1]]
    text = ", ".join(f"{s}-{e}" if s != e else f"{s}" for s, e in zip(starts, ends))
    return f"{rows.size} rows: {text[:300]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+")
    parser.add_argument("--config", action="append", default=[])
    args = parser.parse_args()
    module = kernels.load("matmul_layernorm")
    for text in args.shapes:
        shape = tuple(int(d) for d in text.split("x"))
        inputs = module.make_inputs(shape, jnp.bfloat16, jax.random.key(1))
        ref = np.asarray(jax.jit(module.reference)(*[x.astype(jnp.float32) for x in inputs]), np.float32)
        for extra in args.config or ["{}"]:
            config = module.default_config(shape, "gpu-mosaic") | json.loads(extra)
            try:
                fn = module.build(config, shape, jnp.bfloat16, Platform("gpu-mosaic", poison_outputs=True))
                out = np.asarray(jax.jit(fn)(*inputs).astype(jnp.float32))
            except Exception as e:  # noqa: BLE001 - a probe: report and go on
                print(f"{text} {extra}: {type(e).__name__}: {str(e)[:300]}")
                continue
            err = np.nan_to_num(np.abs(out - ref), nan=np.inf).max(axis=1)
            rel = np.linalg.norm(np.nan_to_num(out - ref, nan=1e3)) / np.linalg.norm(ref)
            print(f"{text} {extra}: relative error {rel:.4f}; bad {ranges(np.nonzero(err > 0.1)[0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
