"""Layer norm: configs of every target match the reference; device configs lower."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from farm.measure import validate
from kernels import layer_norm as K
from kernels.lowering import Platform
from tests.rowwise_checks import CONFIGS, LANE_FOLD, RAGGED, SHAPE, kernel_checks, with_lane_fold

test_matches_reference, test_triton_masks_ragged_rows_and_columns, test_lowers_for_device = \
    kernel_checks(K, SHAPE, RAGGED, with_lane_fold(CONFIGS))


@pytest.mark.parametrize("target,config", [("tpu", CONFIGS["tpu"][2]),
                                           ("gpu-triton", CONFIGS["gpu-triton"][1]),
                                           ("gpu-triton", LANE_FOLD)])
def test_streamed_variance_is_accurate_far_from_zero(target: str, config: dict) -> None:
    # Rows centred at 1000 with unit spread: E[x^2] - E[x]^2 would lose every digit in f32.
    # A ramp across the columns gives each column chunk its own mean, so merging the chunks'
    # statistics must account for the spread between their means.
    x, weight, bias = K.make_inputs(SHAPE, jnp.float32, jax.random.key(3))
    ramp = jnp.linspace(-2.0, 2.0, SHAPE[1])
    x = x - x.mean(axis=-1, keepdims=True) + 1000.0 + ramp
    out = K.build(config, SHAPE, jnp.float32, Platform(target, interpret=True))(x, weight, bias)
    assert validate.relative_error(out, K.reference(x, weight, bias)) < 1e-3


def test_footprint_by_hand() -> None:
    shape = (16384, 16384)
    # TPU emit_pipeline, 16 x 512 chunks, 3 buffers: x (3) and y (2) chunks in bf16, weight
    # and bias chunks (3 each, 32 bytes a column), f32 x and y, count/mean/m2 scratch and the
    # same three carried between chunks as (16, 1) f32 values (128 lanes).
    config = {"block_rows": 16, "strategy": "emit_pipeline", "block_cols": 512, "buffers": 3}
    expected = ((3 + 2) * 16 * 512 * 2 + 3 * 2 * 512 * 32 + 2 * 16 * 512 * 4
                + 3 * 16 * 128 * 4 + 3 * 16 * 128 * 4)
    assert K.footprint(config, shape, "bfloat16", "tpu") == expected
    # Triton one_pass: registers only, but for the reduction scratch of one row over 16 warps.
    config = {"block_rows": 1, "strategy": "one_pass", "num_warps": 16}
    assert K.footprint(config, shape, "bfloat16", "gpu-triton") == 16 * 4
