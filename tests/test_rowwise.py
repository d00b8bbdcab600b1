"""The row engine behind softmax and the norms: poisoning, refusals, spaces, launch grid."""
from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from farm.measure import validate
from kernels import rows
from kernels.lowering import Platform
from kernels.rows import triton as triton_rows
from tests.rowwise_checks import assert_matches, lower_for_device

NAMES = ("softmax", "batch_softmax", "softmax_two_pass", "layer_norm", "rms_norm", "rms_norm_bwd")


@pytest.mark.parametrize("name", NAMES)
def test_registered_and_complete(name: str) -> None:
    module = kernels.load(name)
    # kernels.rows.mosaic: the kernels that state a StagedMath run on Mosaic GPU too; rms_norm_bwd
    # has a Mosaic GPU kernel of its own (kernels/rms_norm_bwd_mgpu.py)
    staged = {"gpu-mosaic"} if hasattr(module, "STAGED") or name == "rms_norm_bwd" else set()
    assert module.NAME == name and set(module.TARGETS) == {"interpret", "tpu", "gpu-triton"} | staged
    staged_rows = ("softmax", "batch_softmax", "softmax_two_pass", "layer_norm", "rms_norm")
    assert hasattr(module, "STAGED") == (name in staged_rows)


@pytest.mark.parametrize("name,target,config", [
    ("softmax", "interpret", {"block_rows": 8, "strategy": "grid", "block_cols": 128}),
    ("softmax", "tpu", {"block_rows": 8, "strategy": "emit_pipeline", "block_cols": 128}),
    ("softmax", "gpu-triton", {"block_rows": 4, "strategy": "one_pass"}),
    ("rms_norm_bwd", "tpu", {"block_rows": 8, "strategy": "one_pass"}),
    ("rms_norm_bwd", "gpu-triton", {"block_rows": 2, "strategy": "one_pass", "rows_per_program": 4}),
    ("rms_norm_bwd", "gpu-triton", {"block_rows": 2, "strategy": "fori_loop", "block_cols": 128,
                                    "rows_per_program": 4, "unroll": 1}),
    ("softmax", "gpu-triton", {"block_rows": 2, "strategy": "split_cols", "block_cols": 128}),
])
def test_poisoning_catches_rows_a_config_never_writes(monkeypatch, name: str, target: str,
                                                      config: dict) -> None:
    # A launch grid one block of rows short leaves the last rows (and their partial sums) unwritten.
    covered = rows.Plan.row_blocks.fget
    monkeypatch.setattr(rows.Plan, "row_blocks", property(lambda p: covered(p) - 1))
    module, shape = kernels.load(name), (16, 256)
    inputs = module.make_inputs(shape, jnp.float32, jax.random.key(0))
    fn = module.build(config, shape, jnp.float32, Platform(target, interpret=True,
                                                           poison_outputs=True))
    out = jax.tree.leaves(jax.jit(fn)(*inputs))
    written = (covered(module.KERNEL.plan(config, shape, target)) - 1) * (
        config.get("rows_per_program") or config["block_rows"])
    assert np.isnan(np.asarray(out[0][written:])).all()
    assert not np.isnan(np.asarray(out[0][:written])).any()
    assert validate.relative_error(out, module.reference(*validate.upcast(inputs))) == math.inf


