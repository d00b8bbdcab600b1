"""RMS norm over the last axis: y = x / sqrt(mean(x^2) + eps) * weight.

Config knobs: those of the row engine (`kernels.rows`). Streamed rows fold the sum of squares
(with fold 'lanes' on Triton, per lane, summed once per row). On Mosaic GPU (strategy
smem_row, `kernels.rows.mosaic`) each row is staged once in shared memory beside the weight: one
walk sums the squares, the map scales the row in place, one HBM read and one write.
Gradients: the `rms_norm_bwd` kernel (BACKWARD), so a tuned rms_norm is differentiable.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from kernels import rows
from kernels.protocol import Backward
from kernels.rows import mosaic as mosaic_rows

NAME = "rms_norm"
SHAPE_NAMES = ("rows", "cols")
PARALLEL_DIMS = ("rows",)
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")
MEMORY_PARAMS = rows.MEMORY_PARAMS
EPS = 1e-6
# rms_norm_bwd(x, weight, dy) -> (dx, dweight)
BACKWARD = Backward("rms_norm_bwd", inputs=("input0", "input1", "cotangent0"), grads=(0, 1))


def reference(x: jax.Array, weight: jax.Array) -> jax.Array:
    """RMS norm of each row in plain jax.numpy, computed in float32."""
    x32 = x.astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + EPS)
    return (x32 * rstd * weight.astype(jnp.float32)).astype(x.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random rows (normal, each with its own scale) and a weight near 1."""
    k_x, k_scale, k_w = jax.random.split(key, 3)
    rows, cols = shape
    scale = jnp.exp(jax.random.normal(k_scale, (rows, 1)))
    x = scale * jax.random.normal(k_x, shape)
    weight = 1.0 + 0.2 * jax.random.normal(k_w, (cols,))
    return x.astype(dtype), weight.astype(dtype)


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: square, sum, two scalings per element."""
    return 4 * math.prod(shape)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: read x and weight once, write y once."""
    rows, cols = shape
    return (2 * rows * cols + cols) * jnp.dtype(dtype).itemsize


def _rms_norm_rows(x: jax.Array, weight: jax.Array, *, cols: int,
                   valid: jax.Array | None) -> tuple[jax.Array]:
    del valid  # padded columns read as 0 and add nothing to the sum of squares
    rstd = jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) / cols + EPS)
    return (x * rstd * weight,)


def _init(shape: tuple[int, ...]) -> rows.Stats:
    return (jnp.zeros(shape, jnp.float32),)


def _update(stats: rows.Stats, x: jax.Array, weight: jax.Array, *, start: jax.Array,
            valid: jax.Array | None) -> rows.Stats:
    del weight, start, valid
    (sum_squares,) = stats
    return (sum_squares + jnp.sum(x * x, axis=-1, keepdims=True),)


def _finish(stats: rows.Stats, cols: int) -> rows.Stats:
    (sum_squares,) = stats
    return (jax.lax.rsqrt(sum_squares / cols + EPS),)


def _normalize(row: rows.Stats, x: jax.Array, weight: jax.Array) -> tuple[jax.Array]:
    (rstd,) = row
    return (x * rstd * weight,)


def _lane_update(stats: rows.Stats, x: jax.Array, weight: jax.Array, *, start: jax.Array,
                 valid: jax.Array | None) -> rows.Stats:
    del weight, start, valid  # padded columns read as 0
    (sum_squares,) = stats
    return (sum_squares + x * x,)


def _combine_lanes(stats: rows.Stats) -> rows.Stats:
    (sum_squares,) = stats
    return (jnp.sum(sum_squares, axis=-1, keepdims=True),)


MATH = rows.RowMath(NAME, rows=_rms_norm_rows, init=_init, update=_update, finish=_finish,
                    apply=_normalize, col_inputs=1,
                    lanes=rows.LaneFold(update=_lane_update, combine=_combine_lanes))


STAGED = rows.StagedMath(
    NAME, col_inputs=1,
    walks=(rows.Walk(fold=lambda acc, x, stats, valid: acc + x * x, across=jnp.sum, identity=0.0,
                     finish=lambda total, stats, cols: jax.lax.rsqrt(total / cols + EPS), combine=jnp.add),),
    apply=lambda x, stats, weight: x * stats[0] * weight)


KERNEL = rows.RowKernel(MATH, SHAPE_NAMES)
shape_of = KERNEL.shape_of
# Mosaic GPU's staged rows on gpu-mosaic, the row engine's strategies on every other target.
check_config, footprint, default_config, build = mosaic_rows.protocol(KERNEL, STAGED)
default_gpu_targets = KERNEL.default_gpu_targets
