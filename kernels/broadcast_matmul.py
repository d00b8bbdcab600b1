"""Batched A times one shared B: C[b, m, n] = sum_k A[b, m, k] B[k, n], accumulated in float32.

Strategy knob fold_batch (every target): true folds the batch into the rows and runs one
(batch * m, n, k) matmul, so row tiles may span batch entries and B's tiles are reused across
the whole batch; false keeps the batch as the outermost grid axis. Other knobs: matmul_core.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from kernels import matmul_core
from kernels.knobs import Knobs, refusal
from kernels.lowering import Platform

NAME = "broadcast_matmul"
SHAPE_NAMES = ("batch", "m", "n", "k")
PARALLEL_DIMS = ("batch", "m", "n", "k")  # k: the pieces' products are summed
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")


@dataclasses.dataclass(frozen=True)
class BroadcastKnobs(Knobs):
    """This kernel's own knob: fold the batch into the rows (or keep it as a grid axis)."""

    fold_batch: bool = False


def _typed(config: dict[str, Any], target: str) -> tuple[matmul_core.MatmulConfig, BroadcastKnobs]:
    return matmul_core.parse_config(config, target, BroadcastKnobs)


def _problem(own: BroadcastKnobs, shape: tuple[int, ...]) -> matmul_core.Problem:
    batch, m, n, k = shape
    if own.fold_batch:
        return matmul_core.Problem(batch * m, n, k)
    return matmul_core.Problem(m, n, k, batch=batch, shared_b=True)


def reference(a: jax.Array, b: jax.Array) -> jax.Array:
    """A[b] @ B for every batch entry in plain jax.numpy with float32 accumulation."""
    return jnp.einsum("bmk,kn->bmn", a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random A (batch, m, k) and B (k, n), normal with unit scale."""
    batch, m, n, k = shape
    ka, kb = jax.random.split(key)
    return (jax.random.normal(ka, (batch, m, k), jnp.float32).astype(dtype),
            jax.random.normal(kb, (k, n), jnp.float32).astype(dtype))


def shape_of(a: jax.Array, b: jax.Array) -> tuple[int, ...]:
    """(batch, m, n, k) of A (batch, m, k) and B (k, n)."""
    batch, m, k = a.shape
    return batch, m, b.shape[1], k


def flops(shape: tuple[int, ...]) -> int:
    """2 batch m n k multiply-adds."""
    batch, m, n, k = shape
    return 2 * batch * m * n * k


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: A and the one B read once, C written once."""
    batch, m, n, k = shape
    return (batch * m * k + k * n + batch * m * n) * jnp.dtype(dtype).itemsize


def footprint(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
    """On-chip bytes of one program (VMEM on TPU, shared memory on GPU); see matmul_core."""
    core, own = _typed(config, target)
    return matmul_core.footprint(_problem(own, shape), core, dtype, target)


def default_config(shape: tuple[int, ...], target: str, dtype: Any = None) -> dict[str, Any]:
    """Batch kept as a grid axis, with tiles that divide the matrices (within on-chip memory at
    the inputs' dtype; None: bfloat16)."""
    own = BroadcastKnobs()
    return own.to_dict() | matmul_core.default_config(_problem(own, shape), target, dtype)


def _checked(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str):
    core, own = _typed(config, target)
    problem = _problem(own, shape)
    return problem, matmul_core.check(problem, core, dtype, target)


def check_config(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> str | None:
    """None when `build` accepts the config, else why not."""
    return refusal(lambda: _checked(config, shape, dtype, target))


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
    """The Pallas broadcast matmul for `config` on `platform`: a function of (a, b)."""
    batch, m, n, _ = shape
    problem, core = _checked(config, shape, dtype, platform.target)
    fn = matmul_core.build(problem, core, dtype, platform)
    if problem.batch:
        return fn

    def folded(a: jax.Array, b: jax.Array) -> jax.Array:
        return fn(a.reshape(batch * m, -1), b).reshape(batch, m, n)

    return folded
