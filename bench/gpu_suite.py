"""Tune kernels at their seed shapes with the farm on this machine's GPU(s), then time each
winner against XLA (`jax.jit` of the kernel's reference) side by side, with the same method.

    python bench/gpu_suite.py --out DIR [--spaces search_spaces/a.yaml ...] [--trials 24]

Prints a table and writes DIR/suite.json and DIR/suite.md. Device time, not dispatch: every
sample times queued back-to-back calls (farm.measure.timing), inputs rotate over several sets when one
set would fit in L2, and contenders' samples are interleaved.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels  # noqa: E402
from farm.bundle import select  # noqa: E402
from farm.bundle.records import TrialRecord  # noqa: E402
from farm.measure import (
    outcomes,  # noqa: E402
    timing,  # noqa: E402
)
from farm.run.pool import connect  # noqa: E402
from farm.run.sweep import SweepSettings, run_sweep  # noqa: E402
from farm.search import (
    plan,  # noqa: E402
    spaces,  # noqa: E402
)
from kernels.lowering import Platform  # noqa: E402

L2_BYTES = 50 * 2**20
SUITE = ["softmax", "batch_softmax", "softmax_two_pass", "layer_norm", "rms_norm", "rms_norm_bwd", "welford",
         "cross_entropy", "cross_entropy_long", "swiglu", "geglu", "matmul", "bmm", "broadcast_matmul",
         "matmul_layernorm", "matmul_subtiled_epilogue", "flash_attention", "flash_attention_causal"]


def input_sets(module, shape, dtype, count=None):
    """Enough input sets that rotating through them overflows L2 (at most 4)."""
    per_set = module.bytes_moved(shape, dtype)
    n = count or max(1, min(4, math.ceil(2 * L2_BYTES / max(per_set, 1))))
    return [module.make_inputs(shape, dtype, jax.random.key(100 + i)) for i in range(n)]


def ceilings():
    """Copy bandwidth (bytes read + written; the best of three copy kernels) and the bf16 matmul rate."""
    n = 1 << 30
    x = jax.random.normal(jax.random.key(0), (n,), jnp.bfloat16)
    copies = {"negate": jax.jit(lambda v: -v), "copy": jax.jit(lambda v: v.copy()),
              "add_one": jax.jit(lambda v: v + jnp.bfloat16(1))}
    rates = {}
    for name, fn in copies.items():
        t = timing.time_calls(fn, [(x,)], repetitions=20, min_sample_s=20e-3)
        rates[name] = 2 * 2 * n / t.median_s
    try:
        import torch
        a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
        b = torch.empty_like(a)
        for _ in range(3):
            b.copy_(a)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            b.copy_(a)
        end.record()
        torch.cuda.synchronize()
        rates["torch_copy_events"] = 2 * 2 * n * 20 / (start.elapsed_time(end) / 1e3)
        del a, b
    except Exception as err:  # noqa: BLE001 - torch is optional
        rates["torch_copy_events_error"] = str(err)[:200]
    a = jax.random.normal(jax.random.key(1), (8192, 8192), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(2), (8192, 8192), jnp.bfloat16)
    tm = timing.time_calls(jax.jit(lambda p, q: p @ q), [(a, b)], repetitions=20, min_sample_s=20e-3)
    del x, a, b
    best = max(v for k, v in rates.items() if isinstance(v, float))
    return {"copy_bytes_per_s": best, "copy_methods": rates, "bf16_flops_per_s": 2 * 8192**3 / tm.median_s}


def compare(task, config, repetitions):
    """Winner vs XLA on the same inputs, interleaved."""
    module = kernels.load(task.kernel)
    dtype = jnp.dtype(task.dtype)
    sets = input_sets(module, task.shape, dtype)
    fns = {"farm": jax.jit(module.build(config, task.shape, dtype, Platform(task.target))),
           "xla": jax.jit(module.reference)}
    timings = timing.time_side_by_side(fns, sets, repetitions=repetitions)
    return {name: t.median_s for name, t in timings.items()} | {
        f"{name}_spread": t.spread for name, t in timings.items()}


def compare_runs(runs: list[Path], repetitions: int, out: Path) -> list[dict]:
    """Winners from earlier sweeps' trials.jsonl, each timed against XLA side by side."""
    records: dict[str, list[TrialRecord]] = {}
    for run in runs:
        for log in sorted(run.rglob("trials.jsonl")):
            for line in log.read_text().splitlines():
                r = TrialRecord.from_dict(json.loads(line))
                records.setdefault(r.task_key, []).append(r)
    results = []
    for key, task_records in records.items():
        best = select.best_record(task_records)
        first = task_records[0]
        task = plan.TuningTask(first.kernel, first.shape, first.dtype, first.target)
        counts = {o: sum(r.outcome == o for r in task_records) for o in outcomes.ALL}
        module = kernels.load(task.kernel)
        row = {"task": key, "kernel": task.kernel, "shape": list(task.shape), "dtype": task.dtype,
               "target": task.target, "counts": counts, "time_to_2pct_s": select.time_to_within(task_records),
               "config": best and best.config, "sweep_median_s": best and best.median_s,
               "bytes": module.bytes_moved(task.shape, jnp.dtype(task.dtype)), "flops": module.flops(task.shape)}
        if best:
            try:
                row |= compare(task, json.loads(best.config), repetitions)
            except Exception as err:  # noqa: BLE001
                row["compare_error"] = f"{type(err).__name__}: {str(err)[:500]}"
        results.append(row)
        print(json.dumps({k: row.get(k) for k in ("task", "farm", "xla", "sweep_median_s", "compare_error")}),
              flush=True)
        (out / "suite.json").write_text(json.dumps({"results": results}, indent=1, default=str))
    return results


