"""Two-pass softmax: configs of every target match the reference; device configs lower."""
from __future__ import annotations

from kernels import softmax_two_pass as K
from tests.rowwise_checks import CONFIGS as ROW_CONFIGS
from tests.rowwise_checks import RAGGED, SHAPE, kernel_checks

# The shared interpret configs; TPU and Triton configs of the two-pass strategies.
CONFIGS = {
    **ROW_CONFIGS,
    "tpu": [{"block_rows": 16, "strategy": "fori_loop", "block_cols": 128},
            {"block_rows": 16, "strategy": "grid", "block_cols": 128, "buffers": 1},
            {"block_rows": 16, "strategy": "emit_pipeline", "block_cols": 128, "buffers": 1},
            {"block_rows": 16, "strategy": "emit_pipeline", "block_cols": 128, "buffers": 3}],
    "gpu-triton": [{"block_rows": 2, "block_cols": 128, "rows_per_program": 8},
                   {"block_rows": 4, "block_cols": 256, "num_warps": 2, "num_stages": 2}],
}

test_matches_reference, test_triton_masks_ragged_rows_and_columns, test_lowers_for_device = \
    kernel_checks(K, SHAPE, RAGGED, CONFIGS)


def test_online_sum_survives_a_max_in_the_last_block() -> None:
    # The running sum must be rescaled when a later column block raises the row max.
    import jax.numpy as jnp

    from farm.measure import validate
    from kernels.lowering import Platform

    x = jnp.zeros((8, 512), jnp.float32).at[:, -1].set(30.0).at[:, 0].set(-5.0)
    config = {"block_rows": 8, "strategy": "fori_loop", "block_cols": 128}
    out = K.build(config, x.shape, jnp.float32, Platform("tpu", interpret=True))(x)
    assert validate.relative_error(out, K.reference(x)) < 1e-5


def test_footprint_by_hand() -> None:
    shape = (8192, 8192)
    # TPU emit_pipeline, 16 x 1024 chunks: x in 3 buffers, y in 2 (bf16), f32 x and y, m and l
    # (scratch, and carried between chunks).
    config = {"block_rows": 16, "strategy": "emit_pipeline", "block_cols": 1024, "buffers": 3}
    expected = (3 + 2) * 16 * 1024 * 2 + 2 * 16 * 1024 * 4 + 2 * 2 * 16 * 128 * 4
    assert K.footprint(config, shape, "bfloat16", "tpu") == expected
    # Triton: one row, 2 chunks of 4096 bf16 x loaded ahead, reduction scratch of 4 warps.
    config = {"block_rows": 1, "block_cols": 4096, "num_stages": 3}
    assert K.footprint(config, shape, "bfloat16", "gpu-triton") == 2 * 4096 * 2 + 4 * 4


def test_mosaic_default_takes_the_widest_chunks_that_stage_no_more_shared_memory() -> None:
    # Pass 1 reduces every chunk twice, so wider chunks cost less, unless their padding stages
    # more shared memory (a block a SM fewer: 8192 x 50304 ran 1.55x slower in 8192-column chunks).
    from kernels.rows import mosaic as mosaic_rows

    def chunk(shape: tuple[int, int]) -> int:
        config = K.default_config(shape, "gpu-mosaic")
        assert K.check_config(config, shape, "bfloat16", "gpu-mosaic") is None
        return config["block_cols"]

    assert chunk((8192, 8192)) == chunk((8192, 32000)) == mosaic_rows.CHUNKS[1]
    assert chunk((8192, 50304)) == chunk((8192, 50257)) == mosaic_rows.DEFAULT_CHUNK
    assert chunk((7, 4000)) == 4096 and chunk((2, 1000)) == 1024
    assert K.default_config((8192, 128256), "gpu-mosaic")["cluster"] > 1  # the staged default's cluster
