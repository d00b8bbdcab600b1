"""How the farm's worker figure of a short kernel relates to its device time, under XLA flags.

For each case (kernel, shape, config), farm.measure.device.measure's per-call figure (up to 16
calls per dispatch, farm/measure/dispatch.py) beside the CUPTI kernel time per call of plain
queued calls (bench/kernel_profile.profile_calls). Run once per XLA_FLAGS setting (the flags
are read when JAX starts):
  XLA_FLAGS="..." python3 bench/probes/dispatch_flags.py OUT.json KERNEL:SHAPE:CONFIG_JSON ...
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels  # noqa: E402
from bench.kernel_profile import profile_calls  # noqa: E402
from farm.measure import dispatch  # noqa: E402
from farm.measure.device import measure  # noqa: E402
from farm.tasks import TuningTask  # noqa: E402
from kernels.lowering import Platform  # noqa: E402


def main() -> None:
    out, cases = Path(sys.argv[1]), sys.argv[2:]
    rows = []
    for case in cases:
        kernel, shape_text, config_text = case.split(":", 2)
        shape = tuple(int(s) for s in shape_text.split("x"))
        config = json.loads(config_text)
        task = TuningTask(kernel, shape, "bfloat16", "gpu-triton")
        module = kernels.load(kernel)
        calls = dispatch.calls_per_dispatch(module, task, interpret=False)
        m = measure(task, config, interpret=False, input_sets=max(calls, 1), repetitions=10)
        inputs = module.make_inputs(shape, jnp.bfloat16, jax.random.key(0))
        fn = jax.jit(module.build(config, shape, jnp.bfloat16, Platform("gpu-triton")))
        device_us = sum(k["us_per_call"] for k in profile_calls(fn, inputs))
        row = {"case": case, "xla_flags": os.environ.get("XLA_FLAGS", ""), "outcome": m.outcome,
               "calls_per_dispatch": calls, "worker_us": (m.median_s or 0) * 1e6, "device_us": device_us}
        print(f"{row['worker_us']:8.1f} us worker, {device_us:6.1f} us device ({calls} calls a dispatch): "
              f"{kernel} {shape_text} {config.get('strategy')} [{row['xla_flags']}] {m.error or ''}", flush=True)
        rows.append(row)
    out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
