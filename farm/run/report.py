"""A run's report (`farm report RUN_DIR`): the winners against their defaults, and how the search went.

Reads only the run folder: `trials.jsonl` (every trial, in the order it finished) and
`run.json` (the summary). Writes `RUN_DIR/report.md` (the table and, per task, the counts that
the README defines: measured configs, budgeted trials, asked draws) and, with matplotlib
installed (`pip install 'pallas-farm[plot]'`), one best-so-far plot per task under
`RUN_DIR/report/`: the best median after each measured trial. Without matplotlib the text
report is written and `plots_note` says why there are no plots.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from farm.bundle import artifacts
from farm.bundle.locate import RUN_BUNDLE
from farm.bundle.records import TrialRecord
from farm.errors import FarmError
from farm.measure import outcomes
from farm.run import runlog
from farm.run.progress import format_duration, format_seconds
from farm.search.spaces import load_kernel
from farm.tasks import config_json
from kernels.protocol import task_default

REPORT_MD = "report.md"
PLOTS_DIR = "report"
PLOT_NAME_CHARS = 200   # a plot file name's characters before ".png" (file names: 255 bytes)


@dataclasses.dataclass(frozen=True)
class Failure:
    """The failure most of a task's failed configs share: its first line, how many, of how many."""

    message: str
    count: int
    failed: int


def common_failure(records: list[TrialRecord]) -> Failure | None:
    """What most of `records`' measured failures (one task's) share, or None when none failed: the
    most common outcome, then among its errors the most common first line with its numbers left out
    of the comparison (relative errors, sizes and addresses differ config by config); shown as one
    of them. For a task with no valid config, the reason a kernel author needs."""
    failed = [r for r in records if r.outcome in outcomes.FAILURES]
    if not failed:
        return None
    outcome = Counter(r.outcome for r in failed).most_common(1)[0][0]
    lines = [((r.error or "").strip().splitlines() or [""])[0][:300] for r in failed if r.outcome == outcome]
    shapes = Counter(re.sub(r"0x[0-9a-fA-F]+|[0-9][0-9.e+-]*", "#", line) for line in lines)
    shape, count = shapes.most_common(1)[0]
    example = next(line for line in lines if re.sub(r"0x[0-9a-fA-F]+|[0-9][0-9.e+-]*", "#", line) == shape)
    return Failure(f"{outcome}: {example}" if example else outcome, count, len(failed))


@dataclasses.dataclass
class TaskReport:
    """One task's winner, its default and its counts."""

    task_key: str
    best: TrialRecord | None
    default: TrialRecord | None
    counts: Counter
    curve: list[tuple[int, float]]          # (measured trial index, best median so far)
    failure: Failure | None = None           # with no winner: what most of its measured configs failed with
    warm_start: TrialRecord | None = None    # --warm-start: its first config (see `task_reports`)

    @property
    def speedup(self) -> float | None:
        """Default median / winner median, when both were measured."""
        return _ratio(self.default, self.best)

    @property
    def vs_warm_start(self) -> float | None:
        """The warm start's first config's median / winner median, when both were measured."""
        return _ratio(self.warm_start, self.best)


def _ratio(before: TrialRecord | None, after: TrialRecord | None) -> float | None:
    if before and after and before.median_s and after.median_s:
        return before.median_s / after.median_s
    return None


@dataclasses.dataclass
class Report:
    """What `write_report` wrote."""

    markdown: Path
    plots: list[Path]
    plots_note: str | None                  # why there are no plots, when there are none
    tasks: list[TaskReport]


def bundle_winners(run_dir: Path) -> dict[str, dict[str, Any]]:
    """task key -> its row in the run's bundle (status ok): the winner that ships, which finalists
    re-timed side by side (a sweep) or the promotion rule kept (a retune) may have chosen over the
    fastest logged median; empty without a readable bundle."""
    try:
        table = pq.read_table(run_dir / RUN_BUNDLE / artifacts.CONFIGS, columns=["task_key", "status", "config",
                                                                                  "median_s"])
    except (OSError, pa.ArrowException, KeyError):
        return {}
    return {row["task_key"]: row for row in table.to_pylist() if row["status"] == "ok" and row["config"]}


