"""Which search strategy gets near a task's best config in the fewest trials: a tabular replay.

    python bench/search_strategies.py RUN_DIR [--strategies tpe random pattern hybrid] [--seeds 20]
        [--in-flight 16] [--budget N] [--within 0.02] [--trials-per-s R] [--default outside]
        [--processes N] [--warm-start nearest] [--out DIR]

RUN_DIR is a sweep that measured every valid config of its tasks (a grid sweep: `farm sweep SPACE
--sampler grid --trials N`, N at least the valid set), or a bundle with `--space` for its spaces.
For each task, strategy and seed the real `Searcher` (real Optuna, journal storage in a temporary
folder, as the farm uses) asks for configs, and each is answered from the table: its measured
median, or its recorded failure. `--in-flight` proposals are outstanding at once and answered
oldest first, like a worker's compile pool. The score is the number of measured trials until the
best so far is within `--within` of the table's best (the exhaustive measurement, not the
replay's); a seed that does not get there within the budget (default: the space's) is a miss.
Seconds are trials / `--trials-per-s` (default: the table's own rate, all its tasks together).
`--default outside` replays each task as if its space left the kernel's default out (a value it
does not list, a knob it does not tune): the default is measured first, outside the study, and
the sampler starts without it (what 140 of 1214 tasks at users' shapes get with the shipped spaces).
`--warm-start nearest` replays each task as `farm sweep --warm-start` starts it from a bundle of
the other tasks' best configs: its nearest tuned shapes' winners first (those its space holds: a
sweep measures the others outside its study, which the table cannot time).
Writes search_strategies.json and search_strategies.md to `--out`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import statistics
import sys
import tempfile
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna

from farm.bundle import artifacts
from farm.bundle.records import TrialRecord
from farm.measure import outcomes
from farm.run import runlog
from farm.search import plan, spaces, studies
from farm.search.plan import PlannedTask
from farm.search.searcher import Answer, Proposal, Searcher
from farm.search.valid_set import ValidSet
from farm.tasks import config_json

STRATEGIES = ("tpe", "random", "pattern", "hybrid")
MISSING = "not in the table"
DEFAULTS = ("in-space", "outside")


@dataclasses.dataclass(frozen=True)
class TaskTable:
    """One task's exhaustive measurements: config key -> its answer, and the best time."""

    planned: PlannedTask
    answers: dict[str, tuple[str, float | None]]   # key -> (outcome, median_s)
    pruned: frozenset[str]                        # configs the sweep never compiled (cannot fit)
    best_s: float
    valid: int                                    # the task's valid configs (what the searcher enumerates)
    missing: int                                  # valid configs the table lacks (answered as failures)


def task_tables(planned: Sequence[PlannedTask], records: Sequence[TrialRecord]) -> list[TaskTable]:
    """The tables of the tasks that have an ok trial; a config measured more than once is
    answered with the median of its ok times (else its first failure)."""
    by_task: dict[str, dict[str, list[TrialRecord]]] = {}
    for r in records:
        by_task.setdefault(r.task_key, {}).setdefault(r.config, []).append(r)
    tables = []
    for p in planned:
        answers, pruned = {}, set()
        for key, rs in by_task.get(p.task.key, {}).items():
            ok = [r.median_s for r in rs if r.outcome == outcomes.OK and r.median_s is not None]
            failed = [r.outcome for r in rs if r.outcome in outcomes.FAILURES]
            if ok:
                answers[key] = (outcomes.OK, statistics.median(ok))
            elif failed:
                answers[key] = (failed[0], None)
            elif any(r.outcome == outcomes.PRUNED for r in rs):
                pruned.add(key)
        times = [t for outcome, t in answers.values() if outcome == outcomes.OK]
        valid = _valid_keys(p)
        if times:
            tables.append(TaskTable(p, answers, frozenset(pruned), min(times), len(valid),
                                    len(valid - set(answers) - pruned)))
    return tables


def _valid_keys(planned: PlannedTask) -> set[str]:
    """The keys of the task's valid configs, as `Searcher.open` enumerates them (empty: too many)."""
    task, space = planned.task, planned.space
    valid = ValidSet.enumerate(space.params_for(task.target),
                               lambda config: space.violated(config, task.shape, task.dtype, task.target) is None)
    return set(valid.keys) if valid is not None else set()


def load(source: Path, space_files: Sequence[Path] = ()) -> tuple[list[TaskTable], float | None]:
    """The task tables of a run folder (or of a bundle, given its spaces) and the table's own
    rate of measured trials per second (None when it does not say)."""
    if space_files:
        planned = plan.expand(spaces.load_spaces(list(space_files)))
    else:
        planned, _ = runlog.load_run(source)
    records = runlog.replay(source)
    if not records:
        folder = source / "bundle" if (source / "bundle").is_dir() else source
        records = [TrialRecord.from_dict(row) for row in artifacts.read_trials(folder).to_pylist()]
    measured = [r for r in records if r.outcome in outcomes.MEASURED and r.elapsed_s is not None]
    rate = len(measured) / max(r.elapsed_s for r in measured) if measured else None
    return task_tables(planned, records), rate


