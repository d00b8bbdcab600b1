"""RMS norm backward on Mosaic GPU (kernels/rms_norm_bwd_mgpu.py): rows taken in turn through
shared-memory slots, dweight summed in shared memory or registers. Numerics in Pallas's GPU
interpreter, CUDA lowering with the footprint against Mosaic GPU's own count, refusals, and the
search space's gpu-mosaic points."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from farm.measure import validate
from farm.search import plan, spaces
from kernels import rms_norm_bwd
from kernels import rms_norm_bwd_mgpu as mgpu
from kernels.lowering import Platform
from tests.mosaic_checks import mosaic_smem_bytes

TARGET = "gpu-mosaic"


def _config(shape: tuple[int, int], **knobs) -> dict:
    return {**rms_norm_bwd.default_config(shape, TARGET), **knobs}


def _errors(shape: tuple[int, int], dtype, config: dict) -> list[float]:
    inputs = rms_norm_bwd.make_inputs(shape, dtype, jax.random.key(2))
    fn = rms_norm_bwd.build(config, shape, dtype, Platform(TARGET, interpret=True, poison_outputs=True))
    return [validate.relative_error(got, want)
            for got, want in zip(fn(*inputs), rms_norm_bwd.reference(*validate.upcast(inputs)))]


@pytest.mark.parametrize("dweight_in", ["smem", "registers"])
@pytest.mark.parametrize("shape,dtype,knobs", [
    ((40, 1024), jnp.bfloat16, {"rows_per_program": 16, "slots": 2, "block_cols": 512}),  # a last block of 8 rows
    ((32, 512), jnp.float32, {"rows_per_program": 8, "slots": 3, "block_cols": 512}),
    ((6, 2048), jnp.bfloat16, {"rows_per_program": 4, "slots": 4, "block_cols": 1024}),  # fewer rows than slots
    # rows no chunk of 512 divides (hidden sizes 768, 896): smaller chunks, fewer elements a thread
    ((24, 768), jnp.bfloat16, {"rows_per_program": 8, "slots": 3, "block_cols": 256}),
    ((20, 896), jnp.bfloat16, {"rows_per_program": 8, "slots": 2, "block_cols": 128}),
    ((16, 384), jnp.float32, {"rows_per_program": 4, "slots": 3, "block_cols": 128}),
])
def test_rows_in_turn_match_the_reference_in_the_gpu_interpreter(shape, dtype, knobs, dweight_in):
    config = _config(shape, **knobs, dweight_in=dweight_in)
    assert rms_norm_bwd.check_config(config, shape, dtype, TARGET) is None
    tolerance = validate.tolerance(jnp.dtype(dtype).name, rms_norm_bwd)
    assert all(error <= tolerance for error in _errors(shape, dtype, config))


@pytest.mark.parametrize("knobs", [
    {"rows_per_program": 32, "slots": 3, "block_cols": 2048},
    {"rows_per_program": 64, "slots": 2, "block_cols": 2048, "dweight_in": "registers"},
    {"rows_per_program": 32, "slots": 3, "block_cols": 2048, "dweight_in": "registers", "stream_cols": 2},
])
def test_lowers_for_cuda_within_the_footprint(knobs, monkeypatch):
    shape = (8192, 8192)
    config = _config(shape, **knobs)
    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in (shape, (shape[1],), shape)]

    def lower() -> str:
        fn = rms_norm_bwd.build(config, shape, jnp.bfloat16, Platform(TARGET))
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    assert "mosaic_gpu" in lower()
    actual = mosaic_smem_bytes(lower, monkeypatch)
    assert actual <= rms_norm_bwd.footprint(config, shape, jnp.bfloat16, TARGET) <= actual + 1024


@pytest.mark.parametrize("dweight_in", ["smem", "registers"])
@pytest.mark.parametrize("cols,chunk,vector", [(768, 256, 2), (896, 128, 1), (2304, 256, 2), (4096, 4096, 4)])
def test_rows_no_chunk_of_512_divides_lower_for_cuda_with_fewer_elements_a_thread(cols, chunk, vector, dweight_in):
    # A chunk is the warpgroup's 128 threads x `vector` elements: 8 bytes a thread down to 512 bf16
    # columns, fewer below (Mosaic GPU refuses a layout of more elements than the chunk holds).
    shape = (4096, cols)
    config = rms_norm_bwd.default_config(shape, TARGET)
    assert config["block_cols"] == chunk and mgpu.vector_size(chunk, jnp.bfloat16) == vector
    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in (shape, (cols,), shape)]
    fn = rms_norm_bwd.build({**config, "dweight_in": dweight_in}, shape, jnp.bfloat16, Platform(TARGET))
    assert "mosaic_gpu" in jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_a_deployment_runs_gpu_triton_where_the_mosaic_default_takes_untimed_small_chunks():
    both = ("gpu-mosaic", "gpu-triton")
    assert rms_norm_bwd.default_gpu_targets((4096, 768), "bfloat16", both) == ("gpu-triton", "gpu-mosaic")
    assert rms_norm_bwd.default_gpu_targets((4096, 8192), "bfloat16", both) == both
    assert rms_norm_bwd.default_gpu_targets((4096, 768), "bfloat16", ("gpu-mosaic",)) == ("gpu-mosaic",)


def test_dweight_in_registers_leaves_the_slots_its_shared_memory():
    shape = (8192, 8192)
    in_smem = rms_norm_bwd.footprint(_config(shape, slots=2, dweight_in="smem"), shape, jnp.bfloat16, TARGET)
    in_registers = rms_norm_bwd.footprint(_config(shape, slots=2, dweight_in="registers"), shape, jnp.bfloat16, TARGET)
    assert in_smem - in_registers == 4 * 8192  # the float32 dweight row shares the slots' memory
    assert 2 * in_registers <= mgpu.mgpu_launch.SMEM_BYTES < 2 * in_smem  # two blocks a SM, against one


@pytest.mark.parametrize("shape,knobs,reason", [
    ((64, 1000), {"block_cols": 512}, "128-byte units"),
    ((64, 3072), {"block_cols": 2048}, "must divide the row"),
    ((64, 32768), {"block_cols": 2048, "slots": 2}, "shared memory"),
    ((64, 16384), {"block_cols": 2048, "dweight_in": "registers"}, "at most 64"),
    ((64, 4096), {"rows_per_program": 128}, "exceeds the rows"),
    ((64, 4096), {"slots": 5}, "slots must be in"),
    ((64, 4096), {"stream_cols": 1}, "stream_cols must be 0"),
    ((64, 4096), {"buffers": 2}, "unknown knob"),
])
def test_what_it_refuses_it_names(shape, knobs, reason):
    assert reason in rms_norm_bwd.check_config(_config(shape, **knobs), shape, "bfloat16", TARGET)


@pytest.mark.parametrize("shape", [(8192, 8192), (4096, 5120), (1000, 4096), (8, 1024)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_default_config_fits_users_shapes_in_either_dtype(shape, dtype):
    assert rms_norm_bwd.check_config(rms_norm_bwd.default_config(shape, TARGET), shape, dtype, TARGET) is None


@pytest.mark.parametrize("shape", [(3, 5120), (5, 1536)])  # a hidden size of 5120; 1536 = 3 chunks of 512
def test_default_config_matches_the_reference_at_users_widths(shape):
    tolerance = validate.tolerance("bfloat16", rms_norm_bwd)
    assert all(error <= tolerance for error in _errors(shape, jnp.bfloat16, _config(shape)))


def test_default_config_of_a_row_only_16_bit_fits():
    shape = (16384, 16384)  # a float32 row's 2 slots, weight and dweight row take 320 KiB
    config = rms_norm_bwd.default_config(shape, TARGET)
    assert rms_norm_bwd.check_config(config, shape, "bfloat16", TARGET) is None
    assert "shared memory" in rms_norm_bwd.check_config(config, shape, "float32", TARGET)


def test_the_space_offers_legal_gpu_mosaic_points(repo):
    from farm.search.valid_set import ValidSet

    space = spaces.load_space(repo / "search_spaces" / "rms_norm_bwd.yaml")
    (planned,) = plan.expand([space], [TARGET], 32)
    shape, dtype = planned.task.shape, planned.task.dtype
    every = ValidSet.enumerate(space.params_for(TARGET), lambda c: space.violated(c, shape, dtype, TARGET) is None,
                               space.prefix_checks(shape, dtype, TARGET))
    legal = [c for c in every.configs if rms_norm_bwd.check_config(dict(c), shape, dtype, TARGET) is None]
    assert legal and {c["dweight_in"] for c in legal} == {"smem", "registers"}
    assert {c["slots"] for c in legal} == {2, 3, 4}


@pytest.mark.parametrize("dweight_in", ["smem", "registers"])
def test_the_weight_read_from_global_memory(dweight_in):
    shape, dtype = (24, 1024), jnp.bfloat16
    config = _config(shape, rows_per_program=8, slots=3, block_cols=512, dweight_in=dweight_in, stream_cols=2)
    staged = rms_norm_bwd.footprint({**config, "stream_cols": 0}, shape, dtype, TARGET)
    assert staged - rms_norm_bwd.footprint(config, shape, dtype, TARGET) == 2 * 1024
    tolerance = validate.tolerance(jnp.dtype(dtype).name, rms_norm_bwd)
    assert all(error <= tolerance for error in _errors(shape, dtype, config))
