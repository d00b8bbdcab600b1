"""Typed configs of the row family: shape_of, check_config and from_dict, without running kernels."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import glu, rows
from kernels.lowering import Platform
from tests.shipped_spaces import admitted_configs, space

ROW_KERNELS = ("softmax", "batch_softmax", "softmax_two_pass", "layer_norm", "rms_norm",
               "rms_norm_bwd", "welford", "cross_entropy", "swiglu", "geglu")
SOFTMAX_AND_NORMS = ("softmax", "batch_softmax", "softmax_two_pass", "layer_norm", "rms_norm", "rms_norm_bwd")
SMALL = {"batch_softmax": (2, 16, 384), "swiglu": (2, 16, 256), "geglu": (2, 16, 256)}
SPACES = {name: (name,) for name in ROW_KERNELS} | {"cross_entropy": ("cross_entropy",
                                                                      "cross_entropy_long")}
# An illegal config per target, and a word its reason must contain.
ILLEGAL = {
    "tpu": ({"block_rows": 4, "strategy": "fori_loop", "block_cols": 128}, "divisible by 8"),
    "interpret": ({"block_rows": 8, "strategy": "emit_pipeline"}, "not available on interpret"),
    "gpu-triton": ({"block_rows": 3, "strategy": "fori_loop", "block_cols": 128}, "powers of two"),
    "gpu-mosaic": ({"block_rows": 1, "strategy": "smem_row", "block_cols": 3000}, "power of two"),
}
# rms_norm_bwd's Mosaic GPU kernel takes rows in turn (kernels/rms_norm_bwd_mgpu.py): its own knobs.
ILLEGAL_OF = {("rms_norm_bwd", "gpu-mosaic"): ({"block_rows": 1, "strategy": "smem_rows", "block_cols": 3000,
                                               "rows_per_program": 8}, "power of two")}
GLU_ILLEGAL = {
    "tpu": ({"block_rows": 8, "block_cols": 128, "buffers": 3}, "1 or 2"),
    "interpret": ({"block_rows": 0, "block_cols": 128}, "positive"),
    "gpu-triton": ({"block_size": 1000}, "power of two"),
}


def _cases() -> list[tuple[str, str, tuple[int, ...], str]]:
    """(kernel, target, shape, dtype) of every task of the row kernels' spaces."""
    return [(name, target.name, shape, target.dtypes[0])
            for name in ROW_KERNELS for path in SPACES[name]
            for target in space(path).targets for shape in target.shapes]


@pytest.mark.parametrize("name", ROW_KERNELS)
def test_shape_of_inverts_make_inputs(name: str) -> None:
    module = kernels.load(name)
    shape = SMALL.get(name, (16, 384))
    for dtype in (jnp.float32, jnp.bfloat16):
        assert module.shape_of(*module.make_inputs(shape, dtype, jax.random.key(0))) == shape


@pytest.mark.parametrize("name,target,shape,dtype", _cases())
def test_check_config_accepts_the_default_and_refuses_with_a_reason(name, target, shape, dtype):
    module = kernels.load(name)
    assert module.check_config(module.default_config(shape, target), shape, dtype, target) is None
    config, word = ILLEGAL_OF.get((name, target)) or (
        GLU_ILLEGAL if module.SHAPE_NAMES == glu.SHAPE_NAMES else ILLEGAL)[target]
    reason = module.check_config(config, shape, dtype, target)
    assert isinstance(reason, str) and word in reason, reason
    # build refuses the same config for the same reason: one validation path.
    with pytest.raises((ValueError, NotImplementedError), match=re.escape(reason)):
        module.build(config, shape, jnp.dtype(dtype), Platform(target))


@pytest.mark.parametrize("name", ROW_KERNELS)
def test_every_config_the_spaces_admit_builds(name: str) -> None:
    module = kernels.load(name)
    for path in SPACES[name]:
        space_ = space(path)
        for target in space_.targets:
            for shape in target.shapes:
                for dtype in target.dtypes:
                    admitted = admitted_configs(space_, target.name, shape, dtype)
                    for config in admitted:
                        module.build(config, shape, jnp.dtype(dtype), Platform(target.name))
                    if name not in SOFTMAX_AND_NORMS:
                        continue
                    # Mosaic GPU's row kernels have one strategy (rows staged in shared memory, a
                    # block each; rms_norm_bwd's taken in turn); the knob names it there, in the
                    # row engine's vocabulary. Elsewhere a strategy knob offers a choice.
                    strategies = {c.get("strategy") for c in admitted} - {None}
                    assert len(strategies) != 1 or strategies in ({"smem_row"}, {"smem_rows"}), \
                        f"{path} {target.name}: a strategy knob without a choice"
                    assert all(module.footprint(c, shape, dtype, target.name) > 0 for c in admitted)


