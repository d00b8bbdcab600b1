"""Which tasks `farm retune` retunes, and how: the previous bundle, staleness, warm starts, budgets.

A planned task is *stale* when the previous bundle has no `ok` row for it on this device kind
(it is `new`) or when that row's software fingerprint differs from the current one (or is
missing); every other row is carried over unchanged. A stale task is warm-started: the previous
winner first (the baseline), then the next best configs of its previous run, then the kernel's
default; its budget defaults to a quarter of the space's (at least the warm start + 2). A new
task starts from the winners of its nearest tuned shapes (`farm.retune.nearest`), with the
space's budget.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from farm.bundle import fingerprint
from farm.bundle.locate import open_bundle
from farm.bundle.records import TrialRecord
from farm.bundle.trust import Trust
from farm.errors import BundleError, FarmError
from farm.measure import outcomes
from farm.retune.rules import RetuneSettings
from farm.search.plan import PlannedTask

# Default budget of a stale task: this share of the space's budget, at least the warm start + EXPLORE.
BUDGET_SHARE = 0.25
EXPLORE = 2


@dataclasses.dataclass(frozen=True)
class Previous:
    """The previous bundle, verified and read."""

    path: str
    manifest: dict[str, Any]
    rows: list[dict[str, Any]]
    trials: list[TrialRecord]


@dataclasses.dataclass
class TaskPlan:
    """A planned task, its current fingerprint, its previous row and why (whether) it is retuned."""

    planned: PlannedTask
    device_kind: str | None
    fingerprint: dict[str, Any]
    previous: dict[str, Any] | None
    changes: list[str]
    warm: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    winner_measurable: bool = True
    escalated: bool = False

    @property
    def key(self) -> str:
        """The task key."""
        return self.planned.task.key

    @property
    def stale(self) -> bool:
        """Whether the task is retuned."""
        return bool(self.changes)


def load_previous(path: str | Path, trust: Trust, *, allow_unsigned: bool = False,
                  flag: str = "--previous") -> Previous:
    """The previous bundle (run, bundle or `farm pull` deployment folder, or archive), verified;
    errors name `flag`."""
    try:
        with open_bundle(path, trust, allow_unsigned=allow_unsigned) as opened:
            return Previous(str(path), opened.manifest, opened.configs().to_pylist(),
                            [TrialRecord.from_dict(t) for t in opened.trials().to_pylist()])
    except BundleError as err:  # exit 1: failed verification
        raise BundleError(f"{flag} {err}") from None
    except FarmError as err:
        raise FarmError(f"{flag} {err}") from None


def previous_row(previous: Previous, task_key: str, device_kind: str | None) -> dict[str, Any] | None:
    """The newest previous row of a task on a device kind."""
    rows = [r for r in previous.rows if r["task_key"] == task_key and r.get("device_kind") == device_kind]
    return max(rows, key=lambda r: str(r.get("created") or "")) if rows else None


def warm_start(plan: TaskPlan, previous: Previous, top: int) -> tuple[list[dict[str, Any]], bool]:
    """The configs to queue first (previous winner, then the next best of its run) the kernel takes now.

    Returns them and whether the previous winner itself is measurable now: a sweep measures a
    warm start even where the current space leaves it out, as long as the kernel takes it
    (`measurable`), so the previous winner stays the baseline after a space is narrowed.
    """
    row = plan.previous
    if row is None or row.get("status") != "ok" or not row.get("config"):
        return [], True
    task = plan.planned.task
    valid = functools.partial(measurable, plan.planned)
    winner = json.loads(row["config"])
    ok = [t for t in previous.trials if t.task_key == task.key and t.outcome == outcomes.OK
          and t.median_s is not None and t.device_kind in (None, plan.device_kind)]
    same_run = [t for t in ok if t.run_id == row.get("run_id")]
    ranked = sorted(same_run or ok, key=lambda t: (t.median_s, t.spread or 0.0))
    configs: list[dict[str, Any]] = [winner]
    for trial in ranked:
        if len(configs) >= top:
            break
        config = json.loads(trial.config)
        if config not in configs:
            configs.append(config)
    return [c for c in configs if valid(c)], valid(winner)


def measurable(planned: PlannedTask, config: dict[str, Any]) -> bool:
    """Whether a sweep of `planned` would measure `config` when queued first (a warm start): a
    point of its space that no constraint refuses, or any config the kernel takes (a sweep
    measures it outside the study where the space leaves it out: `farm.search.searcher`)."""
    return planned.kernel_takes(config)   # the points of its space too: the kernel takes each of them


def budget(plan: TaskPlan, settings: RetuneSettings) -> int:
    """Trials for a stale task: --trials, else a share of the space's budget, at least the warm start + EXPLORE.

    The default never exceeds the space's budget, except to measure every warm-start config.
    `new` tasks (no warm start) get the space's budget, as in a cold sweep.
    """
    if not plan.warm:
        return plan.planned.trials
    if settings.trials:
        return settings.trials
    wanted = max(len(plan.warm) + 1 + EXPLORE, math.ceil(BUDGET_SHARE * plan.planned.trials))
    return max(len(plan.warm), min(plan.planned.trials, wanted))


def plan_tasks(planned: Sequence[PlannedTask], previous: Previous, environment: Mapping[str, Mapping[str, Any]],
               settings: RetuneSettings) -> list[TaskPlan]:
    """Each planned task's current fingerprint, previous row, staleness, warm start and budget."""
    sources: dict[str, dict[str, str]] = {}
    plans = []
    for p in planned:
        info = environment.get(p.task.key, {})
        if p.task.kernel not in sources:
            sources[p.task.kernel] = fingerprint.kernel_sources(p.task.kernel)
        current = fingerprint.for_task(p.task.kernel, info, sources[p.task.kernel])
        device_kind = info.get("device_kind")
        row = previous_row(previous, p.task.key, device_kind)
        if row is None:
            changes = [f"not in the previous bundle for device kind {device_kind}"]
        else:
            changes = fingerprint.changes(fingerprint.parse(row.get("fingerprint")), current)
        plan = TaskPlan(p, device_kind, current, row, changes)
        if plan.stale and row is None:   # a new task: its nearest tuned shapes' winners first, a full budget
            # (imported here: farm.retune.nearest builds on this module)
            from farm.retune.nearest import nearest_seeds

            plan.warm = nearest_seeds(previous, [p], limit=settings.top).configs.get(p.task.key, [])
        elif plan.stale:
            plan.warm, plan.winner_measurable = warm_start(plan, previous, settings.top)
            plan.planned = dataclasses.replace(p, trials=budget(plan, settings))
        plans.append(plan)
    return plans
