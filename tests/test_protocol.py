"""The kernel contract (kernels.protocol) over the registry, and the typed configs' dict edge.

Nothing here compiles a kernel: shapes come from `jax.eval_shape`, configs are only checked.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import attention_config, matmul_config, protocol
from kernels.knobs import ConfigError, Unsupported
from kernels.lowering import Platform
from tests import shipped_spaces

REPO = Path(__file__).resolve().parent.parent
SPACES = {s.kernel: s for s in shipped_spaces.every_space()}


def _kernels() -> list[str]:
    return sorted(kernels.REGISTRY)


def _small_task(name: str) -> tuple[tuple[int, ...], str]:
    """The interpret target's first shape and dtype in the kernel's space."""
    target = next(t for t in SPACES[name].targets if t.name == "interpret")
    return tuple(target.shapes[0]), target.dtypes[0]


@pytest.mark.parametrize("name", _kernels())
def test_every_registered_kernel_satisfies_the_protocol(name):
    module = kernels.load(name)
    assert isinstance(module, protocol.Kernel), protocol.check_module(module)
    assert protocol.check_module(module) == []
    assert module.NAME == name
    for member in protocol.REQUIRED:  # functions take the Protocol's parameters (bar *inputs)
        declared = getattr(protocol.Kernel, member, None)
        if callable(declared) and "inputs" not in inspect.signature(declared).parameters:
            expected = len(inspect.signature(declared).parameters) - 1  # self
            params = inspect.signature(getattr(module, member)).parameters.values()
            assert len([p for p in params if p.default is inspect.Parameter.empty]) == expected, member
            # beyond them only default_config's optional dtype (kernels.protocol.task_default)
            extra = {p.name for p in params if p.default is not inspect.Parameter.empty}
            assert extra <= ({"dtype"} if member == "default_config" else set()), (member, extra)


@pytest.mark.parametrize("name", _kernels())
def test_shape_of_inverts_make_inputs(name):
    module = kernels.load(name)
    shape, dtype = _small_task(name)
    inputs = jax.eval_shape(lambda: module.make_inputs(shape, jnp.dtype(dtype), jax.random.key(0)))
    assert tuple(module.shape_of(*inputs)) == shape


@pytest.mark.parametrize("name", _kernels())
def test_check_config_accepts_defaults_and_refuses_unknown_knobs(name):
    module = kernels.load(name)
    for target in SPACES[name].targets:
        for shape in target.shapes:
            default = module.default_config(shape, target.name)
            assert module.check_config(default, shape, target.dtypes[0], target.name) is None, (target.name, shape)
        reason = module.check_config({**default, "no_such_knob": 1}, shape, target.dtypes[0], target.name)
        assert reason and "no_such_knob" in reason


MM, LN, ATT = (128, 256, 256), (64, 256, 256), (1, 1, 256, 64)
REFUSED = [
    ("matmul", {"block_m": 96, "block_n": 128, "block_k": 128}, MM, "float32", "interpret", None),  # ragged: padded
    ("matmul", {"block_m": 64, "block_n": 128, "block_k": 128, "epi_n": 48}, MM, "float32", "interpret",
     "epi_n = 48 must divide"),
    ("matmul", {"block_m": 64, "block_n": 128, "block_k": 128, "group_m": 3}, MM, "float32", "interpret",
     "group_m = 3 must divide"),
    ("matmul", {"block_m": 64, "block_n": 128, "block_k": 128, "k_strategy": "grid", "buffers": 3}, MM,
     "bfloat16", "tpu", "buffers"),
    ("matmul", {"block_m": 64, "block_n": 128, "block_k": 128, "k_strategy": "diagonal"}, MM, "bfloat16", "tpu",
     "k_strategy = 'diagonal'"),
    ("matmul", {"block_m": 64, "block_n": 64, "block_k": 64}, MM, "float32", "gpu-mosaic", "bfloat16 or float16"),
    ("matmul", {"block_m": 64, "block_n": 64, "block_k": 64, "mgpu_pipeline": "warp_specialized", "cluster": "m"},
     (192, 256, 256), "bfloat16", "gpu-mosaic", "must pair up in clusters"),
    ("matmul", {"block_m": 64, "block_n": 64}, MM, "float32", "interpret", "missing knob block_k"),
    ("bmm", {"block_m": 64, "block_n": 64, "block_k": 64, "num_warps": 4}, (2, 64, 128, 128), "float32",
     "interpret", "unknown knob 'num_warps'"),
    ("broadcast_matmul", {"block_m": 64, "block_n": 64, "block_k": 64, "fold_batch": "yes"}, (2, 64, 128, 128),
     "float32", "interpret", "fold_batch"),
    ("matmul_layernorm", {"block_m": 64, "block_n": 128, "block_k": 128, "ln_strategy": "fused"}, LN, "float32",
     "interpret", "whole rows"),
    ("matmul_layernorm", {"block_m": 64, "block_n": 64, "block_k": 64, "ln_strategy": "two_phase", "ln_rows": 12},
     LN, "float32", "tpu", "(ln_rows = 12): TPU block (12, 256): the last two dimensions must be divisible"),
    ("matmul_layernorm", {"block_m": 64, "block_n": 256, "block_k": 64}, LN, "bfloat16", "gpu-mosaic",
     "use tile_stats"),
    ("matmul_layernorm", {"block_m": 64, "block_n": 64, "block_k": 64, "ln_strategy": "tile_stats"}, LN,
     "bfloat16", "gpu-triton", "Mosaic GPU matmuls only"),
    ("matmul_subtiled_epilogue", {"block_m": 64, "block_n": 128, "block_k": 128, "epi_n": 48}, MM, "float32",
     "interpret", "epi_n = 48 must divide"),
    ("matmul_subtiled_epilogue", {"block_m": 64, "block_n": 128, "block_k": 128, "epi_m": 48}, MM, "float32",
     "tpu", "epi_m = 48 must divide"),
    ("flash_attention", {"block_q": 96, "block_kv": 64}, ATT, "float32", "interpret", None),  # padded to 192
    ("flash_attention", {"block_q": 64, "block_kv": 64}, ATT, "bfloat16", "tpu", "multiple of 128"),
    ("flash_attention", {"block_q": 128, "block_kv": 128, "attn_strategy": "unroll", "buffers": 1}, (1, 1, 256, 128),
     "bfloat16", "tpu", None),
    ("flash_attention", {"block_q": 128, "block_kv": 128, "buffers": 1}, (1, 1, 256, 128), "bfloat16", "tpu",
     "buffers 2 or 3"),
    ("flash_attention_causal", {"block_q": 32, "block_kv": 64}, ATT, "bfloat16", "gpu-mosaic", "multiples of 64"),
    ("flash_attention_causal", {"block_q": 64, "block_kv": 64, "max_concurrent_steps": 1}, ATT, "bfloat16",
     "gpu-mosaic", "at least 2"),
    ("flash_attention_causal", {"block_q": 128, "block_kv": 64}, (1, 1, 128, 64), "bfloat16", "gpu-mosaic",
     None),  # 128 rows run in one block of 256
]


@pytest.mark.parametrize("name,config,shape,dtype,target,reason", REFUSED)
def test_check_config_gives_the_reason_build_refuses(name, config, shape, dtype, target, reason):
    module = kernels.load(name)
    said = module.check_config(config, shape, dtype, target)
    if reason is None:  # a legal config: build accepts it too (building traces nothing yet)
        assert said is None
        return
    assert said is not None and reason in said, said
    with pytest.raises(ConfigError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        module.build(config, shape, jnp.dtype(dtype), Platform(target))


def test_from_dict_refuses_unknown_and_missing_knobs_by_name():
    with pytest.raises(ConfigError, match=r"unknown knob 'blok_m' \(known knobs: block_m, block_n, block_k"):
        matmul_config.TpuMatmulConfig.from_dict({"blok_m": 128, "block_n": 128, "block_k": 128})
    with pytest.raises(ConfigError, match="missing knob block_kv"):
        attention_config.TritonAttentionConfig.from_dict({"block_q": 64})
    with pytest.raises(ConfigError, match="expected an integer"):
        attention_config.AttentionConfig.from_dict({"block_q": 64.5, "block_kv": 64})
    with pytest.raises(Unsupported):  # a NotImplementedError too, as build raised before
        attention_config.MosaicGpuAttentionConfig(64, 64, max_concurrent_steps=1)


def test_typed_configs_round_trip_through_dicts_and_coerce_numbers():
    import numpy as np

    config = matmul_config.TritonMatmulConfig.from_dict(
        {"block_m": np.int64(64), "block_n": 64, "block_k": 32.0, "num_stages": 4})
    assert config.to_dict() == {"block_m": 64, "block_n": 64, "block_k": 32, "group_m": 1, "split_k": 1,
                                "num_warps": 4, "num_stages": 4}
    assert all(type(v) is int for v in config.to_dict().values())
    assert matmul_config.TritonMatmulConfig.from_dict(config.to_dict()) == config


def test_one_default_per_knob():
    # Triton's num_stages: the matmul family's and attention's typed defaults are what build passes
    # to Triton and what footprint assumes; Mosaic GPU's mgpu_pipeline default is default_config's.
    mm = matmul_config.TritonMatmulConfig(64, 64, 32)
    assert kernels.load("matmul").default_config(MM, "gpu-triton")["num_stages"] == mm.num_stages
    # attention's default takes 3 stages by choice where they fit; its smaller fallbacks (a head
    # dim of 512, where neither 128-row nor 64-row Q blocks fit) take the class's own warps and stages
    att = attention_config.TritonAttentionConfig(32, 32)
    assert kernels.load("flash_attention").default_config((1, 2, 256, 512), "gpu-triton") == att.to_dict()
    assert kernels.load("flash_attention").footprint({"block_q": 32, "block_kv": 32}, ATT, jnp.bfloat16,
                                                     "gpu-triton") == att.footprint(ATT, jnp.bfloat16)
    assert kernels.load("matmul").default_config(MM, "gpu-mosaic")["mgpu_pipeline"] == \
        matmul_config.MosaicGpuMatmulConfig(64, 64, 64).mgpu_pipeline
    # (plain attention at head dims of 32 and 64 takes the pipelined kernel by choice: see
    # MosaicGpuAttentionConfig.default)
    wide = ATT[:3] + (128,)
    assert kernels.load("flash_attention").default_config(wide, "gpu-mosaic")["mgpu_pipeline"] == \
        attention_config.MosaicGpuAttentionConfig(64, 64).mgpu_pipeline


def test_required_names_are_the_protocols_members():
    members = set(protocol.Kernel.__annotations__) | {
        name for name, value in vars(protocol.Kernel).items() if callable(value) and not name.startswith("_")}
    assert members == set(protocol.REQUIRED)
    hooks = set(protocol.OptionalHooks.__annotations__) | {
        name for name, value in vars(protocol.OptionalHooks).items() if callable(value) and not name.startswith("_")}
    assert hooks == set(protocol.OPTIONAL)


def test_optional_hooks_are_read_with_their_defaults():
    bare = ModuleType("bare")
    assert protocol.hook(bare, "TOLERANCE") == {}
    assert protocol.hook(bare, "MEMORY_PARAMS") is None
    assert protocol.hook(bare, "hbm_bytes") is None
    bare.MEMORY_PARAMS = ("block",)
    assert protocol.hook(bare, "MEMORY_PARAMS") == ("block",)
    with pytest.raises(KeyError, match="not an optional kernel hook"):
        protocol.hook(bare, "build")


def test_load_refuses_a_module_without_the_required_names(monkeypatch):
    import sys

    partial = ModuleType("partial_kernel")
    partial.NAME = "partial_kernel"
    monkeypatch.setitem(sys.modules, "tests.partial_kernel", partial)
    with pytest.raises(kernels.UnknownKernel, match="lacks SHAPE_NAMES, TARGETS, build"):
        kernels.load("tests.partial_kernel")
