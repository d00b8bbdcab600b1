"""The matmul family (matmul, bmm, broadcast_matmul, matmul_layernorm, matmul_subtiled_epilogue).

Numerics run every strategy in interpret mode on the CPU: TPU interpret mode for "tpu", Pallas
interpret for "gpu-triton"/"interpret", Pallas's GPU interpreter for "gpu-mosaic" (bf16 only).
Lowering for TPU and for CUDA checks what interpret mode cannot (Mosaic's block rules, WGMMA
layouts, Mosaic GPU's shared-memory budget). Timing and real-hardware numerics are not tested here.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import kernels
from farm.measure import outcomes, validate
from farm.measure.device import measure
from farm.tasks import TuningTask
from kernels import matmul_config, matmul_core, mgpu_launch
from kernels.knobs import ConfigError, Unsupported
from kernels.lowering import Platform
from tests import shipped_spaces
from tests.mosaic_checks import mosaic_smem_bytes, tma_bounds_as_on_hardware

ROOT = Path(__file__).resolve().parents[1]
FAMILY = ("matmul", "bmm", "broadcast_matmul", "matmul_layernorm", "matmul_subtiled_epilogue")

MM, BATCHED, LN, EPI = (128, 256, 256), (2, 64, 256, 256), (64, 256, 256), (128, 256, 256)
SHAPES = {"matmul": MM, "bmm": BATCHED, "broadcast_matmul": BATCHED, "matmul_layernorm": LN,
          "matmul_subtiled_epilogue": EPI}
TRITON = {"num_warps": 4, "num_stages": 2}


def _blocks(bm: int, bn: int, bk: int, **knobs) -> dict:
    return {"block_m": bm, "block_n": bn, "block_k": bk, **knobs}


def _run(name: str, config: dict, target: str, dtype=jnp.float32, shape=None) -> float:
    module = kernels.load(name)
    shape = shape or SHAPES[name]
    inputs = module.make_inputs(shape, dtype, jax.random.key(1))
    fn = module.build(config, shape, dtype, Platform(target, interpret=True, poison_outputs=True))
    out = jax.jit(fn)(*inputs)
    return validate.relative_error(out, module.reference(*validate.upcast(inputs)))


def _lower(name: str, config: dict, target: str, dtype=jnp.bfloat16, shape=None) -> str:
    module = kernels.load(name)
    shape = shape or SHAPES[name]
    inputs = jax.eval_shape(lambda: module.make_inputs(shape, dtype, jax.random.key(0)))
    platform = {"tpu": "tpu", "gpu-triton": "cuda", "gpu-mosaic": "cuda"}[target]
    fn = module.build(config, shape, dtype, Platform(target))
    return jax.jit(fn).trace(*inputs).lower(lowering_platforms=(platform,)).as_text()


def test_modules_follow_the_protocol_and_are_registered():
    for name in FAMILY:
        module = kernels.load(name)
        assert module.NAME == name
        assert set(module.TARGETS) >= {"interpret", "tpu", "gpu-triton"}


@pytest.mark.parametrize("name", FAMILY)
def test_space_loads_and_default_configs_satisfy_it(name):
    space = shipped_spaces.space(name)
    module = kernels.load(name)
    for target in space.targets:
        for shape in target.shapes:
            config = module.default_config(shape, target.name)
            assert space.violated(config, shape, target.dtypes[0], target.name) is None, (target.name, shape)
    # The seed shapes the brief asks for, in bf16 on every accelerator target.
    seeds = {t.name: t.shapes for t in space.targets if t.name != "interpret"}
    assert all(all(len(s) == len(module.SHAPE_NAMES) for s in shapes) for shapes in seeds.values())


NUMERICS = [
    ("matmul", "interpret", _blocks(64, 128, 64, group_m=2, epi_n=32)),
    ("matmul", "gpu-triton", _blocks(32, 64, 64, group_m=2, **TRITON)),
    ("matmul", "tpu", _blocks(64, 128, 128, k_strategy="grid", buffers=1)),
    ("matmul", "tpu", _blocks(128, 128, 128, k_strategy="emit_pipeline", buffers=3)),
    ("bmm", "gpu-triton", _blocks(32, 128, 32, **TRITON)),
    ("bmm", "tpu", _blocks(64, 128, 128, k_strategy="emit_pipeline")),
    ("broadcast_matmul", "gpu-triton", _blocks(32, 64, 64, fold_batch=True, group_m=4, **TRITON)),
    ("broadcast_matmul", "tpu", _blocks(64, 128, 128, k_strategy="resident", buffers=1, fold_batch=False)),
    ("broadcast_matmul", "tpu", _blocks(128, 256, 128, k_strategy="emit_pipeline", fold_batch=True)),
    ("matmul_layernorm", "gpu-triton", _blocks(16, 256, 32, ln_strategy="fused", **TRITON)),
    ("matmul_layernorm", "gpu-triton", _blocks(32, 64, 32, ln_strategy="two_phase", ln_rows=4, **TRITON)),
    ("matmul_layernorm", "gpu-triton", _blocks(32, 64, 32, ln_strategy="two_phase", ln_store="input", **TRITON)),
    ("matmul_layernorm", "tpu", _blocks(32, 256, 128, ln_strategy="fused", k_strategy="grid")),
    ("matmul_layernorm", "tpu", _blocks(64, 256, 128, ln_strategy="fused", k_strategy="emit_pipeline")),
    ("matmul_layernorm", "tpu", _blocks(64, 128, 128, ln_strategy="two_phase", ln_rows=16, k_strategy="resident")),
    ("matmul_subtiled_epilogue", "gpu-triton", _blocks(64, 128, 32, epi_n=64, **TRITON)),
    ("matmul_subtiled_epilogue", "tpu", _blocks(64, 256, 128, k_strategy="grid", epi_n=128, epi_m=32)),
    ("matmul_subtiled_epilogue", "tpu", _blocks(128, 256, 128, k_strategy="emit_pipeline", epi_n=128)),
]


@pytest.mark.parametrize("name,target,config", NUMERICS, ids=lambda v: v if isinstance(v, str) else "-".join(
    str(x) for x in v.values()))
def test_numerics_in_interpret_mode(name, target, config):
    dtype = jnp.bfloat16 if "fold_batch" in config or target == "interpret" else jnp.float32
    module = kernels.load(name)
    assert _run(name, config, target, dtype) <= validate.tolerance(jnp.dtype(dtype).name, module)


def test_a_wrong_kernel_fails_validation():
    # The layer norm's reference normalises rows: an un-normalised matmul is far off.
    module = kernels.load("matmul_layernorm")
    a, b, gamma, beta = module.make_inputs(LN, jnp.float32, jax.random.key(0))
    plain = kernels.load("matmul").build(_blocks(32, 64, 64), LN, jnp.float32, Platform("interpret"))
    assert validate.relative_error(plain(a, b), module.reference(a, b, gamma, beta)) > 0.5


TPU_LOWERING = [
    ("matmul", _blocks(128, 128, 128, k_strategy="grid", buffers=1)),
    ("matmul", _blocks(128, 256, 128, k_strategy="resident", epi_m=64, epi_n=128)),
    ("matmul", _blocks(128, 128, 128, k_strategy="emit_pipeline", buffers=3)),
    ("bmm", _blocks(64, 128, 128, k_strategy="grid")),
    ("bmm", _blocks(64, 128, 128, k_strategy="emit_pipeline")),
    ("broadcast_matmul", _blocks(64, 256, 128, k_strategy="resident", fold_batch=False)),
    ("matmul_layernorm", _blocks(64, 256, 128, ln_strategy="fused", k_strategy="emit_pipeline")),
    ("matmul_layernorm", _blocks(64, 128, 128, ln_strategy="two_phase", ln_rows=8, k_strategy="grid")),
    ("matmul_subtiled_epilogue", _blocks(128, 256, 128, k_strategy="grid", epi_n=128, epi_m=64)),
]


@pytest.mark.parametrize("name,config", TPU_LOWERING)
def test_lowers_for_tpu_on_cpu(name, config):
    assert "tpu_custom_call" in _lower(name, config, "tpu")


def test_tpu_lowering_rejects_what_interpret_mode_accepts():
    config = _blocks(64, 128, 64, k_strategy="grid")  # block_k 64: not a multiple of 128 lanes
    assert _run("matmul", config, "tpu") < 1e-5
    with pytest.raises(Exception, match="divisible by 8 and 128"):
        _lower("matmul", config, "tpu")


def test_build_refuses_unsupported_configs():
    with pytest.raises(ValueError, match="must divide"):
        kernels.load("matmul").build(_blocks(64, 128, 128, epi_n=48), MM, jnp.float32, Platform("interpret"))
    with pytest.raises(NotImplementedError, match="buffers"):
        kernels.load("matmul").build(_blocks(64, 128, 128, k_strategy="grid", buffers=3), MM,
                                     jnp.bfloat16, Platform("tpu"))
    with pytest.raises(ValueError, match="whole rows"):
        kernels.load("matmul_layernorm").build(_blocks(64, 128, 128, ln_strategy="fused"), LN,
                                               jnp.float32, Platform("interpret"))
    with pytest.raises(NotImplementedError, match="bfloat16 or float16"):
        kernels.load("matmul").build(_blocks(64, 64, 64), MM, jnp.float32, Platform("gpu-mosaic"))
    with pytest.raises(NotImplementedError, match="use tile_stats"):
        kernels.load("matmul_layernorm").build(_blocks(64, 256, 64, ln_strategy="two_phase"), LN,
                                               jnp.bfloat16, Platform("gpu-mosaic"))


@pytest.mark.parametrize("name", ["matmul", "bmm", "matmul_layernorm", "matmul_subtiled_epilogue"])
def test_triton_kernels_lower_for_cuda(name):
    config = {"matmul_layernorm": _blocks(32, 64, 32, ln_strategy="two_phase", ln_rows=4, **TRITON),
              "matmul_subtiled_epilogue": _blocks(64, 128, 32, epi_n=64, **TRITON)}.get(
        name, _blocks(32, 64, 32, group_m=2, **TRITON))
    assert "__gpu$xla.gpu.triton" in _lower(name, config, "gpu-triton")


# ------------------------------------------------------------------------------ Mosaic GPU

MGPU = [
    ("matmul", _blocks(64, 128, 64, mgpu_pipeline="pipelined", max_concurrent_steps=2)),
    ("matmul", _blocks(64, 64, 64, mgpu_pipeline="warp_specialized", max_concurrent_steps=2,
                       wg_split="n", grid_tile_width=2)),
    ("bmm", _blocks(64, 64, 64, mgpu_pipeline="warp_specialized", max_concurrent_steps=3, wg_split="m")),
    ("broadcast_matmul", _blocks(64, 128, 64, mgpu_pipeline="pipelined", max_concurrent_steps=2,
                                 fold_batch=False)),
    ("matmul_subtiled_epilogue", _blocks(64, 64, 64, mgpu_pipeline="warp_specialized",
                                         max_concurrent_steps=2, epi_n=32, grid_minor="m")),
    ("matmul", _blocks(64, 64, 64, mgpu_pipeline="warp_specialized", max_concurrent_steps=3, delay_release=1)),
]


@pytest.mark.parametrize("name,config", MGPU)
def test_mosaic_gpu_kernels_lower_for_cuda(name, config):
    shape = (2, 128, 128, 128) if name == "bmm" else None
    assert "mosaic_gpu" in _lower(name, config, "gpu-mosaic", shape=shape)


@pytest.mark.parametrize("cluster", ["m", "n"])
def test_mosaic_gpu_clusters_lower_for_cuda_and_need_an_even_tile_count(cluster):
    # Pallas's GPU interpreter has no clusters: lowering is what the CPU can check; the GPU
    # validates every clustered config's numerics when a sweep measures it.
    config = _blocks(64, 64, 64, mgpu_pipeline="warp_specialized", max_concurrent_steps=2, wg_split="n",
                     cluster=cluster)
    plain = _lower("matmul", {**config, "cluster": "none"}, "gpu-mosaic", shape=(256, 512, 128))
    clustered = _lower("matmul", config, "gpu-mosaic", shape=(256, 512, 128))
    assert "mosaic_gpu" in clustered and clustered != plain
    # a block's tile is 64 x 128; a cluster's is twice that along `cluster`
    odd = (192, 512, 128) if cluster == "m" else (256, 384, 128)
    with pytest.raises(ConfigError, match="cluster"):
        matmul_core.check(matmul_core.Problem(*odd), config, jnp.bfloat16, "gpu-mosaic")
    matmul_core.check(matmul_core.Problem(*odd), {**config, "cluster": "none"}, jnp.bfloat16, "gpu-mosaic")
    with pytest.raises(Unsupported, match="warp_specialized"):
        matmul_core.check(matmul_core.Problem(256, 512, 128), {**config, "mgpu_pipeline": "pipelined"},
                          jnp.bfloat16, "gpu-mosaic")


def test_row_statistics_of_tiles_combine_to_each_rows_mean_and_variance():
    # rows with a large offset: E[x^2] - E[x]^2 in f32 would lose the variance; sums about a shift keep it
    x = 1000.0 + jax.random.normal(jax.random.key(0), (8, 96), jnp.float32) * jnp.arange(1, 9)[:, None]
    naive = (x * x).mean(-1) - x.mean(-1) ** 2
    assert not jnp.allclose(naive, x.var(-1), rtol=1e-4)  # the case is hard enough to tell them apart
    tiles = x.reshape(8, 3, 32)
    sums = tiles.sum(-1)
    squares = ((tiles - tiles.mean(-1, keepdims=True)) ** 2).sum(-1)
    mean, var = matmul_core.combine_row_stats(jnp.stack([sums.T, squares.T]), 96)
    assert jnp.allclose(mean, x.mean(-1), rtol=1e-6)
    assert jnp.allclose(var, x.var(-1), rtol=1e-4)
    # The Triton phase 2's form: the 3 tiles padded to 4 with garbage, masked by `valid`
    padded = [jnp.concatenate([t.T, jnp.full((1, 8), 7e5)]) for t in (sums, squares)]
    valid = (jnp.arange(4) < 3)[:, None]
    masked = matmul_core.row_moments(*padded, sums.T[:1], 96, valid=valid, tiles=3)
    assert jnp.allclose(masked[0], x.mean(-1), rtol=1e-6) and jnp.allclose(masked[1], x.var(-1), rtol=1e-4)


TILE_STATS = dict(ln_strategy="tile_stats", max_concurrent_steps=2)


@pytest.mark.parametrize("pipeline,split,rows", [("warp_specialized", "m", 384), ("warp_specialized", "n", 320),
                                                 ("pipelined", "n", 320)])
def test_tile_statistics_cover_whole_row_tiles_past_a_ragged_m(pipeline, split, rows):
    # On the H200 a ragged last row tile's 1-D TMA stores of its statistics ran on into the next
    # tile's row (m = 3000 in tiles of 128: rows 0 to 71 wrong, thirty-second session). The
    # statistics now span whole row tiles (m = 300: 384 rows in tiles of 128, 320 in 64s), and
    # phase 2 reads the first m.
    # Pallas's GPU interpreter cannot run a ragged tile, so the CPU checks the lowering.
    config = _blocks(64, 64, 64, mgpu_pipeline=pipeline, wg_split=split, ln_store="input", **TILE_STATS)
    problem = matmul_core.Problem(300, 512, 128, epilogue=matmul_core.Epilogue(row_stats=True))
    core = {k: v for k, v in config.items() if not k.startswith("ln_")}
    kernel = matmul_core.build(problem, core, jnp.bfloat16, Platform("gpu-mosaic"))
    a, b = jnp.zeros((300, 128), jnp.bfloat16), jnp.zeros((128, 512), jnp.bfloat16)
    product, stats = jax.eval_shape(kernel, a, b)
    assert product.shape == (300, 512) and stats.shape == (2, 512 // 64, rows)
    text = jax.jit(kernel).trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert f"tensor<2x8x{rows}xf32>" in text
    for phase2 in ("xla", "triton"):  # both phase 2s take the padded statistics
        assert "mosaic_gpu" in _lower("matmul_layernorm", config | {"ln_phase2": phase2, "ln_rows": 1},
                                      "gpu-mosaic", shape=(300, 512, 128))
    sums = jnp.arange(2 * 3 * 5, dtype=jnp.float32).reshape(2, 3, 5)
    assert matmul_core.combine_row_stats(sums, 96, 4)[0].shape == (4,)


@pytest.mark.parametrize("pipeline,split,store,shape", [
    ("pipelined", "n", "float32", (128, 256, 128)), ("pipelined", "n", "input", (128, 256, 128)),
    ("warp_specialized", "n", "input", (128, 256, 128)), ("warp_specialized", "m", "float32", (128, 256, 128)),
    ("pipelined", "n", "input", (192, 320, 128)),  # a user's odd shape: 3 x 5 tiles, 5 per row
])
def test_mosaic_gpu_layer_norm_from_tile_statistics_in_the_gpu_interpreter(pipeline, split, store, shape,
                                                                           monkeypatch):
    # Warpgroup tiles of 64 x 64, each storing its rows' statistics over 64 columns; one "SM", so
    # the persistent kernel loops over several blocks.
    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 1)
    config = _blocks(64, 64, 64, mgpu_pipeline=pipeline, wg_split=split, ln_store=store, **TILE_STATS)
    error = _run("matmul_layernorm", config, "gpu-mosaic", jnp.bfloat16, shape)
    assert error <= validate.tolerance("bfloat16", kernels.load("matmul_layernorm"))


@pytest.mark.parametrize("rows,shape", [
    (2, (128, 256, 128)), (8, (128, 256, 128)),
    (1, (64, 384, 128)),     # 6 tiles a row, padded to 8 and masked; one masked chunk of 512 columns
    (2, (64, 1536, 128)),    # 24 tiles; three chunks of 512, unrolled
    (2, (16, 8704, 64)),     # 136 tiles; seventeen chunks of 512 in a loop
    (1, (16, 2176, 64))])    # 34 tiles; a chunk of 2048, then a masked one from column 2048
def test_tile_statistics_with_a_triton_phase_2(rows, shape, monkeypatch):
    # Mosaic GPU's phase 1 in the GPU interpreter, the Triton normalising kernel in Pallas's
    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 1)
    config = _blocks(64, 64, 64, mgpu_pipeline="warp_specialized", ln_store="input", ln_phase2="triton",
                     ln_rows=rows, **TILE_STATS)
    error = _run("matmul_layernorm", config, "gpu-mosaic", jnp.bfloat16, shape)
    assert error <= validate.tolerance("bfloat16", kernels.load("matmul_layernorm"))
    # lowering for CUDA checks the windows' bounds (a static window past a row's end is refused there)
    text = _lower("matmul_layernorm", config, "gpu-mosaic", shape=(max(shape[0], 64),) + shape[1:])
    assert "mosaic_gpu" in text and "__gpu$xla.gpu.triton" in text
    module = kernels.load("matmul_layernorm")
    assert "dividing m" in module.check_config(config | {"ln_rows": 2}, (63, 384, 128), jnp.bfloat16, "gpu-mosaic")


def test_the_triton_phase_2_chunks_a_row_in_powers_of_two():
    module = kernels.load("matmul_layernorm")
    chunks = {n: module.phase2_chunk(n) for n in (256, 384, 4096, 5120, 6144, 8192, 14336, 32768, 4160)}
    assert chunks == {256: 256, 384: 512, 4096: 4096, 5120: 1024, 6144: 2048, 8192: 8192, 14336: 2048,
                      32768: 8192, 4160: 2048}


@pytest.mark.parametrize("shape,rows", [
    ((4096, 4096, 4096), 2), ((4096, 8192, 4096), 1), ((4096, 32768, 4096), 1), ((1001, 4096, 4096), 1),
    ((4096, 5120, 5120), 1), ((16, 14336, 4096), 4), ((1, 4096, 4096), 1), ((3000, 3072, 1000), 2),
    ((4096, 14336, 4096), 4), ((1002, 14336, 4096), 2), ((4096, 16384, 4096), 1),
    ((1024, 4224, 1024), 1), ((16, 6400, 4096), 1)])  # rows ending in a masked chunk
def test_the_mosaic_gpu_layer_norm_default_stores_bf16_and_normalises_in_triton(shape, rows):
    # Measured on the H200 (BENCHMARKS.md, thirty-first session): the bf16 product and the Triton
    # phase 2 190.7 us against 209.2 (f32, XLA's phase 2) at 4096^3; at 5120 columns 292.2 against
    # 298.3 for XLA's phase 2 over the same bf16 product (the Triton phase 2 takes any n).
    module = kernels.load("matmul_layernorm")
    default = module.default_config(shape, "gpu-mosaic")
    assert (default["ln_store"], default["ln_phase2"], default["ln_rows"]) == ("input", "triton", rows)
    assert module.check_config(default, shape, jnp.bfloat16, "gpu-mosaic") is None
    space = shipped_spaces.space("matmul_layernorm")
    assert space.violated(default, shape, "bfloat16", "gpu-mosaic") is None
    assert "__gpu$xla.gpu.triton" in _lower("matmul_layernorm", default, "gpu-mosaic", shape=shape)
    assert "float32" == module.default_config(shape, "gpu-triton")["ln_store"]  # other targets unchanged


@pytest.mark.parametrize("shape,rows", [((3000, 14336, 1000), 1), ((4096, 11008, 4096), 1), ((4096, 4096, 4096), 4),
                                        ((1024, 4224, 1024), 2), ((3, 768, 64), 4), ((64, 131072, 64), 1)])
def test_the_triton_layer_norm_default_stays_in_its_space_at_wide_rows(shape, rows):
    # A sweep on the H200 answered the Triton default "invalid" at 14336 and 11008 columns (8 rows
    # a program: over the space's 65536 elements), so those tasks started from a random draw; 4
    # rows of 14336 then ran 1101.5 us against 387.5 for 1 (the rows spilled; thirty-third session).
    module = kernels.load("matmul_layernorm")
    default = module.default_config(shape, "gpu-triton")
    assert default["ln_rows"] == rows and module.check_config(default, shape, jnp.bfloat16, "gpu-triton") is None
    space = shipped_spaces.space("matmul_layernorm")
    if rows * shape[1] <= module.TRITON_ROW_ELEMENTS:
        assert space.violated(default, shape, "bfloat16", "gpu-triton") is None


def test_the_two_phase_row_kernel_takes_warps_for_its_elements_not_the_matmuls():
    # On the H200 (thirty-third session) 4 rows of 11008 in the matmul's 4 warps took 947 us (32
    # registers a thread: the rows spilled), in 8 warps 97 us.
    config = _blocks(64, 64, 32, ln_strategy="two_phase", ln_rows=1, **TRITON)
    for n, row_warps in ((14336, 8), (4096, 4)):
        text = _lower("matmul_layernorm", config, "gpu-triton", shape=(64, n, 128))
        assert re.findall(r'name = "(matmul|layer_norm)", num_stages = \d+ : i32, num_warps = (\d+)', text) == [
            ("matmul", "4"), ("layer_norm", str(row_warps))]


@pytest.mark.parametrize("name,shape,tile,warps", [
    ("matmul", (4096, 11008, 4096), (128, 256), 8), ("matmul", (1001, 50257, 4096), (128, 256), 8),
    ("matmul", (1024, 4224, 1024), (128, 128), 4),  # a ragged 256-column tile where 128 columns are whole
    ("matmul", (512, 4096, 4096), (128, 128), 4),   # 64 tiles of 128 x 256: half an H200 idle
    ("bmm", (16, 2048, 2048, 2048), (128, 256), 8), ("broadcast_matmul", (64, 2048, 2048, 2048), (128, 256), 8),
    ("matmul_layernorm", (3000, 14336, 1000), (128, 256), 8),
    ("matmul_subtiled_epilogue", (2048, 2048, 2048), (128, 256), 8),
    ("matmul", (500, 4096, 4096), (64, 64), 4), ("bmm", (64, 256, 2048, 2048), (64, 64), 4)])  # under 512 rows
def test_the_triton_default_of_a_large_product_takes_large_tiles(name, shape, tile, warps):
    # On the H200 (BENCHMARKS.md, thirty-third session; us, against the earlier 64 x 64 x 32 tiles):
    # matmul 4096^3 181.7 / 448.8 (XLA 183.7), 4096 x 11008 x 4096 496.5 / 1252.3, matmul + layer
    # norm 4096 x 11008 x 4096 617.1 / 2213.9, 1024 x 4224 x 1024 in 128 x 128 tiles 14.4 / 30.3.
    module = kernels.load(name)
    default = module.default_config(shape, "gpu-triton")
    assert (default["block_m"], default["block_n"], default["num_warps"]) == (*tile, warps)
    m = shape[-3]
    assert -(-m // default["block_m"]) % default["group_m"] == 0
    assert module.check_config(default, shape, jnp.bfloat16, "gpu-triton") is None
    space = shipped_spaces.space(name)
    assert space.violated(default, shape, "bfloat16", "gpu-triton") is None
    assert "__gpu$xla.gpu.triton" in _lower(name, default, "gpu-triton", shape=shape)


def test_the_layer_norm_space_offers_the_triton_phase_2_up_to_4_rows_at_any_width():
    space = shipped_spaces.space("matmul_layernorm")
    module = kernels.load("matmul_layernorm")

    def offered(shape, phase2):
        base = module.default_config(shape, "gpu-mosaic")
        return [r for r in (1, 2, 4, 8, 16, 32) if space.violated(
            base | {"ln_phase2": phase2, "ln_rows": r}, shape, "bfloat16", "gpu-mosaic") is None]

    assert offered((4096, 2048, 4096), "triton") == [1, 2, 4, 8]    # 16384 elements a program
    assert offered((4096, 14336, 4096), "triton") == [1, 2, 4]
    assert offered((4096, 14336, 4096), "xla") == [8]


@pytest.mark.parametrize("shape", [(128, 256, 128), (63, 256, 128)])
def test_the_mosaic_gpu_layer_norm_default_matches_the_reference(shape, monkeypatch):
    # Mosaic GPU's phase 1 and the Triton phase 2 in Pallas's GPU interpreter; 63 rows: one a program
    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 1)
    module = kernels.load("matmul_layernorm")
    default = module.default_config(shape, "gpu-mosaic")
    assert default["ln_phase2"] == "triton" and default["ln_rows"] == (2 if shape[0] % 2 == 0 else 1)
    error = _run("matmul_layernorm", default, "gpu-mosaic", jnp.bfloat16, shape)
    assert error <= validate.tolerance("bfloat16", module)


@pytest.mark.parametrize("name,shape,pipeline", [
    ("matmul", (4096, 4096, 4096), "warp_specialized"), ("matmul", (8192, 8192, 8192), "warp_specialized"),
    ("bmm", (64, 2048, 2048, 2048), "warp_specialized"),
    ("broadcast_matmul", (64, 2048, 2048, 2048), "warp_specialized"),
    ("matmul_subtiled_epilogue", (4096, 4096, 4096), "warp_specialized"),
    ("matmul_layernorm", (4096, 4096, 4096), "warp_specialized"),
    ("matmul_layernorm", (4096, 5120, 5120), "warp_specialized"),
    ("matmul_layernorm", (3000, 4096, 1000), "warp_specialized"),
    ("matmul", (1001, 4096, 4096), "pipelined"),   # off the TMA grid: the threads store it
    ("bmm", (32, 1000, 2048, 2048), "pipelined"), ("matmul_layernorm", (16, 5120, 5120), "pipelined"),
    ("matmul_layernorm", (1, 4096, 4096), "pipelined"), ("matmul", (512, 4096, 4096), "pipelined")])
def test_the_mosaic_gpu_default_of_a_large_product_is_warp_specialized(name, shape, pipeline):
    # Measured on the H200 (BENCHMARKS.md, thirtieth session): LARGE_TILES against the singly
    # pipelined tiles, e.g. matmul 8192^3 1366.9 against 1708.5 us, matmul + layer norm 4096^3 207.9
    # against 236.1; small products keep the pipelined default.
    module = kernels.load(name)
    default = module.default_config(shape, "gpu-mosaic")
    assert default["mgpu_pipeline"] == pipeline
    assert module.check_config(default, shape, jnp.bfloat16, "gpu-mosaic") is None
    space = shipped_spaces.space(name)
    assert space.violated(default, shape, "bfloat16", "gpu-mosaic") is None
    if pipeline == "warp_specialized":
        assert {k: default[k] for k in matmul_config.LARGE_TILES} == matmul_config.LARGE_TILES
        assert "mosaic_gpu" in _lower(name, default, "gpu-mosaic", shape=shape)


@pytest.mark.parametrize("name,shape,cluster", [
    ("matmul", (4096, 11008, 4096), "m"), ("matmul", (2048, 11008, 4096), "m"),
    ("matmul_layernorm", (4096, 6400, 4096), "m"), ("bmm", (4, 1024, 11008, 4096), "m"),
    ("matmul", (1032, 11008, 4096), "none")])  # 43 or 25 n tiles; 1032 rows: 9 m tiles of 128 (ragged)
def test_the_large_default_pairs_m_tiles_where_the_n_tiles_are_odd(name, shape, cluster):
    # Measured on the H200 (BENCHMARKS.md, thirty-second session): matmul 4096 x 11008 x 4096 476.6
    # us clustered along m against 625.4 in the pipelined tiles it fell back to (XLA 522.0).
    module = kernels.load(name)
    default = module.default_config(shape, "gpu-mosaic")
    assert {k: default[k] for k in matmul_config.LARGE_TILES} == matmul_config.LARGE_TILES | {"cluster": cluster}
    assert module.check_config(default, shape, jnp.bfloat16, "gpu-mosaic") is None
    assert module.check_config(default | {"cluster": "n"}, shape, jnp.bfloat16, "gpu-mosaic") is not None
    space = shipped_spaces.space(name)
    assert space.violated(default, shape, "bfloat16", "gpu-mosaic") is None
    assert "mosaic_gpu" in _lower(name, default, "gpu-mosaic", shape=shape)


@pytest.mark.parametrize("split,cluster", [("m", "m"), ("n", "n")])
def test_mosaic_gpu_layer_norm_from_tile_statistics_lowers_in_clusters(split, cluster):
    # Pallas's GPU interpreter has no clusters: the CPU checks the lowering, the GPU the numerics.
    config = _blocks(64, 64, 64, mgpu_pipeline="warp_specialized", wg_split=split, cluster=cluster, **TILE_STATS)
    assert "mosaic_gpu" in _lower("matmul_layernorm", config, "gpu-mosaic", shape=(256, 512, 128))


def test_tile_statistics_are_a_mosaic_gpu_strategy():
    module = kernels.load("matmul_layernorm")
    assert "Mosaic GPU" in module.check_config(_blocks(32, 64, 32, ln_strategy="tile_stats", **TRITON), LN,
                                                 jnp.bfloat16, "gpu-triton")
    assert "tile_stats" in module.check_config(_blocks(64, 64, 64, ln_strategy="two_phase"), LN, jnp.bfloat16,
                                               "gpu-mosaic")
    assert module.default_config(LN, "gpu-mosaic")["ln_strategy"] == "tile_stats"


@pytest.mark.parametrize("name,config", [MGPU[0], MGPU[4]])
def test_mosaic_gpu_numerics_in_the_gpu_interpreter(name, config, monkeypatch):
    # One "SM", so the persistent warp-specialized kernel loops over both tiles.
    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 1)
    shape = {"matmul": (128, 256, 128), "matmul_subtiled_epilogue": (128, 128, 128)}[name]
    error = _run(name, config, "gpu-mosaic", jnp.bfloat16, shape)
    assert error <= validate.tolerance("bfloat16", kernels.load(name))


def test_mosaic_gpu_poisoned_build_writes_into_a_nan_buffer():
    module = kernels.load("matmul")
    inputs = jax.eval_shape(lambda: module.make_inputs(MM, jnp.bfloat16, jax.random.key(0)))
    fn = module.build(MGPU[1][1], MM, jnp.bfloat16, Platform("gpu-mosaic", poison_outputs=True))
    text = jax.jit(fn).trace(*inputs).lower(lowering_platforms=("cuda",)).as_text()
    assert "dense<0x7FC0> : tensor<bf16>" in text  # the NaN the output buffer starts from
    assert "output_operand_aliases" in text  # ... and the kernel writes into it in place


SEED = (8192, 8192, 8192)
SMEM_CASES = [
    _blocks(128, 128, 64, mgpu_pipeline="warp_specialized", max_concurrent_steps=4),  # fits: 229968 B
    _blocks(128, 128, 64, mgpu_pipeline="warp_specialized", max_concurrent_steps=5),  # does not
    _blocks(128, 128, 64, mgpu_pipeline="pipelined", max_concurrent_steps=6),
    _blocks(64, 256, 128, mgpu_pipeline="pipelined", max_concurrent_steps=3, epi_n=128),
    _blocks(128, 128, 64, mgpu_pipeline="warp_specialized", wg_split="m", max_concurrent_steps=3, epi_n=32),
]


@pytest.mark.parametrize("config", SMEM_CASES)
def test_mosaic_gpu_footprint_bounds_mosaics_own_shared_memory_count(config, monkeypatch):
    core = pytest.importorskip("jax.experimental.mosaic.gpu.core")
    if not hasattr(core, "_SMEM_SIZE_BOUND"):
        pytest.skip("this JAX does not expose Mosaic GPU's shared-memory bound")
    model = kernels.load("matmul").footprint(config, SEED, jnp.bfloat16, "gpu-mosaic")
    try:
        _lower("matmul", config, "gpu-mosaic", shape=SEED)
        fits = True
    except ValueError as err:
        assert "exceeds available shared memory" in str(err)
        fits = False
    assert fits == (model <= mgpu_launch.SMEM_BYTES)
    actual = mosaic_smem_bytes(lambda: _lower("matmul", config, "gpu-mosaic", shape=SEED), monkeypatch)
    assert actual <= model <= actual + matmul_config.MGPU_SMEM_OVERHEAD


def test_footprints_grow_with_tiles_and_depth():
    p = matmul_core.Problem(4096, 4096, 4096)
    small = _blocks(128, 128, 128, k_strategy="grid")
    assert matmul_core.footprint(p, small, jnp.bfloat16, "tpu") < matmul_core.footprint(
        p, {**small, "k_strategy": "resident"}, jnp.bfloat16, "tpu")
    assert matmul_core.footprint(p, {**small, "buffers": 1}, jnp.bfloat16, "tpu") < matmul_core.footprint(
        p, small, jnp.bfloat16, "tpu")
    triton = _blocks(128, 128, 64, num_stages=2)
    assert matmul_core.footprint(p, triton, jnp.bfloat16, "gpu-triton") < matmul_core.footprint(
        p, {**triton, "num_stages": 4}, jnp.bfloat16, "gpu-triton")


def test_the_farm_measures_tpu_strategies_and_rejects_what_mosaic_would():
    task = TuningTask("matmul_layernorm", LN, "bfloat16", "tpu")
    good = _blocks(32, 256, 128, ln_strategy="fused", k_strategy="emit_pipeline", buffers=3)
    m = measure(task, good, interpret=True, repetitions=2, warmup=1)
    assert m.outcome == outcomes.OK, m.error
    m = measure(task, {**good, "k_strategy": "grid", "buffers": 2, "block_k": 64}, interpret=True,
                repetitions=2, warmup=1)
    assert m.outcome == outcomes.COMPILE_ERROR and "divisible by 8 and 128" in m.error


# ------------------------------------------------------------------ shapes no tile divides

# A user's shapes: token counts, widths and vocabularies that no tile divides. Every target pads
# what its kernel cannot take (`MatmulConfig.padded`); the Mosaic GPU kernels take edge tiles on
# the 8-row, 64-column grid as they are (TMA zero-fills reads past an edge and clips writes),
# which the CPU can only lower: Pallas's GPU interpreter raises on (or leaves uninitialised) reads
# past an edge. The H200 checks their numerics (`bench/check_gpu_kernels.py --ragged`, BENCHMARKS.md).
RAGGED = [
    ("matmul", "interpret", (100, 72, 40), _blocks(32, 32, 16, group_m=2)),
    ("matmul", "gpu-triton", (100, 72, 40), _blocks(32, 64, 32, **TRITON)),
    ("matmul", "tpu", (20, 200, 136), _blocks(16, 128, 128, k_strategy="emit_pipeline")),
    ("bmm", "gpu-triton", (2, 50, 72, 40), _blocks(32, 32, 16, group_m=2, **TRITON)),
    ("broadcast_matmul", "interpret", (3, 50, 72, 40), _blocks(32, 32, 16, fold_batch=True)),
    ("broadcast_matmul", "interpret", (3, 50, 72, 40), _blocks(32, 32, 16, fold_batch=False)),
    ("matmul_subtiled_epilogue", "interpret", (100, 72, 40), _blocks(32, 64, 16, epi_n=32)),
    ("matmul_layernorm", "interpret", (96, 72, 40), _blocks(32, 32, 16, ln_strategy="two_phase", ln_rows=8)),
    ("matmul_layernorm", "interpret", (50, 72, 40), _blocks(32, 72, 16, ln_strategy="fused")),
    # a hidden size that is no power of two (5120, 768), rows that 8 do not divide: Triton's row
    # kernel masks the columns and the last program's rows
    ("matmul_layernorm", "gpu-triton", (50, 200, 40), _blocks(16, 64, 16, ln_strategy="two_phase", ln_rows=8,
                                                              **TRITON)),
]


# ------------------------------------------------------------------------------ a split K
# A decode step multiplies a few rows by a long K: too few output tiles to keep every SM reading
# B, so split_k gives each tile several programs, each one run of K, their f32 partial products
# summed (and the epilogue applied) after the kernel.
SPLIT = [
    ("matmul", "interpret", (16, 128, 512), _blocks(16, 64, 32, split_k=4)),
    ("matmul", "interpret", (5, 72, 300), _blocks(16, 32, 32, split_k=4)),  # ragged m, n; k padded to 4 runs
    ("matmul", "gpu-triton", (1, 64, 256), _blocks(16, 32, 32, split_k=2, **TRITON)),
    ("bmm", "interpret", (3, 8, 64, 256), _blocks(16, 32, 32, split_k=2)),
    ("broadcast_matmul", "interpret", (3, 8, 64, 256), _blocks(16, 32, 32, fold_batch=True, split_k=8)),
    ("matmul_subtiled_epilogue", "interpret", (16, 128, 256), _blocks(16, 64, 32, epi_n=32, split_k=2)),
    ("matmul_layernorm", "interpret", (16, 64, 256), _blocks(16, 64, 32, ln_strategy="fused", split_k=4)),
]


@pytest.mark.parametrize("name,target,shape,config", RAGGED + SPLIT, ids=lambda v: "x".join(map(str, v))
                         if isinstance(v, tuple) else v if isinstance(v, str) else None)
def test_shapes_no_tile_divides_and_split_ks_match_the_reference(name, target, shape, config):
    module = kernels.load(name)
    assert module.check_config(config, shape, jnp.float32, target) is None
    assert _run(name, config, target, jnp.float32, shape) <= validate.tolerance("float32", module)


def test_mosaic_gpu_takes_ragged_edge_tiles_without_copies():
    # (200, 192, 192) in 128 x 128 block tiles, K in steps of 128: every dimension ends in a part tile.
    config = _blocks(64, 128, 128, mgpu_pipeline="warp_specialized", wg_split="m", max_concurrent_steps=2)
    on_grid = _lower("matmul", config, "gpu-mosaic", shape=(200, 192, 192))
    assert "mosaic_gpu" in on_grid and "stablehlo.pad" not in on_grid and "stablehlo.slice" not in on_grid
    assert "stablehlo.pad" not in _lower("bmm", config, "gpu-mosaic", shape=(3, 200, 192, 192))
    # 201 rows, 200 columns: off the 8-row and 64-column grid, so the operands are padded to it; the
    # product, which TMA cannot store at its size, is padded and sliced back, or (store "threads")
    # stored by the threads at its own size
    problem = matmul_core.Problem(201, 200, 192)
    typed = matmul_core.check(problem, config, jnp.bfloat16, "gpu-mosaic")
    runs = typed.padded(problem, jnp.bfloat16)
    assert (runs.m, runs.n, runs.k) == (208, 256, 192)
    assert typed.writes(problem, jnp.bfloat16) == runs
    off_grid = _lower("matmul", config, "gpu-mosaic", shape=(201, 200, 192))
    assert "stablehlo.pad" in off_grid and "stablehlo.slice" in off_grid
    threads = matmul_core.check(problem, {**config, "store": "threads"}, jnp.bfloat16, "gpu-mosaic")
    assert threads.writes(problem, jnp.bfloat16) == dataclasses.replace(runs, m=201, n=200)
    off_grid = _lower("matmul", {**config, "store": "threads"}, "gpu-mosaic", shape=(201, 200, 192))
    assert "stablehlo.pad" in off_grid and "stablehlo.slice" not in off_grid


# Shapes off the grid, each kernel and pipeline: the threads store the product (`mgpu_store`).
DIRECT = [
    ("matmul", (4096, 50257, 768), _blocks(128, 128, 128, mgpu_pipeline="warp_specialized", wg_split="m",
                                            max_concurrent_steps=2, store="threads")),
    ("matmul", (1001, 4096, 512), _blocks(128, 128, 64, mgpu_pipeline="warp_specialized", wg_split="n",
                                           cluster="n", delay_release=1, store="threads")),
    ("matmul", (300, 1001, 128), _blocks(128, 128, 64, store="threads")),
    ("bmm", (2, 1001, 130, 64), _blocks(128, 128, 64, store="threads")),
    ("broadcast_matmul", (3, 50, 72, 64), _blocks(64, 64, 64, fold_batch=False, store="threads")),
    ("matmul_subtiled_epilogue", (1001, 1002, 128), _blocks(128, 128, 64, epi_n=32, store="threads")),
]


@pytest.mark.parametrize("name,shape,config", DIRECT, ids=lambda v: "x".join(map(str, v))
                         if isinstance(v, tuple) else v if isinstance(v, str) else None)
def test_mosaic_gpu_threads_store_products_off_the_grid_without_slicing(name, shape, config):
    text = _lower(name, config, "gpu-mosaic", shape=shape)
    assert "mosaic_gpu" in text and "stablehlo.pad" in text and "stablehlo.slice" not in text


def test_thread_stores_stage_one_slot_and_are_refused_on_the_grid_and_with_row_statistics():
    config = _blocks(128, 128, 64, mgpu_pipeline="warp_specialized")
    threads = {**config, "store": "threads"}
    on_grid, off_grid = matmul_core.Problem(4096, 4096, 768), matmul_core.Problem(4096, 4033, 768)
    assert "on it" in matmul_core.check_config(on_grid, threads, jnp.bfloat16, "gpu-mosaic")
    assert matmul_core.check_config(off_grid, threads, jnp.bfloat16, "gpu-mosaic") is None
    t = matmul_core.as_config(config, "gpu-mosaic").tiles()
    assert matmul_core.footprint(off_grid, config, jnp.bfloat16, "gpu-mosaic") - matmul_core.footprint(
        off_grid, threads, jnp.bfloat16, "gpu-mosaic") == t.wgs * (t.slots - 1) * t.epi_m * t.epi_n * 2
    stats = matmul_core.Problem(4001, 4096, 768, epilogue=matmul_core.Epilogue(row_stats=True))
    assert "row statistics" in matmul_core.check_config(stats, threads, jnp.bfloat16, "gpu-mosaic")
    # the interpreter cannot run inlined Mosaic GPU code: it writes the padded product
    assert _run("matmul", {**_blocks(64, 128, 64), "store": "threads"}, "gpu-mosaic", jnp.bfloat16,
                (128, 200, 128)) <= validate.tolerance("bfloat16", kernels.load("matmul"))


def test_thread_stores_are_as_wide_as_the_row_width_keeps_them_aligned():
    from kernels.mgpu_store import vector_width

    assert [vector_width(n, 2) for n in (50257, 50258, 4036, 4096, 200)] == [1, 2, 4, 8, 8]
    assert [vector_width(n, 4) for n in (50257, 4096)] == [1, 4]


def test_row_statistics_take_ragged_rows_but_refuse_ragged_columns():
    module = kernels.load("matmul_layernorm")
    config = _blocks(64, 128, 64, ln_strategy="tile_stats", ln_store="input", mgpu_pipeline="warp_specialized",
                     wg_split="m", max_concurrent_steps=2)
    assert module.check_config(config, (200, 256, 128), jnp.bfloat16, "gpu-mosaic") is None
    assert "mosaic_gpu" in _lower("matmul_layernorm", config, "gpu-mosaic", shape=(200, 256, 128))
    # a part tile's statistics would count the zeros past the edge as columns of the row
    assert "must divide n = 192" in module.check_config(config, (200, 192, 128), jnp.bfloat16, "gpu-mosaic")
    # Triton blocks are powers of two: the fused kernel's whole rows of 200 columns are refused, not
    # miscompiled; two_phase's row kernel masks them (test_shapes_no_tile_divides_match_the_reference)
    fused = _blocks(32, 200, 32, ln_strategy="fused", **TRITON)
    assert "powers of two" in module.check_config(fused, (64, 200, 128), jnp.bfloat16, "gpu-triton")
    two_phase = _blocks(32, 64, 32, ln_strategy="two_phase", ln_rows=4, **TRITON)
    assert module.check_config(two_phase, (64, 200, 128), jnp.bfloat16, "gpu-triton") is None
    assert "ln_rows = 3): Triton blocks are powers of two" in module.check_config(
        {**two_phase, "ln_rows": 3}, (63, 200, 128), jnp.bfloat16, "gpu-triton")
    assert module.default_config((3, 200, 128), "gpu-triton")["ln_rows"] == 4  # 3 rows in a masked tile of 4
    assert "__gpu$xla.gpu.triton" in _lower("matmul_layernorm", two_phase, "gpu-triton", shape=(64, 5120, 128))


@pytest.mark.parametrize("shape", [(3000, 4096, 4096), (1001, 50257, 768)])
def test_default_configs_and_the_search_cover_shapes_no_tile_divides(shape):
    from farm.search.valid_set import ValidSet

    for name in ("matmul", "matmul_subtiled_epilogue"):
        module = kernels.load(name)
        space = shipped_spaces.space(name)
        for target in ("gpu-mosaic", "gpu-triton", "tpu"):
            config = module.default_config(shape, target)
            assert module.check_config(config, shape, "bfloat16", target) is None, (name, target, config)
            assert 64 <= config["block_m"] <= 256  # a tile: not the whole ragged dimension, nor 8 rows
        found = ValidSet.enumerate(space.params_for("gpu-mosaic"), space.leaf_check(shape, "bfloat16", "gpu-mosaic"),
                                   space.prefix_checks(shape, "bfloat16", "gpu-mosaic"))
        assert found is not None and len(found) > 1000, name


def test_a_split_k_pads_k_to_whole_runs_bounds_its_partials_and_lowers_for_cuda():
    triton = matmul_config.TritonMatmulConfig(16, 64, 128, split_k=4)
    runs = triton.padded(matmul_core.Problem(16, 4096, 14000), jnp.bfloat16)
    assert (runs.m, runs.n, runs.k) == (16, 4096, 14336)  # 4 runs of 28 steps of 128
    assert triton.partial_bytes(matmul_core.Problem(16, 4096, 14000), jnp.bfloat16) == 4 * 16 * 4096 * 4
    assert matmul_config.TritonMatmulConfig(16, 64, 128).partial_bytes(runs, jnp.bfloat16) == 0
    with pytest.raises(ConfigError, match="split_k must be in 1..64"):
        matmul_config.TritonMatmulConfig(16, 64, 128, split_k=0)
    module = kernels.load("matmul")
    refusal = module.check_config(_blocks(64, 64, 64, split_k=16, **TRITON), (8192, 8192, 8192), "bfloat16",
                                  "gpu-triton")
    assert "4096 MiB, over the 1024 MiB bound" in refusal
    text = _lower("matmul", _blocks(16, 64, 128, split_k=4, **TRITON), "gpu-triton", shape=(16, 4096, 14336))
    assert "__gpu$xla.gpu.triton" in text and "tensor<4x16x4096xf32>" in text  # the partials, then their sum


def test_the_search_splits_k_only_where_output_tiles_are_few():
    space = shipped_spaces.space("matmul")
    from farm.search.valid_set import ValidSet

    def splits(shape):
        found = ValidSet.enumerate(space.params_for("gpu-triton"), space.leaf_check(shape, "bfloat16", "gpu-triton"),
                                   space.prefix_checks(shape, "bfloat16", "gpu-triton"))
        return {c["split_k"] for c in found.configs}

    assert splits((16, 4096, 14336)) == {1, 2, 4, 8, 16}
    assert splits((8192, 8192, 8192)) == {1}


def test_a_tpu_kernels_output_feeds_the_next_outside_jit():
    # TPU interpret mode traces under an abstract TPU mesh; matmul + layer norm's two phases are
    # two TPU kernels. Called outside jax.jit, the first's output came back sharded over a
    # one-CPU mesh (the abstract mesh's axis was Explicit) and the second refused it as not its
    # context's mesh (`kernels.tpu_mesh`).
    module = kernels.load("matmul_layernorm")
    config = _blocks(64, 128, 128, ln_strategy="two_phase", ln_rows=16, k_strategy="grid")
    inputs = module.make_inputs(LN, jnp.float32, jax.random.key(1))
    out = module.build(config, LN, jnp.float32, Platform("tpu", interpret=True))(*inputs)
    assert validate.relative_error(out, module.reference(*inputs)) <= validate.tolerance("float32", module)


@pytest.mark.parametrize("name,shape", [("matmul", (200, 320, 192)), ("broadcast_matmul", (2, 32, 423, 369)),
                                        ("bmm", (2, 200, 320, 192))])
def test_mosaic_gpu_part_tiles_match_the_reference_with_tma_bounds(name, shape, monkeypatch):
    # Tiles past m, n or k: run as part tiles on the 8-row, 64-column grid, or past the padded
    # operands off it. Pallas's GPU interpreter raised on those reads past the end and dropped
    # those writes whole; TMA reads zeros there and drops only the part past the end, which the
    # emulation does (`tma_bounds_as_on_hardware`).
    tma_bounds_as_on_hardware(monkeypatch)
    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 2)
    module = kernels.load(name)
    config = module.default_config(shape, "gpu-mosaic")
    assert module.check_config(config, shape, jnp.bfloat16, "gpu-mosaic") is None
    assert _run(name, config, "gpu-mosaic", jnp.bfloat16, shape) <= validate.tolerance("bfloat16", module)


@pytest.mark.parametrize("name,shape", [("matmul", (35, 64, 1899)), ("bmm", (2, 38, 300, 16)),
                                        ("matmul_layernorm", (35, 515, 491)), ("matmul", (600, 700, 40))])
def test_triton_defaults_at_odd_shapes_lower_for_cuda(name, shape):
    # 35 rows took 48-row tiles (the smallest whole number of 16-row units), which Triton's
    # lowering refuses (its arrays are powers of two) and check_config let through: a
    # deployment's default for a batch of 35 failed to compile. Such tiles are now refused.
    module = kernels.load(name)
    default = module.default_config(shape, "gpu-triton")
    assert module.check_config(default, shape, jnp.bfloat16, "gpu-triton") is None
    assert "__gpu$xla.gpu.triton" in _lower(name, default, "gpu-triton", shape=shape)
    refused = module.check_config(default | {"block_m": 48}, shape, jnp.bfloat16, "gpu-triton")
    assert refused is not None and "powers of two" in refused


@pytest.mark.parametrize("name", ["matmul", "bmm", "matmul_subtiled_epilogue", "matmul_layernorm"])
def test_delay_release_needs_two_k_steps_a_tile(name):
    # With k in one block_k step, JAX's warp-specialized pipeline never releases that step's slots:
    # the next tile's copies overtook them in the GPU interpreter (barrier phases, hangs; a race
    # or a hang on hardware). check_config refuses it and the spaces offer none.
    module = kernels.load(name)
    extra = TILE_STATS if name == "matmul_layernorm" else {}
    config = _blocks(64, 64, 64, mgpu_pipeline="warp_specialized", wg_split="m", delay_release=1, **extra)
    short = {"bmm": (2, 77, 197, 64)}.get(name, (128, 256, 64))
    refusal = module.check_config(config, short, jnp.bfloat16, "gpu-mosaic")
    assert refusal is not None and "delay_release 1 needs more K steps" in refusal
    longer = short[:-1] + (128,)
    assert module.check_config(config, longer, jnp.bfloat16, "gpu-mosaic") is None
    space = shipped_spaces.space(name)
    assert space.violated(config, short, "bfloat16", "gpu-mosaic") is not None
    assert space.violated(config, longer, "bfloat16", "gpu-mosaic") is None


@pytest.mark.parametrize("name,shape", [("bmm", (4, 128, 128, 256)), ("matmul", (128, 128, 256))])
def test_the_persistent_kernel_runs_one_tile_a_batch_entry_in_the_gpu_interpreter(name, shape, monkeypatch):
    # A (1, 1) grid of tiles: planar_snake's remainder by a width of 0 killed the process (SIGFPE).
    tma_bounds_as_on_hardware(monkeypatch)
    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 2)
    config = _blocks(64, 128, 64, mgpu_pipeline="warp_specialized", wg_split="m", max_concurrent_steps=2)
    assert kernels.load(name).check_config(config, shape, jnp.bfloat16, "gpu-mosaic") is None
    error = _run(name, config, "gpu-mosaic", jnp.bfloat16, shape)
    assert error <= validate.tolerance("bfloat16", kernels.load(name))
