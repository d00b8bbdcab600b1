"""Shared checks for the row-wise kernels (softmax, norms): numerics, lowering, config choice."""
from __future__ import annotations

from types import ModuleType
from typing import Any

from tests.memory_bound_checks import (
    DTYPES,
    LOWERING_PLATFORM,
    assert_matches,
    largest_config,
    lower_for_device,
    named_configs,
)
from tests.shipped_spaces import space

# The test shape and configs the 2-D row-wise kernels share (a kernel may replace a target's list).
SHAPE = (16, 384)  # three 128-column blocks; padded to 512 on Triton
RAGGED = (13, 200)  # Triton: neither rows nor columns fill a power-of-two block
# Triton split_cols: a row's chunks over programs (SHAPE: 3 chunks; RAGGED: a ragged last chunk
# and a ragged last block of rows).
SPLIT_COLS = {"block_rows": 2, "strategy": "split_cols", "block_cols": 128}
CONFIGS = {
    "interpret": [{"block_rows": 8, "strategy": "fori_loop", "block_cols": 128},
                  {"block_rows": 16, "strategy": "grid", "block_cols": 128}],
    "tpu": [{"block_rows": 16, "strategy": "one_pass", "buffers": 1},
            {"block_rows": 16, "strategy": "fori_loop", "block_cols": 128},
            {"block_rows": 16, "strategy": "grid", "block_cols": 128},
            {"block_rows": 16, "strategy": "emit_pipeline", "block_cols": 128, "buffers": 3}],
    "gpu-triton": [{"block_rows": 4, "strategy": "one_pass", "num_warps": 4, "num_stages": 1},
                   {"block_rows": 2, "strategy": "fori_loop", "block_cols": 128, "rows_per_program": 8},
                   {"block_rows": 1, "strategy": "fori_loop", "block_cols": 128, "unroll": 1},
                   SPLIT_COLS],
}
# Triton's per-lane fold (kernels with a `LaneFold`): ragged chunks too (384 = 3 x 128 on SHAPE,
# 200 = 128 + 72 on RAGGED).
LANE_FOLD = {"block_rows": 2, "strategy": "fori_loop", "block_cols": 128, "rows_per_program": 8,
             "fold": "lanes"}


def with_lane_fold(configs: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """`configs` with the lane fold added to the gpu-triton list."""
    return {**configs, "gpu-triton": [*configs["gpu-triton"], LANE_FOLD]}


def seed_shape(kernel: str) -> tuple[int, ...]:
    """The first shape the kernel's search space tunes on TPU."""
    return next(t.shapes[0] for t in space(kernel).targets if t.name == "tpu")


def numerics_cases(module: ModuleType, shape: tuple[int, ...],
                   explicit: dict[str, list[dict[str, Any]]]) -> list[Any]:
    """pytest params (target, dtype, config): the default, the largest valid and `explicit`."""
    import pytest

    cases = []
    for target, configs in explicit.items():
        for dtype in DTYPES:
            cases += [pytest.param(target, dtype, c, id=f"{target}-{dtype}-{name}")
                      for name, c in named_configs(space(module.NAME), module, target, shape, dtype, configs)]
    return cases


def lowering_cases(module: ModuleType, shape: tuple[int, ...],
                   explicit: dict[str, list[dict[str, Any]]]) -> list[Any]:
    """pytest params (target, dtype, shape, config) for the device targets: the numerics
    cases' configs, and the default and largest valid config on the seed shape (bfloat16)."""
    import pytest

    cases = [p for p in numerics_cases(module, shape, explicit) if p.values[0] in LOWERING_PLATFORM]
    cases = [pytest.param(t, d, shape, c, id=p.id) for p in cases for t, d, c in [p.values]]
    seed = seed_shape(module.NAME)
    for target in (t for t in explicit if t in LOWERING_PLATFORM):
        for name, config in (("default", module.default_config(seed, target)),
                             ("largest", largest_config(space(module.NAME), module, target, seed, "bfloat16"))):
            cases.append(pytest.param(target, "bfloat16", seed, config,
                                      id=f"{target}-seed-{name}"))
    return cases


def kernel_checks(module: ModuleType, shape: tuple[int, ...], ragged: tuple[int, ...],
                  configs: dict[str, list[dict[str, Any]]]) -> tuple[Any, Any, Any]:
    """The three checks every row-wise kernel gets, as pytest test functions.

    Assign them to `test_*` names in the kernel's test module: numerics of the default, the
    largest and `configs` per target and dtype; Triton masking of a ragged shape; lowering
    for the device targets at the test and seed shapes.
    """
    import pytest

    @pytest.mark.parametrize("target,dtype,config", numerics_cases(module, shape, configs))
    def matches_reference(target: str, dtype: str, config: dict) -> None:
        assert_matches(module, config, shape, dtype, target)

    @pytest.mark.parametrize("config", configs["gpu-triton"])
    def triton_masks_ragged_rows_and_columns(config: dict) -> None:
        assert_matches(module, config, ragged, "bfloat16", "gpu-triton")

    @pytest.mark.parametrize("target,dtype,shape,config", lowering_cases(module, shape, configs))
    def lowers_for_device(target: str, dtype: str, shape: tuple, config: dict) -> None:
        assert lower_for_device(module, config, shape, dtype, target)

    return matches_reference, triton_masks_ragged_rows_and_columns, lowers_for_device
