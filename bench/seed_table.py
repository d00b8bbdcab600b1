"""The seed benchmark table: each farm winner against every baseline, at the seed shapes, side by side.

    python bench/seed_table.py --runs DIR --out OUT      # DIR: bench/gpu_suite.py's --out folder (repeatable)
    python bench/seed_table.py --bundle B --out OUT      # winners from a bundle's configs.parquet
    python bench/seed_table.py --tune 120 --out OUT      # tune with the farm first, then the table
    python bench/seed_table.py --small --out OUT         # CPU dry run: tiny shapes, interpret mode
    python bench/seed_table.py --tune 120 --shape softmax:8192x50257 --shape rms_norm:4096x5120 --out OUT
                                                         # users' shapes (or --spaces with 3-line spaces)

For every (space, shape, dtype) it builds the farm's winner for each tuned target (the kernel's
default config for each target when none was tuned, and says so) and the baselines of
bench/baselines.py,
checks every column against the kernel's float32 reference (relative L2 error within the farm's
tolerance; a failing column is reported, never timed; one whose result is a strided view rather
than a dense array, as torch.compile's product at 50257 columns is, is marked: it skips the
compaction a JAX array needs), then times all columns in one interleaved run. It measures the
ceilings in the same process (copy bandwidth counting bytes read plus written; the bf16 matmul
rate, each through XLA and torch, the better kept) and writes
OUT/seed_table.json, OUT/seed_table.md, OUT/seed_speedup.png and OUT/seed_search_progress.png.
Columns whose temporaries exceed --max-temp-gb (the naive attention math at (8, 32, 8192, 256))
are skipped and say why; past --budget-s seconds the remaining rows leave out torch.compile, and
past 1.4 times that everything but the farm and XLA, so that one run fits a 10-minute slot.

Timing method (the same for every column): farm.measure.timing.time_side_by_side. Each sample queues
back-to-back calls (enough for >= 5 ms) and waits once at the end: JAX results through
`jax.block_until_ready`, torch results through `torch.cuda.synchronize` (the torch result is
wrapped in an object whose `block_until_ready` synchronizes, which `jax.block_until_ready`
calls). Launches overlap device work, so a sample is device time whenever a call's device time
exceeds its dispatch time. Samples come in pairs, n and 2n calls, and a pair's per-call time is
their difference over n, which cancels what a sample pays once (the first launch onto an idle
device, the final wait); the median of the pairs is reported, with (p75 - p25) / median as
spread. Pairs of the columns are interleaved round robin, so all see the same clocks. Inputs
rotate over enough sets that one pass over them is at least twice the L2 (at most 256 sets); no
cache flush is needed and none is timed. Beside the columns, interleaved with them, each row times
a copy (torch's device copy on a GPU, else XLA's negation; baselines.same_bytes_copy) of a bf16
vector whose read + write bytes are the row's, over as many input sets: the copy ceiling at the
row's size, which a small row's launch, ramp-up and last wave keep below the large copy's; a
memory-bound row is reported against both. JAX and torch run on separate
CUDA streams of the same device; only one column runs at a time (each sample ends with a full
wait). Why not CUDA events or triton.testing.do_bench for everything: XLA launches on its own
streams, so an event recorded on torch's stream does not bracket JAX work, and do_bench's per-call
wait would time JAX's host dispatch; queued calls with one wait time both frameworks the same way.

Independent check (--check): for the first shape of a few spaces (or every row: --check all),
right after the row is timed, farm.measure.timing.time_calls of each timed column (torch.compile's
included; input sets rotated as in the table) runs under a CUPTI trace (torch.profiler, kernels of
every stream, JAX's and torch's alike), and its per-call figure is compared with the device's own
clock on the same samples: the span from a sample's first kernel start to its last kernel end, per
call. Same calls, same GPU clocks: the difference is what farm.measure.timing gets wrong. Goal:
within 5%. The kernels' summed durations per call are reported too. Below 0.8 times the table's
figure, the column is host-bound (marked): its calls are launched slower than the device runs
them, and both clocks measure the host. Measured on the H200: a JAX call costs about 35-50 us of
host time, so JAX columns of kernels shorter than that are host-bound; such rows are also
compared on device time (the kernels' durations), in their own section. The GPU's SM and memory
clocks, power, temperature and clock-event reasons (nvidia-smi, bench/gpu_clocks.py) are read
before and after each column's check: a check that sees a kernel slower than the table did can
then be put down to the clocks, or not. Before each column's check the GPU is left idle until it
draws at most --check-settle-w watts, or its power stops falling (at most --check-settle-s
seconds; bench/gpu_clocks.py: settle): on the H200 the compute-bound rows run at the power cap,
and without it the first column checked (the farm's, right after the table's timing) started at
649-686 W and 1635-1785 MHz, the later ones at 213-641 W and 1755-1980 MHz (five compute-bound
rows, 2026-12-02). With the settle, every column's check starts idle at about 125 W and 1980 MHz,
and the check and the table are two regimes: the check sustains one column for its samples, the
table interleaves short samples (bursts). At 8192^3 the farm's Mosaic GPU matmul ran 9.8% faster
in the table than in its check (ending at 1485 MHz, power cap) and torch's 0.9%: compute-bound
rows are compared on both.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels  # noqa: E402
from bench import baselines, gpu_clocks  # noqa: E402
from farm.measure import (  # noqa: E402
    roofline,
    timing,
    validate,
)
from farm.search import (
    plan,  # noqa: E402
    spaces,  # noqa: E402
)
from kernels.lowering import Platform  # noqa: E402
from kernels.protocol import task_default  # noqa: E402

# bench/gpu_suite.py's order; other spaces follow alphabetically.
ORDER = ["softmax", "batch_softmax", "softmax_two_pass", "layer_norm", "rms_norm", "rms_norm_bwd", "welford",
         "cross_entropy", "cross_entropy_long", "swiglu", "geglu", "matmul", "bmm", "broadcast_matmul",
         "matmul_layernorm", "matmul_subtiled_epilogue", "flash_attention", "flash_attention_causal"]
CHECK = ["softmax", "rms_norm", "layer_norm", "cross_entropy", "matmul", "flash_attention"]
COLUMN_ORDER = ["xla", "xla_cublas", "torch", "torch_compile", "torch_compile_max", "torch_sdpa",
                "torch_sdpa_flash", "torch_sdpa_cudnn", "cudnn", "pallas_ops_triton", "pallas_ops_mgpu"]
DEFAULT_L2_BYTES = 60 * 2**20
MAX_SETS = 256
# A column whose CUPTI kernel time is below this fraction of its queued-call time is host-bound:
# its calls are launched slower than the device runs them, and the table's figure is the host's.
DISPATCH_BOUND = 0.8
# A table figure further than this from the device clock of the check's samples (the same column
# timed again right after, alone) is marked: the two moments of the GPU disagree (e.g. geglu at
# 16x16384x4096 on the H200: 1.445 ms in the table, 1.812 ms on the device clock a moment later).
TABLE_OFF_PCT = 5.0


@dataclasses.dataclass
class Row:
    """One line of the table: a space's kernel at one shape and dtype, with a config per target."""

    space: str
    kernel: str
    shape: tuple[int, ...]
    dtype: str
    targets: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def label(self) -> str:
        """space/shape/dtype."""
        return f"{self.space}/{'x'.join(map(str, self.shape))}/{self.dtype}"


