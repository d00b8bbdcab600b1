"""A worker's gate between compiling and quiet timing.

A sweep overlaps compiles (in child processes, or in threads of the worker for executables
that cannot travel) with timing on the device, on purpose: the device never waits for the
compiler, and a trial's timing noise is settled later, when the finalists are re-timed side by
side. That re-timing must not share the host with compiles: in the H200 seed suite, finalists
re-timed while the other tasks' finalists compiled had spreads of 29-38% (a 28 us cross
entropy) where the same configs re-timed alone had 7-11%, and a Mosaic GPU attention's
in-process compiles held the GIL under its timing thread. So quiet timing waits for compiles
in progress to end and holds new ones back until it is done; compiles never wait for each other.
A trial's own timing that compiles disturbed (`farm.measure.timing.Timing.disturbed`: on the
H200, 3-70 times too slow while other configs compiled) is taken again the same way.

Why compiles disturb timing: the GIL, not the CPU. The thread that times queues each call in
Python and gives the GIL up inside the call; to take it back it waits until the thread holding
it has run for Python's switch interval (5 ms) while the device runs dry. On the H200
(`bench/probes/timing_disturbance.py`, a 1.41 ms softmax): 14 compile processes beside the
timing, 1.41 ms; 4 threads of the timing process tracing and lowering configs (as a worker's
compile threads did for every Mosaic GPU task until its executables loaded in the worker:
`compile_pool.kernel_runtimes`), 22.0 ms; 4 threads spinning in Python, 41.3 ms. So builds
run in compile processes, the device's holder shortens the switch interval (`gil_handoff`:
1.45 and 2.11 ms there with 0.1 ms), and a timing still disturbed is taken again quietly.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

GIL_HANDOFF_S = 1e-4   # the switch interval while the device is timed (Python's default: 5 ms)


@contextlib.contextmanager
def gil_handoff(interval_s: float = GIL_HANDOFF_S) -> Iterator[None]:
    """Within: a thread waiting for the GIL gets it after `interval_s` (or the interval already
    set, if shorter), so the thread queuing timed calls is not held up for Python's 5 ms by
    threads compiling beside it. Process-wide; callers hold the device lock, one at a time."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, interval_s))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class CompileGate:
    """Many compiles at once, or one quiet timing: never both."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._compiling = 0
        self._quiet = False

    @contextlib.contextmanager
    def compiling(self) -> Iterator[None]:
        """Hold while compiling: waits while a quiet timing runs."""
        with self._cond:
            self._cond.wait_for(lambda: not self._quiet)
            self._compiling += 1
        try:
            yield
        finally:
            with self._cond:
                self._compiling -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def quiet(self, max_wait_s: float | None = None) -> Iterator[bool]:
        """Hold while timing quietly: waits for other quiet timings, then for compiles in progress
        (at most `max_wait_s` for these: a hung compile must not hold the device for its whole
        time limit); new compiles wait until it is done. Yields whether no compile runs."""
        with self._cond:
            self._cond.wait_for(lambda: not self._quiet)
            self._quiet = True                                     # new compiles wait from here
            clear = self._cond.wait_for(lambda: self._compiling == 0, timeout=max_wait_s)  # in progress end
        try:
            yield clear
        finally:
            with self._cond:
                self._quiet = False
                self._cond.notify_all()

    @property
    def quiet_requested(self) -> bool:
        """Whether a quiet timing runs or waits for compiles to end (new compiles wait)."""
        with self._cond:
            return self._quiet

    @property
    def active_compiles(self) -> int:
        """Compiles in progress now."""
        with self._cond:
            return self._compiling
