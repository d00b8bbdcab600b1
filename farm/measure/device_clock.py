"""A device clock for short GPU kernels: kernel durations from a CUPTI trace of the timed calls.

Below about 10 us a kernel is launched slower than the GPU runs it: XLA's runtime spends a few
microseconds of host time per kernel launch, even with 16 calls in one dispatch
(`farm.measure.dispatch`), so a wall clock times the host. On the H200, softmax at 3x50257 timed
9.0 us a call on the wall clock for a 3.0 us kernel, and layer norm at 4x16384 23.2 us for
5.3 us (bench/probes/dispatch_flags.py), and the search kept configs 1.6-2.8x slower on the
device than the one it missed. This clock runs the timed dispatches under XLA's own profiler
(CUPTI; no other library) and reads each dispatch's kernel durations from the trace: the time
the GPU spent in the kernels, whatever the host did between them.

Durations only: the gaps between a call's kernels are not counted (a config of two kernels is
charged their two durations, not the launch between them). A trace that does not show the
kernels it should (another CUPTI subscriber, a platform without the tracer) gives no figure, and
the caller falls back to the wall clock.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax

from farm.measure import timing
from farm.measure.timing import Timing

logger = logging.getLogger(__name__)

GPU_PLANE = "/device:GPU:"           # XSpace planes of GPU devices (one per device)
STREAM_LINE = "Stream #"             # a plane's lines of work on one CUDA stream
KERNEL_STAT = "kernel_details"       # a stat CUPTI's collector puts on kernel events only
NOT_KERNELS = ("Memcpy", "Memset")   # copies and fills on a stream: not kernel time


@dataclasses.dataclass(frozen=True)
class KernelSpan:
    """One kernel the device ran: its name and start and end on the trace's clock (ns)."""

    name: str
    start_ns: float
    end_ns: float

    @property
    def seconds(self) -> float:
        """The kernel's duration in seconds."""
        return (self.end_ns - self.start_ns) * 1e-9


def kernel_spans(profile: Any) -> list[KernelSpan]:
    """Every kernel on a GPU stream of a trace (`jax.profiler.ProfileData`), in start order.

    Copies and fills are left out; an event the trace shows twice (on two lines) counts once."""
    seen: set[tuple[str, float, float]] = set()
    for plane in profile.planes:
        if not plane.name.startswith(GPU_PLANE):
            continue
        for line in plane.lines:
            if not line.name.startswith(STREAM_LINE):
                continue
            for event in line.events:
                stats = {name for name, _ in event.stats}
                if KERNEL_STAT in stats or not event.name.startswith(NOT_KERNELS):
                    seen.add((event.name, event.start_ns, event.end_ns))
    return sorted((KernelSpan(*s) for s in seen), key=lambda s: (s.start_ns, s.end_ns))


def per_dispatch_seconds(spans: Sequence[KernelSpan], dispatches: int) -> list[float] | None:
    """Each dispatch's kernel seconds: the spans, in start order, cut into `dispatches` equal groups
    (a dispatch launches the same kernels each time). None when they do not divide evenly: the
    trace holds kernels of something else, or misses some."""
    if dispatches <= 0 or not spans or len(spans) % dispatches:
        return None
    per = len(spans) // dispatches
    return [sum(s.seconds for s in spans[i * per:(i + 1) * per]) for i in range(dispatches)]


def _options() -> Any:
    """Profiler options for device activity only: no host or Python events, no HLO of every
    executable of the process in the trace."""
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 0
    options.python_tracer_level = 0
    options.enable_hlo_proto = False
    options.raise_error_on_start_failure = True
    return options


@contextlib.contextmanager
def profiles() -> Iterator[list[Any]]:
    """Trace this process while the block runs (`jax.profiler.start_trace` into a temporary
    folder); the list it yields holds the trace (`jax.profiler.ProfileData`, one per file) once
    the block ends. Raises RuntimeError where no trace can be started (another one running)."""
    found: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="farm-trace-") as folder:
        jax.profiler.start_trace(folder, profiler_options=_options())
        try:
            yield found
        finally:
            jax.profiler.stop_trace()
        found.extend(jax.profiler.ProfileData.from_file(str(path))
                     for path in sorted(Path(folder).rglob("*.xplane.pb")))


@contextlib.contextmanager
def traced() -> Iterator[list[KernelSpan]]:
    """Trace the device while the block runs (`profiles`); the list it yields holds the kernels,
    in start order, once the block ends."""
    spans: list[KernelSpan] = []
    with profiles() as found:
        yield spans
    spans.extend(span for profile in found for span in kernel_spans(profile))
    spans.sort(key=lambda s: (s.start_ns, s.end_ns))


def run_dispatches(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], dispatches: int,
                   first: int = 0) -> None:
    """`dispatches` queued calls of `fn`, inputs rotating from set `first`, one wait at the end."""
    out = None
    for i in range(dispatches):
        out = fn(*input_sets[(first + i) % len(input_sets)])
    jax.block_until_ready(out)


def _traced_dispatches(queue: Callable[[], int]) -> list[float] | None:
    """Each dispatch's kernel seconds from one trace of `queue` (which queues dispatches and says
    how many); None where the trace cannot be taken or does not show them (`per_dispatch_seconds`)."""
    try:
        with traced() as spans:
            dispatches = queue()
    except RuntimeError as err:
        logger.warning("no device trace: %s", err)
        return None
    return per_dispatch_seconds(spans, dispatches)


def dispatch_seconds(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], dispatches: int,
                     ) -> list[float] | None:
    """Each of `dispatches` queued calls' kernel seconds, from one trace; None where the trace does
    not show them (see `per_dispatch_seconds`) or cannot be taken."""
    def queue() -> int:
        run_dispatches(fn, input_sets, dispatches)
        return dispatches

    return _traced_dispatches(queue)


def sustained_seconds(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], sustain_s: float,
                      ) -> float | None:
    """Kernel seconds per dispatch of `fn` run back to back for at least `sustain_s` under one trace:
    the median over the dispatches of the span's second half (None: no trace, as above)."""
    batch = max(1, len(input_sets))

    def queue() -> int:
        done, start = 0, time.perf_counter()
        while done < 2 or time.perf_counter() - start < sustain_s:
            run_dispatches(fn, input_sets, batch, first=done)
            done += batch
        return done

    values = _traced_dispatches(queue)
    return None if values is None else statistics.median(values[len(values) // 2:])


def time_on_device(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], *, samples: int,
                   warmup: int = 2) -> Timing | None:
    """Per-dispatch kernel seconds of `fn` over `samples` queued dispatches, inputs rotating, after
    `warmup` untraced ones, as a Timing on the DEVICE clock (one sample per dispatch); None where
    the trace does not show them."""
    run_dispatches(fn, input_sets, max(1, warmup))
    values = dispatch_seconds(fn, input_sets, max(2, samples))
    return None if values is None else timing.summarize(values, 1, clock=timing.DEVICE)


@functools.cache
def available() -> bool:
    """Whether this process's first device is a GPU whose kernels a trace shows (checked once, on
    a small XLA kernel: two dispatches must show as two equal groups of kernels)."""
    device = jax.devices()[0]
    if device.platform != "gpu":
        return False
    x = jax.numpy.ones((1024,), jax.numpy.float32)
    probe = jax.jit(lambda a: a * 2.0 + 1.0)
    jax.block_until_ready(probe(x))
    seconds = dispatch_seconds(probe, [(x,)], 2)
    if seconds is None:
        logger.warning("the device trace shows no kernels on %s: timing on the wall clock", device.device_kind)
    return seconds is not None and all(s > 0 for s in seconds)
