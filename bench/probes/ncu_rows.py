"""Run a row kernel's farm configs and torch.compile's kernel a few times each, for ncu to read.

    ncu --clock-control none --metrics ... python3 bench/probes/ncu_rows.py --kernel rms_norm \\
        --shape 16384x16384 --config '{...}' [--config ...]

Each config (completed from the kernel's default) and torch.compile's column run CALLS times
after one warm-up call; ncu's --kernel-name picks the kernels to read.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels  # noqa: E402
from bench import baselines  # noqa: E402
from bench.configs_side_by_side import config_arguments  # noqa: E402
from kernels.lowering import Platform  # noqa: E402

CALLS = 2


def main() -> None:
    args = config_arguments(__doc__.splitlines()[0]).parse_args()
    shape = tuple(int(d) for d in args.shape.split("x"))
    module = kernels.load(args.kernel)
    inputs = module.make_inputs(shape, jnp.dtype(args.dtype), jax.random.key(3))
    default = module.default_config(shape, args.target)
    calls = []
    for text in args.config:
        fn = jax.jit(module.build({**default, **json.loads(text)}, shape, jnp.dtype(args.dtype),
                                  Platform(args.target)))
        calls.append(lambda fn=fn: fn(*inputs))
    compiled = baselines.columns(args.kernel)["torch_compile"](
        baselines.Case(module, shape, args.dtype, [inputs]))
    calls.append(lambda: compiled.call(0))
    for call in calls:
        for _ in range(1 + CALLS):
            jax.block_until_ready(call())


if __name__ == "__main__":
    main()
