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
# Keep error texts readable in tables; the head of a compiler error says what went wrong.
ERROR_CHARS = 4000
# How a run_error whose reference failed begins: no verdict on the config, but on the task (a
# sweep stops asking for its trials once REFERENCE_FAILURES_TO_STOP of them say so).
REFERENCE_FAILED = "the reference could not be computed (not this config's fault): "

# Messages compilers and runtimes give when memory runs out (kept with real examples in tests).
_OOM_PATTERNS = (
    r"Shared memory size limit exceeded",
    r"exceeds available shared memory",
    r"[Rr]an out of memory in memory space",
    r"[Rr]an out of shared memory",
    r"RESOURCE_EXHAUSTED",
    r"[Oo]ut of memory",
    r"OutOfMemory",
)


# Failures whose message hides their cause: (a pattern of the whole text, the cause), said first in
# the stored error so that no cut loses it (the real messages are test data).
_KNOWN_CAUSES = (
    (r"_allocate_(?:semaphores|buffer)\b[\s\S]*out of bounds for int16",
     "JAX's TPU interpreter numbers the semaphores and buffers of one kernel call in int16, and this "
     "call allocated more than 32767 of them (emit_pipeline allocates some every grid step): a limit of "
     "interpret mode, not of this config on a TPU; validate it in interpret mode at fewer grid steps"),
)


def known_cause(message: str) -> str | None:
    """What a failure's message means where the message itself does not say it, else None."""
    return next((cause for pattern, cause in _KNOWN_CAUSES if re.search(pattern, message)), None)


def classify_error(message: str, default: str) -> str:
    """`oom` when the message says memory ran out, else `default`."""
    if any(re.search(p, message) for p in _OOM_PATTERNS):
        return OOM
    return default


_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KiB": 2**10, "M": 2**20, "MB": 2**20, "MiB": 2**20,
          "G": 2**30, "GB": 2**30, "GiB": 2**30}
_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*(GiB|MiB|KiB|GB|MB|KB|G|M|K|B)?"
# (requested, available): the first size each pattern captures; the real messages are test data.
_NUMBER_PATTERNS = (
    (rf"requested:? {_SIZE}", rf"available:? {_SIZE}"),                     # Triton (via XLA)
    (rf"\bsmem_bytes={_SIZE}", rf"max_smem_bytes={_SIZE}"),                # Mosaic GPU
    (rf"Used {_SIZE} of", rf"Used [0-9.]+\w* of {_SIZE}"),                 # Mosaic TPU / XLA:TPU (vmem)
    (rf"trying to allocate {_SIZE}", None),                                 # XLA's device allocator (HBM)
    (rf"HLO temporaries \({_SIZE}\)", rf"available HBM \({_SIZE}\)"),          # XLA:TPU's CompileTimeHbmOom
)


def _bytes(pattern: str | None, message: str) -> int | None:
    match = re.search(pattern, message) if pattern else None
    if match is None:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2) or ""])


def memory_numbers(message: str) -> tuple[int | None, int | None]:
    """(requested, available) bytes from an out-of-memory message, None where it gives neither."""
    for requested_re, available_re in _NUMBER_PATTERNS:
        requested = _bytes(requested_re, message)
        if requested is not None:
            return requested, _bytes(available_re, message)
    return None, None


@dataclasses.dataclass
class Measurement:
    """What a worker reports for one config."""

    outcome: str
    median_s: float | None = None
    spread: float | None = None       # (p75 - p25) / median of the timing samples
    min_s: float | None = None
    n_timed: int = 0
    calls_per_sample: int = 0
    cut_short: bool = False           # timing stopped early: clearly slower than the task's best so far
    disturbed: bool = False           # the timing was held up from outside (`timing.Timing.disturbed`)
    retimed_quiet: bool = False       # ... so it was taken again with no compile running (the figures are those)
    clock: str | None = None          # the timing's clock: "wall" or "device" (`farm.measure.timing.Timing.clock`)
    numerics_error: float | None = None  # relative L2 error against the reference
    compile_s: float | None = None
    error: str | None = None
    worker: str | None = None
    device_kind: str | None = None
    requested_bytes: int | None = None   # out of memory: what the compiler or allocator asked for
    available_bytes: int | None = None   # ... and what it had, where the message says

    def fail(self, message: str, default: str) -> Measurement:
        """Record a failure: its outcome (`oom` or `default`), its text (cut to ERROR_CHARS, a known
        cause said first) and, for `oom`, the byte counts parsed from the whole message."""
        self.outcome = classify_error(message, default)
        cause = known_cause(message)
        self.error = (message if cause is None else f"known cause: {cause}\n{message}")[:ERROR_CHARS]
        if self.outcome == OOM:
            self.requested_bytes, self.available_bytes = memory_numbers(message)
        return self

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (it crosses Ray and lands in Parquet)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Measured:
    """What a worker actor returns for one trial: the measurement, the device seconds it took,
    and whether the worker must be replaced (a compile thread it could not stop)."""

    measurement: Measurement
    device_s: float = 0.0
    restart: bool = False