@pytest.mark.parametrize("name,config,shape,target,error,message", [
    ("softmax", {"block_rows": 4}, (32, 128), "tpu", ValueError, "divisible by 8 and 128"),
    ("softmax", {"block_rows": 8, "strategy": "grid", "block_cols": 96}, (32, 384), "tpu",
     ValueError, "divisible by 8 and 128"),
    # (TPU pads such a row to whole chunks: Plan.pad_cols)
    ("softmax", {"block_rows": 8, "strategy": "grid", "block_cols": 256}, (32, 384), "interpret",
     ValueError, "must divide the shape"),
    ("softmax", {"block_rows": 8, "strategy": "one_pass", "buffers": 3}, (32, 384), "tpu",
     ValueError, "buffers=3"),
    ("softmax", {"block_rows": 8, "strategy": "emit_pipeline", "block_cols": 128}, (32, 384),
     "interpret", NotImplementedError, "not available on interpret"),
    ("softmax", {"block_rows": 3, "strategy": "one_pass"}, (32, 384), "gpu-triton", ValueError,
     "powers of two"),
    ("softmax", {"block_rows": 8}, (2, 32, 384), "tpu", NotImplementedError, "batch_softmax"),
    ("softmax_two_pass", {"block_rows": 8, "strategy": "one_pass"}, (32, 384), "tpu",
     ValueError, "takes strategy in ('fori_loop', 'emit_pipeline', 'grid') on tpu"),
    ("softmax_two_pass", {"block_rows": 1, "strategy": "one_pass"}, (32, 384), "gpu-triton", ValueError,
     "fori_loop"),
    ("rms_norm_bwd", {"block_rows": 1, "strategy": "fori_loop", "block_cols": 128, "rows_per_program": 8},
     (32, 384), "gpu-triton", ValueError, "rows_per_program == block_rows"),
    ("softmax", {"block_rows": 1, "strategy": "split_cols", "block_cols": 512}, (4, 384), "gpu-triton",
     ValueError, "384 columns in chunks of 512 make 1"),
    ("softmax", {"block_rows": 1, "strategy": "split_cols", "block_cols": 128}, (4, 200000), "gpu-triton",
     ValueError, "over 2 to 1024 programs"),
    ("softmax", {"block_rows": 1, "strategy": "split_cols", "block_cols": 128, "rows_per_program": 2},
     (4, 384), "gpu-triton", ValueError, "rows_per_program must be block_rows"),
    ("softmax", {"block_rows": 1, "strategy": "split_cols", "block_cols": 96}, (4, 384), "gpu-triton",
     ValueError, "powers of two; block_cols=96"),
    ("softmax", {"block_rows": 1, "strategy": "split_cols", "block_cols": 128}, (4, 384), "tpu",
     NotImplementedError, "not available on tpu"),
])
def test_unsupported_configs_are_refused_up_front(name, config, shape, target, error, message):
    with pytest.raises(error, match=re.escape(message)):
        kernels.load(name).build(config, shape, jnp.bfloat16, Platform(target))


@pytest.mark.parametrize("name,config,shape", [
    ("softmax", {"block_rows": 8, "strategy": "one_pass"}, (13, 384)),
    ("cross_entropy", {"block_rows": 8, "strategy": "one_pass", "stats_layout": "column"}, (13, 384)),
    ("cross_entropy", {"block_rows": 128, "strategy": "one_pass", "stats_layout": "lane"}, (200, 256)),
    ("welford", {"block_rows": 16, "strategy": "fori_loop", "block_cols": 128}, (21, 384)),
    ("batch_softmax", {"block_rows": 8, "strategy": "grid", "block_cols": 128}, (2, 13, 384)),
    ("layer_norm", {"block_rows": 8, "strategy": "emit_pipeline", "block_cols": 128}, (13, 384)),
    # one block of all 7 rows: emit_pipeline slices no rows (Mosaic TPU refused a traced start)
    ("softmax", {"block_rows": 7, "strategy": "emit_pipeline", "block_cols": 128}, (7, 384)),
    # a block of more rows than there are: all 3 rows, unpadded
    ("softmax", {"block_rows": 16, "strategy": "emit_pipeline", "block_cols": 128}, (3, 384)),
    ("cross_entropy", {"block_rows": 4, "strategy": "one_pass", "stats_layout": "column"}, (3, 384)),
    # and a chunk past the row is all of it: the two-pass softmax at 300 columns (no 128-multiple divides)
    ("softmax_two_pass", {"block_rows": 8, "strategy": "emit_pipeline", "block_cols": 512}, (5, 300)),
    ("softmax_two_pass", {"block_rows": 8, "strategy": "grid", "block_cols": 512}, (13, 300)),
    # dweight sums over the rows: the padded rows are masked out of it
    ("rms_norm_bwd", {"block_rows": 8, "strategy": "one_pass"}, (13, 384)),
    ("rms_norm_bwd", {"block_rows": 8, "strategy": "fori_loop", "block_cols": 128}, (13, 384)),
    ("rms_norm_bwd", {"block_rows": 16, "strategy": "grid", "block_cols": 128}, (21, 384)),
    ("rms_norm_bwd", {"block_rows": 8, "strategy": "emit_pipeline", "block_cols": 128}, (13, 384)),
], ids=str)
def test_tpu_pads_rows_to_whole_blocks(name, config, shape):
    """TPU row blocks are whole: where block_rows does not divide the rows, the rows are padded
    with zeros by a copy and the outputs sliced back (per-row vectors, lane-dense or not, alike);
    in TPU interpret mode with poisoned outputs, against the reference."""
    module = kernels.load(name)
    config = {**module.default_config(shape, "tpu"), **config}
    block = min(config["block_rows"], shape[-2])
    plan = module.KERNEL.plan(config, shape, "tpu")
    assert (plan.block_rows, plan.pad_rows) == (block, -shape[-2] % block)
    assert_matches(module, config, shape, "float32", "tpu")


