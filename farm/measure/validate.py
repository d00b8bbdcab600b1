"""Numerics: compare a kernel's output with its reference, with dtype-aware tolerances."""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels import protocol

# Bounds on ||out - ref|| / ||ref||. float32 allows for TF32 matrix units on GPU (~3e-4);
# half types allow for rounding the output and accumulating in a different order.
TOLERANCE = {"float32": 2e-3, "bfloat16": 2e-2, "float16": 1e-2}


def tolerance(dtype: str, kernel: Any = None) -> float:
    """The relative error bound for `dtype`, or the kernel's own TOLERANCE entry."""
    own = protocol.hook(kernel, "TOLERANCE") or {}
    return float(own.get(dtype, TOLERANCE[dtype]))


def upcast(inputs: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    """Floating inputs as float32, so the reference is computed in higher precision."""
    return tuple(x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in inputs)


# Outputs larger than this are compared on the device in float32 (a host float64 copy of a
# 1 GiB output takes seconds: most of a trial); smaller ones on the host in float64.
HOST_CHECK_ELEMENTS = 1 << 22


@jax.jit
def _device_error(out: jax.Array, ref: jax.Array) -> jax.Array:
    o, r = out.astype(jnp.float32), ref.astype(jnp.float32)
    denominator = jnp.sqrt(jnp.sum(r * r))
    error = jnp.sqrt(jnp.sum((o - r) ** 2)) / jnp.where(denominator > 0, denominator, 1.0)
    return jnp.where(jnp.all(jnp.isfinite(o)), error, jnp.inf)


def _host_error(out: Any, ref: Any) -> float:
    o = np.asarray(jax.device_get(out), np.float64)
    r = np.asarray(jax.device_get(ref), np.float64)
    if not np.all(np.isfinite(o)):
        return math.inf
    denominator = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / (denominator if denominator > 0 else 1.0))


def relative_error(out: Any, ref: Any) -> float:
    """Largest ||out - ref|| / ||ref|| over the output leaves; inf on NaN, inf or shape mismatch."""
    worst = 0.0
    outs, refs = jax.tree.leaves(out), jax.tree.leaves(ref)
    if len(outs) != len(refs):
        return math.inf
    for o, r in zip(outs, refs):
        if tuple(np.shape(o)) != tuple(np.shape(r)):
            return math.inf
        if math.prod(np.shape(o)) <= HOST_CHECK_ELEMENTS:
            error = _host_error(o, r)
        else:
            error = float(_device_error(jnp.asarray(o), jnp.asarray(r)))
        worst = max(worst, error)
    return worst


def mismatch(out: Any, expected: Any, task_dtype: Any = None) -> str | None:
    """Why `out` is not shaped as `expected` (`jax.eval_shape` of the reference on the kernel's own
    inputs): another structure, shape or dtype (the reference's, or the task's `task_dtype`: a
    reference may compute and return float32 for bfloat16 inputs); None when every output matches."""
    got, want = jax.tree.leaves(out), jax.tree.leaves(expected)
    allowed = None if task_dtype is None else jnp.dtype(task_dtype)
    if jax.tree.structure(out) != jax.tree.structure(expected):
        return f"the kernel returned {len(got)} output(s) as {jax.tree.structure(out)}, the reference {len(want)} as " \
               f"{jax.tree.structure(expected)}"
    for i, (o, e) in enumerate(zip(got, want)):
        if tuple(o.shape) != tuple(e.shape) or o.dtype not in (e.dtype, allowed):
            also = f" or {allowed}" if allowed is not None and allowed != e.dtype else ""
            return (f"output {i} is {o.dtype}{list(o.shape)}, expected {e.dtype}{also}{list(e.shape)} (the "
                    f"reference's on the same inputs{', or the task dtype' if also else ''})")
    return None
