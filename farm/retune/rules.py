"""The promotion rule and the gate of `farm retune`: pure functions over trial records.

A decision per retuned task:
- `new`: no usable previous winner (no row, no valid config, or a winner the kernel no longer
  takes); the sweep's winner is taken. A winner the current space leaves out but the kernel
  takes is still measured first (outside the study), so it stays the baseline.
- `repaired`: the previous winner now fails (compile error, wrong result, OOM, pruned, ...);
  the new winner replaces it and the task is flagged.
- `failed`: the previous winner fails and no config works (row `no_valid_config`; flagged).
- `improved`: a config is faster than the baseline beyond noise; it replaces the old winner.
- `regressed`: nothing beat the baseline beyond noise, and the baseline is slower than the
  previous bundle's time beyond noise; the old config is kept, with its new time.
- `kept`: nothing beat the baseline beyond noise and it is not slower than before; the old
  config is kept, with its new time.
- `carried`: not stale; the previous row is copied unchanged (not measured).

The *baseline* is the previous winner measured under the new software (trial 0 of the task).

Noise. A is *faster than B beyond noise* when A's median, raised by the relative noise floor
(`--noise`, default 2%), is still below B's fast end: median_A * (1 + noise) < B's median *
(1 - noise). Medians are order statistics that one slow (or fast) sample cannot move, unlike the
spread (IQR / median), which with few samples one outlier sets (with 5 samples, the slowest
sample is half of the upper quartile), so spreads are reported but not used. Where B was timed
on the device clock (kernel durations from a trace, `clock` "device"), noise only ever adds
time, so B's fastest sample is the best B can do and is its fast end. On the wall clock it is
not: each sample there is the difference of two queued runs (`farm.measure.timing`), which
noise moves either way (on a loaded CPU, fastest samples 2 to 990 times below the median were
seen), so a fastest sample there would excuse any regression.

Gate. A task *blocks the rollout* when it is `failed`, or when its new time over the previous
bundle's time exceeds 1 + max_regression *and* the new time is slower beyond noise (whatever
the decision: an `improved` or `repaired` task that is still slower than before blocks too).
`farm retune` exits with EXIT_BLOCKED (3) when any task blocks.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from farm.bundle import select
from farm.bundle.records import TrialRecord
from farm.measure import outcomes
from farm.measure.timing import DEVICE
from farm.tasks import config_json

if TYPE_CHECKING:
    from farm.retune.planning import TaskPlan

NEW, REPAIRED, FAILED, IMPROVED, REGRESSED, KEPT, CARRIED = (
    "new", "repaired", "failed", "improved", "regressed", "kept", "carried")
DECISIONS = (NEW, REPAIRED, FAILED, IMPROVED, REGRESSED, KEPT, CARRIED)
EXIT_BLOCKED = 3


@dataclasses.dataclass(frozen=True)
class RetuneSettings:
    """What `farm retune` does beyond a sweep's settings."""

    top: int = 3                      # previous configs queued per stale task: the winner and the next best
    trials: int | None = None         # budget per stale task (default: see `farm.retune.planning.budget`)
    escalate: bool = True             # a second pass, up to the space's budget, where the landscape moved
    noise: float = 0.02               # noise floor, relative
    max_regression: float = 0.05      # the gate: new / old time above 1 + this (beyond noise) blocks


@dataclasses.dataclass(frozen=True)
class Timing:
    """A measurement's median, relative spread, fastest sample and clock, for comparisons beyond noise."""

    median_s: float
    spread: float = 0.0
    min_s: float | None = None
    clock: str | None = None  # farm.measure.timing's WALL or DEVICE (None: not recorded, as wall)

    @classmethod
    def of(cls, row: Mapping[str, Any] | TrialRecord | None) -> Timing | None:
        """The timing of a configs row or a trial record (None when it has no median)."""
        if isinstance(row, TrialRecord):
            row = row.to_dict()
        if not row or row.get("median_s") is None:
            return None
        return cls(float(row["median_s"]), float(row.get("spread") or 0.0),
                   None if row.get("min_s") is None else float(row["min_s"]), row.get("clock"))

    def upper(self, noise: float) -> float:
        """The slow end of the measurement: its median raised by the noise floor."""
        return self.median_s * (1 + noise)

    def lower(self, noise: float) -> float:
        """The fast end of the measurement: its median lowered by the noise floor, or on the device
        clock its fastest sample (module docstring)."""
        if self.clock == DEVICE and self.min_s is not None:
            return min(self.min_s, self.median_s)
        return self.median_s * (1 - noise)


def faster_beyond_noise(a: Timing | None, b: Timing | None, noise: float) -> bool:
    """Whether `a` is faster than `b` beyond noise: A's median * (1 + noise) below B's fast end (`Timing.lower`)."""
    return a is not None and b is not None and a.upper(noise) < b.lower(noise)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the promotion rule chose for a retuned task: the kept record and the baseline."""

    decision: str
    chosen: TrialRecord | None      # the record whose config goes into the bundle (None: no valid config)
    baseline: TrialRecord | None    # the previous winner's record under the new software (ok or failed)
    note: str | None = None


def decide(plan: TaskPlan, records: Sequence[TrialRecord], noise: float) -> Decision:
    """Apply the promotion rule (module docstring) to a retuned task's trial records."""
    best = select.best_record(records)
    row = plan.previous
    if row is None or row.get("status") != "ok" or not row.get("config"):
        return Decision(NEW, best, None)
    if not plan.winner_measurable:
        return Decision(NEW, best, None, "the kernel no longer takes the previous winner at this shape")
    old_key = config_json(json.loads(row["config"]))
    own = [r for r in records if r.config == old_key]
    baseline = select.best_record(own)
    if baseline is None:
        failure = next((r for r in own if r.outcome != outcomes.CACHED), own[0] if own else None)
        what = f"{failure.outcome}: {first_line(failure.error)}" if failure else "not measured"
        return Decision(REPAIRED if best else FAILED, best, failure, f"previous winner now {what}")
    if best is not None and best.config != old_key and \
            faster_beyond_noise(Timing.of(best), Timing.of(baseline), noise):
        return Decision(IMPROVED, best, baseline)
    slower = faster_beyond_noise(Timing.of(row), Timing.of(baseline), noise)
    return Decision(REGRESSED if slower else KEPT, baseline, baseline)


def landscape_moved(plan: TaskPlan, decision: Decision, noise: float) -> bool:
    """Whether the previous winner now fails, or is slower than its previous time beyond noise."""
    if decision.decision in (NEW, CARRIED) or decision.baseline is None:
        return False
    if decision.baseline.outcome != outcomes.OK:
        return True
    return faster_beyond_noise(Timing.of(plan.previous), Timing.of(decision.baseline), noise)


def blocks_rollout(decision: str, ratio: float | None, slower: bool, max_regression: float) -> bool:
    """The gate: `failed`, or new / old time above 1 + max_regression and slower beyond noise."""
    return decision == FAILED or (ratio is not None and ratio > 1 + max_regression and slower)


def first_line(text: str | None, limit: int = 200) -> str:
    """The first line of an error text, shortened."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else "-"
    return line if len(line) <= limit else line[:limit - 3] + "..."
