"""Each kernel's default config is a point of its search spaces, so a sweep measures it first."""
from __future__ import annotations

from pathlib import Path

import pytest

import kernels
from farm.search import spaces

REPO = Path(__file__).resolve().parent.parent
CASES = [(space, target.name, shape, target.dtypes[0])
         for space in spaces.load_spaces(sorted((REPO / "search_spaces").glob("*.yaml")))
         for target in space.targets for shape in target.shapes]


@pytest.mark.parametrize("space,target,shape,dtype", CASES,
                         ids=[f"{Path(c[0].path).stem}-{c[1]}-{'x'.join(map(str, c[2]))}" for c in CASES])
def test_default_config_is_in_the_space(space, target, shape, dtype):
    default = kernels.load(space.kernel).default_config(shape, target)
    params = space.params_for(target)
    assert set(default) == {p.name for p in params}, f"knobs differ: {sorted(default)}"
    for p in params:
        assert default[p.name] in p.choices, f"{p.name}={default[p.name]!r} is not one of {p.choices}"
    assert space.violated(default, shape, dtype, target) is None
