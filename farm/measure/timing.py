"""Time device work, not Python dispatch.

Each sample times back-to-back calls with a single `block_until_ready` at the end, so that
launches are queued and dispatch overlaps device work; `calls` is chosen so that a sample
lasts at least `min_sample_s`. A sample's clock also holds costs paid once per sample (the
first launch onto an idle device, the final wait): against a CUPTI trace of the same samples
on the H200 they added 7-15% to JAX calls of 0.2-2.5 ms at 5 ms samples (bench/seed_table.py
--check). So each measurement is a pair, `calls` and `2 * calls` calls, and the per-call time
is their difference over `calls`: the once-per-sample costs cancel. Inputs rotate through
several sets so that repeated calls do not all hit in cache.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

WALL = "wall"
DEVICE = "device"


@dataclasses.dataclass(frozen=True)
class Timing:
    """Per-call times in seconds: the median and spread of the samples."""

    median_s: float
    min_s: float
    spread: float  # (p75 - p25) / median
    samples: tuple[float, ...]
    calls_per_sample: int  # calls in the shorter sample of each pair
    cut_short: bool = False  # stopped after RACE_SAMPLES samples: slower than the cutoff it was given
    disturbed_pairs: int = 0  # pairs whose two samples disagree (`consistent_pair`)
    clock: str = WALL         # WALL: paired queued calls on the host's clock; DEVICE: kernel durations
    #                           from a trace (`farm.measure.device_clock`)

    @property
    def disturbed(self) -> bool:
        """Whether something outside the timed calls held them up: samples spread over more than
        DISTURBED_SPREAD of their median, more than one pair in five whose samples disagree, or
        any such pair in a timing cut short (its verdict rests on two samples). Measured on the
        H200 while other configs compiled on its host: samples 3-70 times too slow, spreads of
        0.3-12 (0.01-0.15 with nothing compiling, where a pair in ten may still disagree)."""
        pairs = len(self.samples)
        return (self.spread > DISTURBED_SPREAD or self.disturbed_pairs * 5 > pairs
                or (self.cut_short and self.disturbed_pairs > 0))


def run_sample(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], calls: int) -> float:
    """One sample: `calls` queued calls, inputs rotating, one wait at the end; seconds per call."""
    start = time.perf_counter()
    out = None
    for i in range(calls):
        out = fn(*input_sets[i % len(input_sets)])
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls


# T(2n) / T(n) of an undisturbed pair: 2, less the once-per-sample costs' share (7-15% of a 5 ms
# sample on the H200: about 1.75-1.9). A host stall in one sample moves it out of this range.
PAIR_RATIO = (1.5, 2.2)
DISTURBED_SPREAD = 0.25


def consistent_pair(short_s: float, long_s: float) -> bool:
    """Whether a pair's samples (seconds in all: `n` calls, then `2 n`) agree: T(2n) / T(n) in PAIR_RATIO."""
    return short_s > 0 and PAIR_RATIO[0] <= long_s / short_s <= PAIR_RATIO[1]


def timed_pair(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], calls: int) -> tuple[float, bool]:
    """Seconds per call from a `calls` sample and a `2 * calls` sample, (T(2n) - T(n)) / n, and
    whether the two samples agree (`consistent_pair`)."""
    short = run_sample(fn, input_sets, calls) * calls
    long = run_sample(fn, input_sets, 2 * calls) * 2 * calls
    difference = (long - short) / calls
    per_call = difference if difference > 0 else long / (2 * calls)   # noise larger than the work
    return per_call, consistent_pair(short, long)


def pair_per_call(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], calls: int) -> float:
    """Seconds per call from a `calls` sample and a `2 * calls` sample: (T(2n) - T(n)) / n."""
    return timed_pair(fn, input_sets, calls)[0]


def calibrate(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], *, min_sample_s: float,
              max_calls: int = 1000, warmup: int = 2) -> tuple[int, float]:
    """Calls per sample so that a sample lasts at least `min_sample_s`, and one call's time alone.

    One call's time holds a launch and a wait (about 0.1-0.3 ms on a GPU), far more than a small
    kernel, so the first estimate is refined with a sample of that many calls: samples of a 30 us
    kernel then hold about `min_sample_s / 30 us` calls, enough that the host runs well ahead of
    the device and a short host stall does not leave the device idle.
    """
    once = min(run_sample(fn, input_sets, 1) for _ in range(max(1, warmup)))
    calls = max(1, min(max_calls, math.ceil(min_sample_s / max(once, 1e-9))))
    if calls < max_calls:
        per_call = run_sample(fn, input_sets, calls)
        calls = max(1, min(max_calls, math.ceil(min_sample_s / max(per_call, 1e-9))))
    return calls, once


RACE_SAMPLES = 2   # samples a config must take, all slower than its cutoff, to be cut short


def time_calls(fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]], *, warmup: int = 2,
               repetitions: int = 10, min_sample_s: float = 2e-3, max_calls: int = 1000,
               budget_s: float | None = None, cutoff_s: float | None = None) -> Timing:
    """Median per-call time of `fn` over `repetitions` sample pairs, after `warmup` calls.

    `budget_s`: fewer repetitions (at least 3) where that many would take longer. `cutoff_s`: a
    time that cannot win (a multiple of the best so far); when each of the first RACE_SAMPLES
    samples is slower, timing stops there (`cut_short`): a config that loses clearly costs a few
    calls, not `repetitions` pairs of them.
    """
    calls, once = calibrate(fn, input_sets, min_sample_s=min_sample_s, max_calls=max_calls, warmup=warmup)
    if budget_s is not None:  # shrink repetitions rather than overrun the time limit
        repetitions = max(3, min(repetitions, int(budget_s / max(3 * once * calls, 1e-9))))
    samples: list[float] = []
    cut = False
    disturbed = 0
    for _ in range(repetitions):
        per_call, consistent = timed_pair(fn, input_sets, calls)
        samples.append(per_call)
        disturbed += not consistent
        if cutoff_s is not None and len(samples) == RACE_SAMPLES and min(samples) > cutoff_s:
            cut = True
            break
    return summarize(samples, calls, cut_short=cut, disturbed_pairs=disturbed)


def summarize(samples: Sequence[float], calls_per_sample: int, **fields: Any) -> Timing:
    """A Timing of per-call `samples` (seconds): their median, minimum and spread; `fields` sets the rest."""
    values = sorted(samples)
    median = statistics.median(values)
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [median, median, median]
    return Timing(median, values[0], (q[2] - q[0]) / median if median > 0 else 0.0, tuple(values),
                  calls_per_sample, **fields)


def time_side_by_side(fns: dict[str, Callable[..., Any]], input_sets: Sequence[Sequence[Any]], *,
                      repetitions: int = 10, min_sample_s: float = 5e-3, max_calls: int = 1000) -> dict[str, Timing]:
    """Time several functions of the same inputs in one run, samples interleaved round robin.

    Interleaving puts every contender under the same clocks, temperature and background load.
    """
    calls = {name: calibrate(fn, input_sets, min_sample_s=min_sample_s, max_calls=max_calls)[0]
             for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repetitions):
        for name, fn in fns.items():
            samples[name].append(pair_per_call(fn, input_sets, calls[name]))
    return {name: summarize(values, calls[name]) for name, values in samples.items()}
