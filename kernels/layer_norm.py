"""Layer norm over the last axis: y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias.

Whole rows (one_pass) take the mean, then the variance of the centred row.
Streamed rows fold each column chunk's count, mean and sum of squared deviations into the
running ones (Chan et al.'s parallel merge), which stays accurate when |mean| >> std; with
fold 'lanes' (Triton), each lane keeps Welford's running moments of its columns, and the lanes
are merged the same way once per row. On Mosaic GPU (strategy smem_row, `kernels.rows.mosaic`)
each row is staged once in shared memory beside weight and bias and walked once there for the
sums of x - x[0] and of their squares (moments shifted by the row's first element, which cancel
little however far the row sits from zero), then normalized in place: one HBM read.
Config knobs: those of the row engine (`kernels.rows`, which documents them once).
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from kernels import rows
from kernels.rows import mosaic as mosaic_rows

NAME = "layer_norm"
SHAPE_NAMES = ("rows", "cols")
PARALLEL_DIMS = ("rows",)
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")
MEMORY_PARAMS = rows.MEMORY_PARAMS
EPS = 1e-5


def reference(x: jax.Array, weight: jax.Array, bias: jax.Array) -> jax.Array:
    """Layer norm of each row in plain jax.numpy, computed in float32."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + EPS) * weight.astype(jnp.float32)
    y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random rows (normal, offsets per row and per column), weight near 1 and a small bias."""
    k_x, k_row, k_col, k_w, k_b = jax.random.split(key, 5)
    rows, cols = shape
    x = (jax.random.normal(k_x, shape) + 4.0 * jax.random.normal(k_row, (rows, 1))
         + 2.0 * jax.random.normal(k_col, (1, cols)))
    weight = 1.0 + 0.2 * jax.random.normal(k_w, (cols,))
    bias = 0.2 * jax.random.normal(k_b, (cols,))
    return x.astype(dtype), weight.astype(dtype), bias.astype(dtype)


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: mean, centring, variance, scale and shift."""
    return 8 * math.prod(shape)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: read x, weight and bias once, write y once."""
    rows, cols = shape
    return (2 * rows * cols + 2 * cols) * jnp.dtype(dtype).itemsize


def _layer_norm_rows(x: jax.Array, weight: jax.Array, bias: jax.Array, *, cols: int,
                     valid: jax.Array | None) -> tuple[jax.Array]:
    mean = jnp.sum(x, axis=-1, keepdims=True) / cols
    centred = x - mean if valid is None else jnp.where(valid, x - mean, 0.0)
    var = jnp.sum(centred * centred, axis=-1, keepdims=True) / cols
    return (centred * jax.lax.rsqrt(var + EPS) * weight + bias,)


def _init(shape: tuple[int, ...]) -> rows.Stats:
    """Count, mean and sum of squared deviations of the columns seen so far."""
    return tuple(jnp.zeros(shape, jnp.float32) for _ in range(3))


def _update(stats: rows.Stats, x: jax.Array, weight: jax.Array, bias: jax.Array, *,
            start: jax.Array, valid: jax.Array | None) -> rows.Stats:
    """Merge a chunk's count, mean and squared deviations into the running ones (Chan et al.)."""
    del weight, bias, start
    count, mean, m2 = stats
    n = x.shape[-1] if valid is None else jnp.sum(valid.astype(jnp.float32))
    chunk_mean = jnp.sum(x, axis=-1, keepdims=True) / n
    deviation = x - chunk_mean if valid is None else jnp.where(valid, x - chunk_mean, 0.0)
    chunk_m2 = jnp.sum(deviation * deviation, axis=-1, keepdims=True)
    total = count + n
    delta = chunk_mean - mean
    return total, mean + delta * (n / total), m2 + chunk_m2 + delta * delta * (count * n / total)


def _finish(stats: rows.Stats, cols: int) -> rows.Stats:
    _, mean, m2 = stats
    return mean, jax.lax.rsqrt(m2 / cols + EPS)


def _normalize(row: rows.Stats, x: jax.Array, weight: jax.Array,
               bias: jax.Array) -> tuple[jax.Array]:
    mean, rstd = row
    return ((x - mean) * rstd * weight + bias,)


def _lane_update(stats: rows.Stats, x: jax.Array, weight: jax.Array, bias: jax.Array, *,
                 start: jax.Array, valid: jax.Array | None) -> rows.Stats:
    """Welford's update of each lane's count, mean and squared deviations by one column."""
    del weight, bias, start
    count, mean, m2 = stats
    seen = 1.0 if valid is None else valid.astype(jnp.float32)
    count = count + seen
    delta = x - mean
    # A lane that has seen no column yet keeps mean 0 (its count is 0, so it weighs nothing).
    mean = mean + delta * (seen / jnp.maximum(count, 1.0))
    return count, mean, m2 + delta * (x - mean) * seen


def _combine_lanes(stats: rows.Stats) -> rows.Stats:
    """The lanes' moments merged into the row's (Chan et al., over every lane at once)."""
    count, mean, m2 = stats
    total = jnp.sum(count, axis=-1, keepdims=True)
    row_mean = jnp.sum(count * mean, axis=-1, keepdims=True) / total
    spread = mean - row_mean
    return total, row_mean, jnp.sum(m2 + count * spread * spread, axis=-1, keepdims=True)


MATH = rows.RowMath(NAME, rows=_layer_norm_rows, init=_init, update=_update, finish=_finish,
                    apply=_normalize, col_inputs=2,
                    lanes=rows.LaneFold(update=_lane_update, combine=_combine_lanes))


def _shifted_moments(acc: tuple[jax.Array, jax.Array], x: jax.Array, stats: rows.Stats,
                     valid: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """Per lane: the sums of d = x - shift and of d^2 (positions outside the row add nothing)."""
    d = x - stats[0]
    d = d if valid is None else jnp.where(valid, d, 0.0)
    return acc[0] + d, acc[1] + d * d


def _scale_offset(sums: tuple[jax.Array, jax.Array], stats: rows.Stats, cols: int) -> tuple[jax.Array, jax.Array]:
    """The row's 1/std and -mean/std: the map is then two multiply-adds an element,
    (x * scale + offset) * weight + bias."""
    mean = sums[0] / cols
    var = jnp.maximum(sums[1] / cols - mean * mean, 0.0)
    scale = jax.lax.rsqrt(var + EPS)
    return scale, -(stats[0] + mean) * scale


STAGED = rows.StagedMath(
    NAME, col_inputs=2, shift=True,
    walks=(rows.Walk(fold=_shifted_moments, across=lambda acc: (jnp.sum(acc[0]), jnp.sum(acc[1])),
                     identity=(0.0, 0.0), finish=_scale_offset, combine=lambda a, b: (a[0] + b[0], a[1] + b[1])),),
    apply=lambda x, stats, weight, bias: (x * stats[1][0] + stats[1][1]) * weight + bias)


KERNEL = rows.RowKernel(MATH, SHAPE_NAMES)
shape_of = KERNEL.shape_of
# Mosaic GPU's staged rows on gpu-mosaic, the row engine's strategies on every other target.
check_config, footprint, default_config, build = mosaic_rows.protocol(KERNEL, STAGED)
default_gpu_targets = KERNEL.default_gpu_targets
