"""Several kernel calls per dispatch, so that short kernels are timed on the device, not the host.

A queued JAX call costs the host tens of microseconds (on the H200's host, 35-50 us; CUPTI traces
in bench/results/h200/timing_check/): a kernel shorter than that is launched slower than the
device runs it, so every config of it times as the host's launch rate and the search cannot tell
them apart (rms norm at 4096x4096: a 19.2 us kernel timed 29.2 us in the sweep). For such tasks the
timed executable runs the kernel `calls` times, on `calls` different input sets (identical calls
on the same inputs could be merged by the compiler), in one dispatch; its time over `calls` is
one call's. Which tasks: GPU targets whose roofline floor on the fastest device we know is under
HOST_CALL_S. Interpret mode (a CPU) and TPUs keep one call per dispatch.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from farm.measure import roofline
from farm.measure.timing import Timing
from farm.tasks import TuningTask

HOST_CALL_S = 50e-6       # a dispatch's host time to cover with device work (H200 host: 35-50 us)
MAX_CALLS = 16            # kernel calls per dispatch at most (each needs its own input set)
BATCHED_TARGETS = ("gpu-triton", "gpu-mosaic")
FASTEST = roofline.DATASHEET["h200"]   # a floor on the fastest device we know errs towards batching


def calls_per_dispatch(module: Any, task: TuningTask, interpret: bool) -> int:
    """How many kernel calls the timed executable of `task` makes per dispatch (1: a plain call)."""
    if interpret or task.target not in BATCHED_TARGETS:
        return 1
    floor = roofline.floor_s(module, task.shape, task.dtype, FASTEST) or 0.0
    if floor >= HOST_CALL_S:
        return 1
    return min(MAX_CALLS, math.ceil(HOST_CALL_S / max(floor, HOST_CALL_S / MAX_CALLS)))


def device_clocked(calls: int) -> bool:
    """Whether a task timed with `calls` kernel calls per dispatch is timed on the device clock
    (`farm.measure.device_clock`) where the device has one: the tasks short enough to batch,
    whose wall-clock figure 16 calls a dispatch still leave host-bound below about 10 us."""
    return calls > 1


def repeated(fn: Callable[..., Any], calls: int, n_args: int) -> Callable[..., Any]:
    """A function of `calls` x `n_args` arguments: `fn` on each consecutive group, all outputs.
    Compile it with `compile_options(calls)`, so that its calls run one after another."""
    if calls == 1:
        return fn

    def run(*args: Any) -> tuple[Any, ...]:
        return tuple(fn(*args[i * n_args:(i + 1) * n_args]) for i in range(calls))

    return run


# XLA runs an executable's kernels as a CUDA graph (a command buffer) whose independent nodes
# may overlap: on the H200, 120 of the 127 kernels of 4 dispatches of 16 softmax calls started
# before the one before them ended, and the device clock charged each the contention
# (bench/probes/serialize_probe.py). Without command buffers the kernels run in order on one
# stream (0 of 127 overlapped). An optimization barrier between the calls did not stop it: XLA
# orders the graph by buffers, not by the barrier.
SERIAL_OPTIONS = {"xla_gpu_enable_command_buffer": ""}


def compile_options(calls: int) -> dict[str, str] | None:
    """XLA compile options of an executable of `calls` calls a dispatch: no command buffers, so
    that its kernels run one after another, each timed alone on the device (None for one call)."""
    return dict(SERIAL_OPTIONS) if calls > 1 else None


def grouped_sets(input_sets: Sequence[Sequence[Any]], calls: int) -> list[tuple[Any, ...]]:
    """The arguments of a `repeated` executable: `calls` different input sets per dispatch, rotating.
    Refuses fewer sets than calls (a set twice in one dispatch could be computed once)."""
    if calls == 1:
        return [tuple(s) for s in input_sets]
    if len(input_sets) < calls:
        raise ValueError(f"{calls} calls per dispatch need {calls} different input sets, got "
                         f"{len(input_sets)}")
    n = len(input_sets)
    return [tuple(x for j in range(calls) for x in input_sets[(i * calls + j) % n]) for i in range(n)]


def per_call(t: Timing, calls: int) -> Timing:
    """A timing of dispatches of `calls` kernel calls, as per kernel call (the spread is unchanged)."""
    if calls == 1:
        return t
    return dataclasses.replace(t, median_s=t.median_s / calls, min_s=t.min_s / calls,
                               samples=tuple(s / calls for s in t.samples))
