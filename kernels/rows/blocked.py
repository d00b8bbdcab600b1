"""The row engine on TPU and in interpret mode: blocks through BlockSpecs, the math on VMEM values.

Arrays arrive as (batch, rows, cols) row tensors, (1, 1, cols) column vectors, per-row vectors
as (batch, rows, 1) "column" arrays or lane-dense (rows,) arrays, and column outputs as float32
(partials, 1, cols) sums that the caller adds up.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.lowering import Platform, pallas_call
from kernels.rows.config import LANES, Plan
from kernels.rows.contract import RowMath, Stats
from kernels.rows.footprint import footprint
from kernels.tpu_mesh import tpu_generation, vmem_limit

F32 = jnp.float32


def split_refs(refs: tuple[Any, ...], math_: RowMath) -> tuple[list[Any], ...]:
    """(row inputs, column inputs, vector inputs, row outputs, column outputs, results, scratch)."""
    counts = (math_.row_inputs, math_.col_inputs, math_.vector_inputs, math_.row_outputs,
              math_.col_outputs, math_.results)
    groups, start = [], 0
    for count in counts:
        groups.append(list(refs[start:start + count]))
        start += count
    groups.append(list(refs[start:]))
    return tuple(groups)


def real_rows(p: Plan, row_block: jax.Array) -> jax.Array | None:
    """Which rows of block `row_block` are the shape's, (1, block_rows, 1) bools; None where no
    rows were padded (`Plan.pad_rows`). Padded rows must add nothing to a column output's sum;
    unused (and traced away) where the math has none."""
    if not p.pad_rows:
        return None
    first = row_block * p.block_rows
    return first + lax.broadcasted_iota(jnp.int32, (1, p.block_rows, 1), 1) < p.rows - p.pad_rows


def real_cols(p: Plan, start: jax.Array) -> jax.Array | None:
    """Which columns of the chunk starting at `start` are the shape's, (1, block_cols) bools; None
    where no columns were padded (`Plan.pad_cols`): the folds' `valid`."""
    if not p.pad_cols:
        return None
    return start + lax.broadcasted_iota(jnp.int32, (1, p.block_cols), 1) < p.row_cols


def _store(row_out: list[Any], col_out: list[Any], results: tuple[jax.Array, ...],
           cols: Any, vector_cols: Any = None, real: jax.Array | None = None) -> None:
    """Write one chunk's outputs; column contributions are summed over the block's rows (those
    `real` marks, when given)."""
    n_rows = len(row_out)
    if len(results) != n_rows + len(col_out):
        raise ValueError(f"the math returned {len(results)} outputs, expected "
                         f"{n_rows + len(col_out)}")
    for ref, value in zip(row_out, results[:n_rows]):
        ref[:, :, cols] = value.astype(ref.dtype)
    vector_cols = cols if vector_cols is None else vector_cols
    for ref, value in zip(col_out, results[n_rows:]):
        if real is not None:
            value = jnp.where(real, value, 0.0)
        ref[:, :, vector_cols] = jnp.sum(value, axis=(0, 1), keepdims=True)


def _read(refs: list[Any], cols: Any = slice(None)) -> list[jax.Array]:
    return [ref[:, :, cols].astype(F32) for ref in refs]


# Mosaic TPU moves per-row values between a column and lanes (a lane-dense (rows,) block) by a
# sublane gather, which TPUs before v5 lack ("Sublane gather not supported by this TPU
# generation", libtpu compiling for v4 without a chip). A transpose of the values broadcast over
# 128 lanes does the same on every generation; it is used where the gather is missing.
SUBLANE_GATHER_SINCE = 5


def _lanes_by_transpose(p: Plan) -> bool:
    return p.lane and tpu_generation() < SUBLANE_GATHER_SINCE


def _in_32_bits(x: jax.Array) -> jax.Array:
    return x.astype(F32) if jnp.dtype(x.dtype).itemsize < 4 else x