# -- winners and trial records ---------------------------------------------------------------

def _trial_files(runs: Path) -> dict[str, Path]:
    """Space stem -> trials.jsonl under a gpu_suite folder (DIR/runs/<space>/), or a run folder."""
    found = {p.parent.name: p for p in sorted(runs.glob("runs/*/trials.jsonl"))}
    if (runs / "trials.jsonl").exists():
        found.setdefault(runs.name, runs / "trials.jsonl")
    return found


def read_records(path: Path) -> list[dict[str, Any]]:
    """The trial records of one trials.jsonl (a torn last line is skipped)."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _typed(records: Sequence[dict[str, Any]]) -> list[Any]:
    """The records as `TrialRecord`s (the farm's rules read those)."""
    from farm.bundle.records import TrialRecord

    return [TrialRecord.from_dict(r) for r in records]


def _best(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    try:
        from farm.bundle import select  # imports JAX and the kernels: only when there are records
    except ImportError:           # the same rule as select.best_record, without the farm's dependencies
        ok = [r for r in records if r["outcome"] == "ok" and r.get("median_s") is not None]
        return min(ok, key=lambda r: (r["median_s"], r.get("spread") or 0.0)) if ok else None
    typed = _typed(records)
    best = select.best_record(typed)
    return next((r for r, t in zip(records, typed) if t is best), None)


def tune(paths: Sequence[Path], targets: Sequence[str], out: Path, budget_s: float, trials: int,
         interpret: bool, finalist_sustain_s: float = 0.0) -> Path:
    """Tune `paths` on `targets` with the farm (one sweep sharing every worker, `budget_s` seconds
    once the workers are up; finalists sampled sustained when `finalist_sustain_s` > 0); returns
    the folder to pass as a --runs folder."""
    from bench.gpu_suite import bench_settings
    from farm.run.pool import connect
    from farm.run.sweep import run_sweep

    connect(None)
    planned = plan.expand([spaces.load_space(p) for p in paths], list(targets), trials)
    result = run_sweep(planned, bench_settings(out / "runs" / "tune", interpret=interpret, time_budget_s=budget_s,
                                               finalist_sustain_s=finalist_sustain_s),
                       None)
    print(json.dumps({"tuned": len(planned), "summary": result.summary}), flush=True)
    return out


def _finalist_winners(trials: Path) -> dict[str, dict[str, Any]]:
    """task key -> the winner of its re-timed finalists (finalists.jsonl beside `trials`), as the
    farm's bundle picks it (`farm.measure.finalists.winner`): the sweep's own trial figures were
    taken while other configs compiled, and a disturbed one can rank a config wrongly."""
    from farm.measure import finalists
    from farm.run import runlog

    winners = {}
    for key, timings in runlog.read_finals(trials.parent).items():
        final = finalists.winner(timings)
        if final is not None:
            winners[key] = {"config": json.loads(final.config), "median_s": final.median_s,
                            "source": str(trials.parent / runlog.FINALS_LOG)}
    return winners


def load_winners(runs: Sequence[Path], bundle: Path | None) -> tuple[dict[str, dict], dict[str, list]]:
    """(task key -> {config, median_s, source}, space stem -> trial records) from runs and a bundle.
    A run's task with re-timed finalists is won by their winner, as in the bundle the run would
    make; else by its fastest trial. With several run folders, a task's winner is the best over
    all of them."""
    winners: dict[str, dict[str, Any]] = {}
    progress: dict[str, list[dict[str, Any]]] = {}
    if bundle is not None:
        import pyarrow.parquet as pq

        path = bundle / "configs.parquet" if bundle.is_dir() else bundle
        for row in pq.read_table(path).to_pylist():
            if row.get("status") == "ok" and row.get("config"):
                winners[row["task_key"]] = {"config": json.loads(row["config"]), "median_s": row.get("median_s"),
                                            "source": f"bundle {path}"}
    for folder in runs:
        for stem, path in _trial_files(folder).items():
            progress.setdefault(stem, []).extend({**r, "source_file": str(path), "sweep": f"{folder}:{r.get('run_id')}"}
                                                 for r in read_records(path))
    everything = [r for records in progress.values() for r in records]
    finals: dict[str, list[dict[str, Any]]] = {}
    for folder in runs:
        for path in _trial_files(folder).values():
            for key, won in _finalist_winners(path).items():
                finals.setdefault(key, []).append(won)
    for key in sorted({r["task_key"] for r in everything}):
        # Per file: its finalists' winner where it has one, else its fastest trial.
        candidates = list(finals.get(key, []))
        finalized = {c["source"] for c in candidates}
        for source in sorted({r["source_file"] for r in everything if r["task_key"] == key}):
            if str(Path(source).parent / "finalists.jsonl") in finalized:
                continue
            best = _best([r for r in everything if r["task_key"] == key and r["source_file"] == source])
            if best is not None:
                candidates.append({"config": json.loads(best["config"]), "median_s": best["median_s"],
                                   "source": source})
        if candidates:
            winners[key] = min(candidates, key=lambda c: c["median_s"])
    return winners, progress


def search_stats(records: Sequence[dict[str, Any]], within: float = 0.02) -> dict[str, dict[str, Any]]:
    """Per task: the sweep that found its winner, how long it ran, its trial counts and when it
    first came within `within` of that sweep's final best (seconds since the sweep started).
    `records`: every record of every sweep (a sweep: a --runs folder and run id), so that tasks
    sharing a sweep are counted."""
    from farm.bundle import select
    from farm.measure import outcomes

    def sweep(r: dict[str, Any]) -> str:
        return r.get("sweep") or str(r.get("run_id"))

    stats: dict[str, dict[str, Any]] = {}
    for key in sorted({r["task_key"] for r in records}):
        mine = [r for r in records if r["task_key"] == key]
        best = _best(mine)
        if best is None:
            continue
        run = [r for r in mine if sweep(r) == sweep(best) and r.get("elapsed_s") is not None]
        ok = [r for r in run if r["outcome"] == outcomes.OK and r.get("median_s")]
        stats[key] = {"sweep": sweep(best), "tune_s": max(r["elapsed_s"] for r in run),
                      "within_2pct_s": select.time_to_within(_typed(ok), within),
                      "best_s": min(r["median_s"] for r in ok),
                      "trials": sum(r["outcome"] in outcomes.MEASURED for r in run),
                      "ok": len(ok), "pruned": sum(r["outcome"] == outcomes.PRUNED for r in run),
                      "failed": sum(r["outcome"] in outcomes.FAILURES for r in run),
                      "tasks_in_sweep": len({r["task_key"] for r in records if sweep(r) == sweep(best)})}
    return stats


def build_rows(paths: Sequence[Path], targets: Sequence[str], winners: dict[str, dict]) -> tuple[list[Row], list]:
    """Rows for every space's tasks on `targets`, with each target's winner or default config."""
    rows: dict[tuple, Row] = {}
    errors = []
    for path in paths:
        try:
            planned = plan.expand([spaces.load_space(path)], list(targets))
        except Exception as err:  # noqa: BLE001 - report the space and go on
            errors.append({"space": path.stem, "error": f"{type(err).__name__}: {str(err)[:400]}"})
            continue
        for p in planned:
            t = p.task
            row = rows.setdefault((path.stem, t.shape, t.dtype), Row(path.stem, t.kernel, t.shape, t.dtype))
            won = winners.get(t.key)
            if won is not None:
                row.targets[t.target] = {"config": won["config"], "config_source": "winner",
                                         "sweep_median_s": won["median_s"], "source": won["source"]}
            else:
                module = kernels.load(t.kernel)
                row.targets[t.target] = {"config": task_default(module, t.shape, t.target, t.dtype),
                                         "config_source": "default (no winner found)", "sweep_median_s": None}
    for row in rows.values():   # where some target was tuned, untuned defaults would only add noise
        if any(e["config_source"] == "winner" for e in row.targets.values()):
            row.targets = {t: e for t, e in row.targets.items() if e["config_source"] == "winner"}
    return list(rows.values()), errors


# -- measuring -------------------------------------------------------------------------------

def l2_bytes() -> int:
    """The GPU's L2 size from torch, else 60 MiB (an H200's)."""
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).L2_cache_size)
    except Exception:  # noqa: BLE001
        pass
    return DEFAULT_L2_BYTES


