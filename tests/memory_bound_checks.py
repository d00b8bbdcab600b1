"""Shared checks for the memory-bound kernels (welford, cross_entropy, swiglu, geglu; the row-wise
kernels' `rowwise_checks` builds on them): numerics of a poisoned interpret-mode build against the
reference, lowering for a device target on this CPU host, the largest valid config of a space."""
from __future__ import annotations

from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from farm.measure import validate
from farm.search.spaces import SearchSpace
from kernels.lowering import Platform
from tests.shipped_spaces import admitted_configs

DTYPES = ("float32", "bfloat16")
# The platform a device target is lowered for on this CPU host.
LOWERING_PLATFORM = {"tpu": "tpu", "gpu-triton": "cuda"}


def largest_config(space_: SearchSpace, module: ModuleType, target: str, shape: tuple[int, ...],
                   dtype: str) -> dict[str, Any]:
    """The config of the space valid on `shape` with the largest on-chip footprint."""
    key = (space_.path, module.NAME, target, shape, dtype)
    if key not in _LARGEST:  # collection asks for the same config from more than one list of cases
        valid = admitted_configs(space_, target, shape, dtype)
        assert valid, f"{space_.path}: no valid {target} config for {shape} {dtype}"
        _LARGEST[key] = max(valid, key=lambda c: module.footprint(c, shape, dtype, target))
    return dict(_LARGEST[key])


_LARGEST: dict[tuple[Any, ...], dict[str, Any]] = {}


def named_configs(space_: SearchSpace, module: ModuleType, target: str, shape: tuple[int, ...],
                  dtype: str, explicit: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(name, config): the target's default, the largest valid config and `explicit`, numbered."""
    return [("default", module.default_config(shape, target)),
            ("largest", largest_config(space_, module, target, shape, dtype)),
            *((f"config{i}", c) for i, c in enumerate(explicit))]


def cases(space_: SearchSpace, module: ModuleType, shapes: dict[str, tuple[int, ...]],
          explicit: dict[str, list[dict[str, Any]]], dtypes: tuple[str, ...] = DTYPES) -> list[Any]:
    """pytest params (target, shape, dtype, config): default, largest valid and `explicit` configs."""
    return [pytest.param(target, shapes[target], dtype, c, id=f"{target}-{dtype}-{name}")
            for target, configs in explicit.items() for dtype in dtypes
            for name, c in named_configs(space_, module, target, shapes[target], dtype, configs)]


def relative_error(module: ModuleType, config: dict[str, Any], shape: tuple[int, ...], dtype: str,
                   target: str) -> float:
    """The error of a poisoned, interpret-mode build of `config` against the reference."""
    inputs = module.make_inputs(shape, jnp.dtype(dtype), jax.random.key(7))
    fn = module.build(config, shape, jnp.dtype(dtype), Platform(target, interpret=True, poison_outputs=True))
    out = jax.block_until_ready(jax.jit(fn)(*inputs))
    return validate.relative_error(out, module.reference(*validate.upcast(inputs)))


def assert_matches(module: ModuleType, config: dict[str, Any], shape: tuple[int, ...],
                   dtype: str, target: str) -> None:
    """`config` computes the reference within the farm's tolerance for `dtype`."""
    error = relative_error(module, config, shape, dtype, target)
    bound = validate.tolerance(dtype, module)
    assert error <= bound, f"{target} {config} {dtype}: relative error {error:.3g} > {bound:.3g}"


def lower_for_device(module: ModuleType, config: dict[str, Any], shape: tuple[int, ...], dtype: str,
                     target: str) -> str:
    """Lower the native (non-interpret) build of `config` for the target's device; the module text."""
    args = jax.eval_shape(lambda: module.make_inputs(shape, jnp.dtype(dtype), jax.random.key(0)))
    fn = module.build(config, shape, jnp.dtype(dtype), Platform(target))
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(LOWERING_PLATFORM[target],)).as_text()


def check(module: ModuleType, target: str, shape: tuple[int, ...], dtype: str,
          config: dict[str, Any]) -> None:
    """`config` matches the reference in interpret mode and, on a device target, lowers for it."""
    assert_matches(module, config, shape, dtype, target)
    if target in LOWERING_PLATFORM:
        text = lower_for_device(module, config, shape, dtype, target)
        marker = "tpu_custom_call" if target == "tpu" else "triton"
        assert marker in text, f"{target} lowering of {config} has no {marker} call"
