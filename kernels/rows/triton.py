"""The row engine on Triton: whole refs in global memory, masked loads of power-of-two tiles.

Arrays arrive as (batch, rows, cols) row tensors, (1, cols) column vectors, (batch, rows)
per-row vectors and results, and column outputs as float32 (partials, cols) sums. The grid is
(row programs, batch): the rows axis first, as CUDA allows 2**31 - 1 programs there and 65535
on the others. Per-row reductions over rows of an odd byte width read the tensor flattened,
through 16-byte-aligned windows (`flat_rows`), so that their loads are whole vectors.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.lowering import Platform, pallas_call
from kernels.rows.blocked import split_refs
from kernels.rows.config import Plan
from kernels.rows.contract import RowMath, Stats

F32 = jnp.float32


def _and(a: jax.Array | None, b: jax.Array | None) -> jax.Array | None:
    """The conjunction of two optional masks (None: everything valid)."""
    if a is None or b is None:
        return b if a is None else a
    return a & b


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Where one chunk of a block of rows lies: its window of the row refs, the store mask, the
    column mask, the column of the window's first element (negative for a flat window that
    starts before its row), the flat window's in-array mask (None otherwise) and the chunk's
    first column."""

    window: Any
    mask: jax.Array | None
    col_valid: jax.Array | None
    first: Any
    in_array: jax.Array | None
    c0: Any


# A vector load moves 16 bytes; Triton issues one only from an address it knows is aligned.
VECTOR_BYTES = 16


def flat_rows(math_: RowMath, p: Plan, itemsize: int) -> bool:
    """Whether the plan reads rows through 16-byte-aligned windows of the flattened tensor.

    A row of C elements starts at element r * C. When C * itemsize is not a multiple of 16
    (odd vocabularies such as 50257), Triton cannot prove any row start after the first
    aligned and loads element by element. A flat window starts at r * C rounded down to 16
    bytes instead, so its loads are whole vectors; the up to 15 bytes of the neighbouring rows
    it covers are masked in registers. Measured on the H200 (bench/results/h200/rows_probe/):
    cross entropy at 8192x50257 went from 400 to 342-360 us (8192x50256, aligned: 332 us).
    Kernels that write rows keep row-aligned windows: their flat stores need a mask per element
    and ran 2x slower (softmax 8192x50257, 813 -> 1401-1944 us). So: per-row reductions (no row
    or column outputs, no column inputs), one row per block, 32-bit offsets; one_pass needs
    its power-of-two tile to cover the row and the bytes before it."""
    slack = VECTOR_BYTES // itemsize - 1
    if math_.writes_chunks or math_.col_inputs or p.block_rows != 1 or slack == 0 or p.strategy == "split_cols":
        return False
    if (p.cols * itemsize) % VECTOR_BYTES == 0:
        return False
    if p.batch * p.rows * p.cols + p.block_cols + slack >= 2**31:
        return False
    return p.strategy != "one_pass" or p.block_cols >= p.cols + slack


