"""Per-row mean and variance: mean[i] = sum_j x[i, j] / n, var[i] = sum_j (x[i, j] - mean[i])^2 / n.

The variance is the population variance (ddof = 0), as in `jnp.var`. Both results are float32
arrays of shape (rows,) whatever the input dtype, as a normalisation layer keeps its statistics.

Each block of columns is reduced exactly (its mean, then the sum of squares about that mean),
and blocks are combined with Welford's update in the pairwise form of Chan, Golub and LeVeque:
  n = n_a + n_b,  d = mean_b - mean_a,  mean = mean_a + d n_b / n,  M2 = M2_a + M2_b + d^2 n_a n_b / n
so no sum of squares about zero is ever formed. The walk over columns is the `strategy` knob
of the row engine (`kernels.rows`, which documents every knob and shape rule).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from kernels import rows
from kernels.lowering import Platform

NAME = "welford"
SHAPE_NAMES = ("rows", "cols")
PARALLEL_DIMS = ("rows",)
TARGETS = ("interpret", "tpu", "gpu-triton")
MEMORY_PARAMS = rows.MEMORY_PARAMS


class Moments(NamedTuple):
    """Per-row count, mean and sum of squared deviations (M2), each (rows, 1) f32."""

    count: jax.Array
    mean: jax.Array
    m2: jax.Array


def _empty(block_rows: int) -> Moments:
    zeros = jnp.zeros((block_rows, 1), jnp.float32)
    return Moments(zeros, zeros, zeros)


def _block(x: jax.Array, cols: jax.Array, valid: jax.Array | None) -> Moments:
    del cols
    if valid is None:
        count = jnp.full((x.shape[0], 1), x.shape[1], jnp.float32)
    else:  # padded columns hold 0; they are left out of the count and of the deviations
        count = jnp.broadcast_to(jnp.sum(valid.astype(jnp.float32), axis=-1, keepdims=True),
                                 (x.shape[0], 1))
    # A block of padding only (a flat window's last chunk may hold none of its row) is `_empty`'s
    # state: count, mean and M2 all 0, not 0 / 0.
    mean = jnp.sum(x, axis=-1, keepdims=True) / jnp.maximum(count, 1.0)
    deviation = x - mean if valid is None else jnp.where(valid, x - mean, 0.0)
    return Moments(count, mean, jnp.sum(deviation * deviation, axis=-1, keepdims=True))


def _merge(a: Moments, b: Moments) -> Moments:
    count = a.count + b.count
    divisor = jnp.maximum(count, 1.0)   # two empty states merge to an empty one
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / divisor)
    return Moments(count, mean, a.m2 + b.m2 + delta * delta * (a.count * b.count / divisor))


def _finish(s: Moments) -> tuple[jax.Array, jax.Array]:
    return s.mean, s.m2 / s.count


def _combine(s: Moments) -> Moments:
    """The moments of spans stacked on the last axis, merged (Chan et al., every span at once)."""
    count = jnp.sum(s.count, axis=-1, keepdims=True)
    mean = jnp.sum(s.count * s.mean, axis=-1, keepdims=True) / jnp.maximum(count, 1.0)
    spread = s.mean - mean
    return Moments(count, mean, jnp.sum(s.m2 + s.count * spread * spread, axis=-1, keepdims=True))


WELFORD = rows.RowReduction(state=Moments, init=_empty, block=_block, merge=_merge, finish=_finish,
                            n_outputs=2, pad=0.0, combine=_combine)
KERNEL = rows.RowKernel(rows.reduction_math(NAME, WELFORD), SHAPE_NAMES)
check_config, footprint, default_config = KERNEL.check_config, KERNEL.footprint, KERNEL.default_config
shape_of = KERNEL.shape_of


def reference(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Row mean and population variance in plain jax.numpy, in float32."""
    x = x.astype(jnp.float32)
    return jnp.mean(x, axis=-1), jnp.var(x, axis=-1)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Rows with random offsets (uniform in [-8, 8]) and spreads (0.5 to 3): normal, never zero."""
    rows, cols = shape
    k_mean, k_scale, k_x = jax.random.split(key, 3)
    mean = jax.random.uniform(k_mean, (rows, 1), jnp.float32, -8.0, 8.0)
    scale = jax.random.uniform(k_scale, (rows, 1), jnp.float32, 0.5, 3.0)
    return (mean + scale * jax.random.normal(k_x, shape, jnp.float32)).astype(dtype),


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: sum, subtract, square, sum per element."""
    return 4 * math.prod(shape)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: x read once, two float32 results per row written."""
    rows, cols = shape
    return rows * cols * jnp.dtype(dtype).itemsize + 2 * rows * 4


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any,
          platform: Platform) -> Callable[..., Any]:
    """The Pallas row statistics for `config` on `platform`: x -> (mean, var), float32 (rows,)."""
    reduce_rows = KERNEL.build(config, shape, dtype, platform)

    def welford(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean, var = reduce_rows(x)
        return mean, var

    return welford
