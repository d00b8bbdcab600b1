"""The math contract of the row engine: what a row-wise kernel states, once, for every target.

Two ways to state it, one engine behind both:
  `RowMath`       the general form: a formula on whole rows, and the same formula streamed
                  (fold column chunks into per-row statistics, finish them, map each chunk);
  `RowReduction`  a per-row reduction written as a monoid over column blocks (a state, an
                  associative merge with an identity, the per-row results); `reduction_math`
                  turns it into a `RowMath` with per-row results and no row outputs.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

Stats = tuple[jax.Array, ...]


@dataclasses.dataclass(frozen=True)
class LaneFold:
    """Per-lane statistics for a loop over column chunks, reduced once after the loop.

    The chunk-wise fold (`RowMath.update`) reduces every chunk to per-row statistics, a reduction
    across the program's warps per chunk. A lane fold keeps statistics of the chunk's own shape
    (..., width): lane j folds columns j, j + width, ... with elementwise math only, and
    `combine` reduces the lanes to the per-row statistics `RowMath.finish` takes, once per row
    (torch.compile's looped reductions work this way; `fold: lanes` on Triton).

    update(stats, *chunk, start, valid) -> stats: elementwise; stats as `RowMath.init((..., width))`
        makes them; `valid` as in `RowMath.update` (masked-off row inputs read as `pad`).
    combine(stats) -> stats: the lanes (..., width) reduced to (..., 1).
    """

    update: Callable[..., Stats]
    combine: Callable[[Stats], Stats]


@dataclasses.dataclass(frozen=True)
class RowMath:
    """The math of a row-wise kernel, on float32 blocks whose last axis is the columns.

    Operands, in this order everywhere (kernel inputs, math arguments):
      row inputs     tensors shaped like the kernel's shape, e.g. x;
      column inputs  per-column vectors (cols,), e.g. a norm's weight;
      vector inputs  per-row vectors (shape[:-1]), e.g. labels; read as (..., 1) blocks in
                     their own dtype and never cut into column chunks.
    Outputs, in this order: row outputs (shaped like x, the input dtype), column outputs (summed
    over every row, e.g. a weight gradient) and per-row results (float32, shape[:-1]).

    rows(*blocks, cols, valid) -> outputs: the formula on whole rows: (*row outputs,
        *per-element contributions to the column outputs, *per-row results (..., 1)).
    init(shape) -> stats: empty per-row statistics, each of `shape` (..., 1).
    update(stats, *chunk, start, valid) -> stats: fold one column chunk (its first column is
        `start`, a traced int32) into the statistics.
    finish(stats, cols) -> row values: what `apply` needs; the first `results` of them are the
        kernel's per-row results.
    apply(row_values, *chunk) -> outputs: the row outputs and column contributions of a chunk.
    `valid` is None when every column of the block is real, else a (1, width) bool mask;
    masked-off elements of row inputs read as `pad`, of column inputs as 0.
    lanes: the same statistics folded per lane (`LaneFold`), or None when the kernel has none.
    combine(stats) -> stats: the statistics of disjoint spans of a row, stacked on the last axis
        (..., n), reduced to the row's (..., 1); spans that hold nothing are `init`'s values.
        Default: the lane fold's `combine` (lanes are disjoint spans too). With it, a row's
        chunks can be spread over programs (Triton strategy `split_cols`).
    """

    name: str
    rows: Callable[..., tuple[jax.Array, ...]]
    init: Callable[[tuple[int, ...]], Stats]
    update: Callable[..., Stats]
    finish: Callable[[Stats, int], Stats]
    apply: Callable[..., tuple[jax.Array, ...]]
    row_inputs: int = 1
    col_inputs: int = 0
    row_outputs: int = 1
    col_outputs: int = 0
    vector_inputs: int = 0
    results: int = 0
    pad: float = 0.0
    lanes: LaneFold | None = None
    combine: Callable[[Stats], Stats] | None = None

    @property
    def span_combine(self) -> Callable[[Stats], Stats] | None:
        """How the statistics of a row's spans combine (`combine`, else the lanes'), or None."""
        if self.combine is not None:
            return self.combine
        return None if self.lanes is None else self.lanes.combine

    @functools.cached_property
    def n_stats(self) -> int:
        """How many per-row statistics `init` makes."""
        return len(jax.eval_shape(lambda: self.init((1, 1))))

    @property
    def writes_chunks(self) -> bool:
        """Whether a streamed row needs a second walk over its chunks (row or column outputs)."""
        return bool(self.row_outputs or self.col_outputs)

    @property
    def has_vectors(self) -> bool:
        """Whether the kernel reads or writes per-row vectors (their layout is a TPU knob)."""
        return bool(self.vector_inputs or self.results)


@dataclasses.dataclass(frozen=True)
class RowReduction:
    """The math of a per-row reduction, as a monoid over blocks of columns.

    state: the NamedTuple class of the per-row state; each field a (block_rows, 1) f32 array.
    init(block_rows) -> state             the identity of `merge` (merge(init, init) is init).
    block(x, cols, valid, *row_inputs)    the state of one block: x (r, c) f32, cols (1, c)
        int32 global column ids, valid (1, c) bool or None (GPU padding; padded x holds `pad`),
        row_inputs (r, 1) per-row operands such as labels. A block of padding only gives init's
        values, never NaN (a Triton flat window's last chunk may hold none of its row).
    merge(a, b) -> state                  the state of the two blocks together.
    finish(state) -> results              per-row results, each (r, 1) f32.
    combine(state) -> state               states stacked on the last axis (r, n), merged to (r, 1);
        positions that hold nothing are `init`'s values (optional; see `RowMath.combine`).
    """

    state: type
    init: Callable[[int], Stats]
    block: Callable[..., Stats]
    merge: Callable[[Stats, Stats], Stats]
    finish: Callable[[Stats], Stats]
    n_outputs: int
    pad: float = 0.0
    combine: Callable[[Stats], Stats] | None = None


def reduction_math(name: str, reduction: RowReduction, vector_inputs: int = 0) -> RowMath:
    """The `RowMath` of a reduction: x and `vector_inputs` per-row operands in, per-row results out.

    The engine's blocks may carry leading axes (batch, rows); the reduction sees them flattened
    to (rows, cols), as its contract states."""

    def block_state(x: jax.Array, vectors: tuple[jax.Array, ...], start: jax.Array | int,
                    valid: jax.Array | None) -> Stats:
        lead = x.shape[:-1]
        ids = start + lax.broadcasted_iota(jnp.int32, (1, x.shape[-1]), 1)
        state = reduction.block(x.reshape(-1, x.shape[-1]), ids, valid,
                                *(v.reshape(-1, 1) for v in vectors))
        return tuple(s.reshape(*lead, 1) for s in state)

    def rows(x: jax.Array, *vectors: jax.Array, cols: int, valid: jax.Array | None) -> Stats:
        del cols
        return finish(block_state(x, vectors, 0, valid), x.shape[-1])

    def init(shape: tuple[int, ...]) -> Stats:
        # The reduction's identity is per row (r, 1); lanes or spans (..., n) repeat it.
        return tuple(jnp.broadcast_to(s.reshape(*shape[:-1], 1), shape)
                     for s in reduction.init(math.prod(shape[:-1])))

    def update(stats: Stats, x: jax.Array, *vectors: jax.Array, start: jax.Array,
               valid: jax.Array | None) -> Stats:
        here = block_state(x, vectors, start, valid)
        return tuple(reduction.merge(reduction.state(*stats), reduction.state(*here)))

    def finish(stats: Stats, cols: int) -> Stats:
        del cols
        return tuple(reduction.finish(reduction.state(*stats)))

    def apply(row_values: Stats, *chunk: jax.Array) -> tuple[jax.Array, ...]:
        del row_values, chunk
        return ()

    def combine(stats: Stats) -> Stats:
        lead, n = stats[0].shape[:-1], stats[0].shape[-1]
        merged = reduction.combine(reduction.state(*(s.reshape(-1, n) for s in stats)))
        return tuple(s.reshape(*lead, 1) for s in merged)

    return RowMath(name, rows=rows, init=init, update=update, finish=finish, apply=apply,
                   row_outputs=0, vector_inputs=vector_inputs, results=reduction.n_outputs,
                   pad=reduction.pad, combine=None if reduction.combine is None else combine)


@dataclasses.dataclass(frozen=True)
class Walk:
    """One walk over a row staged whole in on-chip memory, folding it into one per-row statistic.

    fold(acc, x, stats, valid) -> acc: elementwise on a chunk x (f32); acc (an array, or a tuple
        of them) starts as `identity` (a float, or a tuple of them);
        stats are the finished statistics of the walks before this one; valid is None for a
        chunk wholly inside the row, else a bool mask of its positions that are (positions
        outside read as `StagedMath.pad`).
    across(acc) -> the lanes reduced to the walk's value (jnp.sum or jnp.max; a tuple for a tuple).
    finish(value, stats, cols) -> the statistic that later walks and `apply` see (default: value).
    rewrite(x, stats) -> x': when given, each chunk is replaced in place (in the input dtype)
        before it is folded: softmax stores exp(x - max) once and only scales it afterwards.
    stored_dtype: fold the chunk in the input dtype, not float32 (exact for a max, and it saves
        a conversion of every element: packed bf16 instructions).
    combine(a, b) -> value: the values (after `across`, before `finish`) of two disjoint spans of
        a row combined (a sum: their sum). When every walk of a kernel without `merge` has one, a
        row can be split over the blocks of a cluster: they exchange each walk's value, combine
        them and finish it for the whole row.
    """

    fold: Callable[..., Any]
    across: Callable[[Any], Any]
    identity: float | tuple[float, ...]
    finish: Callable[..., jax.Array] | None = None
    rewrite: Callable[..., jax.Array] | None = None
    stored_dtype: bool = False
    combine: Callable[[Any, Any], Any] | None = None

    @property
    def width(self) -> int:
        """How many floats the walk's value holds (one per element of `identity`)."""
        return len(self.identity) if isinstance(self.identity, tuple) else 1


@dataclasses.dataclass(frozen=True)
class StagedMath:
    """The math of a row kernel whose rows are staged whole on chip (Mosaic GPU's `smem_row`):
    walks over the staged row (each reads on-chip memory, none HBM), then either the row mapped
    in place and written out (`apply`), or one per-row result (`result`).

    apply(x, stats, *cols) -> y: a chunk of the output row (f32) from the chunk x (f32), the
        walks' statistics and the column inputs' chunks (f32; e.g. a norm's weight and bias).
    result(stats, pick, *vectors, cols) -> the row's float32 result; pick(i) reads the row's
        column i (a traced int32 in [0, cols)), vectors are the per-row inputs' values (a label).
    pad: what positions outside the row hold during the walks.
    shift: the walks see the row's first element as stats[0] (a shift that keeps one-walk moments
        accurate: sums of x - x[0] and of its squares cancel little however far the row is from 0).
    merge(a, b) -> stats: the statistics of two disjoint spans of a row combined. With it, rows
        longer than shared memory stream through it: kernels with a `result` in pieces (strategy
        smem_pieces), each piece walked and merged into the row's statistics, `pick` then reading
        global memory; kernels with `apply` as a staged head and a tail streamed twice (strategy
        smem_split: walked for statistics, then mapped and written).
    rebase(span, row) -> stats: what `apply` needs for a span whose walks rewrote it in place
        (`Walk.rewrite`) with the span's own statistics `span`, given the row's merged `row`
        (softmax: exp(x - max_span) staged, scaled by exp(max_span - max_row) / sum_row).
        Needed with merge and apply when a walk rewrites.
    """

    name: str
    walks: tuple[Walk, ...]
    apply: Callable[..., jax.Array] | None = None
    result: Callable[..., jax.Array] | None = None
    col_inputs: int = 0
    vector_inputs: int = 0
    pad: float = 0.0
    shift: bool = False
    merge: Callable[[Any, Any], Any] | None = None
    rebase: Callable[[Any, Any], Any] | None = None

    def __post_init__(self) -> None:
        if (self.apply is None) == (self.result is None):
            raise ValueError(f"{self.name}: a staged row kernel has exactly one of apply and result")
        rewrites = any(walk.rewrite is not None for walk in self.walks)
        if self.merge is not None and self.apply is not None and rewrites and self.rebase is None:
            raise ValueError(f"{self.name}: a walk rewrites the staged row, so merging spans for apply "
                             "needs rebase")
        if self.rebase is not None and (self.merge is None or self.apply is None):
            raise ValueError(f"{self.name}: rebase serves apply over merged spans; it needs merge and apply")

    @property
    def combines(self) -> bool:
        """Whether every walk's value combines over spans of a row (`Walk.combine`), and the
        kernel has no `merge`: a cluster's blocks then exchange each walk's value."""
        return self.merge is None and all(walk.combine is not None for walk in self.walks)

    @property
    def splits(self) -> bool:
        """Whether a row can be split over the blocks of a cluster: statistics that merge (no
        column inputs or shift), or walks that combine."""
        return (self.merge is not None and not self.col_inputs and not self.shift) or self.combines

    @property
    def exchanged(self) -> int:
        """Floats each block of a cluster exchanges per row: every walk's value (combine) or
        finished statistic (merge), each as wide as the walk's identity."""
        return sum(walk.width for walk in self.walks)


# The row's max, folded in the input dtype (exact) and kept as float32: softmax's and cross
# entropy's first walk.
ROW_MAX = Walk(fold=lambda acc, x, stats, valid: jnp.maximum(acc, x), across=jnp.max, identity=-math.inf,
               finish=lambda value, stats, cols: value.astype(jnp.float32), stored_dtype=True)
