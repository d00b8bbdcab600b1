"""RMS norm backward: given x, weight and dy of y = x * r * weight, r = 1/sqrt(mean(x^2) + eps),

    dx = r * (dy * weight) - x * r^3 * mean(dy * weight * x)   (over each row)
    dweight = sum over rows of dy * x * r

r is recomputed from x. dweight is a sum across rows: each program writes a float32 partial
sum of its rows, and XLA adds the partials after the call (Triton: one partial per program,
which loops over rows_per_program rows; TPU: one per block of rows; Mosaic GPU: one per block,
which takes rows_per_program rows in turn through shared-memory slots, `kernels.rms_norm_bwd_mgpu`).
Config knobs: those of the row engine (`kernels.rows`) on interpret, tpu and gpu-triton;
Triton's fori_loop takes several blocks of rows a program only unrolled (unroll=1), each chunk's
dweight partial then held in registers (at most 64 float32 a thread: `kernels.rows.config`).
gpu-mosaic: `kernels.rms_norm_bwd_mgpu`'s.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from kernels import rms_norm_bwd_mgpu as mgpu
from kernels import rows
from kernels.lowering import Platform

NAME = "rms_norm_bwd"
SHAPE_NAMES = ("rows", "cols")
PARALLEL_DIMS = ("rows",)  # the weight gradient: a sum over rows
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")
MEMORY_PARAMS = rows.MEMORY_PARAMS
EPS = 1e-6


def _forward(x: jax.Array, weight: jax.Array) -> jax.Array:
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + EPS)
    return x * rstd * weight


def reference(x: jax.Array, weight: jax.Array, dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(dx, dweight): the vector-Jacobian product of the plain jax.numpy RMS norm, in float32."""
    _, vjp = jax.vjp(_forward, x.astype(jnp.float32), weight.astype(jnp.float32))
    dx, dweight = vjp(dy.astype(jnp.float32))
    return dx.astype(x.dtype), dweight.astype(weight.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random x (rows with their own scale), a weight near 1 and a normal dy."""
    k_x, k_scale, k_w, k_dy = jax.random.split(key, 4)
    rows, cols = shape
    x = jnp.exp(jax.random.normal(k_scale, (rows, 1))) * jax.random.normal(k_x, shape)
    weight = 1.0 + 0.2 * jax.random.normal(k_w, (cols,))
    dy = jax.random.normal(k_dy, shape)
    return x.astype(dtype), weight.astype(dtype), dy.astype(dtype)


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: two row sums, dx and the dweight terms."""
    return 10 * math.prod(shape)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: read x, dy and weight, write dx and dweight once."""
    rows, cols = shape
    return (3 * rows * cols + 2 * cols) * jnp.dtype(dtype).itemsize


def _backward_rows(x: jax.Array, dy: jax.Array, weight: jax.Array, *, cols: int,
                   valid: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    del valid  # padded columns read as 0 and add nothing to either sum
    r = jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) / cols + EPS)
    g = dy * weight
    mean_gx = jnp.sum(g * x, axis=-1, keepdims=True) / cols
    return r * g - x * (r * r * r * mean_gx), dy * x * r


def _init(shape: tuple[int, ...]) -> rows.Stats:
    """Sum of x^2 and sum of dy * weight * x over the columns seen so far."""
    return jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)


def _update(stats: rows.Stats, x: jax.Array, dy: jax.Array, weight: jax.Array, *,
            start: jax.Array, valid: jax.Array | None) -> rows.Stats:
    del start, valid
    sum_xx, sum_gx = stats
    return (sum_xx + jnp.sum(x * x, axis=-1, keepdims=True),
            sum_gx + jnp.sum(dy * weight * x, axis=-1, keepdims=True))


def _finish(stats: rows.Stats, cols: int) -> rows.Stats:
    sum_xx, sum_gx = stats
    r = jax.lax.rsqrt(sum_xx / cols + EPS)
    return r, r * r * r * (sum_gx / cols)


def _gradients(row: rows.Stats, x: jax.Array, dy: jax.Array,
               weight: jax.Array) -> tuple[jax.Array, jax.Array]:
    r, r3_mean_gx = row
    return r * dy * weight - x * r3_mean_gx, dy * x * r


def _combine(stats: rows.Stats) -> rows.Stats:
    """The sums of spans stacked on the last axis, for the whole row."""
    return tuple(jnp.sum(s, axis=-1, keepdims=True) for s in stats)


MATH = rows.RowMath(NAME, rows=_backward_rows, init=_init, update=_update, finish=_finish,
                    apply=_gradients, row_inputs=2, col_inputs=1, col_outputs=1, combine=_combine)


KERNEL = rows.RowKernel(MATH, SHAPE_NAMES)
shape_of = KERNEL.shape_of


def check_config(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> str | None:
    """None if `config` can run on `shape` and `target`, else a short reason."""
    if target != mgpu.TARGET:
        return KERNEL.check_config(config, shape, dtype, target)
    try:
        mgpu.plan(config, shape, dtype, NAME)
    except (ValueError, NotImplementedError) as err:
        return str(err)
    return None


def footprint(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
    """On-chip bytes of one program (Mosaic GPU: the slots, the weight and the dweight row)."""
    if target == mgpu.TARGET:
        return mgpu.footprint_bytes(mgpu.plan(config, shape, dtype, NAME), shape[-1], jnp.dtype(dtype).itemsize)
    return KERNEL.footprint(config, shape, dtype, target)


DEFAULT_ROWS_PER_PROGRAM = 64   # Triton one_pass: rows a program takes, keeping the dweight partials few ...
DEFAULT_PROGRAMS = 64           # ... but fewer where that would leave under this many programs


def default_config(shape: tuple[int, ...], target: str) -> dict[str, Any]:
    """A safe config for any shape; on Triton, up to 64 rows per program keep the partials few,
    while a few rows still spread over programs (3 rows in one program ran 51.7 us at 3x5120 on
    the H200, where a program per row runs about 5.6 us)."""
    if target == mgpu.TARGET:
        return mgpu.default_config(shape)
    config = KERNEL.default(shape, target)
    if target == "gpu-triton" and config.strategy == "one_pass":
        spread = max(1, math.prod(shape[:-1]) // DEFAULT_PROGRAMS)
        config = dataclasses.replace(config, rows_per_program=min(DEFAULT_ROWS_PER_PROGRAM,
                                                                  1 << (spread.bit_length() - 1)))
    return config.to_dict(KERNEL.knobs(len(shape), target))


def default_gpu_targets(shape: tuple[int, ...], dtype: Any, targets: tuple[str, ...]) -> tuple[str, ...]:
    """The row engine's order (gpu-triton first for a few long rows), and gpu-triton first too where
    the Mosaic GPU default takes chunks under 512 columns (rows no chunk of 512 divides: 768 or 2304
    columns), which no device has timed yet."""
    if "gpu-triton" in targets and mgpu.default_config(tuple(shape))["block_cols"] < mgpu.FULL_CHUNK:
        return ("gpu-triton", *(t for t in targets if t != "gpu-triton"))
    return KERNEL.default_gpu_targets(shape, dtype, targets)


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
    """The Pallas RMS norm backward for `config` on `platform`: a function of (x, weight, dy)."""
    if platform.target == mgpu.TARGET:
        call = mgpu.build(config, shape, dtype, platform, eps=EPS, name=NAME)
    else:
        call = KERNEL.build(config, shape, dtype, platform)

    def backward(x: jax.Array, weight: jax.Array, dy: jax.Array) -> tuple[jax.Array, jax.Array]:
        return call(x, dy, weight)

    return backward
