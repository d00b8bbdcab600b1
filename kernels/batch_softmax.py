"""Batched softmax over the last axis of a 3-D array: y[b, i, :] = softmax(x[b, i, :]).

The math is `kernels.softmax`'s; blocks are (block_batch, block_rows, cols) on TPU, so a
program may cover several batch entries when rows are few.
Config knobs: those of the row engine (`kernels.rows`), with block_batch (TPU and interpret:
batch entries per program, dividing batch); Triton's grid is (row programs, batch), one batch
entry per program. On Mosaic GPU the batch is flattened into rows, each staged once in shared
memory (`kernels.rows.mosaic`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from kernels import rows, softmax
from kernels.rows import mosaic as mosaic_rows

NAME = "batch_softmax"
SHAPE_NAMES = ("batch", "rows", "cols")
PARALLEL_DIMS = ("batch", "rows")
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")
MEMORY_PARAMS = rows.MEMORY_PARAMS
MATH = dataclasses.replace(softmax.MATH, name=NAME)  # softmax's math, named in errors and profiles as this kernel
STAGED = dataclasses.replace(softmax.STAGED, name=NAME)


def reference(x: jax.Array) -> jax.Array:
    """Softmax over the last axis in plain jax.numpy, computed in float32."""
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random logits (normal, scale 3), a different shift per batch entry."""
    k_x, k_shift = jax.random.split(key)
    shift = jax.random.normal(k_shift, (shape[0], 1, 1), jnp.float32)
    return (3.0 * jax.random.normal(k_x, shape, jnp.float32) + shift).astype(dtype),


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: max, subtract, exp, sum, divide per element."""
    return 5 * math.prod(shape)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: read x once, write y once."""
    return 2 * math.prod(shape) * jnp.dtype(dtype).itemsize


KERNEL = rows.RowKernel(MATH, SHAPE_NAMES)
shape_of = KERNEL.shape_of
# Mosaic GPU's staged rows (the batch flattened into rows) on gpu-mosaic, the row engine elsewhere.
check_config, footprint, default_config, build = mosaic_rows.protocol(KERNEL, STAGED)
default_gpu_targets = KERNEL.default_gpu_targets