class OutsideDefaultSearcher(Searcher):
    """A searcher whose space leaves the kernel's default out (a value it does not list, a knob it
    does not tune): the default is measured outside the study, as a user's narrower space gets it."""

    def _left_out(self, default: dict) -> dict | None:
        task = self.planned.task
        return None if self.planned.space.kernel_refusal(default, task.shape, task.dtype, task.target) else default


def replay(table: TaskTable, strategy: str, seed: int, *, in_flight: int = 16, budget: int | None = None,
           within: float = 0.02, workdir: Path, default: str = "in-space",
           warm_start: Sequence[dict] = ()) -> int | None:
    """Trials measured until the best so far is within `within` of the table's best (None: never).

    The real searcher over journal storage in `workdir` asks (`warm_start` first); `in_flight`
    proposals are answered from the table oldest first.
    """
    planned = dataclasses.replace(table.planned, trials=budget or table.planned.space.trials)
    opener = OutsideDefaultSearcher if default == "outside" else Searcher
    searcher = opener.open(planned, studies.storage(workdir), sampler=strategy, seed=seed, warm_start=warm_start)
    if searcher.valid_set is not None:
        for key in table.pruned:
            searcher.valid_set.close(key)
    target, best, measured = table.best_s * (1 + within), math.inf, 0
    pending: deque[Proposal] = deque()
    while True:
        while len(pending) < in_flight and (proposal := searcher.ask()) is not None:
            pending.append(proposal)
        if not pending:
            return None
        proposal = pending.popleft()
        outcome, median_s = table.answers.get(proposal.key, (outcomes.RUN_ERROR, None))
        error = None if proposal.key in table.answers else MISSING
        searcher.tell(Answer(proposal.trial, proposal.key, outcome, error, median_s=median_s))
        measured += 1
        best = min(best, median_s or math.inf)
        if best <= target:
            return measured


@dataclasses.dataclass(frozen=True)
class Job:
    """One replay: a task's table under one strategy and seed."""

    table: TaskTable
    strategy: str
    seed: int
    in_flight: int
    budget: int | None
    within: float
    default: str = "in-space"
    warm_start: tuple[dict, ...] = ()


