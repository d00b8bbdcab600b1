"""Did a timed sweep get within 2% of the best known config of every task? Side by side, one run.

    python bench/suite_convergence.py --run RUN --reference REF [--reference REF2] \\
        [--at 60,120,180,240] [--out FILE.json]

RUN is the sweep under test (for example the whole seed suite with `--time-budget 300`); each REF
is a longer sweep made for the benchmark (another sampler and seed). For every task of RUN this
takes RUN's winner (its finalists' winner, else its fastest), RUN's best-so-far config at each
`--at` second of the sweep (by `elapsed_s`, warm-up included), and the reference's winner and two
fastest configs; re-times them all side by side on one worker (the sweep's own
`Worker.retime`: inputs rotated past the caches, the roofline floor enforced), and reports RUN's
winner against the fastest of them: within 2% or not, and the first `--at` second at which RUN
already held a config within 2%. Reading a run folder's `trials.jsonl` or `trials.jsonl.gz`.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ray  # noqa: E402

from farm.bundle import select  # noqa: E402
from farm.bundle.records import TrialRecord  # noqa: E402
from farm.measure import finalists, outcomes  # noqa: E402
from farm.measure.device import MeasureSettings  # noqa: E402
from farm.run import runlog  # noqa: E402
from farm.run.actor import Worker  # noqa: E402
from farm.run.pool import connect  # noqa: E402
from farm.tasks import TuningTask  # noqa: E402

WITHIN = 0.02


@dataclasses.dataclass(frozen=True)
class RunView:
    """What this benchmark reads of a run folder."""

    path: Path
    records: list[TrialRecord]
    finals: dict[str, list[finalists.FinalTiming]]
    interpret: bool


def read_run(path: Path) -> RunView:
    """A run folder's trials (plain or gzipped log), finalists and settings."""
    log = path / "trials.jsonl"
    if not log.exists() and (path / "trials.jsonl.gz").exists():
        text = gzip.decompress((path / "trials.jsonl.gz").read_bytes()).decode()
        records = [TrialRecord.from_dict(json.loads(line)) for line in text.splitlines() if line.strip()]
    else:
        records = runlog.replay(path)
    if not records or not (path / "run.json").is_file():
        raise SystemExit(f"{path}: expected a sweep's run folder (run.json and trials.jsonl or trials.jsonl.gz "
                         f"with records)")
    settings = json.loads((path / "run.json").read_text()).get("settings", {})
    return RunView(path, records, runlog.read_finals(path), bool(settings.get("interpret")))


def _ok(records: Sequence[TrialRecord], key: str) -> list[TrialRecord]:
    return [r for r in records if r.task_key == key and r.outcome == outcomes.OK and r.median_s is not None]


def run_winner(view: RunView, key: str) -> str | None:
    """The config a run wrote for `key`: its finalists' winner, else its fastest sweep median."""
    chosen = finalists.winner(view.finals.get(key, []))
    if chosen is not None:
        return chosen.config
    best = select.finalists(_ok(view.records, key), 1)
    return best[0] if best else None


def best_at(records: Sequence[TrialRecord], key: str, seconds: float) -> str | None:
    """The run's fastest config (by sweep median) among trials finished `seconds` into the sweep."""
    best = select.finalists([r for r in _ok(records, key) if r.elapsed_s <= seconds], 1)
    return best[0] if best else None


def candidates(run: RunView, references: Sequence[RunView], key: str, at: Sequence[float]) -> dict[str, str]:
    """role -> config JSON to re-time for `key` (one config may fill several roles)."""
    roles: dict[str, str] = {}
    if (winner := run_winner(run, key)) is not None:
        roles["run"] = winner
    for t in at:
        if (config := best_at(run.records, key, t)) is not None:
            roles[f"run@{t:g}s"] = config
    for i, ref in enumerate(references):
        if (winner := run_winner(ref, key)) is not None:
            roles[f"ref{i}"] = winner
        for j, config in enumerate(select.finalists(_ok(ref.records, key), 2)):
            roles[f"ref{i}.top{j + 1}"] = config
    return roles


