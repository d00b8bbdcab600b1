"""Row softmax: configs of every target match the reference; device configs lower."""
from __future__ import annotations

from kernels import softmax as K
from tests.rowwise_checks import CONFIGS, RAGGED, SHAPE, kernel_checks

test_matches_reference, test_triton_masks_ragged_rows_and_columns, test_lowers_for_device = \
    kernel_checks(K, SHAPE, RAGGED, CONFIGS)


def test_footprint_by_hand() -> None:
    shape = (65536, 2560)
    # TPU one_pass, 16 rows of 2560 bf16: x and y double-buffered, f32 x and y temporaries.
    config = {"block_rows": 16, "strategy": "one_pass"}
    expected = 2 * 2 * 16 * 2560 * 2 + 2 * 16 * 2560 * 4
    assert K.footprint(config, shape, "bfloat16", "tpu") == expected
    # TPU grid over 512-column chunks, one buffer: chunks, temporaries, m and l scratch, and m and l
    # carried between chunks as (16, 1) f32 values.
    config = {"block_rows": 16, "strategy": "grid", "block_cols": 512, "buffers": 1}
    chunks = 2 * 16 * 512 * 2 + 2 * 16 * 512 * 4
    assert K.footprint(config, shape, "bfloat16", "tpu") == chunks + 2 * 16 * 128 * 4 + 2 * 16 * 128 * 4
    # Triton one_pass: the rows live in registers; shared memory holds the reduction scratch
    # (2 rows x 8 warps, f32).
    config = {"block_rows": 2, "strategy": "one_pass", "num_warps": 8}
    assert K.footprint(config, shape, "bfloat16", "gpu-triton") == 2 * 8 * 4