def _triton_body(*refs: Any, math_: RowMath, p: Plan, flat: bool, itemsize: int) -> None:
    from jax.experimental.pallas import triton as pltriton

    row_in, col_in, vec_in, row_out, col_out, res_out, _ = split_refs(refs, math_)
    program, b = pl.program_id(0), pl.program_id(1)
    br, width, C = p.block_rows, p.block_cols, p.cols
    # Masks only where blocks overhang the array, so that full blocks load unmasked.
    ragged_cols = C % width != 0
    ragged_rows = p.rows % p.rows_per_program != 0
    n_row_out, n_col_out = math_.row_outputs, math_.col_outputs
    n_out = n_row_out + n_col_out
    # A loop that reads its chunks twice keeps them in L2 for the second walk.
    fold_policy = "evict_last" if math_.writes_chunks else None
    align_shift = (VECTOR_BYTES // itemsize).bit_length() - 1
    slack = (1 << align_shift) - 1 if flat else 0  # elements a flat window may start early
    total = p.batch * p.rows * C

    def locate(rows: jax.Array, row_valid: jax.Array | None, c0: Any) -> Chunk:
        """Where a chunk of a block of rows lies, and its masks (nothing loaded)."""
        if flat:
            # The window starts at the row's aligned start plus c0; shifting keeps the
            # alignment visible to Triton (its divisibility of x << k is at least 2**k).
            start = (b * p.rows + rows) * C
            base = (start >> align_shift) << align_shift
            first = c0 - (start - base)
            columns = first + jnp.arange(width)
            col_valid = ((columns >= 0) & (columns < C))[None, :]
            in_array = (base + c0 + jnp.arange(width) < total)[None, :]
            return Chunk((pl.ds(0, 1), pl.ds(base + c0, width)), _and(row_valid, col_valid),
                         col_valid, first, in_array, c0)
        col_valid = (c0 + jnp.arange(width) < C)[None, :] if ragged_cols else None
        return Chunk((b, pl.ds(rows, br), pl.ds(c0, width)), _and(row_valid, col_valid), col_valid,
                     c0, None, c0)

    def load_rows(chunk: Chunk, policy: str | None) -> list[jax.Array]:
        """The row inputs' tiles of `chunk`, float32, padding where masked."""
        if flat:
            return [jnp.where(chunk.col_valid,
                              pltriton.load(ref.at[chunk.window], mask=chunk.in_array, other=math_.pad,
                                            eviction_policy=policy).astype(F32),
                              math_.pad) for ref in row_in]
        return [pltriton.load(ref.at[chunk.window], mask=chunk.mask,
                              other=None if chunk.mask is None else math_.pad,
                              eviction_policy=policy).astype(F32) for ref in row_in]

    def load_cols(chunk: Chunk) -> list[jax.Array]:
        """The column inputs' tiles of `chunk`; every program reads them: keep them in L2."""
        return [pltriton.load(ref.at[pl.ds(0, 1), pl.ds(chunk.c0, width)], mask=chunk.col_valid,
                              other=None if chunk.col_valid is None else 0.0,
                              eviction_policy="evict_last").astype(F32)
                for ref in col_in]

    def load_chunk(rows: jax.Array, row_valid: jax.Array | None, c0: Any,
                   policy: str | None) -> tuple[list[jax.Array], Chunk]:
        """(row and column input tiles, where they lie)."""
        chunk = locate(rows, row_valid, c0)
        return load_rows(chunk, policy) + load_cols(chunk), chunk

    def store_chunk(results, window, mask) -> list[jax.Array]:
        for ref, value in zip(row_out, results[:n_row_out]):
            pltriton.store(ref.at[window], value.astype(ref.dtype), mask=mask)
        if mask is not None:
            results = [jnp.where(mask, value, 0.0) for value in results]
        return [jnp.sum(value, axis=0) for value in results[n_row_out:]]

    def row_vectors(rows: jax.Array, row_valid: jax.Array | None) -> tuple[Any, list[jax.Array]]:
        mask = None if row_valid is None else row_valid[:, 0]
        window = (b, pl.ds(rows, br))
        return window, [pltriton.load(ref.at[window], mask=mask,
                                      other=None if mask is None else 0)[:, None]
                        for ref in vec_in]

    def store_results(window: Any, row_valid: jax.Array | None, values: Stats) -> None:
        mask = None if row_valid is None else row_valid[:, 0]
        for ref, value in zip(res_out, values, strict=True):
            pltriton.store(ref.at[window], value.reshape(br).astype(ref.dtype), mask=mask)

    def block_of(k: Any) -> tuple[jax.Array, jax.Array | None]:
        """The first row of the program's k-th block of rows, and which of its rows exist."""
        rows = program * p.rows_per_program + k * br
        return rows, (rows + jnp.arange(br) < p.rows)[:, None] if ragged_rows else None

    def one_pass(k: Any, sums: tuple[jax.Array, ...], blocks: list[jax.Array]) -> tuple[jax.Array, ...]:
        """Whole rows of the k-th block, given its loaded row and column tiles."""
        rows, row_valid = block_of(k)
        vec_window, vectors = row_vectors(rows, row_valid)
        chunk = locate(rows, row_valid, 0)
        if flat:  # the window's columns start at -offset: the streamed form takes a start
            stats = math_.update(math_.init((br, 1)), *blocks, *vectors, start=chunk.first,
                                 valid=chunk.col_valid)
            row_values = math_.finish(stats, C)
            outs = (*math_.apply(row_values, *blocks, *vectors), *row_values[:math_.results])
        else:
            outs = math_.rows(*blocks, *vectors, cols=C, valid=chunk.col_valid)
        contributions = store_chunk(outs[:n_out], chunk.window, chunk.mask)
        store_results(vec_window, row_valid, outs[n_out:])
        return tuple(s + c for s, c in zip(sums, contributions))

    def prefetched(steps: int, sums: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        """one_pass over `steps` blocks, each block's row tiles loaded one step ahead (the
        loop's carry), so that their loads are in flight while the previous block computes;
        the column inputs loaded once."""
        cols = load_cols(locate(*block_of(0), 0))

        def load(k: Any, live: jax.Array | None = None) -> list[jax.Array]:
            rows, row_valid = block_of(k)
            if live is not None:  # masked off: no memory traffic
                row_valid = _and(row_valid, jnp.full((br, 1), live))
            return load_rows(locate(rows, row_valid, 0), None)

        def step(k: jax.Array, carry: tuple[Any, list[jax.Array]]) -> tuple[Any, list[jax.Array]]:
            sums, blocks = carry
            ahead = load(k + 1, k + 1 < steps)  # the last step loads nothing
            return one_pass(k, sums, blocks + cols), ahead

        return lax.fori_loop(0, steps, step, (sums, load(0)))[0]

    def row_block(k: Any, sums: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        rows, row_valid = block_of(k)
        if p.strategy == "one_pass":
            return one_pass(k, sums, load_chunk(rows, row_valid, 0, None)[0])
        vec_window, vectors = row_vectors(rows, row_valid)
        lanes = math_.lanes if p.config.fold == "lanes" else None
        update = math_.update if lanes is None else lanes.update

        def fold(j: jax.Array, stats: Stats) -> Stats:
            blocks, chunk = load_chunk(rows, row_valid, j * width, fold_policy)
            return update(stats, *blocks, *vectors, start=chunk.first, valid=chunk.col_valid)

        stats = walk(fold, math_.init((br, 1 if lanes is None else width)))
        row_values = math_.finish(stats if lanes is None else lanes.combine(stats), C)
        store_results(vec_window, row_valid, row_values[:math_.results])
        if not math_.writes_chunks:
            return sums

        def write(j: jax.Array, carry: int) -> int:
            blocks, chunk = load_chunk(rows, row_valid, j * width, "evict_first")
            contributions = store_chunk(math_.apply(row_values, *blocks, *vectors), chunk.window,
                                        chunk.mask)
            # fori_loop covers one block of rows per program: its partial sums are final.
            part = (b * p.row_blocks + program, pl.ds(j * width, width))
            for ref, value in zip(col_out, contributions):
                pltriton.store(ref.at[part], value,
                               mask=j * width + jnp.arange(width) < C if ragged_cols else None)
            return carry

        if not held:
            walk(write, 0)
            return sums
        # Several blocks of rows a program: each chunk's partial sums carried in registers (a
        # static chunk index: unroll=1), stored once after the last block.
        sums = list(sums)
        for j in range(chunks):
            blocks, chunk = load_chunk(rows, row_valid, jnp.int32(j) * width, "evict_first")
            contributions = store_chunk(math_.apply(row_values, *blocks, *vectors), chunk.window, chunk.mask)
            for c, value in enumerate(contributions):
                sums[j * n_col_out + c] = sums[j * n_col_out + c] + value
        return tuple(sums)

    # A flat window starts up to 15 bytes before its row: it may take one more chunk.
    chunks = pl.cdiv(C + slack, width) if flat else p.col_blocks

    def walk(body: Callable[[Any, Any], Any], carry: Any) -> Any:
        """body over the row's chunks: a loop, or (unroll) straight-line code, so that every
        chunk's loads can be issued before the first chunk's arrive. Seen in the H200's SASS
        (bench/results/h200/norms_codegen/ncu/): Triton unrolled the statistics walk of a
        constant trip count by itself, but not the write walk."""
        if not p.config.unroll:
            return lax.fori_loop(0, chunks, body, carry)
        for j in range(chunks):
            # A traced index: a static slice past the row's end would be refused while tracing
            # (the masks cover it); Triton folds the constant all the same.
            carry = body(jnp.int32(j), carry)
        return carry

    steps = p.rows_per_program // br
    # fori_loop with column outputs over several blocks of rows: partial sums per chunk (RowConfigTriton.check)
    held = p.strategy == "fori_loop" and bool(col_out) and steps > 1
    sums = tuple(jnp.zeros((width,), F32) for _ in range(len(col_out) * (chunks if held else 1)))
    if p.config.prefetch:
        sums = prefetched(steps, sums)
    else:
        sums = row_block(0, sums) if steps == 1 else lax.fori_loop(0, steps, row_block, sums)
    if p.strategy == "one_pass":
        part = (b * p.row_blocks + program, pl.ds(0, width))
        for ref, value in zip(col_out, sums):
            pltriton.store(ref.at[part], value, mask=jnp.arange(width) < C if ragged_cols else None)
    elif held:
        for j in range(chunks):   # a traced start: a static slice past the row's end is refused
            part = (b * p.row_blocks + program, pl.ds(jnp.int32(j) * width, width))
            for c, ref in enumerate(col_out):
                pltriton.store(ref.at[part], sums[j * n_col_out + c],
                               mask=j * width + jnp.arange(width) < C if ragged_cols else None)


def _split_body(*refs: Any, math_: RowMath, p: Plan, phase: int) -> None:
    """Strategy split_cols: the program (block of rows, batch entry, chunk) of one phase.

    Phase 0 folds its chunk into statistics and writes them at the chunk's place of the
    (batch, rows, spans) float32 statistics arrays. Phase 1 reads a row's statistics of every
    span at once (one masked tile per statistic), combines and finishes them, then maps its chunk
    (row and column outputs) or, for kernels with per-row results only, writes the results (a
    grid of one chunk)."""
    from jax.experimental.pallas import triton as pltriton

    n_in = math_.row_inputs + math_.col_inputs + math_.vector_inputs
    row_in, col_in, vec_in, *_ = split_refs(refs[:n_in], math_)
    program, b, span = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    br, width, C = p.block_rows, p.block_cols, p.cols
    rows, c0 = program * br, span * width
    row_valid = (rows + jnp.arange(br) < p.rows)[:, None] if p.rows % br else None
    row_mask = None if row_valid is None else row_valid[:, 0]
    col_valid = (c0 + jnp.arange(width) < C)[None, :] if C % width else None
    mask = _and(row_valid, col_valid)
    window = (b, pl.ds(rows, br), pl.ds(c0, width))
    vectors = [pltriton.load(ref.at[b, pl.ds(rows, br)], mask=row_mask,
                             other=None if row_mask is None else 0)[:, None] for ref in vec_in]

    def chunk() -> list[jax.Array]:
        """The chunk's row tiles (padding where masked) and column tiles, float32."""
        tiles = [pltriton.load(ref.at[window], mask=mask, other=None if mask is None else math_.pad)
                 for ref in row_in]
        tiles += [pltriton.load(ref.at[pl.ds(0, 1), pl.ds(c0, width)], mask=col_valid,
                                other=None if col_valid is None else 0.0, eviction_policy="evict_last")
                  for ref in col_in]
        return [t.astype(F32) for t in tiles]

    if phase == 0:
        stats = math_.update(math_.init((br, 1)), *chunk(), *vectors, start=c0, valid=col_valid)
        for ref, value in zip(refs[n_in:], stats, strict=True):
            pltriton.store(ref.at[b, pl.ds(rows, br), pl.ds(span, 1)], value, mask=row_valid)
        return
    n_stats = math_.n_stats
    stats_in, outs = refs[n_in:n_in + n_stats], refs[n_in + n_stats:]
    spans = p.col_blocks
    lanes = pl.next_power_of_2(spans)
    span_valid = (jnp.arange(lanes) < spans)[None, :] if lanes != spans else None
    stats_mask = _and(row_valid, span_valid)
    parts = tuple(pltriton.load(ref.at[b, pl.ds(rows, br), pl.ds(0, lanes)], mask=stats_mask,
                                other=None if stats_mask is None else 0.0) for ref in stats_in)
    if span_valid is not None:  # spans past the row's last hold nothing: the empty statistics
        parts = tuple(jnp.where(span_valid, part, empty)
                      for part, empty in zip(parts, math_.init((br, lanes))))
    row_values = math_.finish(math_.span_combine(parts), C)
    n_row_out, n_col_out = math_.row_outputs, math_.col_outputs
    row_out, col_out, res_out = outs[:n_row_out], outs[n_row_out:n_row_out + n_col_out], outs[n_row_out + n_col_out:]
    first = span == 0  # one program of the row writes its results
    for ref, value in zip(res_out, row_values[:math_.results], strict=True):
        pltriton.store(ref.at[b, pl.ds(rows, br)], value.reshape(br),
                       mask=first if row_mask is None else row_mask & first)
    if not math_.writes_chunks:
        return
    results = math_.apply(row_values, *chunk(), *vectors)
    for ref, value in zip(row_out, results[:n_row_out]):
        pltriton.store(ref.at[window], value.astype(ref.dtype), mask=mask)
    # Column contributions: summed over the block's rows into the program's partial row.
    for ref, value in zip(col_out, results[n_row_out:]):
        value = value if mask is None else jnp.where(mask, value, 0.0)
        pltriton.store(ref.at[b * p.row_blocks + program, pl.ds(c0, width)], jnp.sum(value, axis=0),
                       mask=None if col_valid is None else col_valid[0])


def _build_split(math_: RowMath, p: Plan, platform: Platform, out_shape: tuple[Any, ...],
                 compiler: dict[str, int]) -> Callable[..., Any]:
    """Strategy split_cols: the statistics kernel, then the combining and mapping kernel."""
    stats_shape = tuple(jax.ShapeDtypeStruct((p.batch, p.rows, p.col_blocks), F32)
                        for _ in range(math_.n_stats))
    grid = (p.row_blocks, p.batch, p.col_blocks)
    spans = pallas_call(functools.partial(_split_body, math_=math_, p=p, phase=0), platform=platform,
                        config=compiler, out_shape=stats_shape, grid=grid, name=f"{math_.name}_spans")
    mapped = pallas_call(functools.partial(_split_body, math_=math_, p=p, phase=1), platform=platform,
                         config=compiler, out_shape=out_shape,
                         grid=grid if math_.writes_chunks else grid[:2] + (1,), name=math_.name)
    return lambda *arrays: mapped(*arrays, *spans(*arrays))


def build_triton(math_: RowMath, p: Plan, dtype: Any, platform: Platform) -> Callable[..., Any]:
    """The pallas_call of `math_` for a Triton plan: a function of the engine's arrays.

    With flat windows (`flat_rows`) the kernel sees the row tensor as (1, batch*rows*cols);
    strategy split_cols is two kernels (`_split_body`)."""
    itemsize = jnp.dtype(dtype).itemsize
    flat = flat_rows(math_, p, itemsize)
    out_shape = tuple(
        [jax.ShapeDtypeStruct((p.batch, p.rows, p.cols), dtype)] * math_.row_outputs
        + [jax.ShapeDtypeStruct((p.partials, p.cols), F32)] * math_.col_outputs
        + [jax.ShapeDtypeStruct((p.batch, p.rows), F32)] * math_.results)
    compiler = {"num_warps": p.config.num_warps, "num_stages": p.config.num_stages}
    if p.strategy == "split_cols":
        return _build_split(math_, p, platform, out_shape, compiler)
    body = functools.partial(_triton_body, math_=math_, p=p, flat=flat, itemsize=itemsize)
    call = pallas_call(body, platform=platform, config=compiler, out_shape=out_shape,
                       grid=(p.row_blocks, p.batch), name=math_.name)
    if not flat:
        return call
    n_in = math_.row_inputs
    return lambda *arrays: call(*[x.reshape(1, -1) for x in arrays[:n_in]], *arrays[n_in:])
