"""welford: per-row mean and variance on every target, in interpret mode, plus TPU/Triton lowering."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from farm.measure import validate
from kernels import rows, welford
from kernels.lowering import Platform
from tests import memory_bound_checks as checks
from tests import shipped_spaces

SPACE = shipped_spaces.space("welford")
# interpret: partial row blocks; gpu-triton: odd sizes (padding, masks); tpu: lane-dense room.
SHAPES = {"interpret": (40, 384), "gpu-triton": (37, 300), "tpu": (256, 512)}
EXPLICIT = {
    "interpret": [
        {"strategy": "one_pass", "block_rows": 16},
        {"strategy": "fori_loop", "block_rows": 8, "block_cols": 128},
        {"strategy": "grid", "block_rows": 32, "block_cols": 64},
    ],
    "tpu": [
        {"strategy": "fori_loop", "block_rows": 16, "block_cols": 128, "buffers": 1, "stats_layout": "column"},
        {"strategy": "grid", "block_rows": 128, "block_cols": 256, "buffers": 2, "stats_layout": "lane"},
        {"strategy": "emit_pipeline", "block_rows": 32, "block_cols": 128, "buffers": 3,
         "stats_layout": "column"},
    ],
    "gpu-triton": [
        {"strategy": "one_pass", "block_rows": 4, "block_cols": 64, "num_warps": 2, "num_stages": 1},
        {"strategy": "fori_loop", "block_rows": 8, "block_cols": 64, "num_warps": 4, "num_stages": 3},
        {"strategy": "split_cols", "block_rows": 8, "block_cols": 128, "num_warps": 4, "num_stages": 1},
    ],
}


@pytest.mark.parametrize("target, shape, dtype, config", checks.cases(SPACE, welford, SHAPES, EXPLICIT))
def test_matches_reference(target, shape, dtype, config):
    checks.check(welford, target, shape, dtype, config)


def test_plain_sum_of_squares_merge_is_caught():
    """Dropping Chan's d^2 n_a n_b / n term gives wrong variances: the comparison can fail."""
    def naive(a, b):
        merged = welford._merge(a, b)
        return merged._replace(m2=a.m2 + b.m2)

    broken = rows.RowReduction(welford.Moments, welford._empty, welford._block, naive,
                               welford._finish, n_outputs=2)
    kernel = rows.RowKernel(rows.reduction_math("naive_welford", broken), welford.SHAPE_NAMES)
    config = {"strategy": "fori_loop", "block_rows": 8, "block_cols": 128}
    (x,) = welford.make_inputs((16, 512), jnp.float32, jax.random.key(0))
    fn = kernel.build(config, (16, 512), jnp.float32, Platform("interpret"))
    error = validate.relative_error(fn(x), welford.reference(x))
    assert error > validate.tolerance("float32")


def test_statistics_are_float32_and_stable_far_from_zero():
    x = 1000.0 + jax.random.normal(jax.random.key(1), (16, 1024), jnp.float32)
    config = {"strategy": "grid", "block_rows": 8, "block_cols": 128}
    mean, var = welford.build(config, x.shape, jnp.float32, Platform("interpret"))(x)
    assert mean.dtype == var.dtype == jnp.float32 and mean.shape == var.shape == (16,)
    assert float(jnp.max(jnp.abs(var - jnp.var(x - 1000.0, axis=-1)))) < 1e-3


@pytest.mark.parametrize("target, config, message", [
    ("tpu", {"strategy": "one_pass", "block_rows": 4}, "multiple of 8"),
    ("tpu", {"strategy": "grid", "block_rows": 8, "block_cols": 100}, r"TPU block \(8, 100\)"),  # 128 lanes a chunk
    ("tpu", {"strategy": "one_pass", "block_rows": 64, "stats_layout": "lane"}, ">= 128"),
    ("tpu", {"strategy": "grid", "block_rows": 8, "block_cols": 128, "buffers": 3}, "1 or 2"),
    ("interpret", {"strategy": "emit_pipeline", "block_rows": 8, "block_cols": 128}, "not available"),
    ("gpu-triton", {"strategy": "fori_loop", "block_rows": 3, "block_cols": 64}, "powers of two"),
])
def test_unsupported_configs_are_refused_up_front(target, config, message):
    with pytest.raises((ValueError, NotImplementedError), match=message):
        welford.build(config, (256, 512), jnp.float32, Platform(target))


def test_footprint_matches_hand_count():
    shape, dtype = (524288, 512), jnp.bfloat16
    tpu = {"strategy": "grid", "block_rows": 16, "block_cols": 256, "buffers": 2, "stats_layout": "column"}
    # x 2 x 16 x 256 x 2 + f32 work 2 x 16 x 256 x 4 + 2 outputs x 2 buffers x (16 x 128 lanes x 4)
    # + 3 state vectors x (16 x 128 x 4) + per-row values the grid carries: 3 statistics and 2 results
    # (16 x 128 x 4 each)
    assert welford.footprint(tpu, shape, dtype, "tpu") == 16384 + 32768 + 32768 + 24576 + 5 * 8192
    gpu = {"strategy": "fori_loop", "block_rows": 4, "block_cols": 256, "num_warps": 4, "num_stages": 3}
    # 2 pipelined stages x 4 x 256 x 2 + reduction scratch 4 rows x 4 warps x 4
    assert welford.footprint(gpu, shape, dtype, "gpu-triton") == 4096 + 64


def test_space_loads_and_seed_defaults_are_valid():
    for target in SPACE.targets:
        for shape in target.shapes:
            for dtype in target.dtypes:
                config = welford.default_config(shape, target.name)
                assert SPACE.violated(config, shape, dtype, target.name) is None, (target.name, shape, config)
