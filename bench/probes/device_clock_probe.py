"""Check farm.measure.device_clock on a GPU against torch.profiler's CUPTI trace of the same kernels.

    python3 bench/probes/device_clock_probe.py OUT_DIR KERNEL:SHAPE:CONFIG_JSON ...   (CONFIG_JSON {}: the default)

For each case (bf16, gpu-triton, compiled as a sweep compiles it: farm.measure.compiler with its
calls per dispatch): the wall clock's per-call figure (timing.time_calls), the device clock's
(device_clock.time_on_device) and the seconds it took, what device.time_into reports (its clock),
the finalists' re-timing of the config beside the kernel's default (finalists.retime), and last,
after every trace of XLA's profiler, torch.profiler's kernel time per call of the plain kernel
(bench/kernel_profile.profile_calls); and how many of 4 dispatches' kernels started before the
one before them ended (`overlaps`: calls of one dispatch run side by side). Writes
OUT_DIR/device_clock.json and a dump of one trace's planes, lines and first events
(OUT_DIR/xspace_structure.txt).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels  # noqa: E402
from farm.measure import device_clock, dispatch, finalists, timing  # noqa: E402
from farm.measure.compiler import compile_config  # noqa: E402
from farm.measure.device import time_into  # noqa: E402
from farm.measure.outcomes import OK, Measurement  # noqa: E402
from farm.tasks import TuningTask, config_json  # noqa: E402
from kernels.lowering import Platform  # noqa: E402


def dump_structure(fn, sets, path: Path) -> None:
    """Every plane and line of one trace of two dispatches, with each line's first events and stats."""
    with device_clock.profiles() as found:
        device_clock.run_dispatches(fn, sets, 2)
    lines = []
    for profile in found:
        for plane in profile.planes:
            lines.append(f"PLANE {plane.name} stats={list(plane.stats)[:6]}")
            for line in plane.lines:
                events = list(line.events)
                lines.append(f"  LINE {line.name!r}: {len(events)} events")
                for e in events[:6]:
                    lines.append(f"    {e.name[:90]!r} start={e.start_ns:.0f} dur_ns={e.duration_ns:.0f} "
                                 f"stats={[(k, str(v)[:60]) for k, v in e.stats]}")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    out, cases = Path(sys.argv[1]), sys.argv[2:]
    out.mkdir(parents=True, exist_ok=True)
    print("device clock available:", device_clock.available(), jax.devices()[0].device_kind, flush=True)
    overhead = []
    for _ in range(5):
        started = time.perf_counter()
        with device_clock.traced():
            pass
        overhead.append(time.perf_counter() - started)
    print(f"empty trace: {[round(o * 1e3, 2) for o in overhead]} ms", flush=True)
    rows, plain = [], []
    for i, case in enumerate(cases):
        kernel, shape_text, config_text = case.split(":", 2)
        shape = tuple(int(s) for s in shape_text.split("x"))
        module = kernels.load(kernel)
        task = TuningTask(kernel, shape, "bfloat16", "gpu-triton")
        config = json.loads(config_text) or module.default_config(shape, "gpu-triton")
        calls = dispatch.calls_per_dispatch(module, task, interpret=False)
        c = compile_config(task, config, interpret=False, input_sets=max(calls, 4))
        if isinstance(c, Measurement):
            print(f"{case}: {c.outcome} {c.error[:300]}", flush=True)
            continue
        sets = dispatch.grouped_sets(c.inputs, calls)
        if i == 0:
            dump_structure(c.executable, sets, out / "xspace_structure.txt")
        with device_clock.traced() as spans:
            device_clock.run_dispatches(c.executable, sets, 4)
        overlaps = sum(b.start_ns < a.end_ns for a, b in zip(spans, spans[1:]))
        wall = dispatch.per_call(timing.time_calls(c.executable, sets, repetitions=10), calls)
        started = time.perf_counter()
        dev = device_clock.time_on_device(c.executable, sets, samples=20)
        dev_s = time.perf_counter() - started
        dev = dispatch.per_call(dev, calls) if dev else None
        m = time_into(Measurement(OK), c, repetitions=10)
        default = module.default_config(shape, "gpu-triton")
        fns = {config_json(config): c.executable}
        if config_json(default) not in fns:
            d = compile_config(task, default, interpret=False, input_sets=max(calls, 4))
            if not isinstance(d, Measurement):
                fns[config_json(default)] = d.executable
        started = time.perf_counter()
        finals = finalists.retime(task.key, fns, c.inputs, floor_s=None, calls=calls, budget_s=10.0)
        finals_s = time.perf_counter() - started
        row = {"case": case, "calls_per_dispatch": calls, "kernels_traced": len(spans), "overlaps": overlaps,
               "wall_us": wall.median_s * 1e6,
               "device_us": dev.median_s * 1e6 if dev else None, "device_spread": dev.spread if dev else None,
               "device_clock_s": dev_s, "time_into_us": (m.median_s or 0) * 1e6, "time_into_clock": m.clock,
               "finals": [{"config": t.config, "us": (t.median_s or 0) * 1e6, "clock": t.clock, "n": t.n_timed,
                           "spread": t.spread, "settled": t.settled} for t in finals], "finals_s": finals_s}
        print(json.dumps(row), flush=True)
        rows.append(row)
        fn = jax.jit(module.build(config, shape, jnp.bfloat16, Platform("gpu-triton")))
        plain.append((row, fn, module.make_inputs(shape, jnp.bfloat16, jax.random.key(0))))
    from bench.kernel_profile import profile_calls  # torch's CUPTI subscriber last: one at a time
    for row, fn, inputs in plain:
        row["torch_cupti_us"] = sum(k["us_per_call"] for k in profile_calls(fn, inputs))
        print(f"{row['case'][:60]:60s} wall {row['wall_us']:8.2f}  device {row['device_us'] or 0:8.2f}  "
              f"torch CUPTI {row['torch_cupti_us']:8.2f} us ({row['calls_per_dispatch']} calls a dispatch; "
              f"device clock took {row['device_clock_s'] * 1e3:.0f} ms)", flush=True)
    (out / "device_clock.json").write_text(json.dumps({"overhead_s": overhead, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
