"""Flash attention forward (flash_attention, flash_attention_causal): strategies, lowering, VMEM.

Numerics run in interpret mode on the CPU with tiny sequences (TPU interpret mode is slow):
both TPU strategies, Triton, and the Mosaic GPU kernels in Pallas's GPU interpreter (whose
matmuls there are plain dots, see kernels/attention_mgpu.py). Lowering for TPU and CUDA
checks block rules, layouts and shared memory; speed is only measured on real hardware.
"""
from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import kernels
from farm.measure import outcomes, validate
from farm.measure.device import measure
from farm.tasks import TuningTask
from kernels import flash_attention
from kernels.lowering import Platform
from tests import shipped_spaces
from tests.mosaic_checks import mosaic_smem_bytes, tma_bounds_as_on_hardware

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("flash_attention", "flash_attention_causal")
MIB = 1 << 20
TPU_SHAPE = (1, 1, 256, 128)  # TPU tiles: block_kv a multiple of 128 (the head dim padded to one)
GPU_SHAPE = (1, 2, 128, 32)
MGPU_SHAPE = (1, 1, 256, 64)  # 4 key blocks of 64 through 2 or 3 pipeline slots


def _error(name: str, config: dict, target: str, shape: tuple, dtype=jnp.float32) -> float:
    module = kernels.load(name)
    inputs = module.make_inputs(shape, dtype, jax.random.key(2))
    fn = module.build(config, shape, dtype, Platform(target, interpret=True, poison_outputs=True))
    return validate.relative_error(jax.jit(fn)(*inputs), module.reference(*validate.upcast(inputs)))


def _lower(name: str, config: dict, target: str, shape: tuple, dtype=jnp.bfloat16) -> str:
    module = kernels.load(name)
    inputs = jax.eval_shape(lambda: module.make_inputs(shape, dtype, jax.random.key(0)))
    fn = module.build(config, shape, dtype, Platform(target))
    platform = "tpu" if target == "tpu" else "cuda"
    return jax.jit(fn).trace(*inputs).lower(lowering_platforms=(platform,)).as_text()


def test_causal_programs_start_with_the_most_key_blocks():
    """Causal GPU kernels take their Q blocks heaviest first (each program's K/V blocks fall as
    programs launch), so the last wave holds the lightest; non-causal ones keep launch order."""
    from kernels.attention_core import kv_blocks, q_block_order

    count, bq, bkv, seq = 16, 128, 64, 2048
    order = [q_block_order(i, count, causal=True) for i in range(count)]
    assert sorted(order) == list(range(count))  # every Q block exactly once
    work = [int(kv_blocks(q, bq, bkv, seq, causal=True)) for q in order]
    assert work == sorted(work, reverse=True) and work[0] == seq // bkv and work[-1] == 2
    assert [q_block_order(i, count, causal=False) for i in range(count)] == list(range(count))


def test_causal_and_non_causal_references_differ():
    q, k, v = flash_attention.make_inputs((1, 1, 16, 8), jnp.float32, jax.random.key(0))
    full, causal = (kernels.load(n).reference(q, k, v) for n in NAMES)
    assert jnp.allclose(full[..., -1, :], causal[..., -1, :], atol=1e-5)  # the last row sees every key
    assert validate.relative_error(causal, full) > 0.1
    assert kernels.load(NAMES[1]).flops((1, 1, 16, 8)) * 2 == kernels.load(NAMES[0]).flops((1, 1, 16, 8))


@pytest.mark.parametrize("name", NAMES)
def test_space_loads_with_both_seed_shapes(name):
    space = shipped_spaces.space(name)
    targets = {t.name: t for t in space.targets}
    assert set(targets) == {"tpu", "gpu-triton", "gpu-mosaic", "interpret"}
    assert targets["tpu"].shapes == ((8, 32, 8192, 256), (4, 32, 4096, 128))
    module = kernels.load(name)
    for target in space.targets:
        for shape in target.shapes:
            config = module.default_config(shape, target.name)
            assert space.violated(config, shape, target.dtypes[0], target.name) is None


TPU_CONFIGS = [
    {"block_q": 128, "block_kv": 128, "attn_strategy": "emit_pipeline"},
    {"block_q": 64, "block_kv": 128, "attn_strategy": "emit_pipeline", "buffers": 3},
    {"block_q": 128, "block_kv": 128, "attn_strategy": "unroll"},
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("config", TPU_CONFIGS, ids=lambda c: f"{c['attn_strategy']}-{c['block_q']}")
def test_tpu_strategies_in_tpu_interpret_mode(name, config):
    assert _error(name, config, "tpu", TPU_SHAPE) <= 2e-3


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(1, 2, 197, 64), (1, 1, 200, 80)], ids=str)
def test_tpu_runs_users_head_dims_and_sequence_lengths(name, shape):
    """Head dims narrower than the TPU's 128 lanes (ViT's 64, 80) and sequences no block divides:
    the TPU default runs them (head dim padded to 128 columns, sequence to whole blocks) in TPU
    interpret mode, and its config lies in the shipped space."""
    module = kernels.load(name)
    config = module.default_config(shape, "tpu")
    assert _error(name, config, "tpu", shape) <= 2e-3
    space = shipped_spaces.space(name)
    assert space.violated(config, shape, "bfloat16", "tpu") is None
    assert "tpu_custom_call" in _lower(name, config, "tpu", shape)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("target,config", [
    ("interpret", {"block_q": 64, "block_kv": 32}),
    ("gpu-triton", {"block_q": 32, "block_kv": 64, "num_warps": 4, "num_stages": 2}),
])
def test_triton_kernel_in_interpret_mode(name, target, config):
    assert _error(name, config, target, GPU_SHAPE, jnp.bfloat16) <= validate.tolerance("bfloat16")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("strategy", ["emit_pipeline", "unroll"])
