"""Matrix product: C[m, n] = sum_k A[m, k] B[k, n], accumulated in float32.

The tiling and the code-generation strategies live in `kernels.matmul_core` (see its docstring
for every knob): on TPU the K loop as a grid axis, an inner `emit_pipeline` or a VMEM-resident
panel; on GPU a Triton kernel or a Mosaic GPU kernel, warp-specialized or singly pipelined.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from kernels import matmul_core

NAME = "matmul"
SHAPE_NAMES = ("m", "n", "k")
PARALLEL_DIMS = ("m", "n", "k")  # k: the pieces' products are summed
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")


def _problem(shape: tuple[int, ...]) -> matmul_core.Problem:
    m, n, k = shape
    return matmul_core.Problem(m, n, k)


def reference(a: jax.Array, b: jax.Array) -> jax.Array:
    """A @ B in plain jax.numpy with float32 accumulation."""
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random A (m, k) and B (k, n), normal with unit scale."""
    m, n, k = shape
    ka, kb = jax.random.split(key)
    return (jax.random.normal(ka, (m, k), jnp.float32).astype(dtype),
            jax.random.normal(kb, (k, n), jnp.float32).astype(dtype))


def shape_of(a: jax.Array, b: jax.Array) -> tuple[int, ...]:
    """(m, n, k) of A (m, k) and B (k, n)."""
    return a.shape[0], b.shape[1], a.shape[1]


def flops(shape: tuple[int, ...]) -> int:
    """2 m n k multiply-adds."""
    m, n, k = shape
    return 2 * m * n * k


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: A and B read once, C written once."""
    m, n, k = shape
    return (m * k + k * n + m * n) * jnp.dtype(dtype).itemsize


footprint, default_config, check_config, build = matmul_core.entry_points(_problem, "matmul")
