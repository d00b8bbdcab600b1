"""Batched softmax: configs of every target match the reference; device configs lower."""
from __future__ import annotations

from kernels import batch_softmax as K
from tests.rowwise_checks import SPLIT_COLS, kernel_checks

SHAPE = (2, 16, 384)
RAGGED = (3, 13, 200)  # Triton: neither rows nor columns fill a power-of-two block
CONFIGS = {
    "interpret": [{"block_batch": 2, "block_rows": 16, "strategy": "fori_loop", "block_cols": 128},
                  {"block_rows": 8, "strategy": "grid", "block_cols": 128}],
    "tpu": [{"block_batch": 2, "block_rows": 16, "strategy": "one_pass", "buffers": 1},
            {"block_rows": 16, "strategy": "fori_loop", "block_cols": 128},
            {"block_batch": 2, "block_rows": 16, "strategy": "grid", "block_cols": 128},
            {"block_rows": 16, "strategy": "emit_pipeline", "block_cols": 128, "buffers": 1}],
    "gpu-triton": [{"block_rows": 4, "strategy": "one_pass", "num_warps": 4, "num_stages": 1},
                   {"block_rows": 2, "strategy": "fori_loop", "block_cols": 128, "rows_per_program": 8},
                   SPLIT_COLS],
}

test_matches_reference, test_triton_masks_ragged_rows_and_columns, test_lowers_for_device = \
    kernel_checks(K, SHAPE, RAGGED, CONFIGS)


def test_footprint_by_hand() -> None:
    shape = (64, 2048, 4096)
    # TPU one_pass, 2 batch entries x 16 rows of 4096 bf16: x and y double-buffered, f32 copies.
    config = {"block_batch": 2, "block_rows": 16, "strategy": "one_pass"}
    block = 2 * 16 * 4096
    assert K.footprint(config, shape, "bfloat16", "tpu") == 2 * 2 * block * 2 + 2 * block * 4
    # Triton fori_loop: 2 chunks of 4 x 1024 bf16 x loaded ahead; reduction scratch of 4 rows
    # over the default 4 warps.
    config = {"block_rows": 4, "strategy": "fori_loop", "block_cols": 1024, "num_stages": 3}
    expected = 2 * 4 * 1024 * 2 + 4 * 4 * 4
    assert K.footprint(config, shape, "bfloat16", "gpu-triton") == expected


def test_errors_name_the_kernel_asked_for():
    # softmax's math, under this kernel's name: a refusal said "softmax on gpu-mosaic"
    from kernels import softmax_two_pass

    refused = K.check_config(K.default_config((7, 8, 8), "gpu-mosaic"), (7, 8, 8), "bfloat16", "gpu-mosaic")
    assert refused.startswith("batch_softmax on gpu-mosaic")
    assert softmax_two_pass.MATH.name == "softmax_two_pass" and K.STAGED.name == "batch_softmax"