def test_tpu_strategies_lower_for_tpu_on_cpu(name, strategy):
    config = {"block_q": 256, "block_kv": 512, "attn_strategy": strategy}
    assert "tpu_custom_call" in _lower(name, config, "tpu", (1, 2, 1024, 256))


@pytest.mark.parametrize("strategy", ["emit_pipeline", "unroll"])
def test_unroll_outgrows_a_64_mib_vmem_at_32k_while_emit_pipeline_does_not(strategy):
    # The (8, 32, S, 256) seed's head dim; bf16; the VMEM model is in kernels/attention_core.py.
    vmem = 64 * MIB
    for name in NAMES:
        module = kernels.load(name)
        for block in (128, 512):
            config = {"block_q": block, "block_kv": block, "attn_strategy": strategy}
            at_8k = module.footprint(config, (8, 32, 8192, 256), jnp.bfloat16, "tpu")
            at_32k = module.footprint(config, (8, 32, 32768, 256), jnp.bfloat16, "tpu")
            assert at_8k <= vmem
            if strategy == "unroll":
                assert at_32k > vmem
            else:
                assert at_32k == at_8k <= vmem


def test_triton_attention_lowers_for_cuda():
    config = {"block_q": 64, "block_kv": 64, "num_warps": 4, "num_stages": 2}
    for name in NAMES:
        assert "__gpu$xla.gpu.triton" in _lower(name, config, "gpu-triton", (1, 2, 512, 128))


MGPU_CONFIGS = [
    {"block_q": 64, "block_kv": 64, "mgpu_pipeline": "warp_specialized", "max_concurrent_steps": 2},
    {"block_q": 64, "block_kv": 64, "mgpu_pipeline": "pipelined", "max_concurrent_steps": 3},
    {"block_q": 64, "block_kv": 64, "mgpu_pipeline": "warp_specialized", "max_concurrent_steps": 2,
     "ws_schedule": "intra_overlap"},
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("config", MGPU_CONFIGS, ids=lambda c: c["mgpu_pipeline"] + c.get("ws_schedule", ""))
def test_mosaic_gpu_kernels_in_the_gpu_interpreter(name, config):
    error = _error(name, config, "gpu-mosaic", MGPU_SHAPE, jnp.bfloat16)
    assert error <= validate.tolerance("bfloat16")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("schedule", ["pingpong", "intra_overlap"])
@pytest.mark.parametrize("grid,order", [("persistent", "by_head"), ("persistent_q_ahead", "by_head"),
                                        ("persistent_q_ahead", "by_q")])
def test_the_persistent_kernel_loops_over_tiles_with_its_ring_running_on(name, schedule, grid, order,
                                                                         monkeypatch):
    # Two blocks (SMs) over 12 tiles of 128 rows: each block runs 6 tiles, whose K/V blocks (2 and
    # 4 a tile causal, 4 plain) go through 3 slots, so a tile's first block lands in any slot; the
    # grid is one block a SM, not a tile. persistent_q_ahead: the memory warpgroup loads each
    # tile's Q once the previous tile's is read, O staged apart. Both tile orders cover every
    # (batch, head, Q tile) once: a tile taken twice or never leaves an output poisoned.
    from kernels import mgpu_launch

    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 2)
    config = {"block_q": 64, "block_kv": 64, "max_concurrent_steps": 3, "ws_schedule": schedule, "ws_grid": grid,
              "tile_order": order}
    shape = (2, 3, 256, 64)
    assert _error(name, config, "gpu-mosaic", shape, jnp.bfloat16) <= validate.tolerance("bfloat16")
    module = kernels.load(name)
    inputs = jax.eval_shape(lambda: module.make_inputs(shape, jnp.bfloat16, jax.random.key(0)))

    def axes(config):
        jaxpr = str(jax.make_jaxpr(module.build(config, shape, jnp.bfloat16, Platform("gpu-mosaic")))(*inputs))
        return {axis for axis in ("sm", "q_seq", "heads") if f"axis_name={axis}" in jaxpr}

    assert axes(config) == {"sm"}
    assert axes({**config, "ws_grid": "blocks", "tile_order": "by_head"}) == {"q_seq", "heads"}


