"""Benchmark of the sweep driver alone (issue 16, "the driver is never the bottleneck").

    .venv/bin/python bench/driver_throughput.py [--workers 1,8,16,32] [--depth 18] [--trials 64]
        [--paced-ms 66.7] [--paced-workers 8,16,32] [--fail-share 0.05] [--profile] [--out DIR]

The real `farm.run.sweep.run_sweep` (searchers over Optuna's journal storage, the run log, the
worker pool, Ray) runs with stand-in workers (`StandInWorker`: the interface of
`farm.run.actor.Worker`) that answer from a synthetic, deterministic landscape instead of
compiling and timing: instantly, or after a simulated device time. The tasks are the shipped
spaces' gpu-triton tasks (20 tasks), planned as `farm sweep search_spaces/*.yaml --target
gpu-triton --trials N` plans them. Ray is embedded and local, with as many (logical) GPUs as the
largest worker count, so the workers are placed on the GPU pool as on an accelerator cluster.

Two scenarios, each for every worker count:
  instant  the workers answer at once: the rate is what the driver sustains (its ceiling);
  paced    each answer holds the worker's device `--paced-ms` (66.7 ms: 15 trials/s per GPU,
           the goal), so N workers ask for N x 15 trials/s: can the driver feed them?
Per run: measured trials/s from the workers being warm to the last record, and sustained (the
middle 80% of the measured trials: no ramp, no tail); asks/s and tells/s; milliseconds per ask
(`Searcher.ask`, what proposes one config, answering invalid, pruned and cached draws on the way)
and per tell (`_Sweep._finish`: the record, its line in trials.jsonl, then `Searcher.tell`); the
driver process's CPU time (all its threads, Ray's included) per second of the loop; and
`starved` (paced): the share of the workers' time in the sustained window during which a worker
held no trial at all, its device waiting for the driver (0%: every device kept fed).
`--profile` adds cProfile's top functions of the largest instant run (the driver is slower under
it; the raw stats go to driver_instant_N.prof). Prints a table and writes driver_throughput.json
and driver_throughput.md to `--out`.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import glob
import io
import json
import math
import os
import platform
import pstats
import socket
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Self

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import optuna
import ray

from farm.bundle.records import TrialRecord
from farm.measure import capacity, outcomes
from farm.measure.device import MeasureSettings
from farm.measure.finalists import FinalTiming
from farm.measure.outcomes import Measured, Measurement
from farm.run import pool as pool_
from farm.run import runlog, sweep
from farm.search import plan, spaces
from farm.search.plan import PlannedTask
from farm.search.searcher import Searcher
from farm.tasks import TuningTask, config_json

RESULTS = REPO / "bench" / "results" / "driver_throughput"
GOAL_PER_GPU = 15.0        # trials/s per GPU the farm is working towards
GOAL_GPUS = 8


class StandInWorker:
    """A stand-in for `farm.run.actor.Worker` (same methods): no compiler, no device.

    `run` answers from `synthetic(task, config)`, after `compile_s` (on the calling thread, as a
    compile would be) and `device_s` (holding the one device lock, as validation and timing do).
    It notes when it held no trial at all (its device starved); `duty()` leaves those gaps in
    `stats_dir` for the benchmark. Make the Ray actor class with `stand_in()`.
    """

    compile_s = 0.0
    device_s = 0.0
    fail_share = 0.05
    stats_dir: str | None = None

    def __init__(self, interpret: bool, emulate: str | None = None, compile_processes: int = 0) -> None:
        self.interpret = interpret
        self.emulate = emulate
        self.compile_processes = compile_processes
        self._device = threading.Lock()
        self._busy_s = 0.0
        self._started = time.monotonic()
        self._held = threading.Lock()
        self._inside = 0                                  # trials handed to this worker, not yet answered
        self._idle_from: float | None = time.time()
        self._gaps: list[tuple[float, float]] = []        # wall-clock spans with no trial to work on

    def info(self, target: str | None = None) -> dict[str, Any]:
        """What `Worker.info` says, for a made-up device (GPU targets get an H200's capacity)."""
        cap = capacity.profile("h200") if target and target.startswith("gpu") else capacity.NONE
        return {"host": socket.gethostname(), "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "device_kind": "stand-in", "platform": "stand-in", "software": {"stand-in": "1"},
                "interpret": self.interpret, "emulate": self.emulate, "compile_processes": self.compile_processes,
                "capacity": cap.to_dict() if target else None}

    def run(self, task: TuningTask, config: dict[str, Any], trial_seed: int, settings: MeasureSettings) -> Measured:
        """A synthetic measurement of `config`, after the simulated compile and device time."""
        with self._held:
            if self._inside == 0 and self._idle_from is not None:
                self._gaps.append((self._idle_from, time.time()))
            self._inside += 1
        try:
            if self.compile_s:
                time.sleep(self.compile_s)
            with self._device:
                started = time.monotonic()
                if self.device_s:
                    time.sleep(self.device_s)
                result = synthetic(task, config, repetitions=settings.repetitions, fail_share=self.fail_share,
                                   compile_s=self.compile_s)
                device_s = time.monotonic() - started
                self._busy_s += device_s
        finally:
            with self._held:
                self._inside -= 1
                if self._inside == 0:
                    self._idle_from = time.time()
        result.worker = f"{socket.gethostname()}:{os.getpid()}"
        result.device_kind = "stand-in"
        return Measured(result, device_s)

    def retime(self, task: TuningTask, configs: list[str], settings: MeasureSettings,
               budget_s: float) -> list[FinalTiming]:
        """The finalists re-timed side by side: their synthetic measurements again, at once."""
        timings = []
        for config in configs:
            m = synthetic(task, json.loads(config), repetitions=settings.repetitions, fail_share=self.fail_share)
            ok = m.outcome == outcomes.OK
            timings.append(FinalTiming(task.key, config, m.median_s, m.spread, m.min_s, m.n_timed if ok else 0,
                                       settings.input_sets if ok else 0, None, False, len(configs), int(ok), ok,
                                       None if ok else m.error))
        return timings

    def duty(self) -> dict[str, float]:
        """Seconds the (simulated) device was busy, and seconds since `reset_duty` (or start)."""
        if self.stats_dir:
            with self._held:
                gaps = list(self._gaps)
            Path(self.stats_dir, f"{os.getpid()}.json").write_text(json.dumps({"gaps": gaps}))
        return {"busy_s": self._busy_s, "alive_s": time.monotonic() - self._started}

    def reset_duty(self) -> None:
        """Start the duty cycle's window now."""
        self._busy_s, self._started = 0.0, time.monotonic()


def stand_in(*, device_s: float = 0.0, compile_s: float = 0.0, fail_share: float = 0.05,
             stats_dir: Path | None = None) -> Any:
    """The Ray actor class of stand-in workers (what `SweepSettings.worker_class` takes)."""
    cls = type("StandInActor", (StandInWorker,), {"device_s": device_s, "compile_s": compile_s,
                                                  "fail_share": fail_share, "__doc__": StandInWorker.__doc__,
                                                  "stats_dir": str(stats_dir) if stats_dir else None})
    return ray.remote(max_restarts=0, max_task_retries=0)(cls)


def synthetic(task: TuningTask, config: dict[str, Any], *, repetitions: int = 1, fail_share: float = 0.0,
              compile_s: float = 0.0) -> Measurement:
    """A deterministic measurement of `config`: a smooth bowl over the knobs (each ordered knob's
    log2 has a best value, each categorical value a fixed penalty); `fail_share` of the configs
    (by hash) fail: half `compile_error`, half `oom`."""
    digest = zlib.crc32(f"{task.key}|{config_json(config)}".encode())
    if digest % 10_000 < fail_share * 10_000:
        if digest % 2:
            return Measurement(outcomes.COMPILE_ERROR, compile_s=compile_s, error="stand-in: synthetic compile error")
        return Measurement(outcomes.OOM, compile_s=compile_s, error="stand-in: synthetic out of memory")
    score = 1.0
    for name, value in sorted(config.items()):
        salt = zlib.crc32(f"{task.key}|{name}".encode())
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            score *= 1.0 + 0.05 * (math.log2(value) - (salt % 6 + 2)) ** 2
        else:
            score *= 1.0 + (zlib.crc32(f"{salt}|{value}".encode()) % 7) / 20
    median = 1e-4 * score
    return Measurement(outcomes.OK, median_s=median, spread=0.01, min_s=median * 0.98, n_timed=repetitions,
                       calls_per_sample=1, numerics_error=1e-3, compile_s=compile_s)


# -- timing the driver ---------------------------------------------------------------------------------
class Timers:
    """Wall time and calls of chosen methods, patched in for the length of a `with`."""

    def __init__(self, targets: dict[str, tuple[Any, str]]) -> None:
        self.targets = targets
        self.seconds = dict.fromkeys(targets, 0.0)
        self.calls = dict.fromkeys(targets, 0)
        self.results: dict[str, int] = dict.fromkeys(targets, 0)   # calls that returned something
        self._saved: list[tuple[Any, str, Any]] = []

    def _wrap(self, label: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                value = method(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                self.calls[label] += 1
            if value is not None:
                self.results[label] += 1
            return value
        return timed

    def __enter__(self) -> Self:
        for label, (owner, name) in self.targets.items():
            method = owner.__dict__[name]
            self._saved.append((owner, name, method))
            setattr(owner, name, self._wrap(label, method))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, method in reversed(self._saved):
            setattr(owner, name, method)
        self._saved.clear()


def driver_timers() -> Timers:
    """The driver's parts: propose, tell, log, hand to Ray, wait for Ray."""
    return Timers({"ask": (Searcher, "ask"), "tell": (sweep._Sweep, "_finish"),
                   "searcher_tell": (Searcher, "tell"), "log_append": (runlog.RunLog, "append"),
                   "submit": (pool_.WorkerPool, "submit"), "wait": (pool_.WorkerPool, "wait")})


# -- one sweep -------------------------------------------------------------------------------------------
def planned_tasks(trials: int | None, target: str = "gpu-triton",
                  files: Sequence[str] | None = None) -> list[PlannedTask]:
    """The shipped spaces' tasks of `target`, as `farm sweep search_spaces/*.yaml --target T` plans them."""
    paths = list(files) if files else sorted(glob.glob(str(REPO / "search_spaces" / "*.yaml")))
    return plan.expand(spaces.load_spaces(paths), [target], trials)


def run_once(planned: Sequence[PlannedTask], run_dir: Path, *, workers: int, depth: int, worker_class: Any,
             interpret: bool = False, profile: bool = False, resume: bool = False,
             stats_dir: Path | None = None) -> dict[str, Any]:
    """Run the real sweep on `workers` stand-ins; the driver's rates, costs and the sweep's result.

    `stats_dir`: where the stand-ins (made with the same `stats_dir`) leave the spans they held no
    trial; `starved` is then their share of the workers' time in the sustained window.
    """
    settings = sweep.SweepSettings(run_dir=run_dir, interpret=interpret, workers=workers, depth=depth,
                                   repetitions=1, compile_timeout_s=60.0, timing_timeout_s=60.0,
                                   worker_class=worker_class)
    marks: dict[str, float] = {}
    finished: list[tuple[float, str]] = []
    profiler = cProfile.Profile() if profile else None

    def on_start(_tasks: list) -> None:
        marks["start"], marks["cpu"] = time.time(), time.process_time()
        if profiler is not None:
            profiler.enable()

    def on_record(record: TrialRecord) -> None:
        if "start" in marks:
            finished.append((time.time(), record.outcome))

    timers = driver_timers()
    with timers:
        began = time.monotonic()
        result = sweep.run_sweep(planned, settings, None, resume=resume, on_record=on_record, on_start=on_start)
        total = time.monotonic() - began
    if profiler is not None:
        profiler.disable()
    end = finished[-1][0] if finished else marks.get("start", 0.0)
    loop_s = max(end - marks.get("start", end), 1e-9)
    cpu_s = time.process_time() - marks.get("cpu", time.process_time())
    times = [t for t, outcome in finished if outcome in outcomes.MEASURED]
    measured = len(times)
    cut = len(times) // 10            # the sustained rate leaves out the ramp and the tail (10% each)
    middle = times[cut:len(times) - cut]
    sustained = (len(middle) - 1) / (middle[-1] - middle[0]) if len(middle) > 1 and middle[-1] > middle[0] else None
    starved = _starved(stats_dir, middle[0], middle[-1], workers) if stats_dir and sustained else None
    asks, tells = timers.results["ask"], timers.calls["tell"]
    row = {
        "workers": workers, "depth": depth, "tasks": len(planned), "records": len(result.records),
        "measured": measured, "loop_s": loop_s, "sweep_s": total,
        "trials_per_s": measured / loop_s, "sustained_per_s": sustained, "asks_per_s": asks / loop_s, "tells_per_s": tells / loop_s,
        "asks": asks, "ask_calls": timers.calls["ask"], "tells": tells,
        "ask_ms": 1e3 * timers.seconds["ask"] / max(asks, 1), "tell_ms": 1e3 * timers.seconds["tell"] / max(tells, 1),
        "searcher_tell_ms": 1e3 * timers.seconds["searcher_tell"] / max(timers.calls["searcher_tell"], 1),
        "log_append_ms": 1e3 * timers.seconds["log_append"] / max(timers.calls["log_append"], 1),
        "submit_ms": 1e3 * timers.seconds["submit"] / max(timers.calls["submit"], 1),
        "wait_ms": 1e3 * timers.seconds["wait"] / max(timers.calls["wait"], 1),
        "share": {k: timers.seconds[k] / loop_s for k in ("ask", "tell", "submit", "wait")},
        "driver_cpu": cpu_s / loop_s, "starved": starved,
        "outcomes": dict(sorted(_count(r.outcome for r in result.records).items())),
        "result": result,
    }
    if profiler is not None:
        row["profile"] = _top(profiler)
        row["profiler"] = profiler
    return row


def _starved(stats_dir: Path, start: float, end: float, workers: int) -> float | None:
    """The share of the workers' time in [start, end] during which they held no trial."""
    files = sorted(Path(stats_dir).glob("*.json"))
    if not files:
        return None
    idle = sum(max(0.0, min(b, end) - max(a, start)) for f in files for a, b in json.loads(f.read_text())["gaps"])
    return idle / ((end - start) * max(workers, len(files)))


def _count(items: Iterator[str] | Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def _top(profiler: cProfile.Profile, n: int = 25) -> str:
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(n)
    stats.sort_stats("tottime").print_stats(n)
    return text.getvalue()


# -- the benchmark ---------------------------------------------------------------------------------------
def start_ray(gpus: int) -> None:
    """An embedded local Ray with `gpus` logical GPUs (and as many CPUs): stand-ins need no device."""
    if ray.is_initialized():
        return
    ray.init(address="local", num_cpus=gpus, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             object_store_memory=256 * 2**20, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,8,16,32", help="worker counts, comma separated")
    parser.add_argument("--depth", type=int, default=18, help="trials in flight per worker")
    parser.add_argument("--trials", type=int, default=64, help="trials per task (the spaces' own: 0)")
    parser.add_argument("--paced-ms", type=float, default=1000 / GOAL_PER_GPU,
                        help="simulated device ms per trial in the paced scenario (0: no paced scenario)")
    parser.add_argument("--paced-workers", default="8,16,32", help="worker counts of the paced scenario")
    parser.add_argument("--fail-share", type=float, default=0.05, help="share of configs that fail (compile, oom)")
    parser.add_argument("--profile", action="store_true", help="cProfile the driver (largest instant run)")
    parser.add_argument("--label", default="", help="a name for this set of results (before/after)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    counts = [int(x) for x in args.workers.split(",") if x]
    paced = [int(x) for x in args.paced_workers.split(",") if x] if args.paced_ms else []
    planned = planned_tasks(args.trials or None)
    load = os.getloadavg()
    start_ray(max([*counts, *paced]))
    runs = [("instant", n, 0.0) for n in counts] + [("paced", n, args.paced_ms / 1e3) for n in paced]
    rows = []
    print(f"{len(planned)} tasks, {sum(p.trials for p in planned)} trials; depth {args.depth}")
    _print_header()
    with tempfile.TemporaryDirectory(prefix="driver-bench-") as root:
        for i, (scenario, n, device_s) in enumerate(runs):
            stats = Path(root) / f"{i:02d}-stats"
            stats.mkdir()
            worker_class = stand_in(device_s=device_s, fail_share=args.fail_share, stats_dir=stats)
            profile = args.profile and scenario == "instant" and n == max(counts)
            row = run_once(planned, Path(root) / f"{i:02d}-{scenario}-{n}", workers=n, depth=args.depth,
                           worker_class=worker_class, profile=profile, stats_dir=stats)
            row.pop("result")
            profiler = row.pop("profiler", None)
            if profiler is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                profiler.dump_stats(args.out / f"driver_{scenario}_{n}.prof")
            row.update(scenario=scenario, device_ms=device_s * 1e3,
                       offered_per_s=n / device_s if device_s else None)
            if not device_s:
                row["starved"] = None   # an instant worker waits for the driver by construction
            rows.append(row)
            _print_row(row)
    report = {"label": args.label, "argv": list(argv if argv is not None else sys.argv[1:]),
              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "cpus": os.cpu_count(), "ray": ray.__version__, "optuna": optuna.__version__,
                          "load_average": {"start": load[0], "end": os.getloadavg()[0]}},
              "tasks": len(planned), "trials": sum(p.trials for p in planned), "depth": args.depth,
              "goal_trials_per_s": GOAL_GPUS * GOAL_PER_GPU, "runs": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"driver_throughput{'_' + args.label if args.label else ''}"
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2))
    (args.out / f"{name}.md").write_text(markdown(report))
    print(f"wrote {args.out / name}.json and .md")
    return report


_COLUMNS = [("scenario", "{}"), ("workers", "{}"), ("device_ms", "{:.1f}"), ("offered_per_s", "{:.0f}"),
            ("measured", "{}"), ("trials_per_s", "{:.1f}"), ("sustained_per_s", "{:.1f}"), ("asks_per_s", "{:.1f}"), ("tells_per_s", "{:.1f}"), ("ask_ms", "{:.2f}"),
            ("tell_ms", "{:.2f}"), ("searcher_tell_ms", "{:.2f}"), ("log_append_ms", "{:.3f}"),
            ("wait_ms", "{:.2f}"), ("driver_cpu", "{:.0%}"), ("starved", "{:.1%}")]


def _cells(row: dict[str, Any]) -> list[str]:
    return ["-" if row.get(key) is None else fmt.format(row[key]) for key, fmt in _COLUMNS]


def _print_header() -> None:
    print(" ".join(f"{key:>14}" for key, _ in _COLUMNS))


def _print_row(row: dict[str, Any]) -> None:
    print(" ".join(f"{cell:>14}" for cell in _cells(row)), flush=True)


def markdown(report: dict[str, Any]) -> str:
    """The results as a Markdown table, with the machine and the goal."""
    m = report["machine"]
    load = m["load_average"]
    lines = [f"# Driver throughput{' (' + report['label'] + ')' if report['label'] else ''}", "",
             (f"{report['tasks']} tasks (shipped spaces, gpu-triton), {report['trials']} trials, depth "
              f"{report['depth']}; {m['platform']}, {m['cpus']} CPUs, Python {m['python']}, Ray {m['ray']}, "
              f"Optuna {m['optuna']}. Goal: {report['goal_trials_per_s']:.0f} trials/s ({GOAL_GPUS} GPUs x "
              f"{GOAL_PER_GPU:.0f}/s). Load average {load['start']:.1f} at the start, {load['end']:.1f} at "
              f"the end."), "",
             "| " + " | ".join(key for key, _ in _COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in report["runs"]]
    for row in report["runs"]:
        if "profile" in row:
            lines += ["", f"## Profile ({row['scenario']}, {row['workers']} workers)", "", "```",
                      row["profile"].strip(), "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