def test_from_dict_refuses_unknown_knobs_by_name() -> None:
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['passes'\].*strategy='fori_loop'"):
        rows.from_dict(rows.RowConfigTriton, {"block_rows": 4, "passes": 2}, "softmax on gpu-triton")
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['num_warps'\]"):
        rows.from_dict(rows.RowConfigTPU, {"block_rows": 8, "num_warps": 4}, "softmax on tpu")
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['tiling'\]"):
        rows.from_dict(glu.GluConfigTPU, {"block_rows": 8, "block_cols": 128, "tiling": "flat"}, "swiglu")
    with pytest.raises(ValueError, match="lacks the knob"):
        rows.from_dict(rows.RowConfigInterpret, {"strategy": "grid"}, "softmax on interpret")
    with pytest.raises(ValueError, match="block_rows='x' is not a valid int"):
        rows.from_dict(rows.RowConfigInterpret, {"block_rows": "x"}, "softmax on interpret")
    reason = kernels.load("welford").check_config({"block_rows": 8, "passes": 1}, (64, 512),
                                                   "float32", "gpu-triton")
    assert "unknown knob(s) ['passes']" in reason


def test_each_default_is_written_once_and_read_by_every_path() -> None:
    triton = rows.RowConfigTriton(block_rows=2, strategy="fori_loop", block_cols=256)
    assert (triton.num_warps, triton.num_stages, triton.rows_per_program) == (4, 3, None)
    # The footprint reads the typed default: 2 stages ahead of the loop (num_stages 3).
    softmax = kernels.load("softmax")
    config = {"block_rows": 2, "strategy": "fori_loop", "block_cols": 256}
    assert softmax.footprint(config, (64, 4096), "float32", "gpu-triton") == 2 * 2 * 256 * 4 + 2 * 4 * 4
    assert rows.RowConfigTPU(block_rows=8).to_dict() == {
        "block_rows": 8, "strategy": "one_pass", "block_cols": 128, "block_batch": 1, "buffers": 2,
        "stats_layout": "column"}


def test_the_lane_fold_is_a_knob_of_kernels_that_have_one() -> None:
    shape, lanes = (64, 4096), {"block_rows": 1, "strategy": "fori_loop", "block_cols": 512,
                                "fold": "lanes"}
    for name in ("rms_norm", "layer_norm"):
        module = kernels.load(name)
        assert "fold" in module.default_config(shape, "gpu-triton")
        assert module.check_config(lanes, shape, "bfloat16", "gpu-triton") is None
        reason = module.check_config({**lanes, "strategy": "one_pass"}, shape, "bfloat16", "gpu-triton")
        assert "fold='lanes' folds the chunks of strategy 'fori_loop'" in reason
    softmax = kernels.load("softmax")
    assert "fold" not in softmax.default_config(shape, "gpu-triton")
    assert "softmax has no per-lane fold" in softmax.check_config(lanes, shape, "bfloat16", "gpu-triton")
    assert "fold must be one of" in softmax.check_config({**lanes, "fold": "rows"}, shape, "bfloat16",
                                                          "gpu-triton")


def test_unrolled_walks_are_bounded_and_fori_loop_only() -> None:
    softmax = kernels.load("softmax")
    unrolled = {"block_rows": 1, "strategy": "fori_loop", "block_cols": 1024, "unroll": 1}
    assert "unroll" in softmax.default_config((64, 4096), "gpu-triton")
    assert softmax.check_config(unrolled, (64, 32000), "bfloat16", "gpu-triton") is None
    assert "exceed 32 chunks" in softmax.check_config(unrolled, (64, 50257), "bfloat16", "gpu-triton")
    reason = softmax.check_config({**unrolled, "strategy": "one_pass"}, (64, 4096), "bfloat16", "gpu-triton")
    assert "strategy 'fori_loop' only" in reason
