"""The shipped search spaces (search_spaces/*.yaml), each loaded once per test process, and the
valid configs of a task found as a sweep finds them.

Loading a space checks that its tasks admit configs (up to a second or two a file); the test
modules that build their cases from the shipped spaces at collection share these loads. The
spaces are frozen dataclasses: sharing one cannot leak a change from one test into another.
Tests of loading itself call `farm.search.spaces.load_space`.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from farm.search.spaces import SearchSpace, load_space
from farm.search.valid_set import ValidSet

SPACES = Path(__file__).resolve().parent.parent / "search_spaces"


@functools.cache
def space(name: str) -> SearchSpace:
    """The search space in search_spaces/<name>.yaml."""
    return load_space(SPACES / f"{name}.yaml")


def every_space() -> list[SearchSpace]:
    """Every shipped search space, in file name order."""
    return [space(path.stem) for path in sorted(SPACES.glob("*.yaml"))]


def admitted_configs(space_: SearchSpace, target: str, shape: tuple[int, ...],
                     dtype: str) -> list[dict[str, Any]]:
    """Every config of `space_` valid on the task, found as a sweep finds them: each constraint
    checked once the knobs it reads are set, whole subtrees of the product skipped
    (`ValidSet.enumerate`; test_spaces holds it to checking every config of the product)."""
    found = ValidSet.enumerate(space_.params_for(target), space_.leaf_check(shape, dtype, target),
                               space_.prefix_checks(shape, dtype, target))
    if found is None:  # over the enumeration's bounds: every config of the product, checked
        return [c for c in space_.configs(target) if space_.violated(c, shape, dtype, target) is None]
    return found.configs