def input_sets(module: Any, shape: tuple[int, ...], dtype: Any, l2: int) -> list[tuple[Any, ...]]:
    """Enough input sets that one pass over them is at least twice the L2 (at most MAX_SETS)."""
    per_set = max(1, module.bytes_moved(shape, dtype))
    n = max(1, min(MAX_SETS, math.ceil(2 * l2 / per_set)))
    return [jax.block_until_ready(module.make_inputs(shape, dtype, jax.random.key(100 + i))) for i in range(n)]


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {(text[0] if text else '')[:300]}"


def _farm_column(row: Row, target: str, case: baselines.Case, gpu: bool) -> baselines.Prepared:
    module, entry = case.module, row.targets[target]
    platform = Platform(target, interpret=not gpu and target != "interpret")
    fn = jax.jit(module.build(entry["config"], row.shape, jnp.dtype(row.dtype), platform))
    return baselines.Prepared(fn, [tuple(s) for s in case.input_sets], note=f"farm {target}")


def _single_thread_torch() -> None:
    """On a CPU dry run, one torch thread: its thread pool otherwise fights XLA's for the cores."""
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def _reset_torch() -> None:
    if "torch" not in sys.modules:
        return
    import torch

    try:
        torch._dynamo.reset()   # fresh guards per row: no automatic dynamic shapes, no cache limit
    except Exception:  # noqa: BLE001
        pass
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def budget_note(tune_s: float | None, budget_s: float, no_compile: bool) -> str | None:
    """A warning when tuning spends the whole --budget-s (it counts from the start, tuning
    included), so that every row would leave out torch.compile; None otherwise."""
    if not tune_s or budget_s > tune_s or no_compile:
        return None
    return (f"--budget-s {budget_s:g} counts from the start and --tune {tune_s:g} spends it first, so every "
            f"row will leave out torch.compile (give --budget-s more than --tune to keep it)")


SAME_BYTES_COPY = "copy of the row's bytes"   # timed beside the columns, never one of them


def measure_row(row: Row, args: argparse.Namespace, gpu: bool, late: int) -> dict[str, Any]:
    """Build, check and time every column of one row; every failure is recorded, none raised.

    `late` 1 leaves out the torch.compile columns, 2 everything but farm and XLA (time budget).
    A row of the timing check (--check) also runs it, on every timed column, into `timing_check`.
    """
    _reset_torch()
    module = kernels.load(row.kernel)
    dtype = jnp.dtype(row.dtype)
    case = baselines.Case(module, row.shape, row.dtype, input_sets(module, row.shape, dtype, args.l2_bytes))
    result: dict[str, Any] = {"space": row.space, "kernel": row.kernel, "shape": list(row.shape), "dtype": row.dtype,
                              "flops": module.flops(row.shape), "bytes": module.bytes_moved(row.shape, dtype),
                              "input_sets": len(case.input_sets), "columns": {}}
    columns, prepared = result["columns"], {}
    for target in row.targets:
        name = f"farm:{target}"
        columns[name] = {"kind": "farm", "target": target, **row.targets[target]}
        try:
            prepared[name] = _farm_column(row, target, case, gpu)
        except Exception as err:  # noqa: BLE001
            columns[name] |= {"status": "error", "error": _short(err)}
    for name, factory in baselines.columns(row.kernel, opt_in=args.opt_in).items():
        if args.columns and name not in args.columns and name != "xla":
            continue
        columns[name] = {"kind": "baseline"}
        if (late >= 2 and name != "xla") or (late and name.startswith("torch_compile")):
            columns[name] |= {"status": "skipped", "error": "past the --budget-s time budget"}
            continue
        need = baselines.temp_bytes(row.kernel, name, case)
        if need > args.max_temp_gb * 1e9:
            columns[name] |= {"status": "skipped", "error": f"its temporaries need ~{need / 1e9:.0f} GB "
                                                            f"(> --max-temp-gb {args.max_temp_gb:g})"}
            continue
        try:
            prepared[name] = factory(case)
            columns[name]["note"] = prepared[name].note
        except baselines.Unavailable as err:
            columns[name] |= {"status": "unavailable", "error": str(err)}
        except Exception as err:  # noqa: BLE001
            columns[name] |= {"status": "error", "error": _short(err)}
    try:
        ref = baselines.reference_output(case)
    except Exception as err:  # noqa: BLE001 - nothing can be checked, so nothing is timed
        for name in prepared:
            columns[name] |= {"status": "error", "error": "the float32 reference failed: " + _short(err)}
        result["reference_error"] = _short(err)
        return result, {}
    tolerance = validate.tolerance(row.dtype, module)
    # First calls (compiles, allocator growth) in this order: the farm, the libraries, then the naive
    # math whose temporaries are large, so that a memory failure costs only the naive columns.
    naive = ("xla", "torch", "torch_compile", "torch_compile_max")
    for name in sorted(prepared, key=lambda n: 0 if n.startswith("farm:") else 2 if n in naive else 1):
        try:
            t0 = time.monotonic()
            raw = prepared[name].raw_output(0)
            error = baselines.relative_error(prepared[name].to_reference(raw), ref)
            columns[name] |= {"numerics_error": error, "tolerance": tolerance,
                              "first_call_s": round(time.monotonic() - t0, 3)}
            if layout := baselines.strided_layout(raw):
                columns[name]["layout"] = layout
            del raw
            if not error <= tolerance:
                columns[name]["status"] = "wrong_result"
                del prepared[name]
        except Exception as err:  # noqa: BLE001
            columns[name] |= {"status": "error", "error": _short(err)}
            del prepared[name]
    del ref
    sets = [(i,) for i in range(len(case.input_sets))]
    fns = {name: p.call for name, p in prepared.items()}
    if fns:
        try:
            same_bytes = baselines.same_bytes_copy(result["bytes"], len(sets))
            fns[SAME_BYTES_COPY], result["same_bytes_copy"] = same_bytes.call, same_bytes.note
        except Exception as err:  # noqa: BLE001 - the row goes on without it
            result["same_bytes_copy_error"] = _short(err)
    try:
        timings = timing.time_side_by_side(fns, sets, repetitions=args.repetitions, min_sample_s=args.min_sample_s)
    except Exception:  # noqa: BLE001 - one column failed while timing: time them one by one
        timings = {}
        for name, fn in fns.items():
            try:
                timings[name] = timing.time_calls(fn, sets, repetitions=args.repetitions,
                                                  min_sample_s=args.min_sample_s)
            except Exception as err:  # noqa: BLE001
                if name == SAME_BYTES_COPY:
                    result["same_bytes_copy_error"] = "while timing: " + _short(err)
                else:
                    columns[name] |= {"status": "error", "error": "while timing: " + _short(err)}
    copy = timings.pop(SAME_BYTES_COPY, None)
    if copy is not None:
        result["same_bytes_copy_s"] = copy.median_s
    for name, t in timings.items():
        columns[name] |= {"status": "ok", "median_s": t.median_s, "min_s": t.min_s, "spread": t.spread,
                          "calls_per_sample": t.calls_per_sample, "samples": len(t.samples)}
    first = (row.shape, row.dtype) == args.first_shape.get(row.space)
    if "all" in args.check or (row.space in args.check and first):
        # Here, before the next row's dynamo reset: every timed column, torch.compile's included.
        result["timing_check"] = timing_check({n: p for n, p in prepared.items() if n in timings},
                                              args, gpu, len(sets))
        for c in result["timing_check"]:
            c["table_s"] = columns[c["column"]].get("median_s")
    del prepared, case, fns, timings
    gc.collect()
    return result