def _column_of(lanes: jax.Array) -> jax.Array:
    """(n,) -> (n, 1) by a transpose, in 32 bits."""
    wide = _in_32_bits(lanes)[None, :]
    return jnp.broadcast_to(wide, (LANES, lanes.shape[0])).T[:, :1].astype(lanes.dtype)


def _lanes_of(column: jax.Array) -> jax.Array:
    """(n, 1) -> (n,) by a transpose, in 32 bits."""
    return jnp.broadcast_to(_in_32_bits(column), (column.shape[0], LANES)).T[0].astype(column.dtype)


def _read_vectors(refs: list[Any], p: Plan) -> list[jax.Array]:
    """Per-row inputs as (block_batch, block_rows, 1) values, in their own dtype."""
    if _lanes_by_transpose(p):
        return [_column_of(ref[...]).reshape(p.block_batch, p.block_rows, 1) for ref in refs]
    return [ref[...].reshape(p.block_batch, p.block_rows, 1) for ref in refs]


def _write_results(refs: list[Any], values: Stats, p: Plan) -> None:
    for ref, value in zip(refs, values, strict=True):
        if _lanes_by_transpose(p):
            value = _lanes_of(value.reshape(p.block_rows, 1))
        ref[...] = value.reshape(ref.shape).astype(ref.dtype)


def _load_stats(refs: list[Any]) -> Stats:
    return tuple(ref[...] for ref in refs)


def _save_stats(refs: list[Any], stats: Stats) -> None:
    for ref, value in zip(refs, stats, strict=True):
        ref[...] = value


def _whole_rows_body(*refs: Any, math_: RowMath, p: Plan) -> None:
    row_in, col_in, vec_in, row_out, col_out, res_out, _ = split_refs(refs, math_)
    vectors = _read_vectors(vec_in, p)
    real = real_rows(p, pl.program_id(1))
    if p.strategy == "one_pass":
        outs = math_.rows(*_read(row_in + col_in), *vectors, cols=p.row_cols, valid=None)
        n = len(row_out) + len(col_out)
        _store(row_out, col_out, outs[:n], slice(None), real=real)
        _write_results(res_out, outs[n:], p)
        return

    def chunk(j: jax.Array) -> Any:
        return pl.ds(pl.multiple_of(j * p.block_cols, p.block_cols), p.block_cols)

    def fold(j: jax.Array, stats: Stats) -> Stats:
        return math_.update(stats, *_read(row_in + col_in, chunk(j)), *vectors,
                            start=j * p.block_cols, valid=real_cols(p, j * p.block_cols))

    stats = lax.fori_loop(0, p.col_blocks, fold, math_.init((p.block_batch, p.block_rows, 1)))
    row_values = math_.finish(stats, p.row_cols)
    _write_results(res_out, row_values[:math_.results], p)
    if not math_.writes_chunks:
        return

    def write(j: jax.Array, carry: int) -> int:
        _store(row_out, col_out,
               math_.apply(row_values, *_read(row_in + col_in, chunk(j)), *vectors), chunk(j), real=real)
        return carry

    lax.fori_loop(0, p.col_blocks, write, 0)


def _grid_body(*refs: Any, math_: RowMath, p: Plan) -> None:
    row_in, col_in, vec_in, row_out, col_out, res_out, stats_refs = split_refs(refs, math_)
    phase, j = pl.program_id(2), pl.program_id(3)
    last_phase = 1 if math_.writes_chunks else 0

    @pl.when((phase == 0) & (j == 0))
    def _init():
        _save_stats(stats_refs, math_.init((p.block_batch, p.block_rows, 1)))

    @pl.when(phase == 0)
    def _fold():
        _save_stats(stats_refs, math_.update(_load_stats(stats_refs), *_read(row_in + col_in),
                                             *_read_vectors(vec_in, p), start=j * p.block_cols,
                                             valid=real_cols(p, j * p.block_cols)))

    if math_.results:
        @pl.when((phase == last_phase) & (j == p.col_blocks - 1))
        def _results():
            _write_results(res_out, math_.finish(_load_stats(stats_refs), p.row_cols)[:math_.results], p)

    if math_.writes_chunks:
        @pl.when(phase == 1)
        def _write():
            row_values = math_.finish(_load_stats(stats_refs), p.row_cols)
            _store(row_out, col_out, math_.apply(row_values, *_read(row_in + col_in),
                                                 *_read_vectors(vec_in, p)), slice(None),
                   real=real_rows(p, pl.program_id(1)))