def bench_settings(run_dir: Path, **overrides: Any) -> SweepSettings:
    """The GPU benchmarks' sweep settings: 10 timing pairs, 2 input sets, 120 s compile and timing limits."""
    return SweepSettings(run_dir=run_dir, **{"repetitions": 10, "input_sets": 2, "compile_timeout_s": 120,
                                                    "timing_timeout_s": 120, **overrides})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--spaces", nargs="*", help="space files (default: the suite's)")
    parser.add_argument("--target", action="append", help="targets (default gpu-triton and gpu-mosaic)")
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--repetitions", type=int, default=20)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--sampler")
    parser.add_argument("--no-static-pruning", action="store_true")
    parser.add_argument("--time-budget", type=float, help="seconds per sweep before it stops asking for trials")
    parser.add_argument("--skip-compare", action="store_true")
    parser.add_argument("--together", action="store_true", help="one sweep over all spaces (shared workers)")
    parser.add_argument("--skip-ceilings", action="store_true")
    parser.add_argument("--compare-runs", nargs="*", type=Path,
                        help="no sweep: compare the winners recorded in these run folders' trials.jsonl")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    targets = args.target or ["gpu-triton", "gpu-mosaic"]
    paths = args.spaces or [f"search_spaces/{n}.yaml" for n in SUITE if Path(f"search_spaces/{n}.yaml").exists()]
    results, started = [], time.monotonic()
    if args.compare_runs:
        results = compare_runs(args.compare_runs, args.repetitions, args.out)
        paths = []
    else:
        connect(None)
    groups = ([paths] if args.together else [[p] for p in paths]) if paths else []
    for group in groups:
        try:
            planned = plan.expand([spaces.load_space(p) for p in group], targets, args.trials)
        except Exception as err:  # noqa: BLE001 - report and go on
            results.append({"space": " ".join(group), "error": f"{type(err).__name__}: {err}"})
            continue
        name = "all" if args.together else Path(group[0]).stem
        settings = bench_settings(args.out / "runs" / name, depth=args.depth, workers=args.workers,
                                  sampler=args.sampler, static_pruning=not args.no_static_pruning,
                                  time_budget_s=args.time_budget)
        t0 = time.monotonic()
        try:
            sweep = run_sweep(planned, settings, None)   # the winners are timed here, not bundled
            records = sweep.records
        except Exception:  # noqa: BLE001
            results.append({"space": " ".join(group), "error": traceback.format_exc()[-2000:]})
            continue
        wall = time.monotonic() - t0
        print(json.dumps({"sweep": name, "wall_s": wall, "summary": sweep.summary}), flush=True)
        for p in planned:
            task_records = [r for r in records if r.task_key == p.task.key]
            best = select.best_record(task_records)
            counts = {o: sum(r.outcome == o for r in task_records) for o in outcomes.ALL}
            row = {"task": p.task.key, "kernel": p.task.kernel, "shape": list(p.task.shape), "dtype": p.task.dtype,
                   "target": p.task.target, "sweep_wall_s": wall, "counts": counts,
                   "time_to_2pct_s": select.time_to_within(task_records), "summary": sweep.summary,
                   "config": best and best.config, "sweep_median_s": best and best.median_s}
            if best and not args.skip_compare:
                try:
                    row |= compare(p.task, json.loads(best.config), args.repetitions)
                except Exception as err:  # noqa: BLE001
                    row["compare_error"] = f"{type(err).__name__}: {str(err)[:500]}"
            module = kernels.load(p.task.kernel)
            row["bytes"] = module.bytes_moved(p.task.shape, jnp.dtype(p.task.dtype))
            row["flops"] = module.flops(p.task.shape)
            results.append(row)
            print(json.dumps({k: row.get(k) for k in ("task", "farm", "xla", "sweep_median_s", "config",
                                                      "time_to_2pct_s", "compare_error")}), flush=True)
        (args.out / "suite.json").write_text(json.dumps({"results": results}, indent=1, default=str))
    ceiling = {"copy_bytes_per_s": float("nan"), "bf16_flops_per_s": float("nan")} if args.skip_ceilings \
        else ceilings()
    report = {"date": time.strftime("%Y-%m-%d"), "device": jax.devices()[0].device_kind, "jax": jax.__version__,
              "ceilings": ceiling, "results": results, "wall_s": time.monotonic() - started}
    (args.out / "suite.json").write_text(json.dumps(report, indent=1, default=str))
    lines = ["| task | config | farm | XLA | farm/XLA speedup | GB/s | % copy BW | TFLOP/s | trials ok/pruned/failed "
             "| to 2% (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "farm" not in r:
            lines.append(f"| {r.get('task', r.get('space'))} | failed: {str(r.get('error') or r.get('compare_error'))[:80]} "
                         "| | | | | | | | |")
            continue
        c = r["counts"]
        failed = sum(c[o] for o in outcomes.FAILURES)
        lines.append(f"| {r['task']} | `{r['config']}` | {r['farm'] * 1e3:.3f} ms | {r['xla'] * 1e3:.3f} ms | "
                     f"{r['xla'] / r['farm']:.2f}x | {r['bytes'] / r['farm'] / 1e9:.0f} | "
                     f"{100 * r['bytes'] / r['farm'] / ceiling['copy_bytes_per_s']:.0f}% | "
                     f"{r['flops'] / r['farm'] / 1e12:.0f} | {c[outcomes.OK]}/{c[outcomes.PRUNED]}/{failed} | "
                     f"{r['time_to_2pct_s'] and round(r['time_to_2pct_s'], 1)} |")
    lines.append(f"\nceilings: copy {ceiling['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write), "
                 f"bf16 matmul {ceiling['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s (XLA/cuBLAS, 8192^3)")
    (args.out / "suite.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