@pytest.mark.parametrize("name,config,shape", [
    ("welford", {"strategy": "one_pass", "block_rows": 128}, (200, 256)),
    ("welford", {"strategy": "fori_loop", "block_rows": 128, "block_cols": 128}, (256, 384)),
    ("welford", {"strategy": "grid", "block_rows": 256, "block_cols": 128}, (256, 256)),
    ("welford", {"strategy": "emit_pipeline", "block_rows": 128, "block_cols": 128}, (128, 384)),
    # per-row inputs (the labels, int32) move the other way: lanes to a column
    ("cross_entropy", {"strategy": "one_pass", "block_rows": 128}, (200, 256)),
    ("cross_entropy", {"strategy": "grid", "block_rows": 128, "block_cols": 128}, (128, 384)),
], ids=str)
def test_lane_dense_per_row_vectors_by_transpose_as_tpus_before_v5_need(monkeypatch, name, config, shape):
    """TPUs before v5 lack the sublane gather Mosaic moves per-row values into lanes with (libtpu
    refused every `stats_layout: lane` config of welford and cross entropy for v4); there the engine
    transposes instead. Forced here on the abstract v6e, in TPU interpret mode with poisoned
    outputs, against the reference (tests/test_tpu_deviceless.py compiles it for v4 where libtpu is)."""
    from kernels.rows import blocked

    monkeypatch.setattr(blocked, "SUBLANE_GATHER_SINCE", 99)
    module = kernels.load(name)
    config = {**module.default_config(shape, "tpu"), **config, "stats_layout": "lane"}
    assert module.KERNEL.plan(config, shape, "tpu").lane
    assert_matches(module, config, shape, "float32", "tpu")


@pytest.mark.parametrize("name,shape", [("layer_norm", (13, 300)), ("welford", (13, 300)),
                                        ("rms_norm_bwd", (13, 300)), ("cross_entropy", (13, 300)),
                                        ("softmax_two_pass", (13, 300)), ("batch_softmax", (2, 5, 300))], ids=str)
@pytest.mark.parametrize("strategy", ["fori_loop", "grid", "emit_pipeline"])
def test_tpu_pads_columns_to_whole_chunks(name, shape, strategy):
    """TPU chunks are whole: where block_cols does not divide the row (300 columns, chunks of 128),
    the columns are padded with the math's pad by a copy, the padded columns masked in the folds
    (`valid`: layer norm's and welford's counts need it) and sliced off the outputs (dweight too)."""
    module = kernels.load(name)
    config = {**module.default_config(shape, "tpu"), "block_rows": 8, "strategy": strategy, "block_cols": 128}
    plan = module.KERNEL.plan(config, shape, "tpu")
    assert (plan.pad_cols, plan.pad_rows) == (84, -shape[-2] % min(8, shape[-2]))
    assert_matches(module, config, shape, "float32", "tpu")