def test_the_persistent_grid_is_a_knob_of_the_warp_specialized_kernel_alone():
    from kernels.attention_config import MosaicGpuAttentionConfig

    assert MosaicGpuAttentionConfig(64, 128, ws_grid="persistent").persistent
    with pytest.raises(NotImplementedError, match="ws_grid"):
        MosaicGpuAttentionConfig(64, 128, mgpu_pipeline="pipelined", ws_grid="persistent")
    with pytest.raises(ValueError, match="tile_order"):
        MosaicGpuAttentionConfig(64, 128, ws_grid="persistent", tile_order="by_rows")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape,config", [
    ((1, 2, 1024, 256), {"block_q": 64, "block_kv": 64, "mgpu_pipeline": "warp_specialized",
                         "max_concurrent_steps": 2}),
    ((1, 2, 1024, 128), {"block_q": 64, "block_kv": 128, "mgpu_pipeline": "warp_specialized",
                         "max_concurrent_steps": 2}),
    ((1, 2, 1024, 128), {"block_q": 64, "block_kv": 128, "mgpu_pipeline": "warp_specialized",
                         "max_concurrent_steps": 2, "ws_schedule": "intra_overlap"}),
    ((1, 2, 1024, 128), {"block_q": 128, "block_kv": 128, "mgpu_pipeline": "pipelined",
                         "max_concurrent_steps": 3}),
    ((1, 2, 1024, 80), {"block_q": 64, "block_kv": 128, "mgpu_pipeline": "warp_specialized",
                        "max_concurrent_steps": 2, "swizzle": 32}),
    ((1, 2, 1024, 80), {"block_q": 64, "block_kv": 64, "mgpu_pipeline": "pipelined",
                        "max_concurrent_steps": 2, "swizzle": 64}),
    ((2, 32, 512, 128), {"block_q": 64, "block_kv": 128, "max_concurrent_steps": 3, "ws_grid": "persistent"}),
    ((4, 3, 197, 64), {"block_q": 64, "block_kv": 128, "ws_schedule": "intra_overlap", "ws_grid": "persistent"}),
    ((2, 32, 512, 128), {"block_q": 64, "block_kv": 128, "ws_grid": "persistent_q_ahead"}),
    ((4, 3, 197, 64), {"block_q": 64, "block_kv": 128, "max_concurrent_steps": 3, "ws_grid": "persistent_q_ahead"}),
    ((2, 32, 512, 128), {"block_q": 64, "block_kv": 128, "ws_grid": "persistent_q_ahead", "tile_order": "by_q"}),
])
def test_mosaic_gpu_kernels_lower_in_bf16_within_their_footprint(name, shape, config, monkeypatch):
    # JAX's own attention_mgpu.py fails on bf16 (f16 SMEM); ours lowers in bf16, and its
    # footprint bounds the shared memory Mosaic GPU counts from above by at most 1 KiB.
    assert "mosaic_gpu" in _lower(name, config, "gpu-mosaic", shape)
    actual = mosaic_smem_bytes(lambda: _lower(name, config, "gpu-mosaic", shape), monkeypatch)
    model = kernels.load(name).footprint(config, shape, jnp.bfloat16, "gpu-mosaic")
    assert actual <= model <= actual + 1024


def test_mosaic_gpu_refuses_what_it_cannot_build():
    module = kernels.load("flash_attention")
    with pytest.raises(NotImplementedError, match="bfloat16 or float16"):
        module.build(MGPU_CONFIGS[0], MGPU_SHAPE, jnp.float32, Platform("gpu-mosaic"))
    with pytest.raises(NotImplementedError, match="multiples of 64"):
        module.build({**MGPU_CONFIGS[0], "block_q": 32}, MGPU_SHAPE, jnp.bfloat16, Platform("gpu-mosaic"))
    with pytest.raises(NotImplementedError, match="multiple of 128"):
        module.build({"block_q": 64, "block_kv": 64}, MGPU_SHAPE, jnp.bfloat16, Platform("tpu"))
    # blocks need not divide the sequence (it is padded, or its last blocks run past the end)
    assert module.check_config({"block_q": 96, "block_kv": 64}, MGPU_SHAPE, jnp.bfloat16, "interpret") is None


def test_the_farm_measures_a_mosaic_gpu_kernel_in_the_gpu_interpreter():
    task = TuningTask("flash_attention_causal", MGPU_SHAPE, "bfloat16", "gpu-mosaic")
    m = measure(task, MGPU_CONFIGS[1], interpret=True, repetitions=2, warmup=1)
    assert m.outcome == outcomes.OK, m.error
    assert m.numerics_error <= validate.tolerance("bfloat16")


# ------------------------------------------------------------------ sequences no block divides

# A user's prompt lengths: Q, K and V are padded to whole blocks (the Mosaic GPU kernels run
# part blocks at the end as they are when seq is whole 8-row groups: TMA reads zeros past the
# end and drops the writes), and the keys past seq are masked where no causal mask hides them.
# The Mosaic GPU rows here run sequences shorter than one block (padded); the part blocks, in the
# next test, under the interpreter's emulation of TMA's bounds (`tma_bounds_as_on_hardware`), and
# on the H200 (`bench/check_gpu_kernels.py --ragged`, BENCHMARKS.md).
RAGGED = [
    ("interpret", {"block_q": 32, "block_kv": 16}, (1, 2, 100, 32), jnp.float32),
    ("gpu-triton", {"block_q": 32, "block_kv": 32, "num_warps": 4, "num_stages": 2}, (1, 2, 72, 32), jnp.float32),
    ("tpu", {"block_q": 32, "block_kv": 128}, (1, 1, 200, 128), jnp.float32),
    ("tpu", {"block_q": 32, "block_kv": 128, "attn_strategy": "unroll"}, (1, 1, 200, 128), jnp.float32),
    ("gpu-mosaic", {"block_q": 64, "block_kv": 64}, (1, 2, 100, 64), jnp.bfloat16),
    ("gpu-mosaic", {"block_q": 64, "block_kv": 64, "ws_schedule": "intra_overlap"}, (1, 2, 100, 64), jnp.bfloat16),
    ("gpu-mosaic", {"block_q": 128, "block_kv": 128, "mgpu_pipeline": "pipelined"}, (1, 2, 100, 64), jnp.bfloat16),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("target,config,shape,dtype", RAGGED, ids=lambda v: v if isinstance(v, str) else None)
def test_sequences_no_block_divides_match_the_reference(name, target, config, shape, dtype, monkeypatch):
    from kernels import mgpu_launch

    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 1)
    module = kernels.load(name)
    assert module.check_config(config, shape, dtype, target) is None
    assert _error(name, config, target, shape, dtype) <= validate.tolerance(jnp.dtype(dtype).name, module)


