"""The Mosaic GPU matmul's split tail (tail_split): the last row bands' tiles run as runs of K,
dealt to the persistent slots that the whole tiles leave idle, their partial products summed
after the kernel. The plan is arithmetic (checked here exactly); the kernel runs in Pallas's GPU
interpreter on a few simulated SMs (numerics, outputs poisoned) and lowers for CUDA at users'
shapes with clusters (which the interpreter lacks). Its speed is the H200's to measure
(`bench/probes/tail_split.sh`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import kernels
from farm.measure import outcomes, validate
from farm.measure.device import measure
from farm.tasks import TuningTask
from kernels import matmul_config, mgpu_launch
from kernels.lowering import Platform
from kernels.matmul_config import LARGE_TILES, Epilogue, Problem, as_config, tail_plan
from tests import shipped_spaces
from tests.mosaic_checks import tma_bounds_as_on_hardware

SMALL = dict(block_m=64, block_n=64, block_k=64, mgpu_pipeline="warp_specialized", max_concurrent_steps=2,
             wg_split="m")  # 128 x 64 block tiles


@pytest.mark.parametrize("bands,tiles_per_band,batches,slots,splits", [
    (16, 25, 1, 66, 2), (16, 25, 1, 66, 4), (8, 43, 1, 66, 4),  # 4096 x 6400, 2048 x 11008 in LARGE_TILES
    (2, 16, 1, 132, 4),  # 32 tiles on 132 SMs: every tile split
    (4, 8, 3, 66, 2),  # a batch: the last entry's bands
    (3, 1, 1, 2, 2), (7, 3, 2, 5, 4)])
def test_every_piece_runs_on_one_slot_and_the_busiest_slot_ends_sooner(bands, tiles_per_band, batches, slots,
                                                                         splits):
    plan = tail_plan(bands, tiles_per_band, batches, slots, splits)
    assert plan.bands > 0 and plan.makespan < plan.whole
    assert plan.head_tiles + plan.bands * tiles_per_band == batches * bands * tiles_per_band
    assert plan.pieces == plan.bands * tiles_per_band * splits
    dealt = []
    loads = []
    for slot in range(plan.blocks):
        first, count = int(plan.first_piece(slot)), int(plan.pieces_of(slot))
        dealt += range(first, first + count)
        whole = plan.head_tiles // plan.blocks + (slot < plan.head_tiles % plan.blocks)
        loads.append(whole + count * (1 / splits + matmul_config.TAIL_PIECE_COST))
    assert sorted(dealt) == list(range(plan.pieces))  # each piece once
    assert max(loads) == pytest.approx(plan.makespan)


@pytest.mark.parametrize("bands,tiles_per_band,slots", [(33, 2, 66), (64, 16, 66), (4, 33, 66)])
def test_whole_waves_split_nothing(bands, tiles_per_band, slots):
    # 66 and 132 tiles on 66 slots: one and two full waves; 1024 tiles on 66 slots (8192^3 in
    # LARGE_TILES): 15.5 waves, whose half-full last wave no split of the last bands shortens by 2%
    # at these costs.
    for splits in (2, 4, 8):
        assert tail_plan(bands, tiles_per_band, 1, slots, splits).bands == 0


def _run(name, config, shape, sms, monkeypatch):
    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: sms)
    module = kernels.load(name)
    assert module.check_config(config, shape, jnp.bfloat16, "gpu-mosaic") is None
    plan = as_config(config, "gpu-mosaic").tail(Problem(*shape[-3:], batch=shape[0] if len(shape) == 4 else 0),
                                                jnp.bfloat16)
    assert plan.bands and plan.head_tiles and plan.pieces  # whole tiles, then pieces
    inputs = module.make_inputs(shape, jnp.bfloat16, jax.random.key(3))
    fn = module.build(config, shape, jnp.bfloat16, Platform("gpu-mosaic", interpret=True, poison_outputs=True))
    error = validate.relative_error(jax.jit(fn)(*inputs), module.reference(*validate.upcast(inputs)))
    assert error <= validate.tolerance("bfloat16", module)


@pytest.mark.parametrize("name,shape,sms,split", [
    ("matmul", (384, 64, 256), 2, 2),  # 3 tiles on 2 SMs: 2 whole, the last band in 2 runs of K
    ("bmm", (2, 384, 64, 256), 4, 2),  # the last entry's last 2 bands split; its first band whole
])
def test_a_split_tail_in_the_gpu_interpreter(name, shape, sms, split, monkeypatch):
    _run(name, {**SMALL, "tail_split": split}, shape, sms, monkeypatch)


def test_a_ragged_last_band_splits_as_tma_clips_it(monkeypatch):
    # 360 rows: the split band holds 104 of its 128; its pieces' partial rows past m are
    # dropped by TMA (emulated), as the product's are
    tma_bounds_as_on_hardware(monkeypatch)
    _run("matmul", {**SMALL, "tail_split": 2}, (360, 64, 256), 2, monkeypatch)


def test_the_epilogue_runs_on_the_summed_pieces(monkeypatch):
    # bias + SiLU: in the kernel for whole tiles, after the sum for split ones
    _run("matmul_subtiled_epilogue", {**SMALL, "tail_split": 2}, (384, 128, 256), 4, monkeypatch)


@pytest.mark.parametrize("name,shape,cluster,split", [
    ("matmul", (4096, 6400, 4096), "m", 4), ("matmul", (2048, 11008, 4096), "m", 2),
    ("bmm", (3, 1024, 2048, 1024), "n", 2), ("matmul", (1024, 14336, 4096), "n", 4)])
def test_users_shapes_lower_for_cuda_with_a_split_tail_in_clusters(name, shape, cluster, split):
    module = kernels.load(name)
    config = {**module.default_config(shape, "gpu-mosaic"), "tail_split": split}
    assert {k: config[k] for k in LARGE_TILES} == LARGE_TILES | {"cluster": cluster}
    assert module.check_config(config, shape, jnp.bfloat16, "gpu-mosaic") is None
    assert shipped_spaces.space(name).violated(config, shape, "bfloat16", "gpu-mosaic") is None
    inputs = jax.eval_shape(lambda: module.make_inputs(shape, jnp.bfloat16, jax.random.key(0)))
    fn = module.build(config, shape, jnp.bfloat16, Platform("gpu-mosaic"))
    text = jax.jit(fn).trace(*inputs).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text and "dynamic_update_slice" in text  # the summed tail written into the product


@pytest.mark.parametrize("config,shape,epilogue,why", [
    ({**SMALL, "mgpu_pipeline": "pipelined"}, (384, 64, 256), Epilogue(), "warp_specialized pipeline only"),
    ({**SMALL, "tail_split": 3}, (384, 64, 256), Epilogue(), "equal runs"),  # 4 K steps in 3 runs
    ({**SMALL, "tail_split": 4}, (384, 64, 256), Epilogue(), "equal runs"),  # runs of 1 step < 2 in flight
    ({**SMALL, "tail_split": 2}, (512, 64, 256), Epilogue(), "shortens nothing"),  # 4 tiles: 2 whole waves
    ({**SMALL, "tail_split": 2}, (384, 64, 256), Epilogue(row_stats=True), "row statistics"),
    ({**SMALL, "tail_split": 32}, (384, 64, 256), Epilogue(), "tail_split must be in 1..16"),
])
def test_splits_that_cannot_run_or_gain_are_refused(config, shape, epilogue, why, monkeypatch):
    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 2)
    config = {"tail_split": 2, **config}
    problem = Problem(*shape, epilogue=epilogue)
    with pytest.raises(Exception, match=why):
        as_config(config, "gpu-mosaic").check(problem, jnp.bfloat16)


def test_split_rows_are_as_exact_as_whole_ones(monkeypatch):
    # Each piece stores its f32 partial as two halves of bfloat16 (the value, and what rounding
    # it left): their sum carries about 16 bits, so the split rows' error matches the unsplit
    # kernel's. With the first half alone it was 42% larger here (0.00238 against 0.00167).
    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 2)
    module, shape = kernels.load("matmul"), (384, 64, 512)  # 4 K runs of the last of 3 bands
    inputs = module.make_inputs(shape, jnp.bfloat16, jax.random.key(3))
    reference = module.reference(*validate.upcast(inputs))[256:]
    errors = []
    for split in (1, 4):
        fn = module.build({**SMALL, "tail_split": split}, shape, jnp.bfloat16,
                          Platform("gpu-mosaic", interpret=True, poison_outputs=True))
        errors.append(validate.relative_error(jax.jit(fn)(*inputs)[256:], reference))
    assert as_config({**SMALL, "tail_split": 4}, "gpu-mosaic").tail(Problem(*shape), jnp.bfloat16).bands == 1
    assert errors[1] <= 1.01 * errors[0]


def test_the_farm_measures_a_split_tail_as_a_worker_does(monkeypatch):
    # The worker's path (build, validation against the reference, timing), in the GPU interpreter.
    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 2)
    task = TuningTask("matmul", (384, 64, 256), "bfloat16", "gpu-mosaic")
    m = measure(task, {**kernels.load("matmul").default_config(task.shape, "gpu-mosaic"), **SMALL,
                       "tail_split": 2}, interpret=True, repetitions=2, warmup=1)
    assert m.outcome == outcomes.OK, m.error
    assert m.numerics_error <= validate.tolerance("bfloat16")