def _count_rows(*x, cols=None, valid=None):
    """A column output of ones: each column's sum is the number of rows."""
    return (jnp.ones_like(x[0]),)


@pytest.mark.parametrize("config", [{"block_rows": 8, "strategy": "one_pass"},
                                    {"block_rows": 8, "strategy": "fori_loop", "block_cols": 128},
                                    {"block_rows": 8, "strategy": "grid", "block_cols": 128},
                                    {"block_rows": 8, "strategy": "emit_pipeline", "block_cols": 128}], ids=str)
def test_tpu_padded_rows_add_nothing_to_column_sums(config):
    """Zero rows add zero to rms norm backward's dweight whether or not they are masked; a math
    whose rows each add one to every column (a row count) tells: 13 rows padded to 16 sum to 13."""
    counting = rows.RowMath("count_rows", rows=_count_rows, init=lambda shape: (), update=lambda stats, *a, **k: stats,
                            finish=lambda stats, cols: (), apply=lambda values, *x: _count_rows(*x),
                            row_outputs=0, col_outputs=1)
    kernel = rows.RowKernel(counting, ("rows", "cols"))
    assert kernel.plan(config, (13, 256), "tpu").pad_rows == 3
    fn = kernel.build(config, (13, 256), jnp.float32, Platform("tpu", interpret=True, poison_outputs=True))
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(jnp.zeros((13, 256)))), np.full(256, 13.0))


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "rms_norm_bwd"])
@pytest.mark.parametrize("config", [{"block_rows": 2, "strategy": "one_pass", "rows_per_program": 8},
                                    {"block_rows": 4, "strategy": "fori_loop", "block_cols": 128}])
def test_triton_blocks_that_fill_the_array_match_without_masks(name: str, config: dict) -> None:
    assert_matches(kernels.load(name), config, (16, 256), "float32", "gpu-triton")


def test_triton_puts_row_programs_on_the_unbounded_grid_axis() -> None:
    # 65536 programs of one row each: CUDA takes that many only on its x axis.
    text = lower_for_device(kernels.load("softmax"), {"block_rows": 1, "strategy": "one_pass", "num_warps": 4},
                            (65536, 2560), "bfloat16", "gpu-triton")
    assert re.search(r"grid_x = 65536 : i32, grid_y = 1 : i32", text)