# Sequences whose last blocks run past the end: 168 rows (whole 8-row groups, read through the
# swizzled tiles) and 185 (off that grid: the warp-specialized kernel copies by single rows at a
# head dim of one swizzle); the causal default at 185 is the persistent grid, Q loaded ahead.
PART_BLOCKS = [
    ("flash_attention", {"block_q": 64, "block_kv": 128, "ws_schedule": "intra_overlap"}, 168),
    ("flash_attention", {"block_q": 64, "block_kv": 128, "mgpu_pipeline": "pipelined"}, 168),
    ("flash_attention_causal", None, 185),
]


@pytest.mark.parametrize("name,config,seq", PART_BLOCKS, ids=lambda v: str(v) if not isinstance(v, dict) else None)
def test_mosaic_gpu_part_blocks_match_the_reference_with_tma_bounds(name, config, seq, monkeypatch):
    # Pallas's GPU interpreter raised on these reads past the end and dropped those writes whole;
    # TMA reads zeros there and drops only the part past the end, which the emulation does.
    from kernels import mgpu_launch

    tma_bounds_as_on_hardware(monkeypatch)
    monkeypatch.setattr(mgpu_launch, "num_sms", lambda: 2)
    shape = (1, 2, seq, 64)
    module = kernels.load(name)
    config = config or module.default_config(shape, "gpu-mosaic")
    assert module.check_config(config, shape, jnp.bfloat16, "gpu-mosaic") is None
    assert "stablehlo.pad" not in _lower(name, config, "gpu-mosaic", shape)  # part blocks, not padding
    assert _error(name, config, "gpu-mosaic", shape, jnp.bfloat16) <= validate.tolerance("bfloat16", module)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("config", [{"block_q": 64, "block_kv": 128},
                                    {"block_q": 64, "block_kv": 64, "ws_schedule": "intra_overlap"},
                                    {"block_q": 64, "block_kv": 128, "mgpu_pipeline": "pipelined"}])
def test_mosaic_gpu_attention_runs_part_blocks_without_copies(name, config):
    # 1000 rows: 7.8 blocks of 128 rows, 7.8 or 15.6 of keys; 1001 is off the 8-row grid: the
    # warp-specialized kernel copies it by single rows at a head dim one swizzle wide
    # (`copies_single_rows`), the pipelined one pads, and at 128 columns (two swizzles) both pad
    assert "stablehlo.pad" not in _lower(name, config, "gpu-mosaic", (1, 4, 1000, 128))
    assert "stablehlo.pad" in _lower(name, config, "gpu-mosaic", (1, 4, 1001, 128))
    pads = config.get("mgpu_pipeline") == "pipelined"
    assert ("stablehlo.pad" in _lower(name, config, "gpu-mosaic", (1, 4, 1001, 64))) == pads


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seq,dim", [(197, 64), (577, 64), (257, 64), (301, 32), (150, 16), (1001, 64)])
def test_sequences_off_the_row_grid_run_unpadded_at_head_dims_of_one_swizzle(name, seq, dim):
    # ViT's 197 and 577 tokens, CLIP's 257, a prompt of 1001: the swizzled tiles' view of global
    # memory takes whole 8-row groups, so Q, K and V were padded by copies, which cost as much as
    # the kernel on the H200 (thirty-fourth session: 29.0 of 58.1 us at (32, 12, 197, 64)). The
    # warp-specialized kernel now copies through a row-tiled view aliased with its tiles, and the
    # default takes it: 28.5 us on the H200 (thirty-sixth session). (The GPU interpreter cannot
    # read past an array's end as TMA does: these shapes' numerics are checked on the H200,
    # `bench/probes/attention_off_grid.sh`: relative errors 0.0019-0.0022.)
    module = kernels.load(name)
    shape = (2, 3, seq, dim)
    default = module.default_config(shape, "gpu-mosaic")
    assert default["mgpu_pipeline"] == "warp_specialized" and default["swizzle"] == min(2 * dim, 128)
    assert module.check_config(default, shape, "bfloat16", "gpu-mosaic") is None
    assert "stablehlo.pad" not in _lower(name, default, "gpu-mosaic", shape)
    for schedule in ("pingpong", "intra_overlap"):
        config = {**default, "ws_schedule": schedule, "max_concurrent_steps": 3}
        assert "stablehlo.pad" not in _lower(name, config, "gpu-mosaic", shape)
    # still padded: the pipelined kernel (its K/V pipeline copies through 8-row tiles), a head dim
    # narrower than its swizzle, or two or three swizzles wide (one copy per 8-row slab and
    # swizzle ran (1, 32, 4001, 128) in 759.1 us against 434.4 at 4000 rows), and sequences
    # shorter than a block
    pipelined = {**default, "mgpu_pipeline": "pipelined", "ws_schedule": "pingpong", "ws_grid": "blocks"}
    assert "stablehlo.pad" in _lower(name, pipelined, "gpu-mosaic", shape)
    if dim < 64:
        assert "stablehlo.pad" in _lower(name, {**default, "swizzle": 128}, "gpu-mosaic", shape)
    for wide in ((2, 3, seq, 128), (2, 3, seq, 192), (2, 3, seq, 40)):  # 2 and 3 swizzles of 64, 3 of 16
        assert "stablehlo.pad" in _lower(name, module.default_config(wide, "gpu-mosaic"), "gpu-mosaic", wide)
    assert "stablehlo.pad" in _lower(name, default, "gpu-mosaic", (2, 3, 123, dim))


