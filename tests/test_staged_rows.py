"""The row engine on Mosaic GPU (rows staged in shared memory, kernels/rows/mosaic.py): softmax,
rms norm, layer norm and cross entropy. Numerics in Pallas's GPU interpreter, CUDA lowering at
users' shapes with the footprint against Mosaic GPU's own count, refusals, the farm's measure path."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from farm.measure import outcomes, validate
from farm.measure.device import measure
from farm.tasks import TuningTask
from kernels import batch_softmax, cross_entropy, layer_norm, rms_norm, softmax, softmax_two_pass
from kernels.lowering import Platform
from kernels.rows import mosaic as mosaic_rows
from tests.mosaic_checks import mosaic_smem_bytes

TARGET = "gpu-mosaic"


def _config(block_cols: int = 1024, **knobs) -> dict:
    return {"block_rows": 1, "strategy": "smem_row", "block_cols": block_cols, **knobs}


def _error(module, shape: tuple[int, int], dtype, config: dict, inputs: tuple | None = None) -> float:
    inputs = module.make_inputs(shape, dtype, jax.random.key(5)) if inputs is None else inputs
    fn = module.build(config, shape, dtype, Platform(TARGET, interpret=True, poison_outputs=True))
    return validate.relative_error(fn(*inputs), module.reference(*validate.upcast(inputs)))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("shape", [
    (3, 2048),   # rows of whole 128-byte units: each row is its own window, no masks
    (3, 1096),   # 16-byte but not 128-byte rows: the window path with every row aligned; the
                 # last chunk masked past the row
    (5, 1001),   # odd: no row after the first starts aligned; windows start up to 7 or 63 (bf16),
                 # 3 or 31 (f32) elements early, and each row's ends are stored element by element
])
@pytest.mark.parametrize("window_align", [16, 128])
@pytest.mark.parametrize("module", [softmax, cross_entropy, softmax_two_pass],
                         ids=["softmax", "cross_entropy", "softmax_two_pass"])
def test_staged_rows_match_the_reference_in_the_gpu_interpreter(module, shape, dtype, window_align):
    config = _config(window_align=window_align)
    plan = mosaic_rows.plan(module.STAGED, config, shape, dtype)
    assert plan.aligned == (shape[1] == 2048)
    assert _error(module, shape, dtype, config) <= validate.tolerance(jnp.dtype(dtype).name, module)


@pytest.mark.parametrize("block_cols", [1024, 4096])
def test_two_pass_softmax_rescales_its_running_sum_when_a_later_chunk_raises_the_max(block_cols):
    # Pass 1 folds the staged row chunk by chunk (online max and sum): a max in the last chunk
    # must rescale the sum of the chunks before it; a row of -inf but one column sums to 1.
    shape = (4, 4096)
    x = softmax_two_pass.make_inputs(shape, jnp.float32, jax.random.key(3))[0]
    x = x.at[0, -1].set(40.0).at[1, 0].set(-30.0).at[2].set(-jnp.inf).at[2, 4000].set(1.0)
    config = _config(block_cols)
    assert len(softmax_two_pass.STAGED.walks) == 1  # two passes: the online walk, then the map
    assert _error(softmax_two_pass, shape, jnp.float32, config, (x,)) <= 1e-5


@pytest.mark.parametrize("stream_cols", [0, 1])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("module,shape", [
    (rms_norm, (3, 2048)),    # whole chunks
    (rms_norm, (3, 3136)),    # a partial last chunk (3136 = 3 x 1024 + 64): masked walk, a short column copy
    (layer_norm, (4, 5184)),  # ditto (5 x 1024 + 64), two column inputs
])
def test_norms_stage_rows_beside_their_column_inputs(module, shape, dtype, stream_cols):
    config = _config(stream_cols=stream_cols)
    assert _error(module, shape, dtype, config) <= validate.tolerance(jnp.dtype(dtype).name, module)
    # Streamed, each column input takes two chunks of shared memory instead of the whole row.
    whole = module.footprint(_config(), shape, dtype, TARGET)
    saved = (whole - module.footprint(config, shape, dtype, TARGET)) // jnp.dtype(dtype).itemsize
    assert saved == stream_cols * module.STAGED.col_inputs * (-(-shape[1] // 1024) * 1024 - 2 * 1024)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("module,shape", [(rms_norm, (3, 2048)), (layer_norm, (4, 5120)), (layer_norm, (2, 1024))])
def test_norms_may_read_their_column_inputs_from_global_memory(module, shape, dtype):
    # stream_cols 2: each chunk of the weight (and bias) loaded straight from global memory, the
    # next one's ahead of the map (one chunk, two, five), so a block stages only its row; whole
    # chunks only, else a plain refusal.
    config = _config(stream_cols=2)
    assert _error(module, shape, dtype, config) <= validate.tolerance(jnp.dtype(dtype).name, module)
    staged = -(-shape[1] // 1024) * 1024
    assert module.footprint(config, shape, dtype, TARGET) == staged * jnp.dtype(dtype).itemsize + \
        mosaic_rows.SMEM_OVERHEAD
    reason = module.check_config(_config(2048, stream_cols=2), (4, 5120), dtype, TARGET)
    assert "block_cols (2048) must divide the row (5120 columns)" in reason
    assert "stream_cols must be one of (0, 1, 2)" in module.check_config(_config(stream_cols=3), shape, dtype, TARGET)


def test_layer_norm_shifted_moments_hold_for_rows_far_from_zero():
    # One walk sums x - x[0] and its square: rows offset by 1000 with unit spread keep their
    # variance (unshifted, E[x^2] - E[x]^2 in float32 would lose it to cancellation).
    shape = (3, 2048)
    x, weight, bias = layer_norm.make_inputs(shape, jnp.float32, jax.random.key(3))
    x = x - x.mean(axis=1, keepdims=True) + 1000.0
    error = _error(layer_norm, shape, jnp.float32, _config(), (x, weight, bias))
    assert error <= validate.tolerance("float32", layer_norm)


def test_cross_entropy_picks_the_label_and_ignores_labels_out_of_range_like_the_row_engine():
    shape = (4, 1001)
    logits, labels = cross_entropy.make_inputs(shape, jnp.bfloat16, jax.random.key(4))
    labels = labels.at[0].set(1000).at[1].set(0).at[2].set(-1).at[3].set(5000)
    staged = cross_entropy.build(_config(), shape, jnp.bfloat16, Platform(TARGET, interpret=True))(logits, labels)
    engine = cross_entropy.build(cross_entropy.default_config(shape, "interpret"), shape, jnp.bfloat16,
                                 Platform("interpret", interpret=True))(logits, labels)
    np.testing.assert_allclose(np.asarray(staged), np.asarray(engine), rtol=1e-5)
    reference = cross_entropy.reference(logits.astype(jnp.float32), labels)
    np.testing.assert_allclose(np.asarray(staged)[:2], np.asarray(reference)[:2], rtol=1e-5)


@pytest.mark.parametrize("shape,dtype,piece,slots", [
    ((3, 9216), jnp.bfloat16, 4096, 2),  # pieces 4096, 4096 and 1024: the slots wrap around once
    ((3, 8256), jnp.float32, 4096, 3),   # a last piece of 64 columns, shorter than a chunk
    ((2, 20480), jnp.bfloat16, 4096, 4),  # five pieces through four slots
])
def test_cross_entropy_streams_rows_through_shared_memory_in_pieces(shape, dtype, piece, slots):
    config = _config(strategy="smem_pieces", piece_cols=piece, slots=slots)
    logits, labels = cross_entropy.make_inputs(shape, dtype, jax.random.key(6))
    labels = labels.at[0].set(shape[1] - 1).at[1].set(-3)  # the last piece's last column; out of range
    logits = logits.at[0, :2 * piece].set(-jnp.inf)  # two whole pieces of masked logits merge as nothing
    platform = Platform(TARGET, interpret=True, poison_outputs=True)
    pieces = np.asarray(cross_entropy.build(config, shape, dtype, platform)(logits, labels))
    whole = np.asarray(cross_entropy.build(_config(), shape, dtype, platform)(logits, labels))
    np.testing.assert_allclose(pieces, whole, rtol=1e-5)
    assert validate.relative_error(pieces[:1], cross_entropy.reference(logits.astype(jnp.float32), labels)[:1]) \
        <= validate.tolerance(jnp.dtype(dtype).name, cross_entropy)
    staged = cross_entropy.footprint(config, shape, dtype, TARGET) - mosaic_rows.SMEM_OVERHEAD
    assert staged == slots * piece * jnp.dtype(dtype).itemsize


@pytest.mark.parametrize("module,shape,dtype,piece,slots", [
    # f32: a head of 8192 columns beside 3 slots of 16384; the tail's 2 pieces end in a partial chunk
    (softmax, (3, 30720), jnp.float32, 16384, 3),
    (softmax_two_pass, (3, 30720), jnp.float32, 16384, 3),
    (softmax, (2, 74752), jnp.float32, 16384, 3),  # five tail pieces through three slots, both passes wrapping
    (softmax, (3, 82944), jnp.bfloat16, 16384, 4),  # bf16: a head of 49152; tail pieces 16384, 16384, 1024
])
def test_softmax_rows_longer_than_shared_memory_stage_their_head_and_stream_their_tail_twice(
        module, shape, dtype, piece, slots):
    config = _config(4096, strategy="smem_split", piece_cols=piece, slots=slots)
    plan = mosaic_rows.plan(module.STAGED, config, shape, dtype)
    head = plan.head
    assert plan.footprint <= mosaic_rows.mgpu_launch.SMEM_BYTES and 0 < head < shape[1]
    x = softmax.make_inputs(shape, dtype, jax.random.key(8))[0]
    x = x.at[0, head + 5].set(30.0)      # row 0: the max in the tail, far above the head's
    x = x.at[1, head:].set(-jnp.inf)     # row 1: a tail of -inf only (its pieces sum to 0, not NaN)
    x = x.at[2 % shape[0], :head].set(-jnp.inf)  # the last row: a head of -inf only
    error = _error(module, shape, dtype, config, (x,))
    assert error <= validate.tolerance(jnp.dtype(dtype).name, module)


def test_softmax_over_shared_memory_tunes_on_mosaic_gpu_with_rows_split_over_a_cluster(tmp_path):
    # The shipped softmax space with a user's 151936-column vocabulary: the gpu-mosaic task
    # proposes only rows split over a cluster (whole rows do not fit a block; smem_split is for
    # rows longer than a cluster holds), all of them valid; at 2**20 columns, only smem_split.
    import optuna

    from farm.search import plan, spaces
    from farm.search.searcher import Searcher

    path = tmp_path / "vocab.yaml"
    path.write_text("kernel: softmax\nshapes: [[8192, 151936]]\ndtypes: [bfloat16]\n")
    (planned,) = plan.expand([spaces.load_space(path)], [TARGET], 8)
    searcher = Searcher.open(planned, optuna.storages.InMemoryStorage())
    configs = [a.config for a in (searcher.ask() for _ in range(8)) if a is not None]
    assert len(configs) == 8
    assert all(c["strategy"] == "smem_row" and c["cluster"] > 1 for c in configs)
    assert all(softmax.check_config(c, (8192, 151936), "bfloat16", TARGET) is None for c in configs)
    path.write_text("kernel: softmax\nshapes: [[64, 1048576]]\ndtypes: [bfloat16]\n")
    (planned,) = plan.expand([spaces.load_space(path)], [TARGET], 4)
    searcher = Searcher.open(planned, optuna.storages.InMemoryStorage())
    configs = [a.config for a in (searcher.ask() for _ in range(4)) if a is not None]
    assert len(configs) == 4 and all(c["strategy"] == "smem_split" and c["cluster"] == 1 for c in configs)


@pytest.mark.parametrize("shape", [(2, 3, 1001), (2, 4, 2048)])
def test_batch_softmax_flattens_the_batch_into_staged_rows(shape):
    x = batch_softmax.make_inputs(shape, jnp.bfloat16, jax.random.key(2))[0]
    fn = batch_softmax.build(_config(), shape, jnp.bfloat16, Platform(TARGET, interpret=True, poison_outputs=True))
    error = validate.relative_error(fn(x), batch_softmax.reference(x.astype(jnp.float32)))
    assert error <= validate.tolerance("bfloat16", batch_softmax)
    assert batch_softmax.footprint(_config(), shape, "bfloat16", TARGET) == \
        softmax.footprint(_config(), (shape[0] * shape[1], shape[2]), "bfloat16", TARGET)


def test_rows_far_from_zero_and_with_one_dominant_column():
    # The max is taken before the exponentials: large offsets cannot overflow, and a row whose
    # mass sits on one column (in the masked edge chunk) comes out as that one-hot row.
    shape = (4, 1001)
    x = softmax.make_inputs(shape, jnp.float32, jax.random.key(1))[0] + 1000.0
    x = x.at[:, -1].add(100.0)
    assert _error(softmax, shape, jnp.float32, _config(), (x,)) <= validate.tolerance("float32", softmax)


@pytest.mark.parametrize("name,shape,knobs", [
    ("softmax", (8192, 32000), {}),
    ("softmax", (8192, 50257), {"approx_math": 1}),  # windows from 128-byte boundaries (by the width)
    ("softmax", (8192, 50257), {"window_align": 16}),
    ("softmax", (16384, 4000), {}),  # windows from 16-byte boundaries (by the width)
    ("softmax", (4096, 100000), {}),
    ("cross_entropy", (8192, 50257), {"approx_math": 1}),
    ("rms_norm", (16384, 16384), {}),
    ("layer_norm", (16384, 16384), {"stream_cols": 1, "block_cols": 2048}),
    ("layer_norm", (4096, 5120), {"stream_cols": 1, "approx_math": 1}),
    ("cross_entropy", (8192, 128256), {}),  # the default: pieces of 16384 columns, 3 slots
    ("cross_entropy", (8192, 151936), {"piece_cols": 32768, "slots": 2, "approx_math": 1}),
    ("softmax", (8192, 128256), {"strategy": "smem_split", "piece_cols": 8192, "slots": 2, "cluster": 1}),
    ("softmax", (8192, 151936), {"strategy": "smem_split", "piece_cols": 4096, "slots": 3, "cluster": 1}),
    ("softmax", (8192, 128256), {}),  # the default: the row split over 4 blocks of a cluster
    ("softmax", (8192, 151936), {"cluster": 6, "block_cols": 2048}),
    ("softmax_two_pass", (8192, 8192), {"block_cols": 8192}),
    ("softmax_two_pass", (8192, 128256), {}),  # the default: the row split over 4 blocks of a cluster
    ("softmax_two_pass", (8192, 151936), {"strategy": "smem_split", "piece_cols": 8192, "slots": 2, "cluster": 1}),
    ("cross_entropy", (8192, 128256), {"strategy": "smem_row", "cluster": 4}),
    ("layer_norm", (16384, 16384), {"cluster": 2, "block_cols": 2048}),  # runs of the weight and bias too
    ("rms_norm", (4096, 5120), {"cluster": 2, "block_cols": 1024}),  # runs of 3072 and 2048 columns
    ("layer_norm", (2048, 131072), {"cluster": 8, "block_cols": 2048, "stream_cols": 1}),  # column inputs streamed
    ("layer_norm", (64, 5184), {"cluster": 2, "block_cols": 1024, "stream_cols": 1}),  # a last chunk of 64 columns
    ("layer_norm", (16384, 16384), {"stream_cols": 2, "block_cols": 2048}),  # column inputs from global memory
    ("rms_norm", (2048, 131072), {"cluster": 8, "stream_cols": 2, "block_cols": 2048}),
])
def test_users_shapes_lower_for_cuda_within_the_footprint(name, shape, knobs, monkeypatch):
    module = kernels.load(name)
    config = {**module.default_config(shape, TARGET), **knobs}
    args = jax.eval_shape(lambda: module.make_inputs(shape, jnp.bfloat16, jax.random.key(0)))

    def lower() -> str:
        fn = module.build(config, shape, jnp.bfloat16, Platform(TARGET))
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    assert "mosaic_gpu" in lower()
    actual = mosaic_smem_bytes(lower, monkeypatch)
    model = module.footprint(config, shape, jnp.bfloat16, TARGET)
    assert actual <= model <= actual + 1024


def test_what_it_refuses_it_names():
    assert softmax.check_config(_config(), (8192, 50257), "bfloat16", TARGET) is None
    reason = softmax.check_config(_config(), (8192, 151936), "bfloat16", TARGET)
    assert "shared memory" in reason and "151936 columns" in reason
    assert "power of two" in softmax.check_config(_config(3000), (64, 4096), "bfloat16", TARGET)
    assert "smem_row" in softmax.check_config({**_config(), "strategy": "one_pass"}, (64, 4096), "bfloat16", TARGET)
    assert "block_rows must be 1" in softmax.check_config({**_config(), "block_rows": 2}, (64, 4096),
                                                          "bfloat16", TARGET)
    assert "smem_row" in softmax.check_config(_config(), (64, 4096), "bfloat16", "gpu-triton")
    assert "approx_math must be 0 or 1" in softmax.check_config(_config(approx_math=2), (64, 4096), "bfloat16",
                                                                TARGET)
    assert "no column inputs" in softmax.check_config(_config(stream_cols=1), (64, 4096), "bfloat16", TARGET)
    # A norm's weight would sit at another offset in every window of an odd width: gpu-triton runs those.
    reason = rms_norm.check_config(_config(), (64, 1001), "bfloat16", TARGET)
    assert "128-byte units" in reason and "gpu-triton" in reason
    assert rms_norm.check_config(_config(), (64, 1001), "bfloat16", "gpu-triton") is not None  # strategy
    # Rows in pieces: kernels that can merge pieces' statistics, rows of whole 128-byte units.
    reason = softmax.check_config(_config(strategy="smem_pieces"), (64, 8192), "bfloat16", TARGET)
    assert "cannot stream its rows in pieces" in reason and "smem_split" in reason
    assert "smem_split" not in rms_norm.check_config(_config(strategy="smem_pieces"), (64, 8192), "bfloat16", TARGET)
    pieces = _config(strategy="smem_pieces", piece_cols=4096)
    assert "128-byte units" in cross_entropy.check_config(pieces, (64, 50257), "bfloat16", TARGET)
    assert "shorter than the row" in cross_entropy.check_config(pieces, (64, 4096), "bfloat16", TARGET)
    assert "slots must be in" in cross_entropy.check_config({**pieces, "slots": 5}, (64, 8192), "bfloat16", TARGET)
    reason = cross_entropy.check_config({**pieces, "piece_cols": 65536, "slots": 4}, (64, 151936), "bfloat16", TARGET)
    assert "4 slots of 65536 columns" in reason
    assert softmax.default_config((8192, 50257), TARGET) == _config(4096, approx_math=1, piece_cols=16384, slots=3,
                                                                    cluster=1)
    # Unless a config sets window_align: windows from 128-byte boundaries from 32768 columns, else 16-byte.
    for cols, align in ((50257, 128), (32769, 128), (32767, 16), (4000, 16)):
        assert mosaic_rows.plan(softmax.STAGED, _config(), (64, cols), "bfloat16").align * 2 == align
    assert mosaic_rows.plan(softmax.STAGED, _config(window_align=16), (64, 50257), "float32").align == 4
    assert "window_align must be one of" in softmax.check_config(_config(window_align=64), (64, 1001), "bfloat16",
                                                                 TARGET)
    # The default chunk pads a row by at most an eighth more than 1024-column chunks do (5120 columns
    # in 4096-column chunks would stage and walk 8192: layer norm at 4096x5120 ran 31.4 us, 22.9 in 1024).
    assert rms_norm.default_config((4096, 5120), TARGET) == _config(1024, approx_math=1, stream_cols=0, cluster=1)
    assert [mosaic_rows.default_chunk(cols) for cols in (2560, 5120, 6144, 8192, 14336, 32000, 50257)] == \
        [1024, 1024, 2048, 4096, 2048, 4096, 4096]
    # Up to 16 rows longer than 4096 columns: a row over up to 8 blocks of a cluster, in 1024-column
    # chunks (2048 where each of 8 blocks gets one), each block reading its run of the column inputs
    # from global memory (layer norm at 4x16384 on the H200: 3.3 us a block per row, 2.05 us over 8
    # blocks in 2048-column chunks, 2.11 in 1024).
    assert layer_norm.default_config((4, 16384), TARGET) == _config(2048, approx_math=1, stream_cols=2, cluster=8)
    assert layer_norm.default_config((4, 8192), TARGET)["block_cols"] == 1024
    assert rms_norm.default_config((16, 5120), TARGET)["cluster"] == 5     # a chunk or more per block
    for shape in ((4, 16384), (2, 32768), (16, 5120), (3, 131072)):
        default = layer_norm.default_config(shape, TARGET)
        assert all(layer_norm.check_config(default, shape, dtype, TARGET) is None for dtype in ("bfloat16", "float32"))
    for shape in ((4, 2048), (4, 4096), (17, 16384)):    # short rows (2 blocks lost at 4x2048), more rows
        assert layer_norm.default_config(shape, TARGET)["cluster"] == 1
    # A norm's default for rows a block cannot hold whole: column inputs streamed, else a cluster.
    assert layer_norm.default_config((64, 40960), TARGET)["stream_cols"] == 1
    default = rms_norm.default_config((64, 131072), TARGET)
    assert default["cluster"] > 1 and all(rms_norm.check_config(default, (64, 131072), dtype, TARGET) is None
                                          for dtype in ("bfloat16", "float32"))
    assert default["stream_cols"] == 2  # each block reads its run of the weight from global memory
    # No cluster holds a float32 row of 200000 columns with weight and bias: the fewest blocks that
    # hold a bfloat16 one (6: runs of 36864 columns, three arrays of 72 KiB a block).
    default = layer_norm.default_config((4, 200000), TARGET)
    assert default["cluster"] == 6 and layer_norm.check_config(default, (4, 200000), "bfloat16", TARGET) is None
    assert default["stream_cols"] == 1  # 200000 is no whole number of chunks: streamed through shared memory
    assert cross_entropy.default_config((128, 1000), TARGET) == _config(1024, approx_math=1, piece_cols=16384,
                                                                         slots=3, cluster=1)
    for vocab in (128256, 151936):  # too long for a block whole: the default streams pieces
        default = cross_entropy.default_config((8192, vocab), TARGET)
        assert default["strategy"] == "smem_pieces"
        assert all(cross_entropy.check_config(default, (8192, vocab), dtype, TARGET) is None
                   for dtype in ("bfloat16", "float32"))
        default = softmax.default_config((8192, vocab), TARGET)  # a map: the row split over a cluster
        # 151936 columns in runs of 4096-column chunks would leave the 5th block 64% of a run:
        # 2048-column chunks leave it 95%.
        assert default == _config({128256: 4096, 151936: 2048}[vocab], approx_math=1, piece_cols=16384, slots=3,
                                  cluster={128256: 4, 151936: 5}[vocab])
        assert all(softmax.check_config(default, (8192, vocab), dtype, TARGET) is None
                   for dtype in ("bfloat16", "float32"))
    # A float32 default of a row that a bfloat16 block holds whole is still valid in bfloat16.
    default = softmax.default_config((64, 60032), TARGET)
    assert default["cluster"] == 2
    assert softmax.check_config(default, (64, 60032), "bfloat16", TARGET) is None
    # Rows too long for a cluster's 8 blocks at float32 stage a head and stream their tail.
    assert softmax.default_config((64, 480000), TARGET)["strategy"] == "smem_split"
    # smem_split: row maps whose statistics merge; rows of whole 128-byte units; a head of a chunk at least.
    split = _config(4096, strategy="smem_split", piece_cols=8192, slots=2)
    for module, shape in ((cross_entropy, (64, 151936)), (rms_norm, (64, 151936)), (layer_norm, (64, 151936))):
        assert "smem_split" in module.check_config(split, shape, "bfloat16", TARGET)
    assert "128-byte units" in softmax.check_config(split, (64, 150001), "bfloat16", TARGET)
    assert "head of at least one chunk" in softmax.check_config(split, (64, 4096), "bfloat16", TARGET)
    assert "head of at least one chunk" in softmax.check_config({**split, "piece_cols": 32768, "slots": 4},
                                                                 (64, 151936), "float32", TARGET)


@pytest.mark.parametrize("kernel,shape", [("softmax", (4, 1001)), ("layer_norm", (4, 1024)),
                                          ("cross_entropy", (4, 1001))])
def test_the_farm_measures_staged_rows_in_the_gpu_interpreter(kernel, shape):
    task = TuningTask(kernel, shape, "bfloat16", TARGET)
    m = measure(task, _config(), interpret=True, repetitions=2, warmup=1)
    assert m.outcome == outcomes.OK, m.error
    assert m.numerics_error <= validate.tolerance("bfloat16", kernels.load(kernel))


def test_a_shape_mosaic_gpu_cannot_run_gets_no_trials_there_and_the_space_still_loads(tmp_path):
    # A norm's rows of 1001 bf16 columns are not whole 128-byte units, which its column inputs
    # need on Mosaic GPU: the shipped space with that user shape loads (its gpu-triton task tunes
    # it), and the gpu-mosaic task answers its default `invalid` with the kernel's reason and
    # proposes nothing.
    import optuna

    from farm.search import plan, spaces
    from farm.search.searcher import Searcher

    path = tmp_path / "odd.yaml"
    path.write_text("kernel: rms_norm\nshapes: [[64, 1001]]\ndtypes: [bfloat16]\n")
    space = spaces.load_space(path)
    planned = {p.task.target: p for p in plan.expand([space], ["gpu-triton", TARGET], 8)}
    answered = []
    searcher = Searcher.open(planned[TARGET], optuna.storages.InMemoryStorage(),
                             on_answer=lambda a: answered.append(a) or a)
    assert searcher.ask() is None
    assert [a.outcome for a in answered] == [outcomes.INVALID] and "128-byte units" in answered[0].error
    triton = Searcher.open(planned["gpu-triton"], optuna.storages.InMemoryStorage())
    assert triton.ask() is not None


@pytest.mark.parametrize("name,shape,clustered", [("rms_norm", (64, 131072), True), ("layer_norm", (64, 16384), False)])
def test_norms_split_rows_over_a_cluster_only_where_a_block_cannot_hold_them(tmp_path, name, shape, clustered):
    # The shipped norm spaces at a user's shape: rows of 256 KiB (bf16) go to clusters, all
    # proposals valid; rows a block holds keep a block per row (clusters measured slower there).
    import optuna

    from farm.search import plan, spaces
    from farm.search.searcher import Searcher

    path = tmp_path / "norm.yaml"
    path.write_text(f"kernel: {name}\nshapes: [{list(shape)}]\ndtypes: [bfloat16]\n")
    (planned,) = plan.expand([spaces.load_space(path)], [TARGET], 6)
    searcher = Searcher.open(planned, optuna.storages.InMemoryStorage())
    configs = [a.config for a in (searcher.ask() for _ in range(6)) if a is not None]
    assert len(configs) == 6
    assert all((c["cluster"] > 1) == clustered for c in configs)
    assert all(kernels.load(name).check_config(c, shape, "bfloat16", TARGET) is None for c in configs)


def test_cross_entropy_over_shared_memory_tunes_on_mosaic_gpu_in_pieces_or_a_cluster(tmp_path):
    # The shipped cross-entropy space with a user's 151936-class vocabulary: the gpu-mosaic task
    # proposes only smem_pieces configs or rows split over a cluster (whole rows do not fit a
    # block), all of them valid.
    import optuna

    from farm.search import plan, spaces
    from farm.search.searcher import Searcher

    path = tmp_path / "vocab.yaml"
    path.write_text("kernel: cross_entropy\nshapes: [[8192, 151936]]\ndtypes: [bfloat16]\n")
    space = spaces.load_space(path)
    (planned,) = plan.expand([space], [TARGET], 8)
    searcher = Searcher.open(planned, optuna.storages.InMemoryStorage())
    asked = [searcher.ask() for _ in range(6)]
    configs = [a.config for a in asked if a is not None]
    assert len(configs) == 6
    assert all((c["strategy"], c["cluster"] > 1) in {("smem_pieces", False), ("smem_row", True)} for c in configs)
    assert all(cross_entropy.check_config(c, (8192, 151936), "bfloat16", TARGET) is None for c in configs)


def test_a_cluster_of_blocks_shares_a_row_in_runs_of_whole_chunks():
    # 8192 x 128256 over 4 blocks: runs of 32768 columns (whole 4096-column chunks), the last
    # block the remaining 29952; each block stages its run only (and a buffer of the blocks'
    # exchanged statistics).
    config = _config(4096, cluster=4)
    plan = mosaic_rows.plan(softmax.STAGED, config, (8192, 128256), "bfloat16")
    assert (plan.segment, plan.last_segment, plan.staged) == (32768, 29952, 32768)
    assert softmax.footprint(config, (8192, 128256), "bfloat16", TARGET) == 32768 * 2 + 128 + mosaic_rows.SMEM_OVERHEAD
    assert softmax.check_config(_config(2048, cluster=6), (8192, 151936), "bfloat16", TARGET) is None
    assert cross_entropy.check_config(_config(4096, cluster=4), (8192, 128256), "float32", TARGET) is None
    # The norms' walks combine (sums): their blocks stage runs of the row and of the column
    # inputs; a row of 131072 bf16 columns with its weight fits 4 blocks, not 2.
    norm = _config(4096, cluster=4, stream_cols=0)
    assert rms_norm.check_config(norm, (64, 131072), "bfloat16", TARGET) is None
    assert rms_norm.footprint(norm, (64, 131072), "bfloat16", TARGET) == 2 * 32768 * 2 + 128 + mosaic_rows.SMEM_OVERHEAD
    assert "cluster of more blocks" in rms_norm.check_config({**norm, "cluster": 2}, (64, 131072), "bfloat16",
                                                             TARGET)
    # Streamed column inputs take two chunks a block, whatever its run: 2 blocks of 65536 columns
    # then hold the weight and bias too.
    streamed = {**norm, "stream_cols": 1, "cluster": 2}
    assert layer_norm.check_config(streamed, (64, 131072), "bfloat16", TARGET) is None
    assert layer_norm.footprint(streamed, (64, 131072), "bfloat16", TARGET) == \
        (65536 + 2 * 2 * 4096) * 2 + 128 + mosaic_rows.SMEM_OVERHEAD
    assert "cluster of more blocks" in layer_norm.check_config({**streamed, "stream_cols": 0}, (64, 131072),
                                                               "bfloat16", TARGET)
    # Refused, by name: another strategy; rows not of whole 128-byte units; a cluster too large
    # for the row; out of range.
    assert "smem_split takes cluster 1" in softmax.check_config(
        _config(4096, strategy="smem_split", piece_cols=8192, slots=2, cluster=2), (64, 151936), "bfloat16", TARGET)
    reason = softmax.check_config(_config(4096, cluster=2), (64, 50257), "bfloat16", TARGET)
    assert "128-byte units" in reason and "cluster 1 takes any width" in reason
    assert "leaves the last block nothing" in softmax.check_config(_config(4096, cluster=8), (64, 8192), "bfloat16",
                                                                   TARGET)
    assert "cluster must be in [1, 8]" in softmax.check_config(_config(4096, cluster=9), (64, 151936), "bfloat16",
                                                               TARGET)
    # A row too long for the blocks' runs names the way out.
    assert "cluster of more blocks" in softmax.check_config(_config(4096, cluster=2), (64, 262144), "bfloat16",
                                                            TARGET)


def test_clustered_rows_run_on_a_gpu_only():
    # Pallas's GPU interpreter has no clusters: the build says so instead of running something else.
    with pytest.raises(NotImplementedError, match="GPU only"):
        softmax.build(_config(4096, cluster=2), (2, 16384), jnp.bfloat16, Platform(TARGET, interpret=True))


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="clusters run on a GPU only (no interpreter support)")
@pytest.mark.parametrize("module,shape,dtype,config", [
    (softmax, (3, 128256), jnp.bfloat16, _config(4096, cluster=4, approx_math=1)),
    (softmax, (3, 151936), jnp.float32, _config(2048, cluster=6)),  # runs of 26624, the last of 18816
    (softmax_two_pass, (3, 128256), jnp.bfloat16, _config(4096, cluster=4, approx_math=1)),
    (softmax_two_pass, (3, 151936), jnp.float32, _config(2048, cluster=6)),
    (cross_entropy, (3, 128256), jnp.bfloat16, _config(4096, cluster=4)),
    (batch_softmax, (2, 2, 65536), jnp.bfloat16, _config(4096, cluster=3)),
    (rms_norm, (3, 131072), jnp.bfloat16, _config(4096, cluster=4, stream_cols=0)),
    (layer_norm, (3, 16384), jnp.bfloat16, _config(2048, cluster=2, stream_cols=0)),
    (layer_norm, (3, 5120), jnp.float32, _config(1024, cluster=2, stream_cols=0)),  # runs of 3072 and 2048
    # Column inputs streamed through two chunk slots a block: runs of 3072 and 2112 columns (the
    # last block's last chunk 64 columns); runs of 16384 in 8 blocks.
    (layer_norm, (3, 5184), jnp.float32, _config(1024, cluster=2, stream_cols=1)),
    (layer_norm, (5, 131072), jnp.bfloat16, _config(2048, cluster=8, stream_cols=1, approx_math=1)),
    (rms_norm, (3, 131072), jnp.bfloat16, _config(2048, cluster=8, stream_cols=1)),
    # Column inputs read from global memory: runs of 3072 and 2048 columns; runs of 16384.
    (layer_norm, (3, 5120), jnp.float32, _config(1024, cluster=2, stream_cols=2)),
    (layer_norm, (5, 131072), jnp.bfloat16, _config(2048, cluster=8, stream_cols=2, approx_math=1)),
])
def test_clustered_rows_match_the_reference_on_a_gpu(module, shape, dtype, config):
    inputs = module.make_inputs(shape, dtype, jax.random.key(9))
    if module is layer_norm:  # rows far from zero: every block shifts by the row's first element
        inputs = (inputs[0] + 1000.0, *inputs[1:])
    elif module in (softmax, softmax_two_pass, cross_entropy):
        x = inputs[0]
        x = x.at[0, -5].set(30.0)            # row 0: the max in the last block, far above the rest
        x = x.at[1, :shape[1] // 2].set(-jnp.inf)  # row 1: the first blocks see -inf only
        inputs = (x, *inputs[1:])
        if module is cross_entropy:  # labels in the last block (row 1's past its -inf)
            inputs = (x, inputs[1].at[:2].set(shape[1] - 5))
    fn = module.build(config, shape, dtype, Platform(TARGET, poison_outputs=True))
    error = validate.relative_error(fn(*inputs), module.reference(*validate.upcast(inputs)))
    assert error <= validate.tolerance(jnp.dtype(dtype).name, module)


def test_a_row_too_short_for_the_window_is_refused_naming_what_takes_it():
    module = kernels.load("softmax")
    refusal = module.check_config(module.default_config((7, 77), "gpu-mosaic"), (7, 77), "float32", "gpu-mosaic")
    assert refusal is not None
    assert "77 columns (308 bytes, not whole 128-byte units)" in refusal
    assert "needs at least 128 columns (gpu-triton takes any width)" in refusal