def judge(key: str, roles: dict[str, str], timings: Sequence[finalists.FinalTiming],
          at: Sequence[float], trials: int) -> dict[str, Any]:
    """One task's row: the run's winner against the fastest config re-timed beside it."""
    by_config = {t.config: t for t in timings}
    fair = [t for t in timings if t.median_s is not None and not t.below_floor]
    best = min(fair, key=lambda t: t.median_s) if fair else None

    def ratio(role: str) -> float | None:
        t = by_config.get(roles.get(role, ""))
        return None if best is None or t is None or t.median_s is None or t.below_floor else t.median_s / best.median_s

    run_ratio = ratio("run")
    first = next((t for t in at if (r := ratio(f"run@{t:g}s")) is not None and r <= 1 + WITHIN), None)
    return {"task": key, "trials": trials, "run_s": by_config[roles["run"]].median_s if "run" in roles else None,
            "best_s": best.median_s if best else None,
            "best_from": sorted(r for r, c in roles.items() if best and c == best.config),
            "ratio": run_ratio, "within": run_ratio is not None and run_ratio <= 1 + WITHIN,
            "first_within_s": first, "roles": roles,
            "timings": [dataclasses.asdict(t) for t in timings]}


def _task(run: RunView, key: str) -> TuningTask:
    r = next(r for r in run.records if r.task_key == key)
    return TuningTask(r.kernel, tuple(r.shape), r.dtype, r.target)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="the timed sweep's run folder")
    parser.add_argument("--reference", type=Path, action="append", required=True, help="a longer sweep's run folder")
    parser.add_argument("--at", default="60,120,180,240", help="seconds into the run to check its best-so-far")
    parser.add_argument("--budget-s", type=float, default=6.0, help="re-timing budget per task")
    parser.add_argument("--compile-processes", type=int, default=None,
                        help="compile processes of the re-timing worker (default: CPUs less two, at most 16)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    at = [float(t) for t in args.at.split(",") if t]
    run = read_run(args.run)
    references = [read_run(p) for p in args.reference]
    keys = list(dict.fromkeys(r.task_key for r in run.records))
    connect(None)
    gpu = bool(ray.cluster_resources().get("GPU")) and not run.interpret
    processes = args.compile_processes if args.compile_processes is not None else (
        max(0, min(16, (os.cpu_count() or 2) - 2)) if gpu else 0)
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", **({} if gpu else {"JAX_PLATFORMS": "cpu"})}
    worker = Worker.options(num_gpus=1 if gpu else 0, num_cpus=1, max_concurrency=2,
                            runtime_env={"env_vars": env}).remote(interpret=not gpu, emulate=None,
                                                                  compile_processes=processes)
    rows, started = [], time.perf_counter()
    print(f"{'task':58} {'trials':>6} {'run':>10} {'best':>10} {'ratio':>6} {'<=2%':>5} {'first':>6}  best from")
    for key in keys:
        roles = candidates(run, references, key, at)
        if "run" not in roles:
            rows.append({"task": key, "trials": 0, "within": False, "error": "the run measured no config ok"})
            print(f"{key:58} no config measured ok")
            continue
        timings = ray.get(worker.retime.remote(_task(run, key), list(dict.fromkeys(roles.values())),
                                               MeasureSettings(compile_timeout_s=600.0), args.budget_s))
        row = judge(key, roles, timings, at, len({r.config for r in run.records if r.task_key == key}))
        rows.append(row)
        fmt = (lambda s: f"{s * 1e6:9.1f}u" if s else "        -")
        print(f"{key:58} {row['trials']:6d} {fmt(row['run_s'])} {fmt(row['best_s'])} "
              f"{row['ratio'] or float('nan'):6.3f} {'yes' if row['within'] else 'NO':>5} "
              f"{row['first_within_s'] or '-':>6}  {','.join(row['best_from'])}", flush=True)
    summary = json.loads((args.run / "run.json").read_text()).get("summary", {})
    report = {"run": str(args.run), "references": [str(p) for p in args.reference], "at_s": at,
              "within": sum(r["within"] for r in rows), "tasks": len(rows), "retime_s": time.perf_counter() - started,
              "run_summary": {k: summary.get(k) for k in ("wall_s", "measuring_s", "finalists_s", "measured_trials",
                                                          "measuring_trials_per_s", "duty_cycle")},
              "rows": rows}
    print(f"within {WITHIN:.0%} of the best known: {report['within']} of {report['tasks']} tasks "
          f"(run: wall {summary.get('wall_s', 0):.0f} s, measuring {summary.get('measuring_s', 0):.0f} s)")
    if args.out:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(args.out)
    return report


if __name__ == "__main__":
    main()
