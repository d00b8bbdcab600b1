"""Where one call's device time goes: every CUDA kernel a config launches, from a CUPTI trace.

    python bench/kernel_profile.py --kernel matmul_layernorm --shape 4096x4096x4096 --target gpu-mosaic \\
        --config '{"ln_strategy": "tile_stats", ...}' [--config ...] [--out F.json]

For each config (completed from the kernel's default, as in bench/configs_side_by_side.py) and for
`jax.jit` of the kernel's reference (XLA), runs 20 queued calls under torch.profiler (CUDA
activity) after a warm-up, and prints each kernel's name (shortened), launches per call and mean
duration in microseconds, and the sum per call. Kernel durations only: gaps between kernels are
not counted, so the sum is a lower bound of the call's device time.
"""
from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels  # noqa: E402
from bench.configs_side_by_side import config_arguments  # noqa: E402
from farm.tasks import config_json  # noqa: E402
from kernels.lowering import Platform  # noqa: E402

CALLS = 20


def profile_calls(fn, inputs) -> list[dict]:
    """Per kernel name: launches per call and mean duration (us) over CALLS queued calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        jax.block_until_ready(fn(*inputs))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            out = fn(*inputs)
        jax.block_until_ready(out)
    spans = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
            spans[e.name[:80]].append(e.time_range.elapsed_us())
    return [{"kernel": name, "per_call": len(d) / CALLS, "mean_us": sum(d) / len(d),
             "us_per_call": sum(d) / CALLS} for name, d in sorted(spans.items(), key=lambda kv: -sum(kv[1]))]


def main() -> None:
    args = config_arguments(__doc__.splitlines()[0], target="gpu-mosaic").parse_args()
    shape = tuple(int(d) for d in args.shape.split("x"))
    module = kernels.load(args.kernel)
    dtype = jnp.dtype(args.dtype)
    inputs = module.make_inputs(shape, dtype, jax.random.key(3))
    default = module.default_config(shape, args.target)
    fns = {"xla (jax.jit reference)": jax.jit(module.reference)}
    for text in args.config:
        config = {**default, **json.loads(text)}
        fns[config_json(config)] = jax.jit(module.build(config, shape, dtype, Platform(args.target)))
    report = []
    for name, fn in fns.items():
        try:
            rows = profile_calls(fn, inputs)
        except Exception as err:  # noqa: BLE001 - report and go on
            report.append({"config": name, "error": str(err).splitlines()[0][:300]})
            print(f"error: {report[-1]['error']}: {name}")
            continue
        report.append({"config": name, "kernels": rows, "sum_us_per_call": sum(r["us_per_call"] for r in rows)})
        print(f"{report[-1]['sum_us_per_call']:9.1f} us per call in kernels: {name}")
        for r in rows:
            print(f"    {r['us_per_call']:8.1f} us  {r['per_call']:.0f} x {r['mean_us']:7.1f}  {r['kernel']}")
    if args.out:
        args.out.write_text(json.dumps({"kernel": args.kernel, "shape": shape, "device": jax.devices()[0].device_kind,
                                        "calls": CALLS, "rows": report}, indent=1))


if __name__ == "__main__":
    main()
