"""RMS norm backward: configs of every target match the reference; device configs lower."""
from __future__ import annotations

from kernels import rms_norm_bwd as K
from tests.rowwise_checks import CONFIGS as ROW_CONFIGS
from tests.rowwise_checks import RAGGED, SHAPE, SPLIT_COLS, kernel_checks

CONFIGS = {**ROW_CONFIGS,
           "gpu-triton": [{"block_rows": 2, "strategy": "one_pass", "rows_per_program": 16, "num_warps": 4},
                          {"block_rows": 4, "strategy": "fori_loop", "block_cols": 128, "rows_per_program": 4},
                          # the next block of rows loaded while this one computes (RAGGED: the
                          # second program's last blocks are partly and wholly past the rows)
                          {"block_rows": 2, "strategy": "one_pass", "rows_per_program": 8, "num_warps": 4,
                           "prefetch": 1},
                          SPLIT_COLS,
                          # several blocks of rows a program, each chunk's dweight partial held in
                          # registers (RAGGED: the last program's last blocks partly and wholly past the rows)
                          {"block_rows": 2, "strategy": "fori_loop", "block_cols": 128, "rows_per_program": 8,
                           "unroll": 1, "num_warps": 4}]}

test_matches_reference, test_triton_masks_ragged_rows_and_columns, test_lowers_for_device = \
    kernel_checks(K, SHAPE, RAGGED, CONFIGS)


def test_both_gradients_are_checked() -> None:
    # A wrong dweight alone must fail validation: the error is the worst over (dx, dweight).
    import jax
    import jax.numpy as jnp

    from farm.measure import validate

    inputs = K.make_inputs(SHAPE, jnp.float32, jax.random.key(0))
    dx, dweight = K.reference(*inputs)
    assert validate.relative_error((dx, 1.1 * dweight), K.reference(*inputs)) > 2e-3


def test_footprint_by_hand() -> None:
    shape = (8192, 8192)
    # TPU one_pass, 16 rows: x, dy, dx double-buffered (bf16); weight once and the dweight
    # partial twice (32 bytes a column); f32 x, dy, dx.
    config = {"block_rows": 16, "strategy": "one_pass"}
    expected = (2 * 2 + 2 * 1) * 16 * 8192 * 2 + (1 + 2) * 8192 * 32 + 3 * 16 * 8192 * 4
    assert K.footprint(config, shape, "bfloat16", "tpu") == expected
    # Triton one_pass: registers only, but for the reduction scratch of one row over 16 warps.
    # fori_loop, 3 stages: 2 chunks ahead of both row inputs (x, dy), 8 x 512 bf16 each.
    config = {"block_rows": 1, "strategy": "one_pass", "rows_per_program": 64, "num_warps": 16}
    assert K.footprint(config, shape, "bfloat16", "gpu-triton") == 16 * 4
    config = {"block_rows": 8, "strategy": "fori_loop", "block_cols": 512, "rows_per_program": 8, "num_warps": 4,
              "num_stages": 3}
    assert K.footprint(config, shape, "bfloat16", "gpu-triton") == 2 * 2 * 8 * 512 * 2 + 8 * 4 * 4


def test_prefetch_needs_a_loop_over_blocks_of_rows() -> None:
    shape = (64, 512)
    base = {"block_rows": 2, "strategy": "one_pass", "num_warps": 4, "prefetch": 1}
    assert K.check_config({**base, "rows_per_program": 8}, shape, "bfloat16", "gpu-triton") is None
    reason = K.check_config({**base, "rows_per_program": 2}, shape, "bfloat16", "gpu-triton")
    assert "prefetch=1" in reason and "rows_per_program" in reason
    reason = K.check_config({**base, "strategy": "fori_loop", "block_cols": 128, "rows_per_program": 2},
                            shape, "bfloat16", "gpu-triton")
    assert "prefetch" in reason and "one_pass" in reason
    assert "prefetch" in K.check_config({**base, "prefetch": 2, "rows_per_program": 8}, shape, "bfloat16",
                                        "gpu-triton")
    assert "prefetch" in K.check_config({"block_rows": 16, "strategy": "one_pass", "prefetch": 1}, shape,
                                        "bfloat16", "tpu")


def test_fori_loop_holds_its_partials_over_blocks_of_rows_only_unrolled_and_within_registers() -> None:
    # Several blocks of rows a program keep every chunk's dweight partial in registers: the chunks
    # must be straight-line code, and the row's float32 partials at most 64 a thread.
    shape = (4096, 16384)
    base = {"block_rows": 1, "strategy": "fori_loop", "block_cols": 2048, "rows_per_program": 32, "num_warps": 8}
    assert K.check_config({**base, "unroll": 1}, shape, "bfloat16", "gpu-triton") is None
    assert "unroll=1" in K.check_config(base, shape, "bfloat16", "gpu-triton")
    reason = K.check_config({**base, "unroll": 1, "num_warps": 4}, shape, "bfloat16", "gpu-triton")
    assert "16384 float32 partial sums" in reason and "64 a thread with 4 warps" in reason
    # the partials are one row per program: 4096 / 32 of them
    plan = K.KERNEL.plan({**base, "unroll": 1}, shape, "gpu-triton")
    assert plan.partials == 128
