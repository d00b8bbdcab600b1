"""Winners that are not noise: re-time a task's best few configs side by side before one is written.

A sweep times each config once, briefly, on one input set, so its single fastest median may be
luck (a quiet moment, inputs that stayed in cache). `retime` runs the finalists in the same
process, interleaved round robin (each round one sample pair of each, so all see the same
clocks and load), on input sets rotated past the caches (ROTATE_PAST_BYTES of inputs per pass),
until their order is settled or the budget ends. A median below the roofline floor
(`farm.measure.roofline`) is a measurement error: its samples are dropped and it is measured
again, and if it stays below, it is marked and can never win.

Short interleaved samples time each finalist in bursts. On the H200 a compute-bound kernel at the
power cap runs slower sustained than in bursts, and not every kernel by as much: the farm's
Mosaic GPU matmul ran 9.8% slower sustained, torch's 0.9% (BENCHMARKS.md, 2026-12-02). With
`sustain_s`, each round's sample of a finalist is instead taken from that many seconds of its
calls back to back (the median of the pairs in the second half, once the clocks have settled to
the load): the ranking of a training step's regime, at sustain_s seconds a sample.

Finalists short enough to be batched several calls a dispatch (`farm.measure.dispatch`) are
re-timed on the device clock where the device has one (`farm.measure.device_clock`): a sample is
the median kernel time of DEVICE_DISPATCHES dispatches under one trace, as in the sweep.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

from farm.measure import device_clock, dispatch, timing

ROTATE_PAST_BYTES = 128 << 20   # twice the largest last-level cache of the devices we target (H200: 50 MB)
MAX_INPUT_SETS = 16
MIN_SAMPLES = 6  # samples of every finalist before the order may be settled
DEVICE_DISPATCHES = 8   # dispatches behind one sample on the device clock (their median)


@dataclasses.dataclass(frozen=True)
class FinalTiming:
    """One finalist's side-by-side re-timing."""

    task_key: str
    config: str                    # canonical JSON
    median_s: float | None
    spread: float | None           # (p75 - p25) / median
    min_s: float | None
    n_timed: int
    input_sets: int
    floor_s: float | None          # the roofline floor; a median below it is never a winner
    below_floor: bool
    finalists: int                 # how many configs were re-timed together
    rounds: int
    settled: bool                  # the leader's order was settled before the budget ended
    error: str | None = None
    sustain_s: float = 0.0         # seconds of back-to-back calls behind each sample (0: one sample pair)
    clock: str = timing.WALL       # the samples' clock (`farm.measure.timing.Timing.clock`)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (a line of finalists.jsonl)."""
        return dataclasses.asdict(self)


def rotation_sets(bytes_per_set: int) -> int:
    """Input sets to rotate through so that one pass reads at least ROTATE_PAST_BYTES."""
    return max(1, min(MAX_INPUT_SETS, math.ceil(ROTATE_PAST_BYTES / max(1, bytes_per_set))))


def _stats(samples: Sequence[float]) -> tuple[float, float, float]:
    values = sorted(samples)
    median = statistics.median(values)
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [median] * 3
    return median, (q[2] - q[0]) / median if median > 0 else 0.0, values[0]


def median_error(values: Sequence[float]) -> float:
    """The standard error of the median of `values`, relative to it (from the interquartile range:
    sigma ~ IQR / 1.349, and the median's error ~ 1.2533 sigma / sqrt(n)); inf under 2 values."""
    if len(values) < 2:
        return math.inf
    median, spread, _ = _stats(values)
    return 1.2533 * spread / 1.349 / math.sqrt(len(values)) if median > 0 else math.inf


def settled(samples: dict[str, list[float]], tie: float = 0.01) -> bool:
    """Whether the leader is known: against every other config, either the leader's p75 is below
    the other's p25, or their medians are within `tie` and both medians are known that well (their
    standard errors within `tie`: then either is as good). Noisy medians within `tie` are a tie of
    noise, not of speed, and are not settled."""
    if len(samples) < 2:
        return True
    ranked = sorted(samples, key=lambda name: statistics.median(samples[name]))
    leader = samples[ranked[0]]
    lead, lead_error = statistics.median(leader), median_error(leader)
    lq = statistics.quantiles(leader, n=4) if len(leader) >= 2 else [leader[0]] * 3
    for name in ranked[1:]:
        other = samples[name]
        oq = statistics.quantiles(other, n=4) if len(other) >= 2 else [other[0]] * 3
        if lq[2] < oq[0]:
            continue
        if statistics.median(other) <= lead * (1 + tie) and max(lead_error, median_error(other)) <= tie:
            continue
        return False
    return True


def sustained_per_call(fn: Any, input_sets: Sequence[Sequence[Any]], calls: int, sustain_s: float) -> float:
    """Seconds per call of `fn` run back to back for at least `sustain_s`: sample pairs until then
    (at least two), and the median of those that ended in the second half of the span."""
    values: list[tuple[float, float]] = []
    start = time.perf_counter()
    while len(values) < 2 or values[-1][0] < sustain_s:
        per_call = timing.pair_per_call(fn, input_sets, calls)
        values.append((time.perf_counter() - start, per_call))
    return statistics.median(v for ended, v in values if ended >= sustain_s / 2)


