"""Warm starts for a new sweep from a bundle (`farm sweep --warm-start BUNDLE`): each task is
first measured at the configs the bundle tuned for it or for its nearest shapes.

A deployment of the bundle runs the first of them for the task (`farm.deploy.registry`: the
exact row, else the nearest within NEAREST_MAX_DISTANCE, the first the kernel takes), so a
sweep that measures it first (outside its study where the task's space leaves it out) ends with
a winner at least as fast as what the deployment ran, whatever its budget; and a shape near a
tuned one starts its search near that one's winner.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from farm.deploy.registry import NEAREST_MAX_DISTANCE, log_distance
from farm.retune.planning import Previous, measurable
from farm.search.plan import PlannedTask
from farm.tasks import json_object

SEEDS = 3   # configs a task is warm-started with: those of its exact and nearest tuned shapes


@dataclasses.dataclass(frozen=True)
class Seeds:
    """Each task's configs to measure first, and how many of them its space leaves out (measured
    outside its study)."""

    configs: dict[str, list[dict[str, Any]]]
    outside: dict[str, int]


def nearest_seeds(previous: Previous, planned: Sequence[PlannedTask], limit: int = SEEDS) -> Seeds:
    """For each task, the `ok` winners of `previous` for the same kernel, dtype and target at the
    nearest shapes (the task's own first; log2 distance at most NEAREST_MAX_DISTANCE; ties to the
    smaller shape, then the newest row, as the runtime chooses), those the kernel takes at the
    task's shape (`planning.measurable`; the runtime skips the others too), at most `limit`
    distinct ones. Tasks with none are left out of `configs`."""
    by_group: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for row in previous.rows:
        if row.get("status") == "ok" and row.get("config") and row.get("shape"):
            by_group.setdefault((row["kernel"], row["dtype"], row["target"]), []).append(row)
    seeds: dict[str, list[dict[str, Any]]] = {}
    outside: dict[str, int] = {}
    for p in planned:
        task = p.task
        near = [(log_distance(row["shape"], task.shape), row) for row in by_group.get((task.kernel, task.dtype,
                                                                                        task.target), ())
                if len(row["shape"]) == len(task.shape) and min(row["shape"]) > 0]
        near = [(d, row) for d, row in near if d <= NEAREST_MAX_DISTANCE]
        near.sort(key=lambda item: str(item[1].get("created") or ""), reverse=True)
        near.sort(key=lambda item: (item[0], tuple(item[1]["shape"])))   # the runtime's order (`Registry`)
        configs: list[dict[str, Any]] = []
        for _, row in near:
            config = json_object(row["config"])
            if config is None or config in configs or not measurable(p, config):
                continue
            configs.append(config)
            if len(configs) >= limit:
                break
        if configs:
            seeds[task.key] = configs
        left_out = sum(not p.admits(c) for c in configs)
        if left_out:
            outside[task.key] = left_out
    return Seeds(seeds, outside)
