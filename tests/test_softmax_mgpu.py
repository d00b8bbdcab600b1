"""Softmax on Mosaic GPU (rows staged in shared memory): numerics in Pallas's GPU interpreter,
CUDA lowering at users' vocabularies, the footprint against Mosaic GPU's own count, refusals."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from farm.measure import outcomes, validate
from farm.measure.device import measure
from farm.tasks import TuningTask
from kernels import batch_softmax, softmax
from kernels.rows import mosaic as mosaic_rows
from kernels.lowering import Platform

TARGET = "gpu-mosaic"


def _config(block_cols: int = 1024) -> dict:
    return {"block_rows": 1, "strategy": "smem_row", "block_cols": block_cols}


def _error(shape: tuple[int, int], dtype, config: dict, x: jax.Array | None = None) -> float:
    x = softmax.make_inputs(shape, dtype, jax.random.key(5))[0] if x is None else x
    fn = softmax.build(config, shape, dtype, Platform(TARGET, interpret=True, poison_outputs=True))
    return validate.relative_error(fn(x), softmax.reference(x.astype(jnp.float32)))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("shape", [
    (3, 2048),   # rows of whole 128-byte units: each row is its own window, no masks
    (3, 1096),   # 16-byte but not 128-byte rows: the window path with every row aligned; the
                 # last chunk masked past the row
    (5, 1001),   # odd: no row after the first starts aligned; windows start up to 7 (bf16) or
                 # 3 (f32) elements early, and each row's ends are stored element by element
])
def test_staged_rows_match_the_reference_in_the_gpu_interpreter(shape, dtype):
    plan = mosaic_rows.plan(softmax.STAGED, _config(), shape, dtype)
    assert plan.aligned == (shape[1] == 2048)
    assert _error(shape, dtype, _config()) <= validate.tolerance(jnp.dtype(dtype).name, softmax)


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
    assert _error(shape, jnp.float32, _config(), x) <= validate.tolerance("float32", softmax)


@pytest.mark.parametrize("shape", [(8192, 32000), (8192, 50257), (4096, 100000)])
def test_users_vocabularies_lower_for_cuda_within_the_footprint(shape, monkeypatch):
    config = _config(4096)
    args = jax.eval_shape(lambda: softmax.make_inputs(shape, jnp.bfloat16, jax.random.key(0)))

    def lower() -> str:
        fn = softmax.build(config, shape, jnp.bfloat16, Platform(TARGET))
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    assert "mosaic_gpu" in lower()
    core = pytest.importorskip("jax.experimental.mosaic.gpu.core")
    if not hasattr(core, "_SMEM_SIZE_BOUND"):
        pytest.skip("this JAX does not expose Mosaic GPU's shared-memory bound")
    monkeypatch.setattr(core, "_SMEM_SIZE_BOUND", 1)
    with pytest.raises(ValueError, match="exceeds available shared memory") as info:
        lower()
    actual = int(re.search(r"smem_bytes=(\d+)", str(info.value)).group(1))
    model = softmax.footprint(config, shape, jnp.bfloat16, TARGET)
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
    assert softmax.default_config((8192, 50257), TARGET) == _config(4096)


def test_the_farm_measures_the_staged_softmax_in_the_gpu_interpreter():
    task = TuningTask("softmax", (4, 1001), "bfloat16", TARGET)
    m = measure(task, _config(), interpret=True, repetitions=2, warmup=1)
    assert m.outcome == outcomes.OK, m.error
    assert m.numerics_error <= validate.tolerance("bfloat16", softmax)


def test_a_row_longer_than_shared_memory_gets_no_trials_on_mosaic_gpu_and_the_space_still_loads(tmp_path):
    # 151936 bf16 columns (297 KB) do not fit a block: the shipped space with that user shape loads
    # (its gpu-triton task tunes it), and the gpu-mosaic task answers its default `invalid` with
    # the kernel's reason and proposes nothing.
    import optuna

    from farm.search import plan, spaces
    from farm.search.searcher import Searcher

    path = tmp_path / "vocab.yaml"
    path.write_text("kernel: softmax\nshapes: [[8192, 151936]]\ndtypes: [bfloat16]\n")
    space = spaces.load_space(path)
    planned = {p.task.target: p for p in plan.expand([space], ["gpu-triton", TARGET], 8)}
    answered = []
    searcher = Searcher.open(planned[TARGET], optuna.storages.InMemoryStorage(),
                             on_answer=lambda a: answered.append(a) or a)
    assert searcher.ask() is None
    assert [a.outcome for a in answered] == [outcomes.INVALID] and "shared memory" in answered[0].error
    triton = Searcher.open(planned["gpu-triton"], optuna.storages.InMemoryStorage())
    assert triton.ask() is not None
