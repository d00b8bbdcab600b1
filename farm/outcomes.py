"""Trial outcomes: every result of measuring a config is a value, never an exception."""
from __future__ import annotations

import dataclasses
import re
from typing import Any

OK = "ok"
COMPILE_ERROR = "compile_error"   # build, lower or compile failed
RUN_ERROR = "run_error"           # compiled, then failed when run
WRONG_RESULT = "wrong_result"     # ran, but disagrees with the reference (or left outputs unwritten)
OOM = "oom"                       # out of on-chip or device memory
TIMEOUT = "timeout"               # compile or timing outran its limit; the worker was replaced
WORKER_LOST = "worker_lost"       # the worker process died
INVALID = "invalid"               # broke a search-space constraint; never sent to a worker
PRUNED = "pruned"                 # cannot fit (footprint > capacity, or dominates an oom); never compiled
CACHED = "cached"                 # an already measured config, answered from the cache

MEASURED = (OK, COMPILE_ERROR, RUN_ERROR, WRONG_RESULT, OOM, TIMEOUT, WORKER_LOST)
SKIPPED = (INVALID, PRUNED)        # drawn but not counted against the trial budget
ALL = (*MEASURED, *SKIPPED, CACHED)
FAILURES = tuple(o for o in MEASURED if o != OK)

# Messages compilers and runtimes give when memory runs out (kept with real examples in tests).
_OOM_PATTERNS = (
    r"Shared memory size limit exceeded",
    r"exceeds available shared memory",
    r"[Rr]an out of memory in memory space",
    r"RESOURCE_EXHAUSTED",
    r"[Oo]ut of memory",
    r"OutOfMemory",
)


def classify_error(message: str, default: str) -> str:
    """`oom` when the message says memory ran out, else `default`."""
    if any(re.search(p, message) for p in _OOM_PATTERNS):
        return OOM
    return default


@dataclasses.dataclass
class Measurement:
    """What a worker reports for one config."""

    outcome: str
    median_s: float | None = None
    spread: float | None = None       # (p75 - p25) / median of the timing samples
    min_s: float | None = None
    n_timed: int = 0
    calls_per_sample: int = 0
    numerics_error: float | None = None  # relative L2 error against the reference
    compile_s: float | None = None
    error: str | None = None
    worker: str | None = None
    device_kind: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (it crosses Ray and lands in Parquet)."""
        return dataclasses.asdict(self)