def task_reports(records: list[TrialRecord], winners: dict[str, dict[str, Any]] | None = None,
                 warm_starts: dict[str, list[dict[str, Any]]] | None = None) -> list[TaskReport]:
    """Per task (in order of first record): winner, default, outcome counts, best-so-far curve.
    `winners` (`bundle_winners`) names the winners where given: the record of the bundle's config,
    with the bundle's median; else the fastest logged median. `warm_starts` (`farm sweep
    --warm-start`, from sweep.json): each task's first one is what a deployment of that bundle
    ran (measured outside the study where the task's space leaves it out)."""
    by_task: dict[str, list[TrialRecord]] = {}
    for record in records:
        by_task.setdefault(record.task_key, []).append(record)
    reports = []
    for key, group in by_task.items():
        first = group[0]
        module = load_kernel(str(first.kernel), f"{key}: kernel")
        default = config_json(task_default(module, tuple(first.shape), first.target, first.dtype))
        ok = [r for r in group if r.outcome == outcomes.OK and r.median_s is not None]
        curve, best_so_far, index = [], float("inf"), 0
        for r in group:
            if r.outcome in outcomes.MEASURED:
                index += 1
                if r.outcome == outcomes.OK and r.median_s is not None:
                    best_so_far = min(best_so_far, r.median_s)
                if best_so_far < float("inf"):
                    curve.append((index, best_so_far))
        default_ok = [r for r in ok if r.config == default]
        best = min(ok, key=lambda r: r.median_s, default=None)
        row = (winners or {}).get(key)
        shipped = [r for r in ok if row and r.config == row["config"]]
        if shipped:
            best = min(shipped, key=lambda r: r.median_s)
            best = best.replace(median_s=row["median_s"] or best.median_s)
        seeds = (warm_starts or {}).get(key) or [None]
        first = [r for r in ok if seeds[0] is not None and r.config == config_json(seeds[0])]
        reports.append(TaskReport(key, best,
                                  min(default_ok, key=lambda r: r.median_s, default=None),
                                  Counter(r.outcome for r in group), curve,
                                  None if best else common_failure(group),
                                  min(first, key=lambda r: r.median_s, default=None)))
    return reports


def markdown(tasks: list[TaskReport], summary: dict[str, Any], run_dir: Path) -> str:
    """The report's text: the winners against their defaults, then the counts per task."""
    lines = [f"# Run {run_dir.name}", ""]
    if summary:
        lines += [f"{summary.get('measured_trials', 0)} configs measured in "
                  f"{format_duration(summary.get('wall_s'))} ({summary.get('trials_per_s', 0):.2f}/s) on "
                  f"{summary.get('workers', '?')} workers"
                  + (" (stopped by the time budget)" if summary.get("stopped_by_time_budget") else "") + ".", ""]
    warm = any(t.warm_start for t in tasks)   # --warm-start: the winners against its first config too
    lines += ["| task | winner | median | default | vs default |" + (" warm start | vs warm start |" if warm else "")
              + " measured | failed | skipped | config |",
              "|---|---|---|---|---|" + ("---|---|" if warm else "") + "---|---|---|---|"]
    for t in tasks:
        c = t.counts
        failed = ", ".join(f"{o} {c[o]}" for o in outcomes.FAILURES if c[o]) or "-"
        skipped = ", ".join(f"{o} {c[o]}" for o in outcomes.SKIPPED if c[o]) or "-"
        config = " ".join(f"{k}={v}" for k, v in json.loads(t.best.config).items()) if t.best else "-"
        speedup = f"{t.speedup:.2f}x" if t.speedup else "-"
        started = (f" {format_seconds(t.warm_start and t.warm_start.median_s)} | "
                   f"{f'{t.vs_warm_start:.2f}x' if t.vs_warm_start else '-'} |") if warm else ""
        medians = f"{format_seconds(t.best and t.best.median_s)} | {format_seconds(t.default and t.default.median_s)}"
        lines.append(f"| {t.task_key} | {'ok' if t.best else 'no valid config'} | {medians} | {speedup} |{started} "
                     f"{sum(c[o] for o in outcomes.MEASURED)} | {failed} | {skipped} | {config} |")
    lines += ["", "measured: configs compiled, validated and timed on a worker (ok or failed); failed: measured "
              "configs that did not run correctly; skipped: draws never measured (invalid: outside the space "
              "or refused by the kernel; pruned: cannot fit in memory). The trial budget counts measured and "
              "cached configs." + (" warm start: the first --warm-start config, measured in this run: what a "
                                   "deployment of that bundle ran for the task (its own or nearest tuned "
                                   "shape's config)." if warm else "")]
    failing = [task for task in tasks if task.failure]
    if failing:
        lines += ["", "## Tasks with no valid config", ""]
        lines += [f"- {task.task_key}: {task.failure.count} of its {task.failure.failed} failed configs: "
                  f"`{task.failure.message.replace('`', chr(39))}`" for task in failing]
    return "\n".join(lines) + "\n"