@pytest.mark.parametrize("dim", [16, 32, 64])
def test_the_rows_that_copies_use_alias_the_tiles_that_wgmma_reads(dim):
    # Off the 8-row grid, TMA copies through a view tiled by single rows (`attention_mgpu._tiles`),
    # WGMMA reads 8-row tiles: a `plgpu.RefUnion` of two groups, which must lay each tile out at
    # the same shared memory offset in the same bytes (one swizzle wide, the rows' order is the
    # tiles' byte order).
    import re

    shape = (2, 3, 197, dim)
    module = kernels.load("flash_attention")
    default = module.default_config(shape, "gpu-mosaic")
    inputs = jax.eval_shape(lambda: module.make_inputs(shape, jnp.bfloat16, jax.random.key(0)))
    for grid, tiles in (("blocks", 3), ("persistent_q_ahead", 4)):  # Q/O, K, V; Q and O apart
        config = {**default, "ws_grid": grid}
        jaxpr = str(jax.make_jaxpr(module.build(config, shape, jnp.bfloat16, Platform("gpu-mosaic")))(*inputs))
        views = set(re.findall(r"ExtractAliasedRef\(dtype=dtype\(bfloat16\), shape=\(([\d, ]+)\), "
                               r"offset=(\d+), alias_group_idx=(\d)", jaxpr))
        groups: dict[str, dict[int, int]] = {"0": {}, "1": {}}
        for dims, offset, group in views:
            groups[group][int(offset)] = math.prod(int(d) for d in dims.split(","))
        assert len(groups["0"]) == tiles and groups["0"] == groups["1"], grid  # same offsets, same sizes


def test_only_sequences_off_the_grid_change_the_default_kernel():
    from kernels.attention_config import MosaicGpuAttentionConfig as Config

    ws = Config(64, 128, ws_schedule="intra_overlap")
    assert [ws.padded_seq(seq, 64) for seq in (197, 200, 127, 100, 5000, 5001)] == [197, 200, 128, 128, 5000, 5001]
    assert [ws.padded_seq(seq, dim) for seq in (197, 5001) for dim in (128, 192)] == [200, 200, 5008, 5008]
    assert ws.padded_seq(197) == 200  # no head dim given (the GPU interpreter): the 8-row grid
    pipelined = Config(64, 128, mgpu_pipeline="pipelined")
    assert pipelined.padded_seq(197, 64) == 200 and not pipelined.copies_single_rows(64)
    assert Config.default((32, 12, 200, 64)).mgpu_pipeline == "pipelined"
    assert Config.default((32, 12, 197, 64)).mgpu_pipeline == "warp_specialized"
    assert Config.default((32, 12, 197, 32)).mgpu_pipeline == "warp_specialized"
    assert Config.default((32, 12, 197, 128)).mgpu_pipeline == "warp_specialized"  # as at any length
    assert not Config.default((32, 12, 197, 128)).copies_single_rows(128)  # padded: two swizzles


def test_short_sequences_default_to_a_block_a_sm_with_the_next_q_ahead():
    # On the H200 (fortieth session): (32, 12, 197, 64) 20.6 us against 29.0 one block a tile,
    # causal 20.4 against 29.2, causal (2, 32, 1024, 128) 42.5 against 51.8; but (16, 32, 512, 128)
    # 160.4 against 147.1 and (4, 32, 4096, 128) 1964.6 against 1576.0.
    from kernels.attention_config import MosaicGpuAttentionConfig as Config
    from kernels.mgpu_launch import defaults_shared_memory

    def grid(shape, causal=False, dtype=jnp.bfloat16):
        return Config.default(shape, causal, dtype).ws_grid

    assert [grid((8, 32, seq, 128)) for seq in (197, 256, 512)] == [
        "persistent_q_ahead", "persistent_q_ahead", "blocks"]
    assert grid((32, 12, 197, 64)) == "persistent_q_ahead"
    assert [grid((2, 32, seq, 128), causal=True) for seq in (197, 1024, 1025, 4096)] == [
        "persistent_q_ahead", "persistent_q_ahead", "blocks", "blocks"]
    assert grid((16, 16, 200, 64)) == "blocks"  # the pipelined kernel: on the 8-row grid, head dim 64
    # Q and O apart take more shared memory: at head dim 256 in float32 two K/V slots of 64 rows do not fit
    assert grid((2, 16, 256, 256), dtype=jnp.float32) == "blocks"
    for shape, causal in (((32, 12, 197, 64), False), ((2, 8, 1000, 96), True), ((2, 16, 256, 256), False)):
        config = Config.default(shape, causal)
        assert config.footprint(shape, jnp.bfloat16) <= defaults_shared_memory()
    # in the tile order those figures were measured in: every head's first Q tile, then every second
    assert {Config.default(shape, causal).tile_order for shape, causal in (
        ((32, 12, 197, 64), False), ((2, 32, 1024, 128), True))} == {"by_q"}