def _pipeline_body(*refs: Any, math_: RowMath, p: Plan) -> None:
    from jax.experimental.pallas import tpu as pltpu

    row_in, col_in, vec_in, row_out, col_out, res_out, stats_refs = split_refs(refs, math_)
    bb, br, bc = p.block_batch, p.block_rows, p.block_cols
    vectors = _read_vectors(vec_in, p)
    real = real_rows(p, pl.program_id(1))  # the kernel's grid, not the pipeline's
    # A static start where one block spans the axis: Mosaic TPU refuses a traced start it cannot
    # prove tile-aligned (3 or 77 rows of bf16 are not whole (16, 128) tiles).
    window = tuple(pl.ds(0 if size == block else pl.multiple_of(pl.program_id(axis) * block, block), block)
                   for axis, (size, block) in enumerate(((p.batch, bb), (p.rows, br))))
    row_in = [ref.at[window] for ref in row_in]
    row_out = [ref.at[window] for ref in row_out]
    in_mode = None if p.buffers == 2 else pl.Buffered(p.buffers)
    out_mode = None if p.buffers >= 2 else pl.Buffered(1)
    in_specs = ([pl.BlockSpec((bb, br, bc), lambda j: (0, 0, j), pipeline_mode=in_mode)]
                * len(row_in)
                + [pl.BlockSpec((1, 1, bc), lambda j: (0, 0, j), pipeline_mode=in_mode)]
                * len(col_in))
    out_specs = [pl.BlockSpec((bb, br, bc), lambda j: (0, 0, j), pipeline_mode=out_mode)]
    out_specs *= len(row_out)
    n_in = len(in_specs)

    _save_stats(stats_refs, math_.init((bb, br, 1)))

    # program_id inside emit_pipeline is the pipeline's own step.
    def fold(*chunk_refs: Any) -> None:
        start = pl.program_id(0) * bc
        _save_stats(stats_refs, math_.update(_load_stats(stats_refs), *_read(list(chunk_refs)),
                                             *vectors, start=start, valid=real_cols(p, start)))

    def write(*chunk_refs: Any) -> None:
        row_values = math_.finish(_load_stats(stats_refs), p.row_cols)
        results = math_.apply(row_values, *_read(list(chunk_refs[:n_in])), *vectors)
        # Row outputs are the pipeline's chunks; column outputs are whole VMEM blocks, written
        # at the pipeline's step.
        step = pl.ds(pl.multiple_of(pl.program_id(0) * bc, bc), bc)
        _store(list(chunk_refs[n_in:]), col_out, results, slice(None), step, real)

    pltpu.emit_pipeline(fold, grid=(p.col_blocks,), in_specs=in_specs)(*row_in, *col_in)
    if math_.results:
        _write_results(res_out, math_.finish(_load_stats(stats_refs), p.row_cols)[:math_.results], p)
    if math_.writes_chunks:
        pltpu.emit_pipeline(write, grid=(p.col_blocks,), in_specs=in_specs,
                            out_specs=out_specs)(*row_in, *col_in, *row_out)


