"""RMS norm: configs of every target match the reference; device configs lower."""
from __future__ import annotations

from kernels import rms_norm as K
from tests.rowwise_checks import CONFIGS, RAGGED, SHAPE, kernel_checks, with_lane_fold

test_matches_reference, test_triton_masks_ragged_rows_and_columns, test_lowers_for_device = \
    kernel_checks(K, SHAPE, RAGGED, with_lane_fold(CONFIGS))


def test_footprint_by_hand() -> None:
    shape = (8192, 8192)
    # TPU fori_loop, 32 whole rows in VMEM: x and y double-buffered (bf16), the weight once
    # (32 bytes a column), f32 x and y of one 1024-column slice, the sum of squares carried over
    # the loop as a (32, 1) f32 value (128 lanes).
    config = {"block_rows": 32, "strategy": "fori_loop", "block_cols": 1024}
    expected = 2 * 2 * 32 * 8192 * 2 + 8192 * 32 + 2 * 32 * 1024 * 4 + 32 * 128 * 4
    assert K.footprint(config, shape, "bfloat16", "tpu") == expected
    # Triton one_pass: rows live in registers; shared memory holds the f32 partial sums of 16
    # warps for each of 2 rows. fori_loop: 2 chunks of 2 x 1024 bf16 x loaded ahead, plus that.
    config = {"block_rows": 2, "strategy": "one_pass", "num_warps": 16}
    assert K.footprint(config, shape, "bfloat16", "gpu-triton") == 2 * 16 * 4
    config = {"block_rows": 2, "strategy": "fori_loop", "block_cols": 1024, "num_warps": 16, "num_stages": 3}
    assert K.footprint(config, shape, "bfloat16", "gpu-triton") == 2 * 2 * 1024 * 2 + 2 * 16 * 4