def test_keys_past_the_sequence_are_masked_only_where_needed():
    from kernels.attention_core import key_mask, kv_blocks, ragged_keys

    assert ragged_keys(1000, 128, causal=False) == 1000
    assert ragged_keys(1000, 128, causal=True) is None  # the causal mask hides them from real rows
    assert ragged_keys(1024, 128, causal=False) is None
    cols = jnp.arange(8)[None, :] + 996
    assert key_mask(cols, None, 1000).tolist() == [[True] * 4 + [False] * 4]
    assert key_mask(cols, None, None) is None
    # the K/V blocks a query block needs stop at the last block holding keys
    assert kv_blocks(0, 128, 128, 1000, causal=False) == 8
    assert int(kv_blocks(7, 128, 128, 1000, causal=True)) == 8 and int(kv_blocks(3, 128, 128, 1000, causal=True)) == 4


@pytest.mark.parametrize("shape,mosaic_kv,triton_stages", [
    ((4, 32, 4096, 128), 128, 3), ((1, 32, 2048, 80), 128, 3), ((2, 8, 1000, 64), 128, 3),
    ((8, 32, 8192, 256), 64, 2)])  # two 128-row K/V slots, or 3 Triton stages, overflow shared memory at 256
def test_the_gpu_defaults_take_the_blocks_the_h200_ran_fastest(shape, mosaic_kv, triton_stages):
    # On the H200 (BENCHMARKS.md, thirty-third session; us against the earlier 64 x 64 defaults):
    # gpu-mosaic (4, 32, 4096, 128) 1578.7 / 2043.3, causal 913.7 / 1065.7 (torch SDPA 1602.5 and
    # 919.6); gpu-triton 2840.0 / 3742.6, causal 1592.6 / 1829.9.
    from kernels.mgpu_launch import SMEM_BYTES

    for name in NAMES:
        module = kernels.load(name)
        space = shipped_spaces.space(name)
        mosaic, triton = (module.default_config(shape, t) for t in ("gpu-mosaic", "gpu-triton"))
        causal = name == "flash_attention_causal"
        pipeline = "warp_specialized" if causal or shape[3] != 64 else "pipelined"  # see the next test
        schedule = "intra_overlap" if pipeline == "warp_specialized" and not causal else "pingpong"
        assert (mosaic["block_q"], mosaic["block_kv"], mosaic["mgpu_pipeline"], mosaic["ws_schedule"]) == (
            64, mosaic_kv, pipeline, schedule)
        assert (triton["block_q"], triton["block_kv"], triton["num_warps"], triton["num_stages"]) == (
            128, 64, 8, triton_stages)
        for target, config in (("gpu-mosaic", mosaic), ("gpu-triton", triton)):
            assert module.check_config(config, shape, "bfloat16", target) is None
            assert module.footprint(config, shape, "bfloat16", target) <= SMEM_BYTES
            assert space.violated(config, shape, "bfloat16", target) is None
    small = (1, 2, 256, shape[3])  # the lowering at the shape's head dim; the sequence does not matter
    plain = kernels.load("flash_attention").default_config(shape, "gpu-mosaic")
    assert "mosaic_gpu" in _lower("flash_attention", plain, "gpu-mosaic", small)
    assert "__gpu$xla.gpu.triton" in _lower("flash_attention_causal", triton, "gpu-triton", small)


@pytest.mark.parametrize("dim,swizzle,runs_as", [(80, 32, 80), (96, 64, 96), (40, 32, 48), (128, 128, 128),
                                                 (64, 128, 64), (192, 128, 192)])
def test_mosaic_gpu_runs_the_head_dim_in_the_swizzle_that_pads_it_least(dim, swizzle, runs_as):
    # On the H200 (BENCHMARKS.md, thirty-fourth session; us, padding copies included): head dim 80
    # in the 128-byte swizzle ran as 128, with Q, K and V padded by copies: (4, 32, 4096, 80) 1768.0,
    # causal 1184.6; as 80 in the 32-byte swizzle, without copies, 1330.7 and 720.8 (cuDNN 1549.6
    # and 913.7).
    module = kernels.load("flash_attention")
    shape = (1, 2, 1000, dim)
    config = module.default_config(shape, "gpu-mosaic")
    assert config["swizzle"] == swizzle
    assert module.check_config(config, shape, "bfloat16", "gpu-mosaic") is None
    for name in NAMES:
        space = shipped_spaces.space(name)
        assert space.violated(config, shape, "bfloat16", "gpu-mosaic") is None
        assert kernels.load(name).default_config(shape, "gpu-mosaic")["swizzle"] == swizzle
    padded = (1, 2, 1000, runs_as)
    assert module.footprint(config, shape, jnp.bfloat16, "gpu-mosaic") == module.footprint(
        config, padded, jnp.bfloat16, "gpu-mosaic")
    assert ("stablehlo.pad" in _lower("flash_attention", config, "gpu-mosaic", shape)) == (runs_as != dim)
    if swizzle != 128:  # the 128-byte swizzle pads the same head dim with copies
        wide = {**config, "swizzle": 128}
        assert "stablehlo.pad" in _lower("flash_attention", wide, "gpu-mosaic", shape)