@pytest.mark.parametrize("name", ["cross_entropy", "welford"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("config", [{"strategy": "fori_loop", "block_cols": 256},
                                    {"strategy": "fori_loop", "block_cols": 128, "num_stages": 3},
                                    {"strategy": "fori_loop", "block_cols": 128, "unroll": 1},
                                    {"strategy": "one_pass"}])
def test_triton_reductions_read_odd_rows_through_aligned_flat_windows(name, dtype, config) -> None:
    # 13 rows of 1001 columns: no row start after the first is 16-byte aligned, so each window
    # starts up to 7 (bf16) or 3 (f32) elements early and the neighbours' elements are masked.
    module, shape = kernels.load(name), (13, 1001)
    config = {"block_rows": 1, "num_warps": 2, **config}
    plan = module.KERNEL.plan(config, shape, "gpu-triton")
    assert triton_rows.flat_rows(module.KERNEL.math, plan, jnp.dtype(dtype).itemsize)
    assert_matches(module, config, shape, dtype, "gpu-triton")
    text = lower_for_device(module, config, shape, dtype, "gpu-triton")
    assert f"tensor<1x{13 * 1001}x" in text  # the kernel reads the flattened rows


@pytest.mark.parametrize("name", ["cross_entropy", "welford"])
@pytest.mark.parametrize("dtype, cols", [("float32", 127), ("bfloat16", 126)])
@pytest.mark.parametrize("unroll", [0, 1])
def test_triton_flat_windows_take_a_last_chunk_of_padding_only(name, dtype, cols, unroll) -> None:
    # A flat window may start up to 3 (f32) or 7 (bf16) elements early, so the walk takes
    # cdiv(cols + 3 or 7, 64) = 3 chunks of 64; row 0 starts aligned, and its third chunk holds
    # none of its columns. That chunk's state must add nothing: it was 0 / 0 (welford's mean) and
    # exp(-inf - -inf) (cross entropy's sum), NaN for the row.
    module, shape = kernels.load(name), (3, cols)
    config = {"block_rows": 1, "num_warps": 2, "strategy": "fori_loop", "block_cols": 64, "unroll": unroll}
    plan = module.KERNEL.plan(config, shape, "gpu-triton")
    assert triton_rows.flat_rows(module.KERNEL.math, plan, jnp.dtype(dtype).itemsize)
    assert math.ceil(cols / 64) == 2
    assert_matches(module, config, shape, dtype, "gpu-triton")


@pytest.mark.parametrize("name", ["cross_entropy", "welford"])
def test_a_reductions_block_of_padding_only_is_its_identity(name: str) -> None:
    reduction = {"cross_entropy": "CROSS_ENTROPY", "welford": "WELFORD"}[name]
    math_ = getattr(kernels.load(name), reduction)
    init = math_.init(2)
    x = jnp.full((2, 8), math_.pad, jnp.float32)
    cols = jnp.arange(8, dtype=jnp.int32)[None, :] + 100
    labels = (jnp.zeros((2, 1), jnp.int32),) if name == "cross_entropy" else ()
    empty = math_.block(x, cols, jnp.zeros((1, 8), bool), *labels)
    for got in (empty, math_.merge(init, init), math_.merge(init, empty)):
        np.testing.assert_array_equal(np.stack([np.asarray(f) for f in got]), np.stack([np.asarray(f) for f in init]))
    full = math_.block(jnp.arange(16.0).reshape(2, 8), cols - 100, jnp.ones((1, 8), bool), *labels)
    for got in (math_.merge(full, empty), math_.merge(empty, full)):
        np.testing.assert_allclose(np.stack([np.asarray(f) for f in got]), np.stack([np.asarray(f) for f in full]))


@pytest.mark.parametrize("name, shape, dtype, config", [
    ("softmax", (13, 1001), "bfloat16", {"strategy": "fori_loop", "block_cols": 256}),  # writes rows
    ("cross_entropy", (13, 1024), "bfloat16", {"strategy": "fori_loop", "block_cols": 256}),  # aligned
    ("cross_entropy", (13, 1001), "bfloat16", {"strategy": "fori_loop", "block_cols": 256,
                                               "block_rows": 2}),
    ("cross_entropy", (13, 1020), "bfloat16", {"strategy": "one_pass"}),  # 1024 < 1020 + 7
])
def test_triton_keeps_row_windows_where_flat_ones_do_not_apply(name, shape, dtype, config) -> None:
    module = kernels.load(name)
    config = {"block_rows": 1, "num_warps": 2, **config}
    plan = module.KERNEL.plan(config, shape, "gpu-triton")
    assert not triton_rows.flat_rows(module.KERNEL.math, plan, jnp.dtype(dtype).itemsize)
    assert_matches(module, config, shape, dtype, "gpu-triton")


def test_split_cols_needs_math_that_combines_spans() -> None:
    from kernels import softmax

    plain = rows.RowMath("plain_softmax", rows=softmax._softmax_rows, init=softmax._init,
                         update=softmax._update, finish=softmax._finish, apply=softmax._normalize,
                         pad=-jnp.inf)
    assert plain.span_combine is None and softmax.MATH.span_combine is not None
    kernel = rows.RowKernel(plain, softmax.SHAPE_NAMES)
    config = {"block_rows": 1, "strategy": "split_cols", "block_cols": 128}
    assert "cannot combine the statistics of a row's spans" in kernel.check_config(
        config, (4, 384), "bfloat16", "gpu-triton")
    # No default leads there either: a few long rows keep the loop.
    assert kernel.default_config((2, 9000), "gpu-triton")["strategy"] == "fori_loop"


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "rms_norm_bwd", "cross_entropy"])
def test_few_long_rows_default_to_split_cols_and_many_do_not(name: str) -> None:
    # A decode step's sampling softmax: 2 rows of 9000 columns fill 2 of a GPU's programs when
    # each row is one program; split over chunks of 1024 they fill 18.
    module = kernels.load(name)
    few, many = (2, 9000), (4096, 9000)
    config = module.default_config(few, "gpu-triton")
    assert config["strategy"] == "split_cols" and config["block_cols"] == 1024
    assert module.default_config(many, "gpu-triton")["strategy"] == "fori_loop"
    # Past 1024 chunks a row, the loop again.
    assert module.default_config((2, 1024 * 1024 + 1), "gpu-triton")["strategy"] == "fori_loop"
    assert_matches(module, config, few, "bfloat16", "gpu-triton")