# -- the independent timing check ------------------------------------------------------------

def _cuda_kernels(prof: Any) -> list[tuple[int, int]]:
    """(start, end) of every CUDA kernel in a torch.profiler trace, in start order."""
    import torch

    return sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0)


def traced_timing(p: baselines.Prepared, repetitions: int, min_sample_s: float,
                  n_sets: int = 1) -> dict[str, float]:
    """farm.measure.timing.time_calls of `p` (input sets rotated as in the table) run under a CUPTI
    trace (torch.profiler, every stream): farm.measure.timing's per-call figure, and per call the
    median device span (first kernel start to last kernel end) and summed kernel durations of its
    longer samples.

    How many kernels one call launches is read from a trace of one call. time_calls' calibration
    runs a number of calls it chooses before the samples, so the samples are the trace's last
    3 * calls_per_sample * samples calls (each pair: n calls, then 2n)."""
    from torch.profiler import ProfilerActivity, profile

    timing.run_sample(p.call, [(0,)], 2)   # warm
    with profile(activities=[ProfilerActivity.CUDA]) as one:
        timing.run_sample(p.call, [(0,)], 1)
    per = len(_cuda_kernels(one))
    if not per:
        raise RuntimeError("no kernel in the trace of one call")
    sets = [(i,) for i in range(n_sets)]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = timing.time_calls(p.call, sets, warmup=2, repetitions=repetitions, min_sample_s=min_sample_s)
    kernels = _cuda_kernels(prof)
    n = t.calls_per_sample
    sampled = len(t.samples) * 3 * n * per
    if len(kernels) % per or len(kernels) < sampled:
        raise RuntimeError(f"{len(kernels)} kernels in the trace of {len(t.samples)} sample pairs of "
                           f"{n} and {2 * n} calls, {per} kernels a call")
    spans, busy, at = [], [], len(kernels) - sampled
    for _ in t.samples:
        at += n * per
        chunk = kernels[at:at + 2 * n * per]
        at += 2 * n * per
        spans.append((chunk[-1][1] - chunk[0][0]) / 1e6 / (2 * n))
        busy.append(sum(end - start for start, end in chunk) / 1e6 / (2 * n))
    return {"farm_timing_s": t.median_s, "device_s": statistics.median(spans),
            "kernels_s": statistics.median(busy), "kernels_per_call": per}


def _clocks(samples: list[dict[str, Any] | None] | None, settled_s: float | None = None) -> str:
    """The check's GPU samples (bench/gpu_clocks.py) before and after its timing, for the table,
    after the seconds it waited for the GPU to settle, if any."""
    if not samples or not any(samples):
        return ""
    waited = f"idle {settled_s:.1f} s, then " if settled_s else ""
    return waited + "; ".join(gpu_clocks.ClockSample(**{**s, "reasons": tuple(s["reasons"])}).brief() if s else "?"
                              for s in samples)


def timing_check(prepared: dict[str, baselines.Prepared], args: argparse.Namespace, gpu: bool,
                 n_sets: int = 1) -> list[dict]:
    """farm.measure.timing's clock against a device clock on the same samples, for each column."""
    checks = []
    for name, p in prepared.items():
        entry: dict[str, Any] = {"column": name, "method": "CUPTI trace of the same samples (torch.profiler)"}
        try:
            if not gpu:
                raise baselines.Unavailable(baselines.CPU_ONLY)
            entry["settled_s"], _ = gpu_clocks.settle(args.check_settle_w, args.check_settle_s)
            before = gpu_clocks.sample()
            entry |= traced_timing(p, args.repetitions, args.min_sample_s, n_sets)
            entry["clocks"] = [c and dataclasses.asdict(c) for c in (before, gpu_clocks.sample())]
            entry["diff_pct"] = 100 * (entry["farm_timing_s"] - entry["device_s"]) / entry["device_s"]
        except baselines.Unavailable as err:
            entry["error"] = str(err)
        except Exception as err:  # noqa: BLE001
            entry["error"] = _short(err)
        checks.append(entry)
    return checks


# -- ceilings --------------------------------------------------------------------------------

def ceilings(small: bool, gpu: bool, repetitions: int) -> dict[str, Any]:
    """Copy bandwidth (read + write) and the bf16 matmul rate, through XLA and torch: the best kept.
    The copies are `baselines.same_bytes_copy`'s (XLA's negation; torch's copy_ on a GPU)."""
    n, size = (1 << 22, 512) if small or not gpu else (1 << 30, 8192)
    a = jax.random.normal(jax.random.key(1), (size, size), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(2), (size, size), jnp.bfloat16)
    copy_bytes, mm_flops = 2 * 2 * n, 2 * size**3
    found: dict[str, Any] = {"copy_elements": n, "matmul_size": size}
    contenders = {"copy_xla": (baselines.same_bytes_copy(copy_bytes, gpu=False), copy_bytes),
                  "matmul_xla": (baselines.Prepared(jax.jit(lambda p, q: p @ q), [(a, b)]), mm_flops)}
    if gpu:
        torch_copy = baselines.same_bytes_copy(copy_bytes, gpu=True)
        if torch_copy.framework == "torch":
            contenders["copy_torch"] = (torch_copy, copy_bytes)
    try:
        import torch

        device = torch.device("cuda", 0) if gpu else torch.device("cpu")
        sync = (lambda: torch.cuda.synchronize(device)) if gpu else (lambda: None)
        ta, tb = baselines.to_torch(a, device), baselines.to_torch(b, device)
        contenders["matmul_torch"] = (baselines.Prepared(torch.matmul, [(ta, tb)], framework="torch", sync=sync),
                                      mm_flops)
    except Exception as err:  # noqa: BLE001
        found["torch_error"] = _short(err)
    for name, (p, work) in contenders.items():
        try:
            t = timing.time_calls(p.call, [(0,)], repetitions=repetitions)
            found[name] = {"median_s": t.median_s, "spread": t.spread, "per_s": work / t.median_s}
        except Exception as err:  # noqa: BLE001
            found[name] = {"error": _short(err)}
    rate = lambda *names: max((found[k].get("per_s", 0.0) for k in names if k in found), default=0.0)  # noqa: E731
    found["copy_bytes_per_s"] = rate("copy_xla", "copy_torch")
    found["bf16_flops_per_s"] = rate("matmul_xla", "matmul_torch")
    return found