@pytest.mark.parametrize("dim,plain_pipeline", [(32, "pipelined"), (64, "pipelined"), (40, "warp_specialized"),
                                                (80, "warp_specialized"), (128, "warp_specialized")])
def test_plain_attention_at_narrow_heads_defaults_to_the_pipelined_kernel(dim, plain_pipeline):
    # On the H200 (BENCHMARKS.md, thirty-fourth session; us, pipelined against warp-specialized):
    # (4, 32, 4096, 64) 1080.7 / 1333.5 (torch SDPA 1126.2), (16, 16, 1024, 32) 119.9 / 158.9, but
    # (2, 8, 4096, 40), 48 columns in the 32-byte swizzle, 214.3 / 179.3; causal (4, 32, 4096, 64)
    # 1262.3 / 644.6: causal attention keeps the warp-specialized kernel.
    shape = (2, 8, 1024, dim)
    plain = kernels.load("flash_attention").default_config(shape, "gpu-mosaic")
    causal = kernels.load("flash_attention_causal").default_config(shape, "gpu-mosaic")
    assert (plain["mgpu_pipeline"], causal["mgpu_pipeline"]) == (plain_pipeline, "warp_specialized")
    for name, config in (("flash_attention", plain), ("flash_attention_causal", causal)):
        assert kernels.load(name).check_config(config, shape, "bfloat16", "gpu-mosaic") is None
        assert shipped_spaces.space(name).violated(config, shape, "bfloat16",
                                                                            "gpu-mosaic") is None
    assert "mosaic_gpu" in _lower("flash_attention", plain, "gpu-mosaic", shape)


def test_a_bundle_row_from_before_the_swizzle_knob_keeps_its_meaning():
    # Rows tuned before the knob name no swizzle: they run in the 128-byte swizzle they were timed
    # in (head dim 80 as 128), and stay valid for the kernel and its space (a deployment's lookup).
    old = {"block_q": 64, "block_kv": 128, "mgpu_pipeline": "warp_specialized", "max_concurrent_steps": 2,
           "ws_schedule": "pingpong"}
    shape = (1, 2, 256, 80)
    for name in NAMES:
        module = kernels.load(name)
        assert module.check_config(old, shape, "bfloat16", "gpu-mosaic") is None
        assert shipped_spaces.space(name).violated(old, shape, "bfloat16",
                                                                            "gpu-mosaic") is None
        assert module.footprint(old, shape, jnp.bfloat16, "gpu-mosaic") == module.footprint(
            {**old, "swizzle": 128}, shape[:3] + (128,), jnp.bfloat16, "gpu-mosaic")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("pipeline,dim,swizzle", [("warp_specialized", 80, 32), ("pipelined", 96, 64),
                                                  ("pipelined", 80, 32)])
def test_narrow_swizzles_match_the_reference_in_the_gpu_interpreter(name, pipeline, dim, swizzle):
    # The kernels at head dims they run unpadded, in Pallas's GPU interpreter (its matmuls are
    # jnp.dots, see `_pv`, and it does not model the swizzles). WGMMA on the 64- and 32-byte tiles
    # was validated on the H200: relative errors 0.0020-0.0023 at head dims 80 and 96 against the
    # float32 reference (`bench/results/h200/head_swizzle/`).
    config = {"block_q": 64, "block_kv": 64, "mgpu_pipeline": pipeline, "swizzle": swizzle}
    assert _error(name, config, "gpu-mosaic", (1, 1, 256, dim), jnp.bfloat16) <= validate.tolerance("bfloat16")


@pytest.mark.parametrize("name", NAMES)
def test_the_search_offers_a_narrower_swizzle_only_where_it_pads_less(name):
    from farm.search.valid_set import ValidSet

    space = shipped_spaces.space(name)
    offered = {}
    for dim in (80, 96, 128, 256):
        shape = (1, 32, 2048, dim)
        found = ValidSet.enumerate(space.params_for("gpu-mosaic"), space.leaf_check(shape, "bfloat16", "gpu-mosaic"),
                                   space.prefix_checks(shape, "bfloat16", "gpu-mosaic"))
        offered[dim] = {config["swizzle"] for config in found.configs}
    assert offered == {80: {128, 64, 32}, 96: {128, 64}, 128: {128}, 256: {128}}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seq", [197, 129, 300])
