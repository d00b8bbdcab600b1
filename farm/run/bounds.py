"""The bounds of a sweep's settings, checked however they arrive: flags, a resumed run's
sweep.json (a file anyone may have edited), or a program's `SweepSettings`.

Each bound keeps a sweep finite and its memory bounded (100 million rotating input sets grew a
worker by 65 MB/s; a timeout of `inf` failed every trial inside `concurrent.futures`); a breach is
one FarmError naming the flag, the setting and what was expected.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from farm.errors import FarmError, show
from farm.measure.capacity import profiles
from farm.search.space_parts import SAMPLERS

DAY_S = 86400.0


class Bound(NamedTuple):
    """A setting's type ("int", "float" or "bool"), its least and greatest value, whether None is
    allowed, and its flag."""

    kind: str
    low: float = 0
    high: float = 0
    optional: bool = False
    flag: str = ""


BOUNDS: Mapping[str, Bound] = {
    "interpret": Bound("bool", flag="--interpret"),
    "workers": Bound("int", 1, 4096, True, "--workers"),
    "depth": Bound("int", 1, 256, True, "--depth"),
    "compile_processes": Bound("int", 0, 64, True, "--compile-processes"),
    "seed": Bound("int", -(2 ** 63), 2 ** 63 - 1, True, "--seed"),
    "repetitions": Bound("int", 1, 1000, flag="--repetitions"),
    "sample_budget_s": Bound("float", 0, 3600, True, "--sample-budget"),
    "race": Bound("float", 1e-12, 1e6, True, "--race"),
    "input_sets": Bound("int", 1, 64, flag="--input-sets"),
    "compile_timeout_s": Bound("float", 1e-3, DAY_S, flag="--compile-timeout"),
    "timing_timeout_s": Bound("float", 1e-3, DAY_S, flag="--timing-timeout"),
    "max_attempts": Bound("int", 1, 100, flag="--max-attempts"),
    "finalists": Bound("int", 0, 256, True, "--finalists"),
    "finalist_budget_s": Bound("float", 0, 3600),
    "finalist_sustain_s": Bound("float", 0, 600, flag="--finalist-sustain"),
    "static_pruning": Bound("bool"),
    "runnable_only": Bound("bool"),
    "time_budget_s": Bound("float", 0, 366 * DAY_S, True, "--time-budget"),
    "scale_up": Bound("int", 1, 4096, True, "--scale-up"),
    "scale_up_wait_s": Bound("float", 0, DAY_S, flag="--scale-up-wait"),
}


def _fits(value: Any, bound: Bound) -> bool:
    if value is None:
        return bound.optional
    if bound.kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float) if bound.kind == "float" else int):
        return False
    return math.isfinite(value) and bound.low <= value <= bound.high


def check_settings(values: Mapping[str, Any]) -> None:
    """A FarmError for the first setting out of its bounds (BOUNDS), its sampler or its capacity
    profile unknown, or node labels and warm starts of the wrong shape."""
    for name, bound in BOUNDS.items():
        if name in values and not _fits(values[name], bound):
            what = {"bool": "true or false", "int": "an integer", "float": "a finite number"}[bound.kind]
            if bound.kind != "bool":
                what += f" from {bound.low:g} to {bound.high:g}"
            label = f"{bound.flag} ({name})" if bound.flag else name
            raise FarmError(f"{label}: expected {what}{' or none' if bound.optional else ''}, got "
                            f"{show(values[name])}")
    if values.get("sampler") is not None and values["sampler"] not in SAMPLERS:
        raise FarmError(f"--sampler (sampler): expected one of {', '.join(SAMPLERS)}, got {show(values['sampler'])}")
    if values.get("emulate") is not None and values["emulate"] not in profiles():
        raise FarmError(f"--emulate (emulate): expected one of {', '.join(profiles())}, got {show(values['emulate'])}")
    labels = values.get("node_labels", {})
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise FarmError(f"--node-label (node_labels): expected KEY=VALUE labels, got {show(labels)}")
    warm = values.get("warm_start", {})
    if not isinstance(warm, dict) or not all(isinstance(v, list) for v in warm.values()):
        raise FarmError(f"warm_start: expected task key -> a list of configs, got {show(warm)}")
