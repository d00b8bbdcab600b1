"""cross_entropy: per-row loss on every target, in interpret mode, plus TPU/Triton lowering."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from farm.measure import validate
from farm.search.plan import expand
from kernels import cross_entropy, rows
from kernels.lowering import Platform
from tests import memory_bound_checks as checks
from tests import shipped_spaces

SHORT, LONG = shipped_spaces.space("cross_entropy"), shipped_spaces.space("cross_entropy_long")
SHORT_SHAPES = {"interpret": (40, 384), "gpu-triton": (37, 300), "tpu": (128, 512)}
SHORT_EXPLICIT = {
    "interpret": [{"strategy": "grid", "block_rows": 16, "block_cols": 128}],
    "tpu": [
        {"strategy": "one_pass", "block_rows": 128, "block_cols": 64, "buffers": 1, "stats_layout": "lane"},
        {"strategy": "emit_pipeline", "block_rows": 32, "block_cols": 256, "buffers": 2,
         "stats_layout": "column"},
    ],
    "gpu-triton": [{"strategy": "one_pass", "block_rows": 2, "block_cols": 64, "num_warps": 4, "num_stages": 1},
                   # a row's chunks over programs; the label in one chunk of five (37 x 300)
                   {"strategy": "split_cols", "block_rows": 4, "block_cols": 64, "num_warps": 2, "num_stages": 1}],
}
# Long rows: several column blocks per row, as the 131072-class seed needs; float32 as its seed.
LONG_SHAPES = {"interpret": (24, 4096), "gpu-triton": (5, 5000), "tpu": (16, 4096)}
LONG_EXPLICIT = {
    "interpret": [{"strategy": "fori_loop", "block_rows": 8, "block_cols": 512}],
    "tpu": [
        {"strategy": "fori_loop", "block_rows": 8, "block_cols": 512, "buffers": 2, "stats_layout": "column"},
        {"strategy": "emit_pipeline", "block_rows": 8, "block_cols": 1024, "buffers": 3,
         "stats_layout": "column"},
    ],
    "gpu-triton": [{"strategy": "fori_loop", "block_rows": 1, "block_cols": 1024, "num_warps": 8,
                    "num_stages": 2}],
}


@pytest.mark.parametrize("target, shape, dtype, config",
                         checks.cases(SHORT, cross_entropy, SHORT_SHAPES, SHORT_EXPLICIT))
def test_short_rows_match_reference(target, shape, dtype, config):
    checks.check(cross_entropy, target, shape, dtype, config)


@pytest.mark.parametrize("target, shape, dtype, config",
                         checks.cases(LONG, cross_entropy, LONG_SHAPES, LONG_EXPLICIT, ("float32",)))
def test_long_rows_match_reference(target, shape, dtype, config):
    checks.check(cross_entropy, target, shape, dtype, config)


def test_label_column_matters():
    """The loss picks each row's own label: shifted labels are caught by the comparison."""
    shape = (16, 512)
    logits, labels = cross_entropy.make_inputs(shape, jnp.float32, jax.random.key(0))
    fn = cross_entropy.build({"strategy": "fori_loop", "block_rows": 8, "block_cols": 128}, shape,
                             jnp.float32, Platform("interpret"))
    assert validate.relative_error(fn(logits, labels), cross_entropy.reference(logits, labels)) < 1e-6
    shifted = (labels + 1) % shape[1]
    assert validate.relative_error(fn(logits, shifted), cross_entropy.reference(logits, labels)) > 0.1


def test_merge_without_rescaling_is_caught():
    """An online logsumexp that forgets exp(m_a - m) is wrong: the comparison can fail."""
    def unscaled(a, b):
        return cross_entropy._merge(a, b)._replace(sum=a.sum + b.sum)

    broken = rows.RowReduction(cross_entropy.LogSumExp, cross_entropy._empty, cross_entropy._block,
                               unscaled, cross_entropy._finish, n_outputs=1, pad=-jnp.inf)
    kernel = rows.RowKernel(rows.reduction_math("unscaled", broken, vector_inputs=1),
                            cross_entropy.SHAPE_NAMES)
    logits, labels = cross_entropy.make_inputs((8, 1024), jnp.float32, jax.random.key(1))
    fn = kernel.build({"strategy": "grid", "block_rows": 8, "block_cols": 128}, (8, 1024),
                      jnp.float32, Platform("interpret"))
    loss = fn(logits, labels)
    assert validate.relative_error(loss, cross_entropy.reference(logits, labels)) > validate.tolerance("float32")


def test_footprint_matches_hand_count():
    tpu = {"strategy": "one_pass", "block_rows": 128, "block_cols": 64, "buffers": 2, "stats_layout": "lane"}
    # logits 2 x 128 x 2048 x 2 + f32 work 2 x 128 x 2048 x 4 + (loss + labels) x 2 buffers x 128 x 4
    assert cross_entropy.footprint(tpu, (128, 2048), jnp.bfloat16, "tpu") == 1048576 + 2097152 + 2048
    gpu = {"strategy": "one_pass", "block_rows": 2, "block_cols": 64, "num_warps": 4, "num_stages": 1}
    # no loop, nothing pipelined: the reduction scratch of 2 rows over 4 warps (rows stay in registers)
    assert cross_entropy.footprint(gpu, (64, 3000), jnp.float32, "gpu-triton") == 2 * 4 * 4
    looped = {**gpu, "strategy": "fori_loop", "num_stages": 3}
    # 2 pipelined stages of 2 x 64 f32 inputs + the scratch
    assert cross_entropy.footprint(looped, (64, 3000), jnp.float32, "gpu-triton") == 2 * 2 * 64 * 4 + 2 * 4 * 4


def test_spaces_split_the_seed_tasks_and_defaults_are_valid():
    tasks = {p.task.key for p in expand([SHORT, LONG])}
    assert {"cross_entropy/128x2048/bfloat16/gpu-triton", "cross_entropy/128x2048/bfloat16/tpu",
            "cross_entropy/16384x131072/float32/gpu-triton",
            "cross_entropy/16384x131072/float32/tpu"} <= tasks
    for space_ in (SHORT, LONG):
        for target in space_.targets:
            for shape in target.shapes:
                for dtype in target.dtypes:
                    config = cross_entropy.default_config(shape, target.name)
                    assert space_.violated(config, shape, dtype, target.name) is None, (target.name, shape)