def test_the_warp_specialized_kernel_lowers_at_sequences_shorter_than_its_slots(name, seq):
    # Found on the H200 (thirty-fourth session): at ViT's 197 tokens the default's second 128-row
    # K/V slot was prefetched through a static window past the sequence's end (padded to 200), which
    # JAX refuses while tracing ("Out of bound slice: start=128, size=128, ... dim=200"). Lowering
    # for CUDA checks the windows' bounds; the GPU interpreter runs whole blocks only.
    for schedule, steps in (("pingpong", 2), ("intra_overlap", 3)):
        config = {"block_q": 64, "block_kv": 128, "mgpu_pipeline": "warp_specialized", "ws_schedule": schedule,
                  "max_concurrent_steps": steps}
        assert "mosaic_gpu" in _lower(name, config, "gpu-mosaic", (2, 3, seq, 64))
    default = kernels.load(name).default_config((2, 3, seq, 128), "gpu-mosaic")
    assert "mosaic_gpu" in _lower(name, default, "gpu-mosaic", (2, 3, seq, 128))


@pytest.mark.parametrize("name", NAMES)
def test_default_configs_and_the_search_cover_sequences_no_block_divides(name):
    from farm.search.valid_set import ValidSet

    module = kernels.load(name)
    space = shipped_spaces.space(name)
    shape = (1, 32, 1000, 128)
    for target in ("gpu-mosaic", "gpu-triton", "tpu"):
        assert module.check_config(module.default_config(shape, target), shape, "bfloat16", target) is None
        found = ValidSet.enumerate(space.params_for(target), space.leaf_check(shape, "bfloat16", target),
                                   space.prefix_checks(shape, "bfloat16", target))
        assert found is not None and len(found) > 10, target


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("target,config,dim", [
    ("gpu-triton", {"block_q": 64, "block_kv": 64, "num_warps": 4, "num_stages": 2}, 80),
    ("gpu-triton", {"block_q": 32, "block_kv": 32, "num_warps": 4, "num_stages": 2}, 40),
    ("gpu-mosaic", {"block_q": 64, "block_kv": 64, "mgpu_pipeline": "warp_specialized", "max_concurrent_steps": 2}, 80),
    ("gpu-mosaic", {"block_q": 64, "block_kv": 64, "mgpu_pipeline": "pipelined", "max_concurrent_steps": 2}, 96),
])
def test_head_dims_off_the_kernels_grid_run_padded_with_the_real_scale(name, target, config, dim):
    # On the H200 head_dim 80 failed to compile on Triton (its arrays are powers of two) and
    # gpu-mosaic refused it (thirty-second session). Q, K and V now run padded with zeros to 128
    # (Triton: a power of two; Mosaic GPU: 64s in these configs' 128-byte swizzle, where the
    # default's narrower swizzles pad less), scaled by 1 / sqrt(dim); O is sliced back.
    module = kernels.load(name)
    shape = (1, 2, 256, dim)
    assert module.check_config(config, shape, "bfloat16", target) is None
    padded = shape[:3] + (128 if dim > 64 else 64,)
    assert module.footprint(config, shape, jnp.bfloat16, target) == module.footprint(config, padded, jnp.bfloat16,
                                                                                     target)
    text = _lower(name, config, target, shape)
    assert ("__gpu$xla.gpu.triton" if target == "gpu-triton" else "mosaic_gpu") in text
    # numerics in the interpreters; Pallas's GPU interpreter cannot run TMA past the sequence's end,
    # so Mosaic GPU's sequence is whole blocks there
    run = (1, 1, 256, dim) if target == "gpu-mosaic" else (1, 2, 200, dim)
    assert _error(name, config, target, run, jnp.bfloat16) <= validate.tolerance("bfloat16")


@pytest.mark.parametrize("name", NAMES)
def test_triton_reads_any_sequence_and_head_dim_in_place_through_masks(name):
    # ViT's 197 tokens, a 1001-token prompt, head dims 80 and 40: Triton's tiles are powers of two,
    # loaded masked at the sequence's end and the head's last column and stored masked, so Q, K
    # and V are not padded by copies nor O sliced back (they were before: a pad per input)
    module = kernels.load(name)
    for shape in ((2, 3, 197, 64), (1, 2, 1001, 80), (1, 1, 100, 40)):
        text = _lower(name, module.default_config(shape, "gpu-triton"), "gpu-triton", shape)
        assert "__gpu$xla.gpu.triton" in text
        assert "stablehlo.pad" not in text and "stablehlo.slice" not in text, shape
    # masks only where the shape needs them: whole blocks at a power-of-two head dim load plainly
    def jaxpr(shape):
        inputs = jax.eval_shape(lambda: module.make_inputs(shape, jnp.bfloat16, jax.random.key(0)))
        built = module.build(module.default_config(shape, "gpu-triton"), shape, jnp.bfloat16, Platform("gpu-triton"))
        return str(jax.make_jaxpr(built)(*inputs))

    assert "mask=" not in jaxpr((1, 2, 512, 128))
    assert "mask=" in jaxpr((1, 2, 500, 128)) and "mask=" in jaxpr((1, 2, 512, 80))
    # numerics (poisoned outputs: every element must be written): a sequence shorter than a block
    # at a head dim off the power-of-two grid, and the last Q and K/V blocks both part blocks
    config = {"block_q": 32, "block_kv": 16, "num_warps": 4, "num_stages": 2}
    for shape in ((1, 2, 20, 24), (2, 1, 75, 48)):
        assert module.check_config(config, shape, jnp.float32, "gpu-triton") is None
        assert _error(name, config, "gpu-triton", shape) <= validate.tolerance("float32")
