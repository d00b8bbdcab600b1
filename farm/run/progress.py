"""A live progress table for sweeps: trials per task, best so far, failures by kind."""
from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from farm.bundle.records import TrialRecord
from farm.measure import outcomes
from farm.search.plan import PlannedTask


def format_seconds(seconds: float | None) -> str:
    """A time with a readable unit (us, ms, s)."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"


class SweepProgress:
    """Call `update(record)` for each trial record; use as a context manager."""

    def __init__(self, planned: list[PlannedTask], console: Console | None = None) -> None:
        self.planned = planned
        self.console = console or Console(stderr=True)
        self.counts: dict[str, Counter] = {p.task.key: Counter() for p in planned}
        self.best: dict[str, float] = {}
        self._live = Live(self._table(), console=self.console, refresh_per_second=4,
                          transient=False, auto_refresh=self.console.is_terminal)

    def __enter__(self) -> SweepProgress:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._live.update(self._table())
        self._live.__exit__(*exc)

    def update(self, record: TrialRecord) -> None:
        """Count one trial record."""
        key = record.task_key
        self.counts[key][record.outcome] += 1
        if record.outcome == outcomes.OK and record.median_s is not None:
            self.best[key] = min(self.best.get(key, float("inf")), record.median_s)
        if self.console.is_terminal:
            self._live.update(self._table())

    def _table(self) -> Table:
        table = Table(title="sweep", expand=False)
        for column in ("task", "trials", "best", "failures"):
            table.add_column(column)
        for p in self.planned:
            counts = self.counts[p.task.key]
            done = sum(counts[o] for o in (*outcomes.MEASURED, outcomes.CACHED))
            failures = ", ".join(f"{o} {counts[o]}" for o in (*outcomes.FAILURES, *outcomes.SKIPPED) if counts[o])
            table.add_row(p.task.key, f"{done}/{p.trials}", format_seconds(self.best.get(p.task.key)),
                          failures or "-")
        return table
