"""Expand search spaces into tuning tasks: kernel x shape x dtype x target."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from farm.errors import FarmError
from farm.search.space_parts import in_space
from farm.search.spaces import SearchSpace
from farm.tasks import TuningTask


@dataclasses.dataclass(frozen=True)
class PlannedTask:
    """A task with the space that defines its configs and its trial budget."""

    task: TuningTask
    space: SearchSpace
    trials: int

    def admits(self, config: Mapping[str, Any]) -> bool:
        """Whether `config` is a point of the task's space (exactly its target's knobs, each set
        to one of its values) that no constraint, nor the kernel, refuses: what its study draws."""
        task = self.task
        return (in_space(config, self.space.params_for(task.target))
                and self.space.violated(config, task.shape, task.dtype, task.target) is None)

    def kernel_takes(self, config: Mapping[str, Any]) -> bool:
        """Whether the kernel runs `config` at the task's shape, dtype and target (`check_config`),
        whatever the space says: a config outside the space that a sweep may still measure."""
        task = self.task
        return self.space.kernel_refusal(config, task.shape, task.dtype, task.target) is None


def expand(spaces: Sequence[SearchSpace], targets: Sequence[str] | None = None,
           trials: int | None = None) -> list[PlannedTask]:
    """Every task of the spaces, limited to `targets` when given; `trials` overrides budgets."""
    planned: dict[str, PlannedTask] = {}
    for space in spaces:
        for target in space.targets:
            if targets and target.name not in targets:
                continue
            for shape in target.shapes:
                for dtype in target.dtypes:
                    task = TuningTask(space.kernel, shape, dtype, target.name)
                    if task.key in planned:
                        raise FarmError(f"{space.path}: task {task.key} is also defined by "
                                        f"{planned[task.key].space.path}; expected each task in one space")
                    planned[task.key] = PlannedTask(task, space, trials or space.trials)
    if not planned:
        wanted = ", ".join(targets or [])
        raise FarmError(f"no tuning tasks: none of the spaces has the target(s) {wanted}")
    return list(planned.values())
