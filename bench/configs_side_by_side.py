"""Time given configs of one kernel at one shape side by side (and XLA's reference), past the caches.

    python bench/configs_side_by_side.py --kernel softmax --shape 8192x50257 --dtype bfloat16 \\
        --target gpu-triton --config '{"strategy": "one_pass", "num_warps": 32}' --config ... [--out F.json]

Each config is completed from the kernel's default for the shape, validated against the
reference (relative error within the farm's tolerance) and timed with
`farm.measure.finalists.retime` on input sets rotated past the caches, next to `jax.jit` of the
kernel's reference (XLA). Prints one line per config: median, spread, GB/s of `bytes_moved`.
A config that fails to build or validate prints its error and is left out of the timing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels  # noqa: E402
from farm.measure import finalists, roofline, validate  # noqa: E402
from farm.measure.compiler import abstract_inputs, timing_inputs  # noqa: E402
from farm.tasks import TuningTask, config_json  # noqa: E402
from kernels.lowering import Platform  # noqa: E402
from kernels.protocol import task_default  # noqa: E402


def config_arguments(description: str, target: str = "gpu-triton") -> argparse.ArgumentParser:
    """The command line of a script that runs given configs of one kernel at one shape."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--shape", required=True, help="AxB...")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--target", default=target)
    parser.add_argument("--config", action="append", default=[], help="JSON knobs over the default (repeatable)")
    parser.add_argument("--out", type=Path)
    return parser


def main() -> None:
    args = config_arguments(__doc__.splitlines()[0]).parse_args()
    shape = tuple(int(d) for d in args.shape.split("x"))
    task = TuningTask(args.kernel, shape, args.dtype, args.target)
    module = kernels.load(args.kernel)
    interpret = jax.devices()[0].platform == "cpu"
    dtype = jnp.dtype(args.dtype)
    per_set = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(abstract_inputs(module, task)))
    sets = timing_inputs(module, task, 3, finalists.rotation_sets(per_set))
    check_inputs = module.make_inputs(shape, dtype, jax.random.key(11))
    ref = module.reference(*validate.upcast(check_inputs))
    fns, rows = {"xla (jax.jit reference)": jax.jit(module.reference)}, []
    default = task_default(module, shape, args.target, dtype)
    for text in ["{}", *args.config]:
        config = {**default, **json.loads(text)}
        name = config_json(config)
        try:
            fn = jax.jit(module.build(config, shape, dtype, Platform(args.target, interpret=interpret)))
            error = validate.relative_error(fn(*check_inputs), ref)
            if not error <= validate.tolerance(args.dtype, module):
                raise ValueError(f"relative error {error:.3g}")
            fns[name] = fn
        except Exception as err:  # noqa: BLE001 - report and go on
            rows.append({"config": name, "error": str(err).splitlines()[0][:300]})
            print(json.dumps(rows[-1]), flush=True)
    floor = roofline.floor_s(module, shape, args.dtype, roofline.peaks_for_device())
    for t in finalists.retime(task.key, fns, sets, floor_s=floor, budget_s=60):
        rows.append({"config": t.config, "median_us": t.median_s * 1e6, "spread": t.spread,
                     "gb_s": module.bytes_moved(shape, args.dtype) / t.median_s / 1e9, "below_floor": t.below_floor})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"task": task.key, "device": jax.devices()[0].device_kind, "rows": rows},
                                       indent=1))


if __name__ == "__main__":
    main()