def vector_layout(p: Plan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(array shape, block shape) of a per-row vector: lane-dense (rows,) or (batch, rows, 1)."""
    if p.lane:
        return (p.rows,), (p.block_rows,)
    return (p.batch, p.rows, 1), (p.block_batch, p.block_rows, 1)


def build_blocked(math_: RowMath, p: Plan, dtype: Any, platform: Platform) -> Callable[..., Any]:
    """The pallas_call of `math_` for a TPU or interpret plan: a function of the engine's arrays."""
    from jax.experimental.pallas import tpu as pltpu

    bb, br, bc, C = p.block_batch, p.block_rows, p.block_cols, p.cols
    n_batch, n_rows = p.batch // bb, p.row_blocks
    tpu = platform.target == "tpu"
    mode = None if (not tpu or p.buffers == 2) else pl.Buffered(p.buffers)
    vec_array, vec_block = vector_layout(p)
    out_shape = tuple(
        [jax.ShapeDtypeStruct((p.batch, p.rows, C), dtype)] * math_.row_outputs
        + [jax.ShapeDtypeStruct((p.partials, 1, C), F32)] * math_.col_outputs
        + [jax.ShapeDtypeStruct(vec_array, F32)] * math_.results)
    stats_scratch = [pltpu.VMEM((bb, br, 1), F32)] * math_.n_stats
    scratch: list[Any] = []
    if p.strategy == "grid":
        phases = 2 if math_.writes_chunks else 1
        grid = (n_batch, n_rows, phases, p.col_blocks)
        row_in = pl.BlockSpec((bb, br, bc), lambda b, i, ph, j: (b, i, j), pipeline_mode=mode)
        # Outputs stay on block 0 while phase 0 folds statistics; phase 1 fills every block.
        row_out = pl.BlockSpec((bb, br, bc), lambda b, i, ph, j: (b, i, j * ph),
                               pipeline_mode=mode)
        vector = pl.BlockSpec((1, 1, bc), lambda b, i, ph, j: (0, 0, j), pipeline_mode=mode)
        partial = pl.BlockSpec((1, 1, bc), lambda b, i, ph, j: (b * n_rows + i, 0, j * ph),
                               pipeline_mode=mode)
        per_row = pl.BlockSpec(vec_block, (lambda b, i, ph, j: (i,)) if p.lane
                               else (lambda b, i, ph, j: (b, i, 0)))
        body = functools.partial(_grid_body, math_=math_, p=p)
        scratch = stats_scratch
        semantics = ("parallel", "parallel", "arbitrary", "arbitrary")
    else:
        grid = (n_batch, n_rows)
        if p.strategy == "emit_pipeline":
            row_in = row_out = vector = pl.BlockSpec(memory_space=pl.ANY)
            body = functools.partial(_pipeline_body, math_=math_, p=p)
            scratch = stats_scratch
        else:
            row_in = row_out = pl.BlockSpec((bb, br, C), lambda b, i: (b, i, 0), pipeline_mode=mode)
            vector = pl.BlockSpec((1, 1, C), lambda b, i: (0, 0, 0))
            body = functools.partial(_whole_rows_body, math_=math_, p=p)
        partial = pl.BlockSpec((1, 1, C), lambda b, i: (b * n_rows + i, 0, 0))
        per_row = pl.BlockSpec(vec_block, (lambda b, i: (i,)) if p.lane else (lambda b, i: (b, i, 0)))
        semantics = ("parallel", "parallel")
    in_specs = ([row_in] * math_.row_inputs + [vector] * math_.col_inputs
                + [per_row] * math_.vector_inputs)
    out_specs = ([row_out] * math_.row_outputs + [partial] * math_.col_outputs
                 + [per_row] * math_.results)
    tpu_params = None
    if tpu:
        tpu_params = {"dimension_semantics": semantics,
                      "vmem_limit_bytes": vmem_limit(footprint(math_, p, dtype))}
    return pallas_call(body, platform=platform, config={}, out_shape=out_shape, grid=grid,
                       in_specs=in_specs, out_specs=tuple(out_specs), scratch_shapes=scratch,
                       tpu_params=tpu_params, name=math_.name)
