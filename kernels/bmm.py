"""Batched matrix product: C[b, m, n] = sum_k A[b, m, k] B[b, k, n], accumulated in float32.

Every batch entry has its own A and B; the batch is the outermost grid axis (on the persistent
Mosaic GPU kernel, part of the linear tile index). Tiling and strategies: `kernels.matmul_core`.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from kernels import matmul_core

NAME = "bmm"
SHAPE_NAMES = ("batch", "m", "n", "k")
PARALLEL_DIMS = ("batch", "m", "n", "k")  # k: the pieces' products are summed
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")


def _problem(shape: tuple[int, ...]) -> matmul_core.Problem:
    batch, m, n, k = shape
    return matmul_core.Problem(m, n, k, batch=batch)


def reference(a: jax.Array, b: jax.Array) -> jax.Array:
    """A @ B per batch entry in plain jax.numpy with float32 accumulation."""
    return jnp.einsum("bmk,bkn->bmn", a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random A (batch, m, k) and B (batch, k, n), normal with unit scale."""
    batch, m, n, k = shape
    ka, kb = jax.random.split(key)
    return (jax.random.normal(ka, (batch, m, k), jnp.float32).astype(dtype),
            jax.random.normal(kb, (batch, k, n), jnp.float32).astype(dtype))


def shape_of(a: jax.Array, b: jax.Array) -> tuple[int, ...]:
    """(batch, m, n, k) of A (batch, m, k) and B (batch, k, n)."""
    batch, m, k = a.shape
    return batch, m, b.shape[2], k


def flops(shape: tuple[int, ...]) -> int:
    """2 batch m n k multiply-adds."""
    batch, m, n, k = shape
    return 2 * batch * m * n * k


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: every A and B read once, C written once."""
    batch, m, n, k = shape
    return batch * (m * k + k * n + m * n) * jnp.dtype(dtype).itemsize


footprint, default_config, check_config, build = matmul_core.entry_points(_problem, "batched matmul")