# -- the report ------------------------------------------------------------------------------

def _geomean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def flag_below_floor(result: dict[str, Any], peaks: roofline.Peaks | None) -> list[str]:
    """Mark the columns of a row whose time is below its roofline floor (bytes over the device's
    peak bandwidth, flops over its peak): a measurement error, never a result (status
    `below_floor`, left out of every comparison). Returns the names marked."""
    if peaks is None:
        return []
    floor = result["bytes"] / peaks.bandwidth
    if peaks.flops:
        floor = max(floor, result["flops"] / peaks.flops)
    result["floor_s"] = floor
    marked = []
    for name, c in result.get("columns", {}).items():
        if c.get("status") == "ok" and c["median_s"] < floor:
            c["status"], c["error"] = "below_floor", (
                f"{c['median_s'] * 1e6:.1f} us is below the roofline floor {floor * 1e6:.1f} us ({peaks.source}): "
                f"faster than the device can move the bytes or do the flops, a measurement error")
            marked.append(name)
    return marked


def device_time(result: dict[str, Any]) -> None:
    """The row compared on device time (the timing check's CUPTI kernel durations per call), where
    the check ran: the farm's kernels against the fastest other column's; which columns are
    host-bound (their table figure is the host's launch rate, not the device's work); and which
    table figures are off the device clock of the check's samples by over TABLE_OFF_PCT."""
    columns = result.get("columns", {})
    for c in result.get("timing_check", []):
        column = columns.get(c["column"], {})
        if c.get("kernels_s") and c.get("device_s") and column.get("median_s"):
            column["kernels_s"] = c["kernels_s"]
            column["dispatch_bound"] = c["kernels_s"] < DISPATCH_BOUND * column["median_s"]
            c["table_vs_device_pct"] = 100 * (column["median_s"] - c["device_s"]) / c["device_s"]
            column["table_off"] = abs(c["table_vs_device_pct"]) > TABLE_OFF_PCT
    timed = {n: c["kernels_s"] for n, c in result.get("columns", {}).items()
             if c.get("status") == "ok" and c.get("kernels_s")}
    farm = {n: t for n, t in timed.items() if n.startswith("farm:")}
    others = {n: t for n, t in timed.items() if not n.startswith("farm:")}
    result["dispatch_bound"] = sorted(n for n, c in result.get("columns", {}).items()
                                      if c.get("dispatch_bound"))
    result["table_off"] = sorted(n for n, c in result.get("columns", {}).items()
                                 if c.get("table_off") and not c.get("dispatch_bound"))
    if farm and others:
        best_farm, best_other = min(farm, key=farm.get), min(others, key=others.get)
        result |= {"device_farm": best_farm, "device_best_other": best_other,
                   "device_speedup_vs_best_other": others[best_other] / farm[best_farm]}


def summarize(results: list[dict[str, Any]], ceiling: dict[str, Any],
              peaks: roofline.Peaks | None = None) -> dict[str, Any]:
    """Per row: the best farm column, speedups, the bound and % of its ceiling; geometric means.
    Columns below the row's roofline floor (`flag_below_floor`) take part in none of them."""
    copy_bw, mm_rate = ceiling.get("copy_bytes_per_s") or 0, ceiling.get("bf16_flops_per_s") or 0
    ridge = mm_rate / copy_bw if copy_bw and mm_rate else None
    per_column: dict[str, list[float]] = {}
    for r in results:
        flag_below_floor(r, peaks)
        ok = {n: c["median_s"] for n, c in r.get("columns", {}).items() if c.get("status") == "ok"}
        farm = {n: s for n, s in ok.items() if n.startswith("farm:")}
        others = {n: s for n, s in ok.items() if not n.startswith("farm:")}
        for n, s in ok.items():
            if copy_bw:
                r["columns"][n]["pct_copy_bw"] = 100 * r["bytes"] / s / copy_bw
            if mm_rate:
                r["columns"][n]["pct_matmul_rate"] = 100 * r["flops"] / s / mm_rate
        r["bound"] = None if ridge is None else ("compute" if r["flops"] / r["bytes"] > ridge else "memory")
        if not farm:
            continue
        best_farm = min(farm, key=farm.get)
        r |= {"farm_column": best_farm, "farm_s": farm[best_farm]}
        if r["bound"] is not None:
            c = r["columns"][best_farm]
            r["pct_of_ceiling"] = c["pct_matmul_rate"] if r["bound"] == "compute" else c["pct_copy_bw"]
        if r.get("same_bytes_copy_s") and r["bound"] != "compute":
            r["pct_of_same_bytes_copy"] = 100 * r["same_bytes_copy_s"] / farm[best_farm]
        if "xla" in others:
            r["speedup_vs_xla"] = others["xla"] / farm[best_farm]
        if others:
            best_other = min(others, key=others.get)
            r |= {"best_other": best_other, "speedup_vs_best_other": others[best_other] / farm[best_farm]}
        for n, s in others.items():
            per_column.setdefault(n, []).append(s / farm[best_farm])
        device_time(r)
    return {"speedup_vs_xla": _geomean([r.get("speedup_vs_xla") for r in results]),
            "device_speedup_vs_best_other": _geomean([r.get("device_speedup_vs_best_other")
                                                      for r in results]),
            "speedup_vs_best_other": _geomean([r.get("speedup_vs_best_other") for r in results]),
            "speedup_vs_column": {n: _geomean(v) for n, v in per_column.items()},
            "rows_with_farm": sum("farm_s" in r for r in results), "rows": len(results)}


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds * 1e3:.3f}" if seconds >= 1e-4 else f"{seconds * 1e6:.1f} µs"


def _with_unit(seconds: float) -> str:
    text = _ms(seconds)
    return text if text.endswith("µs") else f"{text} ms"


def _cell(c: dict[str, Any] | None) -> str:
    if not c:
        return ""
    status = c.get("status")
    if status == "ok":
        return _ms(c["median_s"])
    if status == "below_floor":
        return f"⚠ {_ms(c['median_s'])} below floor"
    return {"wrong_result": "✗ wrong", "unavailable": "n/a", "skipped": "skipped", "error": "error"}.get(status, "?")


def _column_names(results: list[dict[str, Any]]) -> list[str]:
    names = {n for r in results for n in r.get("columns", {})}
    farm = sorted(n for n in names if n.startswith("farm:"))
    rest = [n for n in COLUMN_ORDER if n in names] + sorted(names - set(COLUMN_ORDER) - set(farm))
    return farm + rest


def _over_ceiling_note(row: dict[str, Any]) -> str:
    """Why a row's figure can pass its measured ceiling without being an error (figures over the
    device's peaks are flagged as errors by `flag_below_floor` instead)."""
    if (row.get("pct_of_ceiling") or 0) <= 100:
        return ""
    if row.get("bound") == "compute":
        return " (over the sustained ceiling: a burst)"
    return " (over a copy's rate, under the HBM peak: a copy reads and writes alike, this row need not)"