def test_split_cols_is_two_kernels_over_every_chunk_of_every_row() -> None:
    # 13 rows of 1001 columns in blocks of 2 rows and chunks of 256: 7 x 4 programs in each kernel.
    config = {"block_rows": 2, "strategy": "split_cols", "block_cols": 256, "num_warps": 2}
    text = lower_for_device(kernels.load("softmax"), config, (13, 1001), "bfloat16", "gpu-triton")
    grids = re.findall(r"grid_x = (\d+) : i32, grid_y = (\d+) : i32, grid_z = (\d+) : i32", text)
    assert grids == [("7", "1", "4")] * 2, grids
    assert "softmax_spans" in text


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "rms_norm", "rms_norm_bwd", "cross_entropy", "welford"])
def test_span_combine_gives_the_whole_rows_statistics(name: str) -> None:
    # The contract split_cols relies on: the statistics of a row's chunks, each folded from
    # `init` alone, stacked on the last axis (and padded with `init`'s values), combine to the
    # statistics of the whole row folded at once; a ragged last chunk is masked.
    module = kernels.load(name)
    math_ = module.KERNEL.math
    shape, width = (5, 300), 128  # chunks of 128, 128 and 44 (+ 84 masked) columns
    inputs = module.make_inputs(shape, jnp.float32, jax.random.key(1))
    # By shape: the module's argument order need not be the math's (rms_norm_bwd: x, weight, dy).
    row_in = [x.astype(jnp.float32) for x in inputs if x.shape == shape]
    col_in = [v.astype(jnp.float32)[None, :] for v in inputs if v.shape == shape[1:]]
    vectors = [v[:, None] for v in inputs if v.shape == shape[:1]]
    assert (len(row_in), len(col_in), len(vectors)) == (math_.row_inputs, math_.col_inputs, math_.vector_inputs)
    whole = math_.update(math_.init((5, 1)), *row_in, *col_in, *vectors, start=jnp.int32(0), valid=None)
    spans = []
    for start in range(0, shape[1], width):
        valid = (start + jnp.arange(width) < shape[1])[None, :]
        missing = start + width - min(start + width, shape[1])

        def cut(x: jax.Array, fill: float, start: int = start, missing: int = missing) -> jax.Array:
            return jnp.pad(x[:, start:start + width], ((0, 0), (0, missing)), constant_values=fill)

        chunk = [cut(x, math_.pad) for x in row_in] + [cut(v, 0.0) for v in col_in]
        spans.append(math_.update(math_.init((5, 1)), *chunk, *vectors, start=jnp.int32(start), valid=valid))
    empty = math_.init((5, 1))  # a fourth span that holds nothing
    stacked = tuple(jnp.concatenate([s[i] for s in spans] + [empty[i]], axis=-1) for i in range(math_.n_stats))
    combined = math_.span_combine(stacked)
    for got, want in zip(math_.finish(combined, shape[1]), math_.finish(whole, shape[1]), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=1e-6)
