"""swiglu and geglu: act(a) * b on every target, in interpret mode, plus TPU/Triton lowering."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from farm.measure import validate
from kernels import geglu, glu, swiglu
from kernels.lowering import Platform, pallas_call
from tests import memory_bound_checks as checks
from tests import shipped_spaces

# interpret: partial edge tiles; gpu-triton: odd sizes (padding, masks); tpu: 128 KiB tiles fit.
SHAPES = {"interpret": (3, 40, 384), "gpu-triton": (3, 37, 300), "tpu": (2, 128, 512)}
EXPLICIT = {
    "interpret": [{"block_rows": 16, "block_cols": 256}],
    "tpu": [{"block_rows": 64, "block_cols": 512, "buffers": 1}],
    "gpu-triton": [
        {"tiling": "flat", "block_size": 512, "blocks_per_program": 4, "block_cols": 64, "num_warps": 2,
         "num_stages": 3},
        {"tiling": "rows", "block_size": 1024, "blocks_per_program": 2, "block_cols": 128, "num_warps": 4,
         "num_stages": 2},
    ],
}


def _cases():
    return [pytest.param(module, *case.values, id=f"{module.NAME}-{case.id}")
            for module in (swiglu, geglu)
            for case in checks.cases(shipped_spaces.space(module.NAME), module, SHAPES, EXPLICIT)]


@pytest.mark.parametrize("module, target, shape, dtype, config", _cases())
def test_matches_reference(module, target, shape, dtype, config):
    checks.check(module, target, shape, dtype, config)


def test_activations_are_the_stated_formulas():
    a = jnp.linspace(-8.0, 8.0, 1001)
    assert float(jnp.max(jnp.abs(swiglu.silu(a) - jax.nn.silu(a)))) < 1e-5
    assert float(jnp.max(jnp.abs(geglu.gelu_tanh(a) - jax.nn.gelu(a, approximate=True)))) < 1e-5
    # The tanh approximation, not the erf form: they differ by ~1e-3 near |a| = 2.
    assert float(jnp.max(jnp.abs(geglu.gelu_tanh(a) - jax.nn.gelu(a, approximate=False)))) > 1e-4


def test_wrong_activation_is_caught():
    """GeGLU built with SiLU is far from the GeGLU reference: the comparison can fail."""
    shape = (2, 16, 128)
    a, b = geglu.make_inputs(shape, jnp.float32, jax.random.key(0))
    fn = glu.build(swiglu.silu, "wrong", {"block_rows": 8, "block_cols": 128}, shape, jnp.float32,
                   Platform("interpret"))
    assert validate.relative_error(fn(a, b), geglu.reference(a, b)) > validate.tolerance("float32")


def test_unwritten_tiles_are_caught_by_poisoning():
    """A grid one tile short leaves NaN behind, which validation counts as infinite error."""
    shape = (2, 16, 256)
    a, b = swiglu.make_inputs(shape, jnp.float32, jax.random.key(0))
    spec = pl.BlockSpec((None, 8, 128), lambda i, j, k: (i, j, k))
    short = pallas_call(lambda a_ref, b_ref, o_ref: glu._blocked_body(a_ref, b_ref, o_ref, act=swiglu.silu),
                        platform=Platform("interpret", poison_outputs=True), config={},
                        out_shape=jax.ShapeDtypeStruct(shape, jnp.float32), grid=(2, 2, 1),
                        in_specs=[spec, spec], out_specs=spec)
    assert validate.relative_error(short(a, b), swiglu.reference(a, b)) == float("inf")


@pytest.mark.parametrize("target, config, message", [
    ("tpu", {"block_rows": 12, "block_cols": 128}, "multiple of 8"),
    ("tpu", {"block_rows": 8, "block_cols": 64}, "multiple of 128"),
    ("tpu", {"block_rows": 8, "block_cols": 128, "buffers": 3}, "1 or 2"),
    ("gpu-triton", {"tiling": "flat", "block_size": 1000}, "power of two"),
    ("gpu-triton", {"tiling": "rows", "block_size": 256, "block_cols": 512}, "<= block_size"),
])
def test_unsupported_configs_are_refused_up_front(target, config, message):
    with pytest.raises((ValueError, NotImplementedError), match=message):
        swiglu.build(config, (2, 48, 256), jnp.float32, Platform(target))


@pytest.mark.parametrize("module", [swiglu, geglu])
@pytest.mark.parametrize("shape", [(1, 77, 1000), (2, 37, 384)], ids=str)
def test_tpu_blocks_past_seq_or_hidden_take_all_of_it(module, shape):
    """Seq 77 or 37 and hidden 1000: no tile of 8 rows by 128 lanes divides them, and the TPU
    spaces held no config. A block past seq or hidden is one block of all of it (full-dimension
    blocks TPU takes at any size); the default is that block, and it matches in TPU interpret
    mode and lowers for TPU."""
    config = module.default_config(shape, "tpu")
    assert glu.typed_config(config, shape, "tpu").tile(shape) == (shape[1], 1000 if shape[2] == 1000 else 128)
    checks.check(module, "tpu", shape, "float32", config)
    checks.check(module, "tpu", shape, "bfloat16", {"block_rows": 128, "block_cols": 2048, "buffers": 1})


@pytest.mark.parametrize("module", [swiglu, geglu])
def test_tpu_pads_a_seq_its_blocks_do_not_divide(module):
    """Seq 37 in blocks of 16 rows: padded to 48 by a copy (TPU interpret mode cannot run partial
    edge tiles under validation's aliased outputs), matches the reference with poisoned outputs in
    TPU interpret mode, and lowers for TPU; block_cols must still divide hidden."""
    shape = (2, 37, 384)
    config = {"block_rows": 16, "block_cols": 128, "buffers": 2}
    assert glu.typed_config(config, shape, "tpu").padded_seq(shape) == 48
    checks.check(module, "tpu", shape, "bfloat16", config)
    with pytest.raises(ValueError, match="block_cols=256 must divide hidden"):
        module.build({"block_rows": 16, "block_cols": 256}, shape, jnp.float32, Platform("tpu"))


@pytest.mark.parametrize("module", [swiglu, geglu])
@pytest.mark.parametrize("shape", [(1, 50257, 2560), (1, 4001, 4096), (3, 4001, 11008), (4, 255, 50257)], ids=str)
def test_tpu_default_at_a_long_odd_seq_fits_vmem(module, shape):
    """No multiple of 8 divides these seqs. The default took one block of all of seq: 514 MB of VMEM
    at 50257 x 512, 256 MB at 255 x 50257 (an odd hidden is one block wide), past every TPU's. Now
    a block of all of seq only within WHOLE_SEQ_VMEM, else the widest row blocks that fit, over
    seq padded (lowered for TPU on this CPU: no TPU ran it)."""
    config = module.default_config(shape, "tpu")
    assert module.check_config(config, shape, "bfloat16", "tpu") is None
    assert module.footprint(config, shape, "float32", "tpu") <= glu.WHOLE_SEQ_VMEM
    assert "tpu_custom_call" in checks.lower_for_device(module, config, shape, "bfloat16", "tpu")


def test_flat_tiling_refuses_int32_overflow():
    with pytest.raises(NotImplementedError, match="2\\*\\*31"):
        swiglu.build({"tiling": "flat", "block_size": 1024}, (16, 16384, 8192), jnp.bfloat16,
                     Platform("gpu-triton"))


@pytest.mark.parametrize("module", [swiglu, geglu])
def test_footprint_matches_hand_count(module):
    shape, dtype = (16, 16384, 4096), jnp.bfloat16
    # a, b, out: 2 buffers x 3 x 256 x 1024 x 2 bytes (no float32 tile: Mosaic works a vreg at a time)
    tpu = {"block_rows": 256, "block_cols": 1024, "buffers": 2}
    assert module.footprint(tpu, shape, dtype, "tpu") == 3145728
    # shared memory: 2 pipelined stages x (a, b) x 4096 x 2 bytes (the register tile does not count)
    gpu = {"tiling": "flat", "block_size": 4096, "blocks_per_program": 2, "block_cols": 64,
           "num_warps": 8, "num_stages": 3}
    assert module.footprint(gpu, shape, dtype, "gpu-triton") == 32768
    assert module.footprint({**gpu, "blocks_per_program": 1}, shape, dtype, "gpu-triton") == 0


@pytest.mark.parametrize("module", [swiglu, geglu])
def test_space_loads_and_seed_defaults_are_valid(module):
    space_ = shipped_spaces.space(module.NAME)
    for target in space_.targets:
        for shape in target.shapes:
            for dtype in target.dtypes:
                config = module.default_config(shape, target.name)
                assert space_.violated(config, shape, dtype, target.name) is None, (target.name, shape, config)