def run_job(job: Job) -> int | None:
    """`replay` in a temporary folder (a process of its own may run it: it quiets Optuna there too)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as workdir:
        return replay(job.table, job.strategy, job.seed, in_flight=job.in_flight, budget=job.budget,
                      within=job.within, workdir=Path(workdir), default=job.default, warm_start=job.warm_start)


def nearest_warm_starts(tables: Sequence[TaskTable]) -> dict[str, tuple[dict, ...]]:
    """Each task's `farm sweep --warm-start` configs from a bundle of the *other* tasks' best
    configs (`farm.retune.nearest`): a new shape warm-started from its tuned neighbours."""
    from farm.retune.nearest import SEEDS, nearest_seeds
    from farm.retune.planning import Previous

    def best_row(table: TaskTable) -> dict:
        key = min((t, k) for k, (outcome, t) in table.answers.items() if outcome == outcomes.OK)[1]
        task = table.planned.task
        return {"kernel": task.kernel, "shape": list(task.shape), "dtype": task.dtype, "target": task.target,
                "status": "ok", "config": key, "created": ""}

    rows = {t.planned.task.key: best_row(t) for t in tables}
    seeds = {}
    for table in tables:
        key = table.planned.task.key
        others = Previous("table", {}, [row for k, row in rows.items() if k != key], [])
        near = nearest_seeds(others, [table.planned], limit=len(rows)).configs.get(key, ())
        # The table times only what its sweep measured: seeds its space leaves out (a sweep measures
        # them outside the study) are left out of the replay, the first SEEDS of the rest kept.
        seeds[key] = tuple([c for c in near if table.planned.admits(c) or config_json(c) in table.answers][:SEEDS])
    return seeds


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The q-quantile by nearest rank (a value of the sample; misses are inf)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(scores: dict[str, dict[str, list[int | None]]], trials_per_s: float,
              baseline: str = "tpe") -> list[dict]:
    """Per task (and all tasks pooled) and strategy: median and p90 trials, the same in seconds,
    the share of seeds that got within reach, and on how many seeds it took fewer (`won`) and more
    (`lost`) trials than `baseline` with the same seed (a miss is more than any trial)."""
    rows = []
    pooled: dict[str, list[int | None]] = {}
    for task, by_strategy in [*scores.items(), ("all tasks", pooled)]:
        for strategy, runs in by_strategy.items():
            if task != "all tasks":
                pooled.setdefault(strategy, []).extend(runs)
            values = [math.inf if r is None else float(r) for r in runs]
            against = [math.inf if r is None else float(r) for r in by_strategy.get(baseline, [])]
            paired = strategy != baseline and len(against) == len(values)
            median, p90 = nearest_rank(values, 0.5), nearest_rank(values, 0.9)
            rows.append({"task": task, "strategy": strategy, "seeds": len(runs),
                         "reached": sum(r is not None for r in runs) / len(runs),
                         "median_trials": _finite(median), "p90_trials": _finite(p90),
                         "median_s": _finite(median / trials_per_s), "p90_s": _finite(p90 / trials_per_s),
                         "won": sum(a < b for a, b in zip(values, against)) if paired else None,
                         "lost": sum(a > b for a, b in zip(values, against)) if paired else None})
    return rows


def _finite(value: float) -> float | None:
    """None for a miss (JSON has no infinity)."""
    return None if math.isinf(value) else value


def markdown(rows: Sequence[dict], tables: Sequence[TaskTable], settings: dict) -> str:
    """The report: settings, the tasks and the rows as a Markdown table (misses as `miss`)."""
    def cell(value: float | None, digits: int = 0) -> str:
        return "miss" if value is None else f"{value:.{digits}f}"

    shown = {**settings, "budget": settings["budget"] or "the space's"}
    lines = [f"# Trials to within {settings['within']:.0%} of the exhaustive best", "",
             ", ".join(f"{k}: {v}" for k, v in shown.items()), "",
             "| task | valid configs | missing from the table | budget | best |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {t.planned.task.key} | {t.valid} | {t.missing} | {settings['budget'] or t.planned.space.trials} | "
              f"{t.best_s * 1e6:.1f} us |" for t in tables]
    header = "| task | strategy | median trials | p90 trials | median s | p90 s | reached | seeds won / lost vs tpe |"
    lines += ["", header, "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['task']} | {r['strategy']} | {cell(r['median_trials'])} | {cell(r['p90_trials'])} | "
              f"{cell(r['median_s'], 1)} | {cell(r['p90_s'], 1)} | {r['reached']:.0%} | "
              f"{'-' if r['won'] is None else str(r['won']) + ' / ' + str(r['lost'])} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    """Replay every task of the table under each strategy and seed; write and print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="run folder, or bundle folder with --space")
    parser.add_argument("--space", type=Path, action="append", default=[], help="the bundle's space (repeatable)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--in-flight", type=int, default=16, help="proposals outstanding at once")
    parser.add_argument("--budget", type=int, help="trials per task (default: the space's)")
    parser.add_argument("--within", type=float, default=0.02, help="relative distance to the best")
    parser.add_argument("--trials-per-s", type=float, help="measured trials per second (default: the table's)")
    parser.add_argument("--tasks", nargs="+", default=[], help="only tasks whose key contains one of these")
    parser.add_argument("--default", choices=DEFAULTS, default="in-space",
                        help="outside: replay each task as if its space left the kernel's default out")
    parser.add_argument("--processes", type=int, default=1, help="replays run in this many processes")
    parser.add_argument("--warm-start", choices=("none", "nearest"), default="none",
                        help="nearest: each task warm-started as `farm sweep --warm-start` would from a bundle of "
                        "the other tasks' best configs (its nearest tuned shapes)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/search_strategies"))
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tables, rate = load(args.source, args.space)
    tables = [t for t in tables if not args.tasks or any(s in t.planned.task.key for s in args.tasks)]
    trials_per_s = args.trials_per_s or rate or 1.0
    warm = nearest_warm_starts(tables) if args.warm_start == "nearest" else {}
    jobs = [Job(t, strategy, seed, args.in_flight, args.budget, args.within, args.default,
                warm.get(t.planned.task.key, ()))
            for t in tables for strategy in args.strategies for seed in range(args.seeds)]
    if args.processes > 1:
        with ProcessPoolExecutor(args.processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(run_job, jobs, chunksize=4))
    else:
        results = [run_job(job) for job in jobs]
    scores: dict[str, dict[str, list[int | None]]] = {}
    for job, result in zip(jobs, results):
        scores.setdefault(job.table.planned.task.key, {}).setdefault(job.strategy, []).append(result)
    rows = summarize(scores, trials_per_s)
    settings = {"source": str(args.source), "seeds": args.seeds, "in_flight": args.in_flight,
                "budget": args.budget, "within": args.within, "default": args.default,
                "warm_start": args.warm_start,
                "trials_per_s": round(trials_per_s, 3)}
    args.out.mkdir(parents=True, exist_ok=True)
    tasks = [{"task": t.planned.task.key, "valid": t.valid, "missing": t.missing, "best_s": t.best_s,
              "budget": args.budget or t.planned.space.trials} for t in tables]
    (args.out / "search_strategies.json").write_text(json.dumps(
        {"settings": settings, "tasks": tasks, "rows": rows, "runs": scores,
         "warm_starts": {k: list(v) for k, v in warm.items() if v}}, indent=1, default=str))
    report = markdown(rows, tables, settings)
    (args.out / "search_strategies.md").write_text(report)
    print(report)
    return rows


if __name__ == "__main__":
    main()
