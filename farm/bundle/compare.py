"""Two bundles' tuned configs side by side: what a deployment gains, loses and changes when NEW
replaces OLD (`farm diff OLD NEW`).

A task is a (task key, device kind) pair, as a deployment looks it up; it is tuned in a bundle
when its row there has status "ok". Each task tuned in either bundle is one `TaskChange`:
`added` (tuned in NEW only), `dropped` (tuned in OLD only: a deployment of NEW runs a nearest
tuned shape's config or the kernel's default for it), `new config` or `same config`. The two
recorded medians are compared only where they were taken the same way: the same clock (the
device's or the host's), both on the device or both emulated in interpret mode; their software
may differ (say, a JAX upgrade between the runs), and `software_changed` says so. The medians come
from two runs, so a ratio within their spreads is noise, not a change (`within_noise`).
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ADDED = "added"
DROPPED = "dropped"
NEW_CONFIG = "new config"
SAME_CONFIG = "same config"
CHANGES = (DROPPED, NEW_CONFIG, ADDED, SAME_CONFIG)  # the order a diff lists them in


def task_label(task_key: str, device_kind: str | None) -> str:
    """A task as people read it: its key, and the device kind where the row names one."""
    return f"{task_key} on {device_kind}" if device_kind else task_key


@dataclasses.dataclass(frozen=True)
class TunedRow:
    """What a diff reads of one tuned configs.parquet row."""

    task_key: str
    device_kind: str | None
    config: dict[str, Any]
    median_s: float | None
    spread: float
    clock: str | None      # farm.measure.timing's WALL or DEVICE; None (older bundles): the host's
    interpret: bool | None
    fingerprint: str | None

    @property
    def task(self) -> str:
        return task_label(self.task_key, self.device_kind)

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> TunedRow | None:
        """The row as a diff reads it, or None when it holds no tuned config (status other than
        "ok", or a config that is not a JSON object)."""
        if row.get("status") != "ok" or not isinstance(row.get("task_key"), str):
            return None
        try:
            config = json.loads(row.get("config") or "")
        except (TypeError, ValueError):
            return None
        if not isinstance(config, dict):
            return None
        median = row.get("median_s")
        ok = isinstance(median, (int, float)) and not isinstance(median, bool) and math.isfinite(median) and median > 0
        spread = row.get("spread")
        spread_ok = isinstance(spread, (int, float)) and math.isfinite(spread) and spread >= 0
        return cls(row["task_key"], row.get("device_kind") or None, config, float(median) if ok else None,
                   float(spread) if spread_ok else 0.0, row.get("clock") or None, row.get("interpret"),
                   row.get("fingerprint_sha256") or None)


@dataclasses.dataclass(frozen=True)
class TaskChange:
    """One task tuned in either bundle: what NEW changes for it, and the two recorded medians."""

    task: str
    change: str                         # one of CHANGES
    old: TunedRow | None
    new: TunedRow | None
    incomparable: str | None = None     # why the two medians cannot be compared (None: they can)

    @property
    def ratio(self) -> float | None:
        """OLD's median over NEW's (above 1: NEW's config ran faster), where the two compare."""
        if self.incomparable or self.old is None or self.new is None:
            return None
        return self.old.median_s / self.new.median_s

    @property
    def within_noise(self) -> bool:
        """Whether the ratio lies within the two medians' spreads (and the 2% floor): no change shown."""
        ratio = self.ratio
        if ratio is None:
            return False
        noise = max(0.02, self.old.spread + self.new.spread)   # type: ignore[union-attr]
        return abs(math.log(ratio)) <= math.log1p(noise)

    @property
    def software_changed(self) -> bool:
        """Whether both rows record a software fingerprint and they differ (a JAX upgrade, a kernel's
        source edited: `farm.bundle.fingerprint`)."""
        return bool(self.old and self.new and self.old.fingerprint and self.new.fingerprint
                    and self.old.fingerprint != self.new.fingerprint)


def _incomparable(old: TunedRow, new: TunedRow) -> str | None:
    if old.median_s is None or new.median_s is None:
        return "no median recorded"
    if bool(old.interpret) != bool(new.interpret):
        return "one was timed in interpret mode"
    if (old.clock or "wall") != (new.clock or "wall"):
        return f"timed on other clocks ({old.clock or 'wall'} and {new.clock or 'wall'})"
    return None


def _tuned(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str | None], TunedRow]:
    tuned: dict[tuple[str, str | None], TunedRow] = {}
    for row in rows:
        read = TunedRow.of(row)
        if read is not None:
            tuned[(read.task_key, read.device_kind)] = read
    return tuned


def compare(old_rows: Iterable[Mapping[str, Any]], new_rows: Iterable[Mapping[str, Any]]) -> list[TaskChange]:
    """Every task tuned in either bundle's configs rows, as a `TaskChange`, in CHANGES order and
    then by task."""
    old, new = _tuned(old_rows), _tuned(new_rows)
    changes = []
    for key in old.keys() | new.keys():
        a, b = old.get(key), new.get(key)
        if a is None:
            changes.append(TaskChange(b.task, ADDED, None, b))   # type: ignore[union-attr]
        elif b is None:
            changes.append(TaskChange(a.task, DROPPED, a, None))
        else:
            change = SAME_CONFIG if a.config == b.config else NEW_CONFIG
            changes.append(TaskChange(a.task, change, a, b, _incomparable(a, b)))
    return sorted(changes, key=lambda c: (CHANGES.index(c.change), c.task))


def counts(changes: Sequence[TaskChange]) -> dict[str, int]:
    """How many tasks each kind of change holds (every kind, zeros included)."""
    return {kind: sum(c.change == kind for c in changes) for kind in CHANGES}
