"""What a sweep would do, before any chip is spent: `farm sweep --dry-run`.

For each planned task: its sampler and trial budget, how many configs its space and kernel accept
(the valid set the searcher would enumerate), how many of those fit the memory a worker prunes
against (the static footprint model: never compiled by the sweep), and where the kernel's
default stands. No Ray, no workers, no run folder: spaces, kernels' checks and footprint models only.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import kernels
from farm.measure import capacity as capacity_
from farm.search import pruning, studies
from farm.search.plan import PlannedTask
from farm.search.valid_set import ValidSet
from kernels.protocol import task_default


@dataclasses.dataclass(frozen=True)
class TaskPreview:
    """One task as its sweep would start it."""

    task_key: str
    sampler: str
    trials: int
    valid: int | None        # configs the space and the kernel accept; None: too many to enumerate
    fits: int | None         # of those, configs within `capacity` (None: not counted)
    capacity: str            # what configs are pruned against, in words
    default: dict[str, Any]
    default_note: str        # "in the space", "measured beside the space", or why it is refused or cannot fit

    @property
    def default_runs(self) -> bool:
        """Whether the sweep would measure the kernel's default (the kernel takes it and it fits)."""
        return not self.default_note.startswith(("refused", "does not fit"))

    @property
    def exhausts(self) -> bool:
        """Whether the budget covers every config that could be measured (a search ends early)."""
        counted = self.fits if self.fits is not None else self.valid
        return counted is not None and self.trials >= counted


def capacity_for(target: str, interpret: bool, emulate: str | None) -> tuple[capacity_.Capacity, str]:
    """The capacity a worker would prune `target`'s configs against, and how it was chosen: the
    emulated profile in interpret mode; else the target's usual device's (the sweep's workers then
    read their own device's)."""
    name = emulate or capacity_.DEFAULT_EMULATED.get(target)
    if not name:
        return capacity_.NONE, "no memory model (interpret)"
    cap = capacity_.profile(name)
    said = f"{name}: {cap.onchip_bytes // 1024} KiB {cap.memory}" if cap.onchip_bytes else name
    if interpret:
        return cap, said
    return cap, f"{said} ({'--emulate; ' if emulate else ''}a sweep's workers read their own device)"


def preview(planned: Sequence[PlannedTask], *, interpret: bool = False, emulate: str | None = None,
            sampler: str | None = None, static_pruning: bool = True) -> list[TaskPreview]:
    """A TaskPreview per planned task (enumerating each valid set as the searcher would)."""
    shown = []
    for p in planned:
        task, space = p.task, p.space
        module = kernels.load(task.kernel)
        params = space.params_for(task.target)
        valid = ValidSet.enumerate(params, space.leaf_check(task.shape, task.dtype, task.target),
                                   space.prefix_checks(task.shape, task.dtype, task.target))
        cap, cap_said = capacity_for(task.target, interpret, emulate)
        fits = None
        if valid is not None:
            fits = len(valid) if not static_pruning else sum(
                1 for config in valid.configs
                if pruning.static_verdict(module, config, task.shape, task.dtype, task.target, cap)[1] is None)
        default = task_default(module, task.shape, task.target, task.dtype)
        refusal = space.kernel_refusal(default, task.shape, task.dtype, task.target)
        unfit = None if refusal is not None else pruning.static_verdict(
            module, default, task.shape, task.dtype, task.target, cap)[1]
        if refusal is not None:
            note = f"refused by the kernel: {refusal}"
        elif unfit is not None and (static_pruning or unfit.invalid):
            note = f"does not fit: {unfit.reason}"
        elif p.admits(default):
            note = "in the space"
        else:
            note = "outside the space, measured beside it"
        shown.append(TaskPreview(task.key, studies.sampler_name(p, sampler), p.trials,
                                 None if valid is None else len(valid), fits, cap_said, default, note))
    return shown
