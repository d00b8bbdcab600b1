"""One trial, typed: `TrialRecord` is a row of trials.parquet and a line of trials.jsonl.

Records live in memory as `TrialRecord`; dicts exist only at the edges (`to_dict` for JSON
and Parquet, `from_dict` for a log or a bundle read back). The Parquet schema is derived from
the fields (`SCHEMA`), so the two cannot drift apart.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pyarrow as pa

from farm.measure.outcomes import Measurement
from farm.tasks import TuningTask


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """Every trial of a sweep and its outcome: measured, failed, pruned, invalid or cached.

    >>> r = TrialRecord.for_task(TuningTask("softmax", (8, 128), "float32", "interpret"), 0, '{"block_rows":8}', "ok")
    >>> TrialRecord.from_dict(r.to_dict()) == r
    True
    """

    task_key: str
    kernel: str
    shape: tuple[int, ...]
    dtype: str
    target: str
    # The Optuna trial number within the task's study; -1 for the kernel's default, measured outside
    # a space that leaves it out (`farm.search.searcher.OUTSIDE_STUDY`), -2, -3, ... for warm starts
    # measured outside it (`farm.search.searcher.outside_trial`).
    trial: int
    config: str                         # canonical JSON (`farm.tasks.config_json`)
    outcome: str                        # one of `farm.measure.outcomes.ALL`
    median_s: float | None = None
    spread: float | None = None
    min_s: float | None = None
    n_timed: int | None = None
    calls_per_sample: int | None = None
    cut_short: bool | None = None       # timed in a few samples only: clearly slower than the best so far
    disturbed: bool | None = None       # its first timing was held up from outside (compiles beside it)
    retimed_quiet: bool | None = None   # ... and was taken again with no compile running: the figures above
    clock: str | None = None            # the timing's clock: "wall" (queued calls) or "device" (kernel durations)
    numerics_error: float | None = None
    compile_s: float | None = None
    device_s: float | None = None       # seconds the device spent validating and timing
    footprint_bytes: int | None = None
    capacity_bytes: int | None = None
    requested_bytes: int | None = None
    available_bytes: int | None = None
    error: str | None = None
    worker: str | None = None
    device_kind: str | None = None
    attempt: int = 1                    # runs that counted against the trial (its worker died under it)
    requeued: int = 0                   # times it moved to another worker, for whatever reason
    started: str | None = None
    finished: str | None = None
    elapsed_s: float | None = None      # seconds since the sweep started
    run_id: str | None = None

    @classmethod
    def for_task(cls, task: TuningTask, trial: int, config: str, outcome: str, **fields: Any) -> TrialRecord:
        """A record of `task`'s trial; `fields` sets the rest."""
        return cls(task.key, task.kernel, tuple(task.shape), task.dtype, task.target, trial, config, outcome,
                   **fields)

    @classmethod
    def measured(cls, task: TuningTask, trial: int, config: str, measurement: Measurement,
                 **fields: Any) -> TrialRecord:
        """A record of what a worker measured (`fields`: what the driver adds, e.g. attempt, device_s)."""
        return cls.for_task(task, trial, config, **{**dataclasses.asdict(measurement), **fields})

    def replace(self, **changes: Any) -> TrialRecord:
        """A copy with `changes`."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON and Parquet): the shape as a list."""
        data = dataclasses.asdict(self)
        data["shape"] = list(self.shape)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialRecord:
        """A record from a dict (a trials.jsonl line, a trials.parquet row); unknown keys are ignored.

        Fields the source lacks (older logs, hand-made rows) take their default, or None.
        """
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                values[f.name] = data[f.name]
            elif f.default is dataclasses.MISSING:
                values[f.name] = None
        if values.get("shape") is not None:
            values["shape"] = tuple(values["shape"])
        for name in TIMESTAMP_FIELDS:   # a Parquet row holds datetimes
            if isinstance(values.get(name), datetime):
                values[name] = values[name].isoformat()
        for name in ("attempt", "requeued"):   # null in Parquet rows of skipped trials from older runs
            if name in values and values[name] is None:
                values.pop(name)
        return cls(**values)

    @classmethod
    def checked(cls, data: Any) -> TrialRecord:
        """`from_dict` of data read from a file anyone may have edited (a run's trials.jsonl): every
        field of its type (ints for ints, numbers for floats, a shape of dimensions 1 to 2**31 - 1),
        the task key the one its kernel, shape, dtype and target make; else a ValueError naming the
        field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        for f in dataclasses.fields(cls):
            value = data.get(f.name, None if f.default is dataclasses.MISSING else f.default)
            if f.name == "shape":
                if not (isinstance(value, (list, tuple)) and 0 < len(value) <= 8 and all(
                        type(d) is int and 1 <= d < 2 ** 31 for d in value)):
                    raise ValueError(f"shape: expected up to 8 dimensions from 1 to 2**31 - 1, got {value!r:.80}")
                continue
            allowed = _FIELD_TYPES[f.name]
            if value is None and f.name in ("attempt", "requeued"):   # null in older runs' rows: the default
                continue
            if not any(value is None if t is type(None) else _is(value, t) for t in allowed):
                names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
                raise ValueError(f"{f.name}: expected {names}, got {value!r:.80}")
        record = cls.from_dict(data)
        key = TuningTask(record.kernel, record.shape, record.dtype, record.target).key
        if record.task_key != key:
            raise ValueError(f"task_key: expected {key!r:.200} (its kernel, shape, dtype and target), got "
                             f"{record.task_key!r:.200}")
        return record


def _is(value: Any, kind: type) -> bool:
    """isinstance, but a bool is no int or float, and an int is a float."""
    if kind in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


_FIELD_TYPES = {name: (typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,))
                for name, hint in typing.get_type_hints(TrialRecord).items() if name != "shape"}


_ARROW = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}
TIMESTAMP = pa.timestamp("us", tz="UTC")
# Fields held as ISO 8601 text in memory and in trials.jsonl, stored as Parquet timestamps.
TIMESTAMP_FIELDS = ("started", "finished")


def _arrow_type(hint: Any) -> pa.DataType:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _arrow_type(inner)
    if typing.get_origin(hint) is tuple:
        return pa.list_(_arrow_type(typing.get_args(hint)[0]))
    return _ARROW[hint]


def arrow_schema(cls: type) -> pa.Schema:
    """The Parquet schema of a record dataclass: one typed, nullable column per field, in order
    (TIMESTAMP_FIELDS as UTC timestamps)."""
    hints = typing.get_type_hints(cls)
    return pa.schema([(f.name, TIMESTAMP if f.name in TIMESTAMP_FIELDS else _arrow_type(hints[f.name]))
                      for f in dataclasses.fields(cls)])


SCHEMA = arrow_schema(TrialRecord)
