"""Do the calls of a batched dispatch (farm.measure.dispatch.repeated) overlap on the GPU, and
what does each way of compiling it do to the device clock's figure?

    python3 bench/probes/serialize_probe.py KERNEL:SHAPE:CONFIG_JSON ...   (CONFIG_JSON {}: the default)

For each case (bf16, gpu-triton, 16 calls a dispatch on 16 input sets): per variant of the
compiled dispatch (XLA's defaults; command buffers off for that executable), the kernels of 4
dispatches that start before the one before them ends (overlaps), the device clock's per-call
figure (farm.measure.device_clock) and the wall clock's (timing.time_calls); beside them the
device clock's figure of single calls (one call a dispatch: each kernel alone on the device).
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
from farm.measure import device_clock, dispatch, timing  # noqa: E402
from kernels.lowering import Platform  # noqa: E402

CALLS = 16
VARIANTS = {"xla default": None, "command buffers off": {"xla_gpu_enable_command_buffer": ""}}


def main() -> None:
    for case in sys.argv[1:]:
        kernel, shape_text, config_text = case.split(":", 2)
        shape = tuple(int(s) for s in shape_text.split("x"))
        module = kernels.load(kernel)
        config = json.loads(config_text) or module.default_config(shape, "gpu-triton")
        fn = module.build(config, shape, jnp.bfloat16, Platform("gpu-triton"))
        sets = [module.make_inputs(shape, jnp.bfloat16, jax.random.key(i)) for i in range(CALLS)]
        single = jax.jit(fn)
        alone = device_clock.time_on_device(single, sets, samples=64)
        print(f"{case[:70]}: single calls {alone.median_s * 1e6:.2f} us (device clock)", flush=True)
        grouped = dispatch.grouped_sets(sets, CALLS)
        for label, options in VARIANTS.items():
            try:
                lowered = jax.jit(dispatch.repeated(fn, CALLS, len(sets[0]))).lower(*grouped[0])
                compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
                with device_clock.traced() as spans:
                    device_clock.run_dispatches(compiled, grouped, 4)
                overlaps = sum(b.start_ns < a.end_ns for a, b in zip(spans, spans[1:]))
                dev = device_clock.time_on_device(compiled, grouped, samples=20)
                wall = timing.time_calls(compiled, grouped, repetitions=6)
                print(f"   {label:22s} overlaps {overlaps:3d}/{len(spans) - 1}  device "
                      f"{dev.median_s / CALLS * 1e6:7.2f} us  wall {wall.median_s / CALLS * 1e6:7.2f} us", flush=True)
            except Exception as err:  # noqa: BLE001 - a variant this XLA refuses: say so, go on
                print(f"   {label:22s} failed: {str(err)[:300]}", flush=True)


if __name__ == "__main__":
    main()
