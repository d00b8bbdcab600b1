"""Row softmax: y[i, :] = exp(x[i, :] - max(x[i, :])) / sum(exp(x[i, :] - max(x[i, :]))).

Config knobs: those of the row engine (`kernels.rows`, which documents them once). one_pass
holds whole rows (Triton: padded to a power of two and masked, so any row length works);
fori_loop, emit_pipeline and grid walk column blocks with an online max and sum (the sum is
rescaled whenever the max grows), then normalize. On Mosaic GPU (`kernels.rows.mosaic`,
strategy smem_row) each row is staged once in shared memory: one HBM read and one write; its
walks take the max, then store exp(x - max) in place while summing it, and the map scales.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from kernels import rows
from kernels.rows import mosaic as mosaic_rows

NAME = "softmax"
SHAPE_NAMES = ("rows", "cols")
PARALLEL_DIMS = ("rows",)
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")
MEMORY_PARAMS = rows.MEMORY_PARAMS


def reference(x: jax.Array) -> jax.Array:
    """Softmax over the last axis in plain jax.numpy, computed in float32."""
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random logits of the given shape (normal, scale 3, never all zeros)."""
    return (3.0 * jax.random.normal(key, shape, jnp.float32)).astype(dtype),


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: max, subtract, exp, sum, divide per element."""
    return 5 * math.prod(shape)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: read x once, write y once."""
    return 2 * math.prod(shape) * jnp.dtype(dtype).itemsize


def _softmax_rows(x: jax.Array, *, cols: int, valid: jax.Array | None) -> tuple[jax.Array]:
    del cols, valid  # padded columns read as -inf and drop out of max and sum
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return (e / jnp.sum(e, axis=-1, keepdims=True),)


def _init(shape: tuple[int, ...]) -> rows.Stats:
    return jnp.full(shape, -jnp.inf, jnp.float32), jnp.zeros(shape, jnp.float32)


def _update(stats: rows.Stats, x: jax.Array, *, start: jax.Array,
            valid: jax.Array | None) -> rows.Stats:
    """Online softmax: the running max m and the sum s of exp(x - m), rescaled as m grows."""
    del start, valid
    m, s = stats
    m_new = jnp.maximum(m, jnp.max(x, axis=-1, keepdims=True))
    s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(x - m_new), axis=-1, keepdims=True)
    return m_new, s


def _finish(stats: rows.Stats, cols: int) -> rows.Stats:
    del cols
    m, s = stats
    return m, 1.0 / s


def _normalize(row: rows.Stats, x: jax.Array) -> tuple[jax.Array]:
    m, inv_l = row
    return (jnp.exp(x - m) * inv_l,)


def _blocked_body(x_ref, o_ref) -> None:
    """A block of whole rows in one pass (for test kernels that reuse softmax's body)."""
    x = x_ref[...].astype(jnp.float32)
    o_ref[...] = _softmax_rows(x, cols=x.shape[-1], valid=None)[0].astype(o_ref.dtype)


def finite_shift(m: jax.Array) -> jax.Array:
    """A span's max as the shift of its exponentials: 0 for a span of -inf only (which then
    sums to 0 and merges as nothing, instead of exp(-inf - -inf) = NaN)."""
    return jnp.where(m == -jnp.inf, 0.0, m)


def _combine(stats: rows.Stats) -> rows.Stats:
    """(max, sum of exp(x - max)) of spans stacked on the last axis, for the whole row."""
    m, s = stats
    top = jnp.max(m, axis=-1, keepdims=True)
    return top, jnp.sum(s * jnp.exp(m - finite_shift(top)), axis=-1, keepdims=True)


MATH = rows.RowMath(NAME, rows=_softmax_rows, init=_init, update=_update, finish=_finish,
                    apply=_normalize, pad=-jnp.inf, combine=_combine)


def merge_spans(a: rows.Stats, b: rows.Stats) -> rows.Stats:
    """(max, 1 / sum of exp(x - max)) of two spans of a row, combined."""
    m = jnp.maximum(a[0], b[0])
    shift = finite_shift(m)
    return m, 1.0 / (jnp.exp(a[0] - shift) / a[1] + jnp.exp(b[0] - shift) / b[1])


def _rebase(span: rows.Stats, row: rows.Stats) -> rows.Stats:
    """The scale of a span staged as exp(x - its own max), for the row's max and sum."""
    return row[0], row[1] * jnp.exp(finite_shift(span[0]) - finite_shift(row[0]))


# Staged rows (Mosaic GPU): the max, then exp(x - max) stored in place and summed; the map
# scales it. Rows longer than shared memory: a staged head and a streamed tail, merged.
STAGED = rows.StagedMath(
    NAME, pad=-jnp.inf, merge=merge_spans, rebase=_rebase,
    walks=(rows.ROW_MAX,
           rows.Walk(fold=lambda acc, e, stats, valid: acc + e, across=jnp.sum, identity=0.0,
                     rewrite=lambda x, stats: jnp.exp(x - finite_shift(stats[0])),
                     finish=lambda total, stats, cols: 1.0 / total)),
    apply=lambda e, stats: e * stats[1])


KERNEL = rows.RowKernel(MATH, SHAPE_NAMES, hint="; use batch_softmax for 3-D shapes")
shape_of = KERNEL.shape_of
# Mosaic GPU's staged rows on gpu-mosaic, the row engine's strategies on every other target.
check_config, footprint, default_config, build = mosaic_rows.protocol(KERNEL, STAGED)
default_gpu_targets = KERNEL.default_gpu_targets