def _plot(task: TaskReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs, ys = zip(*task.curve)
    ax.step(xs, [y * 1e6 for y in ys], where="post", label="best so far")
    if task.default and task.default.median_s:
        ax.axhline(task.default.median_s * 1e6, color="grey", linestyle="--", label="default")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("measured configs")
    ax.set_ylabel("median (us)")
    ax.set_title(task.task_key, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_name(task_key: str) -> str:
    """A task's plot file name: its key with unsafe characters as `_`; a long key (a module-path
    kernel) cut, with a hash of the whole, to stay within a file name's 255 bytes."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", task_key)
    if len(name) > PLOT_NAME_CHARS:
        name = f"{name[:PLOT_NAME_CHARS - 17]}-{hashlib.sha256(task_key.encode()).hexdigest()[:16]}"
    return name + ".png"


def _summary(path: Path) -> dict[str, Any]:
    """run.json's summary, its figures numbers (anything else left out of the report's header)."""
    try:
        summary = json.loads(path.read_text()).get("summary")
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(summary, dict):
        return {}
    numbers = ("measured_trials", "wall_s", "trials_per_s", "workers")
    return {k: v for k, v in summary.items()
            if k not in numbers or (isinstance(v, (int, float)) and not isinstance(v, bool))}


def _warm_starts(path: Path) -> dict[str, list[dict[str, Any]]]:
    """sweep.json's warm starts (task key -> configs); empty when it has none or cannot be read."""
    try:
        warm = json.loads(path.read_text())["settings"]["warm_start"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(warm, dict):
        return {}
    return {k: v for k, v in warm.items() if isinstance(v, list) and v and all(isinstance(c, dict) for c in v)}


def write_report(run_dir: str | Path) -> Report:
    """Write `RUN_DIR/report.md` and (with matplotlib) `RUN_DIR/report/<task>.png`.

    Raises:
        FarmError: RUN_DIR is not a run folder with logged trials.
    """
    run_dir = Path(run_dir)
    if not (run_dir / runlog.TRIALS_LOG).is_file():
        raise FarmError(f"{run_dir}: expected a run folder with {runlog.TRIALS_LOG} (written by farm sweep)")
    records = runlog.replay(run_dir)
    if not records:
        raise FarmError(f"{run_dir / runlog.TRIALS_LOG}: expected at least one trial record")
    summary = _summary(run_dir / runlog.RUN_INFO)
    tasks = task_reports(records, bundle_winners(run_dir), _warm_starts(run_dir / runlog.SWEEP_FILE))
    md = run_dir / REPORT_MD
    md.write_text(markdown(tasks, summary, run_dir))
    plots: list[Path] = []
    note = None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        note = "no plots: matplotlib is not installed (pip install 'pallas-farm[plot]')"
    else:
        folder = run_dir / PLOTS_DIR
        folder.mkdir(exist_ok=True)
        for task in tasks:
            if task.curve:
                path = folder / plot_name(task.task_key)
                _plot(task, path)
                plots.append(path)
    return Report(md, plots, note, tasks)