class _NoTrace(Exception):
    """A device-clock sample the trace did not show: the finalists are timed on the wall clock."""


def _sample(fn: Any, input_sets: Sequence[Sequence[Any]], calls: int, sustain_s: float, clock: str) -> float:
    """One sample of `fn`, seconds per dispatch, on `clock` (`calls`: per wall-clock sample)."""
    if clock == timing.DEVICE:
        if sustain_s > 0:
            value = device_clock.sustained_seconds(fn, input_sets, sustain_s)
        else:
            values = device_clock.dispatch_seconds(fn, input_sets, DEVICE_DISPATCHES)
            value = None if values is None else statistics.median(values)
        if value is None:
            raise _NoTrace
        return value
    return (sustained_per_call(fn, input_sets, calls, sustain_s) if sustain_s > 0
            else timing.pair_per_call(fn, input_sets, calls))


def retime(task_key: str, fns: dict[str, Any], input_sets: Sequence[Sequence[Any]], *, floor_s: float | None,
           min_samples: int = MIN_SAMPLES, max_samples: int = 30, budget_s: float = 10.0,
           min_sample_s: float = 5e-3, calls: int = 1, sustain_s: float = 0.0,
           clock: str = timing.WALL) -> list[FinalTiming]:
    """Re-time `fns` (config JSON -> compiled callable) side by side; one FinalTiming each.
    `calls`: kernel calls each callable makes per dispatch (`farm.measure.dispatch`); the
    results are per kernel call, on the device clock where `dispatch.device_clocked` says so and
    the device has one. `sustain_s` > 0: each sample from that many seconds of a finalist's
    calls back to back (`sustained_per_call`), not from one sample pair."""
    if calls > 1:
        device = dispatch.device_clocked(calls) and device_clock.available()
        results = retime(task_key, fns, dispatch.grouped_sets(input_sets, calls),
                         floor_s=None if floor_s is None else floor_s * calls, min_samples=min_samples,
                         max_samples=max_samples, budget_s=budget_s, min_sample_s=min_sample_s,
                         sustain_s=sustain_s, clock=timing.DEVICE if device else timing.WALL)
        return [dataclasses.replace(
            t, median_s=None if t.median_s is None else t.median_s / calls,
            min_s=None if t.min_s is None else t.min_s / calls, floor_s=floor_s,
            input_sets=len(input_sets)) for t in results]
    started = time.perf_counter()
    if clock == timing.DEVICE:
        for fn in fns.values():
            device_clock.run_dispatches(fn, input_sets, 2)   # warm-up, untraced
        per_sample = {name: 1 for name in fns}
    else:
        per_sample = {name: timing.calibrate(fn, input_sets, min_sample_s=min_sample_s)[0]
                      for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    below: set[str] = set()
    retried: set[str] = set()
    rounds = 0
    while True:
        rounds += 1
        for name, fn in fns.items():
            try:
                samples[name].append(_sample(fn, input_sets, per_sample[name], sustain_s, clock))
            except _NoTrace:
                return retime(task_key, fns, input_sets, floor_s=floor_s, min_samples=min_samples,
                              max_samples=max_samples, budget_s=max(0.0, budget_s - (time.perf_counter() - started)),
                              min_sample_s=min_sample_s, sustain_s=sustain_s)
        n = min(len(s) for s in samples.values())
        if n < min_samples:
            continue
        for name in list(fns):
            if floor_s is not None and statistics.median(samples[name]) < floor_s and name not in below:
                if name in retried:
                    below.add(name)        # below the floor twice: a measurement error, never a winner
                else:
                    retried.add(name)      # drop its samples and measure it again
                    samples[name] = []
        contenders = {k: v for k, v in samples.items() if k not in below and len(v) >= min_samples}
        done = settled(contenders) and len(contenders) == len(fns) - len(below)
        if done or n >= max_samples or time.perf_counter() - started > budget_s:
            break
    results = []
    for name, values in samples.items():
        if not values:
            results.append(FinalTiming(task_key, name, None, None, None, 0, len(input_sets), floor_s, True,
                                       len(fns), rounds, False, "no samples", sustain_s, clock))
            continue
        median, spread, low = _stats(values)
        results.append(FinalTiming(task_key, name, median, spread, low, len(values), len(input_sets), floor_s,
                                   name in below, len(fns), rounds, done, None, sustain_s, clock))
    return results


def winner(timings: Sequence[FinalTiming]) -> FinalTiming | None:
    """The fastest finalist that is not below its floor (None when none qualifies)."""
    fair = [t for t in timings if t.median_s is not None and not t.below_floor]
    return min(fair, key=lambda t: (t.median_s, t.spread or 0.0)) if fair else None
