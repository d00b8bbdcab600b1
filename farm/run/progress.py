"""Sweep progress that a person and a log can read.

Counts, per task and in all (the words the winners table and the README use):

- **measured**: configs a worker compiled, validated and timed (`ok` and the failures:
  `compile_error`, `run_error`, `wrong_result`, `oom`, `timeout`, `worker_lost`);
- **trials**: what `--trials` budgets: measured configs plus `cached` answers;
- **asked**: every draw of the sampler, also the `invalid` and `pruned` ones that were never
  measured (they are skipped, not failures).

On a terminal, `SweepProgress` shows a live table with elapsed time, measured trials per
second and an ETA (from the trial budget, or the time budget when that ends first). Elsewhere
(job logs, cron) it logs one INFO line on the `farm.run.progress` logger every `every_s`
seconds and a last one at the end: trials of the budget, measured, asked, the rate, the ETA and
the best time so far.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from farm.bundle.records import TrialRecord
from farm.measure import outcomes
from farm.search.plan import PlannedTask

logger = logging.getLogger(__name__)
# Seconds between two log lines when stderr is not a terminal.
LOG_EVERY_S = 5.0


def format_seconds(seconds: float | None) -> str:
    """A time with a readable unit (us, ms, s)."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"


def format_duration(seconds: float | None) -> str:
    """A wall-clock duration: 42 s, 3m05s, 1h02m."""
    if seconds is None:
        return "-"
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class SweepProgress:
    """Call `update(record)` for each trial record; use as a context manager.

    Args:
        planned: the sweep's tasks and budgets.
        console: where the live view goes (default stderr); a console that is not a terminal
            gets log lines instead.
        time_budget_s: the sweep's `--time-budget`, for the ETA.
        every_s: seconds between log lines when not on a terminal.
    """

    def __init__(self, planned: list[PlannedTask], console: Console | None = None, *,
                 time_budget_s: float | None = None, every_s: float = LOG_EVERY_S) -> None:
        self.planned = planned
        self.console = console or Console(stderr=True)
        self.time_budget_s = time_budget_s
        self.every_s = every_s
        self.counts: dict[str, Counter] = {p.task.key: Counter() for p in planned}
        self.best: dict[str, float] = {}
        self.replayed = 0                  # records counted before this process measured anything
        self.done = False                  # the sweep ended: the last line says how, not an ETA
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._measuring = threading.Event()     # log lines start once measuring does
        self._thread: threading.Thread | None = None
        self._live: Live | None = None
        if self.console.is_terminal:
            self._live = Live(self._view(), console=self.console, refresh_per_second=4, transient=False,
                              get_renderable=self._view)

    # -- counts ----------------------------------------------------------------------------------
    def update(self, record: TrialRecord) -> None:
        """Count one trial record."""
        with self._lock:
            key = record.task_key
            self.counts.setdefault(key, Counter())[record.outcome] += 1
            if record.outcome == outcomes.OK and record.median_s is not None:
                self.best[key] = min(self.best.get(key, float("inf")), record.median_s)
        self._measuring.set()

    def mark_started(self, planned: list[PlannedTask] | None = None) -> None:
        """Measuring starts now (records counted so far were replayed by --resume): rates and ETA
        count from here. planned: the tasks the sweep runs, when it left some out (`runnable_only`)."""
        with self._lock:
            if planned is not None:
                self.planned = list(planned)
                self.counts = {p.task.key: self.counts.get(p.task.key, Counter()) for p in planned}
            self.replayed = self._total(outcomes.MEASURED)
            self._started = time.monotonic()
        self._measuring.set()

    def _total(self, kinds: tuple[str, ...]) -> int:
        return sum(c[o] for c in self.counts.values() for o in kinds)

    def snapshot(self) -> dict[str, Any]:
        """Totals now: trials (of budget), measured, asked, skipped, failed, rate, elapsed, ETA."""
        with self._lock:
            elapsed = time.monotonic() - self._started
            measured = self._total(outcomes.MEASURED)
            trials = measured + self._total((outcomes.CACHED,))
            budget = sum(p.trials for p in self.planned)
            rate = (measured - self.replayed) / elapsed if elapsed > 0 else 0.0
            eta = (budget - trials) / rate if rate > 0 else None
            if self.time_budget_s is not None:
                left = max(0.0, self.time_budget_s - elapsed)
                eta = left if eta is None else min(eta, left)
            return {"elapsed_s": elapsed, "trials": trials, "budget": budget, "measured": measured,
                    "asked": trials + self._total(outcomes.SKIPPED), "skipped": self._total(outcomes.SKIPPED),
                    "failed": self._total(outcomes.FAILURES), "rate": rate,
                    "eta_s": eta if trials < budget else 0.0,
                    "best": dict(self.best)}

    # -- the two views ---------------------------------------------------------------------------
    def line(self) -> str:
        """One log line: totals, rate, ETA and the best time so far per task (up to 3 shown)."""
        s = self.snapshot()
        best = sorted(s["best"].items())
        shown = ", ".join(f"{k} {format_seconds(v)}" for k, v in best[:3]) + (
            f" (+{len(best) - 3} tasks)" if len(best) > 3 else "")
        if not self.done:
            timing = f"elapsed {format_duration(s['elapsed_s'])}, ETA {format_duration(s['eta_s'])}"
        elif s["trials"] >= s["budget"]:
            timing = f"took {format_duration(s['elapsed_s'])}"
        elif self.time_budget_s is not None and s["elapsed_s"] >= self.time_budget_s:
            timing = f"took {format_duration(s['elapsed_s'])}, stopped by the time budget"
        else:
            timing = (f"took {format_duration(s['elapsed_s'])}, under the budget: the tasks short of it had no "
                      f"valid config left to measure")
        return (f"sweep: {s['trials']}/{s['budget']} trials ({s['measured']} measured, {s['failed']} failed, "
                f"{s['asked']} asked, {s['skipped']} skipped as invalid/pruned); {s['rate']:.2f} measured/s; "
                f"{timing}; best: {shown or '-'}")

    def _view(self) -> Group:
        s = self.snapshot()
        head = Text(f"elapsed {format_duration(s['elapsed_s'])}  {s['rate']:.2f} measured/s  "
                    f"ETA {format_duration(s['eta_s'])}  trials {s['trials']}/{s['budget']}  "
                    f"asked {s['asked']}")
        table = Table(title="sweep", expand=False)
        for column in ("task", "trials", "measured", "best", "failed", "skipped"):
            table.add_column(column)
        with self._lock:
            for p in self.planned:
                counts = self.counts[p.task.key]
                measured = sum(counts[o] for o in outcomes.MEASURED)
                failed = ", ".join(f"{o} {counts[o]}" for o in outcomes.FAILURES if counts[o])
                skipped = ", ".join(f"{o} {counts[o]}" for o in outcomes.SKIPPED if counts[o])
                table.add_row(p.task.key, f"{measured + counts[outcomes.CACHED]}/{p.trials}", str(measured),
                              format_seconds(self.best.get(p.task.key)), failed or "-", skipped or "-")
        return Group(head, table)

    def _log_loop(self) -> None:
        while not self._stop.wait(self.every_s):
            if self._measuring.is_set():
                logger.info(self.line())

    def __enter__(self) -> SweepProgress:
        if self._live is not None:
            self._live.__enter__()
        else:
            logger.info("sweep: %d tasks, %d trials budgeted; starting workers", len(self.planned),
                        sum(p.trials for p in self.planned))
            self._thread = threading.Thread(target=self._log_loop, name="farm-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(self._view(), refresh=True)
            self._live.__exit__(exc_type, *exc)
            self.console.print()    # what follows starts on its own line
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if exc_type is None:
            self.done = True
            logger.info(self.line().replace("sweep:", "sweep done:", 1))
