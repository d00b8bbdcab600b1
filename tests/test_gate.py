"""The worker's gate between compiles and quiet timing (`farm.run.gate`), with real threads."""
from __future__ import annotations

import sys
import threading
import time

import pytest

from farm.run.gate import GIL_HANDOFF_S, CompileGate, gil_handoff


def test_quiet_timing_waits_for_compiles_in_progress_and_holds_new_ones_back():
    gate, events = CompileGate(), []
    compiling, release_compile = threading.Event(), threading.Event()
    quiet_started, release_quiet = threading.Event(), threading.Event()

    def compile_(name: str, hold: threading.Event | None) -> None:
        with gate.compiling():
            events.append(f"{name} compiles")
            if hold is not None:
                compiling.set()
                hold.wait(10)
        events.append(f"{name} done")

    def time_quietly() -> None:
        with gate.quiet():
            events.append("quiet")
            quiet_started.set()
            release_quiet.wait(10)
        events.append("quiet done")

    first = threading.Thread(target=compile_, args=("first", release_compile))
    first.start()
    assert compiling.wait(10)
    quiet = threading.Thread(target=time_quietly)
    quiet.start()
    deadline = time.monotonic() + 10
    while not gate.quiet_requested and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gate.quiet_requested and not quiet_started.is_set()   # a compile is in progress: the timing waits
    second = threading.Thread(target=compile_, args=("second", None))
    second.start()
    second.join(0.2)
    assert second.is_alive() and "second compiles" not in events   # held back behind the timing
    release_compile.set()
    assert quiet_started.wait(10)
    assert gate.active_compiles == 0 and "second compiles" not in events
    release_quiet.set()
    for t in (first, quiet, second):
        t.join(10)
    assert events.index("first done") < events.index("quiet") < events.index("quiet done") < events.index(
        "second compiles")


def test_compiles_do_not_wait_for_each_other():
    gate, inside = CompileGate(), threading.Barrier(3, timeout=10)

    def compile_() -> None:
        with gate.compiling():
            inside.wait()           # all three inside at once, or the barrier times out

    threads = [threading.Thread(target=compile_) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not inside.broken and gate.active_compiles == 0


def test_quiet_timing_waits_a_bounded_time_for_a_compile_that_does_not_end():
    # A hung compile (it would run to its time limit) holds a quiet timing back max_wait_s at most;
    # new compiles still wait behind the timing.
    gate, compiling, release = CompileGate(), threading.Event(), threading.Event()

    def hung_compile() -> None:
        with gate.compiling():
            compiling.set()
            release.wait(10)

    hung = threading.Thread(target=hung_compile)
    hung.start()
    assert compiling.wait(10)
    with gate.quiet(max_wait_s=0.2) as clear:
        assert not clear and gate.active_compiles == 1 and gate.quiet_requested
    with gate.quiet(max_wait_s=0.2):
        release.set()
    hung.join(10)
    with gate.quiet(max_wait_s=0.2) as clear:
        assert clear


def test_gil_handoff_shortens_the_switch_interval_while_held_and_restores_it():
    before = sys.getswitchinterval()
    assert before > GIL_HANDOFF_S                      # Python's default, 5 ms
    with gil_handoff():
        assert sys.getswitchinterval() == pytest.approx(GIL_HANDOFF_S, rel=0.05)
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError), gil_handoff():   # restored when the timing fails too
        raise RuntimeError("a failed run")
    assert sys.getswitchinterval() == before
    sys.setswitchinterval(GIL_HANDOFF_S / 2)           # a shorter interval set by the user stays
    try:
        with gil_handoff():
            assert sys.getswitchinterval() == pytest.approx(GIL_HANDOFF_S / 2, rel=0.05)   # microseconds
    finally:
        sys.setswitchinterval(before)