def markdown(report: dict[str, Any]) -> str:
    """seed_table.md: summary table, every column's time, notes, the timing check, the method."""
    results, ceiling = report["results"], report.get("ceilings", {})
    means = report.get("geomean") or {"rows_with_farm": 0, "speedup_vs_xla": None, "speedup_vs_best_other": None,
                                      "speedup_vs_column": {}}
    lines = [f"# Seed table: {report['device']}, {report['date']}", "",
             f"JAX {report['versions'].get('jax')}, torch {report['versions'].get('torch')}, "
             f"triton {report['versions'].get('triton')}. Times are medians in ms (device time, queued calls; "
             "see the method below).", "",
             "| kernel | shape | dtype | farm | farm (ms) | XLA (ms) | farm/XLA | best other | farm/best other "
             "| bound | % of ceiling | % of a copy of its bytes |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "columns" not in r:
            lines.append(f"| {r.get('space')} | failed: {str(r.get('error'))[:100]} | | | | | | | | | | |")
            continue
        shape, xla = "x".join(map(str, r["shape"])), r["columns"].get("xla", {})
        speed = lambda v: f"{v:.2f}x" if v else ""  # noqa: E731
        pct = f"{r['pct_of_ceiling']:.0f}% {'matmul' if r['bound'] == 'compute' else 'copy BW'}" \
            if r.get("pct_of_ceiling") is not None else ""
        pct += _over_ceiling_note(r)
        best = ""
        if r.get("best_other"):
            other = r["columns"][r["best_other"]]
            best = f"{r['best_other']} ({_ms(other['median_s'])}{', strided view' if other.get('layout') else ''})"
        same = f"{r['pct_of_same_bytes_copy']:.0f}% ({_ms(r['same_bytes_copy_s'])})" \
            if r.get("pct_of_same_bytes_copy") is not None else ""
        lines.append(f"| {r['space']} | {shape} | {r['dtype']} | {(r.get('farm_column') or '—').removeprefix('farm:')} "
                     f"| {_ms(r.get('farm_s'))} | {_cell(xla)} | {speed(r.get('speedup_vs_xla'))} | {best} "
                     f"| {speed(r.get('speedup_vs_best_other'))} | {r.get('bound') or ''} | {pct} "
                     f"| {same} |")
    g = lambda v: f"{v:.2f}x" if v else "n/a"  # noqa: E731
    lines += ["", f"Geometric mean over {means['rows_with_farm']} rows: farm/XLA {g(means['speedup_vs_xla'])}, "
              f"farm/best other {g(means['speedup_vs_best_other'])}. Per column (that column's time / farm's): "
              + ", ".join(f"{n} {g(v)}" for n, v in sorted(means["speedup_vs_column"].items())) + ".", "",
              f"Ceilings measured in this run: copy {ceiling.get('copy_bytes_per_s', 0) / 1e9:.0f} GB/s (bytes read + "
              f"written, {ceiling.get('copy_elements')} bf16 elements), bf16 matmul "
              f"{ceiling.get('bf16_flops_per_s', 0) / 1e12:.1f} TFLOP/s ({ceiling.get('matmul_size')}^3, random data), "
              "each the better of XLA and torch, each timed back to back (sustained: on the H200 the matmul "
              "runs at the power cap); the table's columns interleave short samples (bursts), in which a "
              "compute-bound kernel can run above that ceiling (never above the device's peak, which is checked); "
              "a row is compute-bound when its flops/bytes exceed their ratio. A memory-bound row's last column "
              "is a copy of as many bytes as the row moves (torch's device copy on a GPU, the faster copy "
              "above), timed beside its columns: the copy ceiling at that size.", "", "## Every column (ms)", ""]
    names = _column_names(results)
    lines += ["| row | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for r in results:
        if "columns" in r:
            lines.append(f"| {r['space']} {'x'.join(map(str, r['shape']))} {r['dtype']} | "
                         + " | ".join(_cell(r["columns"].get(n)) for n in names) + " |")
    lines += ["", "## Notes: configs, unavailable and failing columns", ""]
    for r in results:
        for n, c in r.get("columns", {}).items():
            shape = f"{'x'.join(map(str, r['shape']))} {r['dtype']}"
            if n.startswith("farm:"):
                figure = "finalists' figure" if str(c.get("source", "")).endswith("finalists.jsonl") else "sweep figure"
                sweep = f", {figure} {_with_unit(c['sweep_median_s'])}" if c.get("sweep_median_s") else ""
                lines.append(f"- {r['space']} {shape} {n}: {c.get('config_source')} "
                             f"`{json.dumps(c.get('config'))}`{sweep}"
                             + (f"; {c['status']}: {c.get('error', '')}" if c.get("status") != "ok" else ""))
            elif c.get("status") == "wrong_result":
                lines.append(f"- {r['space']} {shape} {n}: wrong result, relative error "
                             f"{c['numerics_error']:.2e} > {c['tolerance']:.0e} (not timed)")
            elif c.get("status") in ("unavailable", "error", "skipped"):
                lines.append(f"- {r['space']} {shape} {n}: {c['status']}: {c.get('error')}")
            if c.get("layout"):
                lines.append(f"- {r['space']} {shape} {n}: returns {c['layout']}: its time leaves out the "
                             "compaction that a dense result (every JAX array) needs")
    searches = report.get("searches") or {}
    if searches:
        lines += ["", "## The searches behind the farm columns", "",
                  "Seconds since the sweep started; a sweep that tuned several tasks at once shared its GPU(s) "
                  "among them (tasks in sweep).", "",
                  "| task | sweep | tasks in sweep | sweep time (s) | first within 2% of final best (s) | trials "
                  "| ok | pruned | failed |", "|---|---|---|---|---|---|---|---|---|"]
        for key, st in searches.items():
            lines.append(f"| {key} | {st['sweep']} | {st['tasks_in_sweep']} | {st['tune_s']:.0f} "
                         f"| {st['within_2pct_s']:.0f} | {st['trials']} | {st['ok']} | {st['pruned']} "
                         f"| {st['failed']} |")
    device_rows = [r for r in results if r.get("device_speedup_vs_best_other")]
    if device_rows:
        lines += ["", "## On device time (CUPTI kernel durations per call, rows with the timing check)", "",
                  "Where a column is host-bound, the table above holds the host's launch rate for it; here "
                  "every column is its kernels' time on the device. The check runs each column's samples back "
                  "to back from a settled GPU (sustained load); the table interleaves the columns' short samples "
                  "round robin (bursts). Compute-bound kernels at the power cap can rank differently in the two: "
                  "on the H200 the farm's Mosaic GPU matmuls ran 5-12% faster in the table than in the check, cuBLAS "
                  "at most 5% (BENCHMARKS.md, 2026-12-02).", "",
                  "| row | farm kernels (ms) | best other | its kernels (ms) | farm/best other | host-bound "
                  "columns | table figure off the device clock by over 5% |", "|---|---|---|---|---|---|---|"]
        for r in device_rows:
            farm, other = r["columns"][r["device_farm"]], r["columns"][r["device_best_other"]]
            lines.append(f"| {r['space']} {'x'.join(map(str, r['shape']))} {r['dtype']} "
                         f"| {_ms(farm['kernels_s'])} | {r['device_best_other']} | {_ms(other['kernels_s'])} "
                         f"| {r['device_speedup_vs_best_other']:.2f}x | {', '.join(r['dispatch_bound'])} "
                         f"| {', '.join(r.get('table_off', []))} |")
        lines.append(f"\nGeometric mean on device time, farm/best other: "
                     f"{g(means.get('device_speedup_vs_best_other'))}.")
    checks = [(r, c) for r in results for c in r.get("timing_check", [])]
    if checks:
        lines += ["", "## Independent timing check (inputs rotated as in the table; goal within 5%)", "",
                  "| row | column | table (ms, rotated inputs) | farm.measure.timing (ms) | device clock (ms) | method "
                  "| difference | kernels only (ms) | table vs device clock | GPU before; after (SM/memory clocks) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r, c in checks:
            diff = f"{c['diff_pct']:+.1f}%" if "diff_pct" in c else c.get("error", "")
            off = f"{c['table_vs_device_pct']:+.1f}%" if "table_vs_device_pct" in c else ""
            lines.append(f"| {r['space']} {'x'.join(map(str, r['shape']))} {r['dtype']} | {c['column']} "
                         f"| {_ms(c.get('table_s'))} | {_ms(c.get('farm_timing_s'))} "
                         f"| {_ms(c.get('device_s'))} | {c.get('method', '')} | {diff} | {_ms(c.get('kernels_s'))} "
                         f"| {off} | {_clocks(c.get('clocks'), c.get('settled_s'))} |")
    lines += ["", "## Method", "", report["method"], ""]
    return "\n".join(lines)


def plot(report: dict[str, Any], progress: dict[str, list[dict[str, Any]]], out: Path) -> list[str]:
    """seed_speedup.png (farm's speedup over every column) and seed_search_progress.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    rows = [r for r in report["results"] if r.get("farm_s")]
    names = [n for n in _column_names(rows) if not n.startswith("farm:")]
    if rows and names:
        colors = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(names)}
        present = [[n for n in names if r["columns"].get(n, {}).get("status") == "ok"] for r in rows]
        bars = sum(len(p) for p in present)
        fig, ax = plt.subplots(figsize=(11, 1.5 + 0.16 * bars + 0.25 * len(rows)))
        labelled = set()
        for i, (r, cols) in enumerate(zip(rows, present)):
            height = 0.8 / max(1, len(cols))
            for k, name in enumerate(cols):
                ratio = r["columns"][name]["median_s"] / r["farm_s"]
                ax.barh(i + k * height, ratio, height=height, color=colors[name],
                        label=None if name in labelled else name)
                labelled.add(name)
        ax.set_yticks([i + 0.4 - 0.4 / max(1, len(c)) for i, c in enumerate(present)],
                      [f"{r['space']} {'x'.join(map(str, r['shape']))} {r['dtype']}\n"
                       f"(farm {r['farm_column'].removeprefix('farm:')})" for r in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("farm speedup over the column (its time / farm's time; > 1: farm faster)")
        ax.set_title(f"Seed table, {report['device']}")
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        fig.savefig(out / "seed_speedup.png", dpi=120)
        plt.close(fig)
        written.append("seed_speedup.png")
    by_kernel: dict[str, list[dict[str, Any]]] = {}   # one panel per kernel, whichever sweeps tuned it
    for records in progress.values():
        for r in records:
            by_kernel.setdefault(r["kernel"], []).append(r)
    spaces_with = {k: recs for k, recs in by_kernel.items() if any(r.get("outcome") == "ok" for r in recs)}
    if spaces_with:
        cols = min(4, len(spaces_with))
        rows_n = math.ceil(len(spaces_with) / cols)
        fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols, 3 * rows_n), squeeze=False)
        for ax, (space, records) in zip(axes.flat, sorted(spaces_with.items(), key=lambda kv: _order(kv[0]))):
            for key in sorted({r["task_key"] for r in records}):
                won = (report.get("searches") or {}).get(key, {}).get("sweep")   # the winner's sweep only
                ok = sorted((r for r in records if r["task_key"] == key and r.get("outcome") == "ok"
                             and (won is None or r.get("sweep") == won)
                             and r.get("median_s") and r.get("elapsed_s") is not None), key=lambda r: r["elapsed_s"])
                if not ok:
                    continue
                xs, ys, best = [], [], math.inf
                for r in ok:
                    best = min(best, r["median_s"])
                    xs.append(r["elapsed_s"])
                    ys.append(best * 1e3)
                parts = key.split("/")
                ax.step(xs, ys, where="post", label=f"{parts[-1]} {parts[1]}", marker=".", markersize=3)
            ax.set_title(space, fontsize=9)
            ax.set_yscale("log")
            ax.set_xlabel("elapsed (s)", fontsize=7)
            ax.set_ylabel("best so far (ms)", fontsize=7)
            ax.tick_params(labelsize=6)
            ax.legend(fontsize=5)
        for ax in list(axes.flat)[len(spaces_with):]:
            ax.axis("off")
        fig.suptitle("Best config time so far against sweep time (ok trials)")
        fig.tight_layout()
        fig.savefig(out / "seed_search_progress.png", dpi=110)
        plt.close(fig)
        written.append("seed_search_progress.png")
    return written


def _order(stem: str) -> tuple[int, str]:
    return (ORDER.index(stem) if stem in ORDER else len(ORDER), stem)


def _versions() -> dict[str, Any]:
    found = {"jax": jax.__version__, "python": sys.version.split()[0]}
    try:
        import jaxlib

        found["jaxlib"] = jaxlib.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch

        found |= {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
        if torch.cuda.is_available():
            found["cudnn_torch"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        pass
    try:
        import triton

        found["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass
    return found


def user_spaces(items: Sequence[str], folder: Path) -> list[Path]:
    """Three-line space files (`user_<kernel>.yaml`, over each kernel's shipped space) for
    `KERNEL:AxB[:DTYPE]` items; a malformed item is a one-line error naming it."""
    shapes: dict[str, dict[str, list[list[int]]]] = {}
    for item in items:
        kernel, _, rest = item.partition(":")
        dims, _, dtype = rest.partition(":")
        try:
            shape = [int(d) for d in dims.split("x")]
        except ValueError:
            raise SystemExit(f"--shape {item!r}: expected KERNEL:AxB[:DTYPE], e.g. softmax:8192x50257") from None
        if not kernel or not all(d > 0 for d in shape):
            raise SystemExit(f"--shape {item!r}: expected KERNEL:AxB[:DTYPE] with positive dimensions")
        shapes.setdefault(kernel, {}).setdefault(dtype or "bfloat16", []).append(shape)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for kernel, by_dtype in shapes.items():
        for dtype, dims in by_dtype.items():
            path = folder / f"user_{kernel}_{dtype}.yaml"
            path.write_text(f"kernel: {kernel}\nshapes: {json.dumps(dims)}\ndtypes: [{dtype}]\n")
            paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the seed table; returns the report it wrote."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for seed_table.json/.md and the plots")
    parser.add_argument("--runs", type=Path, action="append", default=[],
                        help="bench/gpu_suite.py's --out folder (DIR/runs/<space>/trials.jsonl); repeatable")
    parser.add_argument("--bundle", type=Path, help="a bundle folder or its configs.parquet (winners)")
    parser.add_argument("--tune", type=float, metavar="SECONDS",
                        help="first tune the spaces with the farm for this long (one sweep on every GPU; "
                             "--small: interpret mode), then measure its winners (with any --runs)")
    parser.add_argument("--trials", type=int, default=60, help="trial budget per task with --tune (default 60)")
    parser.add_argument("--finalist-sustain", type=float, default=0.0, metavar="SECONDS",
                        help="with --tune: each finalist sample from this many seconds of calls back to back "
                        "(the farm's --finalist-sustain; default 0: short samples)")
    parser.add_argument("--spaces", nargs="*", type=Path, help="space files (default: those of --runs, else all)")
    parser.add_argument("--shape", action="append", default=[], metavar="KERNEL:AxB[:DTYPE]",
                        help="a user's shape, e.g. softmax:8192x50257 (repeatable; DTYPE default bfloat16): "
                             "tuned and measured over the kernel's shipped space, like --spaces")
    parser.add_argument("--target", action="append", help="targets (default: the spaces' gpu-* targets; "
                                                          "interpret with --small on a CPU)")
    parser.add_argument("--small", action="store_true", help="the spaces' interpret shapes (a dry run)")
    parser.add_argument("--columns", nargs="*", help="only these baseline columns (farm and xla always)")
    parser.add_argument("--max-autotune", action="store_true", help="add torch.compile max-autotune-no-cudagraphs")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile columns")
    parser.add_argument("--repetitions", type=int, default=10, help="samples per column (default 10)")
    parser.add_argument("--min-sample-s", type=float, default=5e-3)
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="after this many seconds, remaining rows leave out torch.compile; after 1.4 "
                             "times that, everything but farm and XLA (default 300)")
    parser.add_argument("--max-temp-gb", type=float, default=40.0,
                        help="skip columns whose temporaries need more device memory (default 40)")
    parser.add_argument("--check-settle-w", type=float, default=150.0,
                        help="before each column's check, wait until the GPU draws at most this many watts, "
                             "or its power stops falling (default 150; the H200 idles near 80)")
    parser.add_argument("--check-settle-s", type=float, default=10.0,
                        help="the longest wait for --check-settle-w before a column's check (default 10)")
    parser.add_argument("--check", nargs="*", default=CHECK,
                        help=f"spaces whose first row gets the timing check, or all: every row (default {CHECK})")
    args = parser.parse_args(argv)
    if note := budget_note(args.tune, args.budget_s, args.no_compile):
        print(f"seed table: {note}", file=sys.stderr, flush=True)
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = baselines.on_gpu()
    if not gpu:
        _single_thread_torch()
    args.opt_in = ("torch_compile_max",) if args.max_autotune else ()
    if args.no_compile:
        keep = args.columns or [n for n in COLUMN_ORDER if not n.startswith("torch_compile")]
        args.columns = [n for n in keep if not n.startswith("torch_compile")]
    args.l2_bytes = l2_bytes() if gpu else DEFAULT_L2_BYTES
    if args.shape:
        args.spaces = [*(args.spaces or []), *user_spaces(args.shape, args.out / "user_spaces")]
    targets = args.target or (["interpret"] if args.small and not gpu else ["gpu-triton", "gpu-mosaic"])
    if args.tune:
        tuned = args.spaces or sorted((REPO / "search_spaces").glob("*.yaml"), key=lambda p: _order(p.stem))
        args.runs.append(tune(tuned, ["interpret"] if args.small else targets, args.out / "tune", args.tune,
                              args.trials, interpret=args.small, finalist_sustain_s=args.finalist_sustain))
        args.spaces = args.spaces or tuned
    winners, progress = load_winners(args.runs, args.bundle)
    if args.spaces:
        paths = list(args.spaces)
    else:
        stems = sorted(progress, key=_order) if progress else [p.stem for p in sorted(
            (REPO / "search_spaces").glob("*.yaml"), key=lambda p: _order(p.stem))]
        paths = [REPO / "search_spaces" / f"{s}.yaml" for s in stems if (REPO / "search_spaces" / f"{s}.yaml").exists()]
    if args.small and gpu:
        print("--small on a GPU: interpret shapes, gpu targets (default configs unless tuned at those shapes)")
    rows, errors = build_rows(paths, ["interpret"] if args.small else targets, winners)
    if args.small and gpu:   # interpret shapes, built for the GPU targets
        for row in rows:
            row.targets = {t: {"config": task_default(kernels.load(row.kernel), row.shape, t, row.dtype),
                               "config_source": "default (--small)", "sweep_median_s": None}
                           for t in targets if t in kernels.load(row.kernel).TARGETS}
    args.first_shape = {}
    for row in rows:
        args.first_shape.setdefault(row.space, (row.shape, row.dtype))
    device = jax.devices()[0].device_kind
    method = __doc__[__doc__.index("Timing method"):].strip()
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": device, "versions": _versions(),
                              "gpu": gpu, "small": args.small, "targets": targets, "repetitions": args.repetitions,
                              "l2_bytes": args.l2_bytes, "method": method, "results": list(errors),
                              "searches": search_stats([r for recs in progress.values() for r in recs])}
    print(f"seed table: {len(rows)} rows on {device} ({'GPU' if gpu else 'CPU'}), winners for {len(winners)} tasks",
          flush=True)
    for row in rows:
        spent = time.monotonic() - started
        late = 2 if spent > 1.4 * args.budget_s else 1 if spent > args.budget_s else 0
        t0 = time.monotonic()
        try:
            result = measure_row(row, args, gpu, late)
        except Exception as err:  # noqa: BLE001
            result = {"space": row.space, "kernel": row.kernel, "shape": list(row.shape), "dtype": row.dtype,
                      "error": _short(err), "traceback": traceback.format_exc()[-2000:]}
        result["wall_s"] = round(time.monotonic() - t0, 1)
        report["results"].append(result)
        cols = result.get("columns", {})
        print(f"{row.label} ({result['wall_s']} s): " + ", ".join(
            f"{n} {_cell(c)}" for n, c in cols.items()) + (f" ERROR {result['error']}" if "error" in result else ""),
            flush=True)
        if "timing_check" in result:
            print(f"timing check {result['space']}: " + ", ".join(
                f"{c['column']} {c['diff_pct']:+.1f}%" if "diff_pct" in c else f"{c['column']} ({c.get('error')})"
                for c in result["timing_check"]), flush=True)
        write(report, args.out)
    report["ceilings"] = ceilings(args.small, gpu, args.repetitions)
    report["geomean"] = summarize(report["results"], report["ceilings"], roofline.datasheet(device) if gpu else None)
    report["wall_s"] = round(time.monotonic() - started, 1)
    try:
        report["plots"] = plot(report, progress, args.out)
    except Exception as err:  # noqa: BLE001
        report["plots_error"] = _short(err)
    text = write(report, args.out)
    print(text[:text.index("## Every column")] if "## Every column" in text else text)
    return report


def write(report: dict[str, Any], out: Path) -> str:
    """Write seed_table.json and seed_table.md; returns the markdown."""
    (out / "seed_table.json").write_text(json.dumps(report, indent=1, default=str))
    text = markdown(report)
    (out / "seed_table.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
