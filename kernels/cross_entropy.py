"""Cross-entropy per row: loss[i] = logsumexp(x[i, :]) - x[i, labels[i]].

The result is the loss of every row (no reduction), float32 of shape (rows,): a mean, a
masked mean or a weighted sum is one cheap XLA reduction over `rows` numbers afterwards, and
the kernel needs no cross-program reduction. Labels are int32 class indices in [0, vocab);
they are trusted (an out-of-range label picks no logit, giving loss = logsumexp(x[i])).

Rows are reduced with an online logsumexp over column blocks: each block contributes its
max m_b, sum_b exp(x - m_b) and the label's logit if it holds the label column; blocks merge as
  m = max(m_a, m_b),  s = s_a exp(m_a - m) + s_b exp(m_b - m),  picked = picked_a + picked_b.
The walk over columns (one block, a loop, a grid axis or emit_pipeline) is the `strategy`
knob of the row engine (`kernels.rows`, which documents every knob and shape rule). On Mosaic
GPU (strategy smem_row, `kernels.rows.mosaic`) each row is staged once in shared memory and
walked twice there (max, then the sum of exp(x - max)); the label's logit is one load. Rows
longer than shared memory stream through it in pieces (smem_pieces), each piece's logsumexp
merged into the row's.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from kernels import rows
from kernels.lowering import Platform
from kernels.rows import mosaic as mosaic_rows

NAME = "cross_entropy"
SHAPE_NAMES = ("rows", "vocab")
PARALLEL_DIMS = ("rows",)
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")
MEMORY_PARAMS = rows.MEMORY_PARAMS


class LogSumExp(NamedTuple):
    """Per-row running max, sum of exp(x - max) and the label's logit, each (rows, 1) f32."""

    max: jax.Array
    sum: jax.Array
    picked: jax.Array


def _empty(block_rows: int) -> LogSumExp:
    zeros = jnp.zeros((block_rows, 1), jnp.float32)
    return LogSumExp(jnp.full((block_rows, 1), -jnp.inf, jnp.float32), zeros, zeros)


def _block(x: jax.Array, cols: jax.Array, valid: jax.Array | None, labels: jax.Array) -> LogSumExp:
    del valid  # padded columns hold -inf: exp gives 0 and no label points at them
    m = jnp.max(x, axis=-1, keepdims=True)
    # A block of padding only (a flat window's last chunk may hold none of its row) is `_empty`'s
    # state: max -inf, sum 0, not exp(-inf - -inf) = NaN.
    return LogSumExp(m, jnp.sum(jnp.exp(x - _finite(m)), axis=-1, keepdims=True),
                     jnp.sum(jnp.where(cols == labels, x, 0.0), axis=-1, keepdims=True))


def _merge(a: LogSumExp, b: LogSumExp) -> LogSumExp:
    m = jnp.maximum(a.max, b.max)
    shift = _finite(m)   # two empty states merge to an empty one
    return LogSumExp(m, a.sum * jnp.exp(a.max - shift) + b.sum * jnp.exp(b.max - shift), a.picked + b.picked)


def _finish(s: LogSumExp) -> tuple[jax.Array]:
    return (s.max + jnp.log(s.sum) - s.picked,)


def _combine(s: LogSumExp) -> LogSumExp:
    """The states of spans stacked on the last axis, merged (a span of -inf only adds nothing)."""
    m = jnp.max(s.max, axis=-1, keepdims=True)
    return LogSumExp(m, jnp.sum(s.sum * jnp.exp(s.max - _finite(m)), axis=-1, keepdims=True),
                     jnp.sum(s.picked, axis=-1, keepdims=True))


CROSS_ENTROPY = rows.RowReduction(state=LogSumExp, init=_empty, block=_block, merge=_merge,
                                  finish=_finish, n_outputs=1, pad=-math.inf, combine=_combine)


def _staged_loss(stats: rows.Stats, pick: Callable[[jax.Array], jax.Array], label: jax.Array, *,
                 cols: int) -> jax.Array:
    """logsumexp - the label's logit; an out-of-range label picks none, as on other targets."""
    inside = (label >= 0) & (label < cols)
    return stats[1] - jnp.where(inside, pick(jnp.clip(label, 0, cols - 1)), 0.0)


def _finite(m: jax.Array) -> jax.Array:
    """A span's max as the shift of its exponentials: 0 for a span of -inf only (a piece of
    masked logits sums to 0, its logsumexp -inf, instead of exp(-inf - -inf) = NaN)."""
    return jnp.where(m == -jnp.inf, 0.0, m)


def _merge_logsumexp(a: rows.Stats, b: rows.Stats) -> rows.Stats:
    """(max, logsumexp) of two spans of a row, combined. Two spans of -inf only (masked logits)
    merge to -inf, not to exp(-inf - -inf) = NaN."""
    hi = _finite(jnp.maximum(a[1], b[1]))
    return jnp.maximum(a[0], b[0]), hi + jnp.log(jnp.exp(a[1] - hi) + jnp.exp(b[1] - hi))


STAGED = rows.StagedMath(
    NAME, pad=-math.inf, vector_inputs=1, merge=_merge_logsumexp,
    walks=(rows.ROW_MAX,
           rows.Walk(fold=lambda acc, x, stats, valid: acc + jnp.exp(x - _finite(stats[0])), across=jnp.sum,
                     identity=0.0, finish=lambda total, stats, cols: _finite(stats[0]) + jnp.log(total))),
    result=_staged_loss)
KERNEL = rows.RowKernel(rows.reduction_math(NAME, CROSS_ENTROPY, vector_inputs=1), SHAPE_NAMES)
shape_of = KERNEL.shape_of
# Mosaic GPU's staged rows on gpu-mosaic, the row engine's strategies on every other target.
check_config, footprint, default_config, _build = mosaic_rows.protocol(KERNEL, STAGED)
default_gpu_targets = KERNEL.default_gpu_targets


def reference(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-row loss in plain jax.numpy, in float32."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]
    return jax.nn.logsumexp(logits, axis=-1) - picked


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random logits (normal, scale 3) and labels uniform over [0, vocab), int32."""
    rows, vocab = shape
    k_x, k_label = jax.random.split(key)
    logits = (3.0 * jax.random.normal(k_x, shape, jnp.float32)).astype(dtype)
    return logits, jax.random.randint(k_label, (rows,), 0, vocab, jnp.int32)


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: max, subtract, exp, sum, compare, select per logit."""
    return 6 * math.prod(shape)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: logits read once, int32 labels read, f32 loss written."""
    rows, vocab = shape
    return rows * vocab * jnp.dtype(dtype).itemsize + rows * 4 + rows * 4


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any,
          platform: Platform) -> Callable[..., Any]:
    """The Pallas cross-entropy for `config` on `platform`: (logits, labels) -> loss, f32 (rows,)."""
    reduce_rows = _build(config, shape, dtype, platform)

    def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
        return reduce_rows(logits, labels.astype(jnp.int32))

    return cross_entropy
