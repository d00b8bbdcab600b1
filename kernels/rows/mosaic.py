"""The row engine on Mosaic GPU: each row staged once in shared memory, one HBM read (and write).

Triton cannot hold a vocabulary-wide row on chip (registers spill; it has no explicit shared
memory), so its streamed rows read HBM twice or keep per-lane statistics in registers. Here a
block (one warpgroup, 128 threads) per row copies the row into shared memory in one bulk copy
(`cp.async.bulk`), walks it as often as the kernel's `StagedMath` asks (each walk folds chunks of
`block_cols` columns held in registers into one per-row statistic: softmax's max and sum, a
norm's mean and variance, cross entropy's max and log-sum), then either maps the row in place and
writes it back in one bulk copy, or writes one per-row result. Column inputs (a norm's weight
and bias) are bulk-copied beside the row and waited for only before the map. Other blocks on
the same SM load and store meanwhile.

Row lengths: any from 128 columns (shorter rows too when their bytes are whole 128-byte units).
A bulk copy moves 16-byte-aligned spans (into shared memory, whole 128-byte units), so a row
whose byte length is not a multiple of 128 (50257 bf16 columns) is read through a window of the
flattened input that starts at the row's start rounded down to 16 bytes (up to 7 bf16 elements
of the previous row, masked to `pad` in shared memory, as is everything past the row's end); the
last row's window, which would run past the array, copies its whole units and reads the rest
element by element. Such rows are written as their 16-byte-aligned interior in one bulk copy
and the up to 2 x 7 elements at their ends one by one. Kernels with column inputs take rows of
whole 128-byte units only (their columns would sit at a different offset in every window).
Rows (and column inputs) must fit shared memory (227 KiB a block on sm_90: up to about 115,000
bf16 columns with no column inputs); `check_config` refuses longer ones, and a space's task of
such a shape gets no trials on this target.

Config knobs, in the row engine's vocabulary: strategy "smem_row"; block_rows 1 (a block per
row); block_cols, the chunk of the walks (a power of two, 1024 to 8192: 8 to 64 values per thread);
approx_math, 1 to let Mosaic GPU use the approximate exp, log and rsqrt (`ex2.approx`: a few ulp of
float32, well within the farm's tolerances; the numerics check of every trial still applies).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import mgpu_launch
from kernels.lowering import Platform
from kernels.rows.config import from_dict, is_pow2
from kernels.rows.contract import StagedMath
from kernels.rows.kernel import RowKernel

TARGET = "gpu-mosaic"
STRATEGY = "smem_row"  # a block per row
RING = "smem_ring"  # persistent blocks, a ring of row slots each
STRATEGIES = (STRATEGY, RING)
RING_BUFFERS = (2, 4)
MAX_BLOCKS_PER_SM = 4
# Shared memory of one SM on sm_90 (228 KiB), of which each resident block reserves 1 KiB.
SM_SMEM_BYTES = 233472
BLOCK_RESERVED = 1024
VECTOR_BYTES = 16  # what a bulk copy's addresses and sizes are multiples of
COPY_BYTES = 128  # a copy into shared memory moves a multiple of this (one byte count per thread)
# Rows of other byte lengths are read through windows up to COPY_BYTES + 15 bytes longer than the
# row: from this many columns on, only the last row's window can run past the array.
MIN_UNALIGNED_COLS = 128
CHUNKS = (1024, 8192)  # block_cols bounds: 8 to 64 values per thread
DEFAULT_CHUNK = 4096
# Shared memory a block needs beside the staged arrays: the reductions' scratch and the barriers
# (Mosaic GPU counted 2056 bytes for softmax in JAX 0.10; the margin covers later versions').
SMEM_OVERHEAD = 3072
F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class StagedRowConfig:
    """Rows staged in shared memory and walked in register chunks of block_cols columns: a block
    per row (strategy "smem_row"), or persistent blocks, blocks_per_sm of them per SM, each
    cycling its rows through a ring of `buffers` row slots (strategy "smem_ring")."""

    block_cols: int
    block_rows: int = 1
    strategy: str = STRATEGY
    approx_math: int = 0
    buffers: int = 1
    blocks_per_sm: int = 1

    def __post_init__(self) -> None:
        if self.approx_math not in (0, 1):
            raise ValueError(f"approx_math must be 0 or 1 on {TARGET}, got {self.approx_math!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES} on {TARGET}, got {self.strategy!r}")
        if self.block_rows != 1:
            raise ValueError(f"block_rows must be 1 on {TARGET} (a row at a time), got {self.block_rows}")
        if self.strategy == STRATEGY and (self.buffers, self.blocks_per_sm) != (1, 1):
            raise ValueError(f"{STRATEGY} stages one row per block: buffers and blocks_per_sm must be 1, "
                             f"got {self.buffers} and {self.blocks_per_sm}")
        if self.strategy == RING and not (RING_BUFFERS[0] <= self.buffers <= RING_BUFFERS[1]
                                          and 1 <= self.blocks_per_sm <= MAX_BLOCKS_PER_SM):
            raise ValueError(f"{RING} takes buffers in [{RING_BUFFERS[0]}, {RING_BUFFERS[1]}] and blocks_per_sm "
                             f"in [1, {MAX_BLOCKS_PER_SM}], got {self.buffers} and {self.blocks_per_sm}")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A config checked against a shape and dtype: the window the kernel stages per row."""

    config: StagedRowConfig
    rows: int
    cols: int
    itemsize: int
    col_inputs: int = 0

    @property
    def vector(self) -> int:
        """Elements in 16 bytes: the alignment unit of bulk copies."""
        return VECTOR_BYTES // self.itemsize

    @property
    def aligned(self) -> bool:
        """Whether a row is its own window: its bytes a multiple of COPY_BYTES (so every row
        starts aligned, and the copy's bytes split evenly over the warpgroup's threads)."""
        return self.cols * self.itemsize % COPY_BYTES == 0

    @property
    def window(self) -> int:
        """Elements copied in per row: the row, or a span of whole COPY_BYTES that covers it from
        the row's start rounded down to 16 bytes."""
        if self.aligned:
            return self.cols
        unit = COPY_BYTES // self.itemsize
        return pl.cdiv(self.cols + self.vector - 1, unit) * unit

    @property
    def staged(self) -> int:
        """Shared-memory elements per staged array: the window rounded up to whole chunks."""
        return pl.cdiv(self.window, self.config.block_cols) * self.config.block_cols

    @property
    def interior(self) -> int:
        """Elements of an unaligned row written by one bulk copy (16-byte aligned at both ends):
        the whole row when every row starts aligned, else what is left of it from any start."""
        if self.cols % self.vector == 0:
            return self.cols
        return (self.cols - (self.vector - 1)) // self.vector * self.vector

    @property
    def last_base(self) -> int:
        """Where the last row's window starts in the flattened rows."""
        return (self.rows - 1) * self.cols // self.vector * self.vector

    @property
    def last_copied(self) -> int:
        """Elements of the last row's window within the array, in whole COPY_BYTES (the rest,
        fewer than COPY_BYTES, is read element by element)."""
        unit = COPY_BYTES // self.itemsize
        return (self.rows * self.cols - self.last_base) // unit * unit

    @property
    def footprint(self) -> int:
        """Shared-memory bytes of one block: its row slots and each column input, staged."""
        return (self.config.buffers + self.col_inputs) * self.staged * self.itemsize + SMEM_OVERHEAD

    def programs(self, num_sms: int) -> int:
        """Blocks launched: one per row, or (the ring) blocks_per_sm per SM, at most one per row."""
        if self.config.strategy == STRATEGY:
            return self.rows
        return min(self.rows, num_sms * self.config.blocks_per_sm)


def plan(math_: StagedMath, config: Mapping[str, Any], shape: tuple[int, ...], dtype: Any) -> Plan:
    """The checked plan of `config` for `shape` (2-D, or 3-D with the batch flattened into rows);
    raises with a plain message when it cannot work."""
    name = math_.name
    typed = from_dict(StagedRowConfig, {"strategy": STRATEGY, "block_rows": 1, **config}, f"{name} on {TARGET}")
    if len(shape) not in (2, 3) or (len(shape) == 3 and math_.vector_inputs):
        raise NotImplementedError(f"{name} on {TARGET} takes (rows, cols)"
                                  f"{'' if math_.vector_inputs else ' or (batch, rows, cols)'}, got {tuple(shape)}")
    rows, cols = math.prod(shape[:-1]), shape[-1]
    itemsize = jnp.dtype(dtype).itemsize
    if itemsize not in (2, 4):
        raise NotImplementedError(f"{name} on {TARGET} takes 16- or 32-bit floats, got {jnp.dtype(dtype)}")
    p = Plan(typed, rows, cols, itemsize, math_.col_inputs)
    if not p.aligned and typed.strategy == RING:
        raise ValueError(f"{name} on {TARGET}: {RING} takes rows of whole {COPY_BYTES}-byte units, not "
                         f"{cols} columns ({cols * itemsize} bytes); {STRATEGY} takes any width")
    if not p.aligned and math_.col_inputs:
        raise ValueError(f"{name} on {TARGET}: rows of {cols} columns ({cols * itemsize} bytes) are not whole "
                         f"{COPY_BYTES}-byte units, which a kernel with column inputs needs (gpu-triton takes any width)")
    if not p.aligned and (cols < MIN_UNALIGNED_COLS or rows * cols + p.window >= 2**31):
        raise ValueError(f"{name} on {TARGET}: rows of {cols} columns ({cols * itemsize} bytes, not a "
                         f"multiple of {COPY_BYTES}) need at least {MIN_UNALIGNED_COLS} columns and "
                         f"fewer than 2**31 elements in all")
    if p.footprint > mgpu_launch.SMEM_BYTES:
        staged = (mgpu_launch.SMEM_BYTES - SMEM_OVERHEAD) // ((typed.buffers + math_.col_inputs) * itemsize)
        raise ValueError(f"a row of {cols} columns stages {p.footprint} bytes of shared memory; a "
                         f"block has {mgpu_launch.SMEM_BYTES} on sm_90 (rows up to about "
                         f"{staged - p.config.block_cols} columns with {typed.buffers} row slot(s))")
    if typed.blocks_per_sm * (p.footprint + BLOCK_RESERVED) > SM_SMEM_BYTES:
        raise ValueError(f"{typed.blocks_per_sm} blocks of {p.footprint} bytes of shared memory do not fit "
                         f"one SM's {SM_SMEM_BYTES} (a persistent grid would run in waves)")
    return p


def default_config(shape: tuple[int, ...]) -> dict[str, Any]:
    """Chunks of 4096 columns (32 values per thread), or of the row rounded up to a power of two
    when shorter: 4096 was the fastest of 1024, 2048 and 4096 for softmax at 8192 x 32000 and
    8192 x 50257 on the H200 (BENCHMARKS.md)."""
    chunk = min(DEFAULT_CHUNK, max(CHUNKS[0], 1 << max(shape[-1] - 1, 1).bit_length()))
    return {"block_rows": 1, "strategy": STRATEGY, "block_cols": chunk, "approx_math": 0}


def _positions(chunk: int, dtype: Any, interpret: bool) -> jax.Array:
    """0..chunk-1 in the layout of a chunk of `dtype` loaded from shared memory (Mosaic GPU's
    strided warpgroup layout: 8-byte vectors), which it cannot infer for an iota. Pallas's GPU
    interpreter has no layouts (and no layout_cast)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    iota = lax.broadcasted_iota(jnp.int32, (chunk,), 0)
    if interpret:
        return iota
    return plgpu.layout_cast(iota, plgpu.Layout.WG_STRIDED((chunk,), vec_size=8 // jnp.dtype(dtype).itemsize))


def build(math_: StagedMath, config: Mapping[str, Any], shape: tuple[int, ...], dtype: Any,
          platform: Platform) -> Callable[..., jax.Array]:
    """The Mosaic GPU kernel of `math_` and `config` for `shape`: a function of (x, *column inputs,
    *per-row vector inputs) giving the row output (x's shape and dtype) or the per-row results
    (float32, shape[:-1])."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    p = plan(math_, config, shape, dtype)
    dtype = jnp.dtype(dtype)
    rows, C, chunk, V = p.rows, p.cols, p.config.block_cols, p.vector
    n_chunks = p.staged // chunk
    n_cols, n_vectors = math_.col_inputs, math_.vector_inputs
    ring, slots = p.config.strategy == RING, p.config.buffers
    programs = p.programs(mgpu_launch.num_sms())
    # Every copy stays within its array, so Mosaic GPU issues a bulk copy (a tiled TMA copy
    # would move at most 256 elements along a dimension).
    in_bounds = plgpu.OOBFillMode.PROMISE_IN_BOUNDS
    # Chunks that may hold positions outside the row (before it: the first, when unaligned;
    # after it: those reaching past the shortest offset + C), masked to `pad` once after the load
    # and walked with a validity mask; the rest are walked in one loop.
    edge_chunks = sorted({j for j in range(n_chunks) if (j + 1) * chunk > C} | ({0} if not p.aligned else set()))
    loop_end = min([j for j in edge_chunks if j > 0], default=n_chunks)

    def chunk_at(ref: Any, j: Any) -> Any:
        return ref.at[pl.ds(j * chunk, chunk)]

    def walk_row(x_smem: Any, head: Any) -> tuple[jax.Array, ...]:
        """Mask a staged row's edges to `pad`, then run the walks: the row's statistics."""

        def valid_at(j: int) -> jax.Array:
            position = _positions(chunk, dtype, platform.interpret) + j * chunk
            return (position >= head) & (position < head + C)

        for j in edge_chunks:
            ref = chunk_at(x_smem, j)
            ref[...] = jnp.where(valid_at(j), ref[...].astype(F32), math_.pad).astype(dtype)

        stats: tuple[jax.Array, ...] = ()
        for walk in math_.walks:
            def fold_at(j: Any, acc: Any, valid: jax.Array | None, walk=walk, stats=stats) -> Any:
                ref = chunk_at(x_smem, j)
                x = ref[...] if walk.stored_dtype else ref[...].astype(F32)
                if walk.rewrite is not None:
                    x = walk.rewrite(x, stats)
                    ref[...] = x.astype(dtype)
                return walk.fold(acc, x, stats, valid)

            # The first chunk outside the loop gives the accumulator its layout.
            acc = fold_at(0, walk.identity, valid_at(0) if 0 in edge_chunks else None)
            acc = lax.fori_loop(1, loop_end, lambda j, a, fold_at=fold_at: fold_at(j, a, None), acc)
            for j in edge_chunks:
                if j > 0:
                    acc = fold_at(j, acc, valid_at(j))
            value = walk.across(acc)
            stats = (*stats, value if walk.finish is None else walk.finish(value, stats, C))
        return stats

    def apply_row(x_smem: Any, col_smems: tuple[Any, ...], stats: tuple[jax.Array, ...]) -> None:
        """Map the staged row in place, chunk by chunk."""

        def apply(j: Any, carry: Any) -> Any:
            ref = chunk_at(x_smem, j)
            cols = (chunk_at(c, j)[...].astype(F32) for c in col_smems)
            ref[...] = math_.apply(ref[...].astype(F32), stats, *cols).astype(dtype)
            return carry

        lax.fori_loop(0, n_chunks, apply, 0)

    def result_row(x_smem: Any, head: Any, stats: tuple[jax.Array, ...], vectors: tuple[Any, ...]) -> jax.Array:
        return math_.result(stats, lambda i: x_smem[head + i].astype(F32), *vectors, cols=C)

    def row_body(x_gmem, col_gmems, vector_gmems, o_gmem, x_smem, col_smems, loaded, cols_loaded):
        """smem_row: this block's row, through a window when rows are not whole COPY_BYTES."""
        row = lax.axis_index("rows")
        start = row * C
        if p.aligned:
            head = 0
            plgpu.copy_gmem_to_smem(x_gmem.at[row], x_smem.at[pl.ds(0, C)], loaded, oob_mode=in_bounds)
        else:  # a window of the flattened rows, from the row's start rounded down to 16 bytes
            base = lax.div(start, V) * V
            head = start - base

            @pl.when(row != rows - 1)
            def _():
                plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(base, p.window)], x_smem.at[pl.ds(0, p.window)],
                                        loaded, oob_mode=in_bounds)

            @pl.when(row == rows - 1)
            def _():  # the last window would run past the array: whole units, then the rest
                plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(p.last_base, p.last_copied)],
                                        x_smem.at[pl.ds(0, p.last_copied)], loaded, oob_mode=in_bounds)
                for k in range(p.last_copied, rows * C - p.last_base):
                    x_smem[k] = x_gmem[p.last_base + k]
        for col_gmem, col_smem in zip(col_gmems, col_smems):
            plgpu.copy_gmem_to_smem(col_gmem, col_smem.at[pl.ds(0, C)], cols_loaded, oob_mode=in_bounds)
        vectors = tuple(v[row] for v in vector_gmems)
        plgpu.barrier_wait(loaded)
        stats = walk_row(x_smem, head)
        if math_.result is not None:
            o_gmem[row] = result_row(x_smem, head, stats, vectors)
            return
        if n_cols:
            plgpu.barrier_wait(cols_loaded)
        apply_row(x_smem, col_smems, stats)
        plgpu.commit_smem()
        if p.aligned:
            plgpu.copy_smem_to_gmem(x_smem.at[pl.ds(0, C)], o_gmem.at[row])
        else:
            # The aligned interior in one bulk copy, the ends element by element.
            lead = lax.rem(V - head, V)  # elements before the row's first 16-byte boundary
            plgpu.copy_smem_to_gmem(x_smem.at[pl.ds(head + lead, p.interior)],
                                    o_gmem.at[pl.ds(start + lead, p.interior)])
            for k in range(V - 1 if C % V else 0):
                @pl.when(k < lead)
                def _():
                    o_gmem[start + k] = x_smem[head + k]
            for k in range(p.interior, C):
                @pl.when(k >= lead + p.interior)
                def _():
                    o_gmem[start + k] = x_smem[head + k]
        plgpu.wait_smem_to_gmem(0)

    def ring_body(x_gmem, col_gmems, vector_gmems, o_gmem, slot_smem, col_smems, loaded, cols_loaded):
        """smem_ring: rows g, g + programs, ... of block g through `slots` row slots; the slot of
        row t - 1 is refilled (with row t - 1 + slots) before row t is walked, once the store of
        row t - 1 has read it, so that up to slots - 1 rows are in flight during each walk."""
        g = lax.axis_index("rows")
        mine = lax.div(rows - 1 - g, programs) + 1  # rows of this block (programs <= rows)

        def load(t: Any, slot: Any) -> None:
            plgpu.copy_gmem_to_smem(x_gmem.at[g + t * programs], slot_smem.at[slot, pl.ds(0, C)], loaded.at[slot],
                                    oob_mode=in_bounds)

        for t in range(slots):
            @pl.when(t < mine)
            def _():
                load(t, t)
        for col_gmem, col_smem in zip(col_gmems, col_smems):
            plgpu.copy_gmem_to_smem(col_gmem, col_smem.at[pl.ds(0, C)], cols_loaded, oob_mode=in_bounds)
        if n_cols:
            plgpu.barrier_wait(cols_loaded)

        def step(t: Any, carry: Any) -> Any:
            row, slot = g + t * programs, lax.rem(t, slots)

            @pl.when((t >= 1) & (t - 1 + slots < mine))
            def _():
                if math_.result is None:
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # row t - 1's store has read its slot
                load(t - 1 + slots, lax.rem(t - 1, slots))

            plgpu.barrier_wait(loaded.at[slot])
            x_smem = slot_smem.at[slot]
            stats = walk_row(x_smem, 0)
            if math_.result is not None:
                o_gmem[row] = result_row(x_smem, 0, stats, tuple(v[row] for v in vector_gmems))
                return carry
            apply_row(x_smem, col_smems, stats)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(x_smem.at[pl.ds(0, C)], o_gmem.at[row])
            return carry

        lax.fori_loop(0, mine, step, 0)
        if math_.result is None:
            plgpu.wait_smem_to_gmem(0)

    def body(x_gmem, *refs):
        col_gmems, vector_gmems, o_gmem = refs[:n_cols], refs[n_cols:n_cols + n_vectors], refs[-1]

        def allocated(x_smem, *rest):
            col_smems, loaded = rest[:n_cols], rest[n_cols]
            cols_loaded = rest[n_cols + 1] if n_cols else None
            (ring_body if ring else row_body)(x_gmem, col_gmems, vector_gmems, o_gmem, x_smem, col_smems, loaded,
                                              cols_loaded)

        staged_row = plgpu.SMEM((slots, p.staged) if ring else (p.staged,), dtype)
        loaded = plgpu.Barrier(num_arrivals=1, num_barriers=slots) if ring else plgpu.Barrier(num_arrivals=1)
        cols = [plgpu.SMEM((p.staged,), dtype) for _ in range(n_cols)]
        pl.run_scoped(allocated, staged_row, *cols, loaded, *([plgpu.Barrier(num_arrivals=n_cols)] if n_cols else []))

    if math_.result is not None:
        out = jax.ShapeDtypeStruct((rows,), F32)
    else:
        out = jax.ShapeDtypeStruct((rows, C) if p.aligned else (rows * C,), dtype)
    params = plgpu.CompilerParams(approx_math=bool(p.config.approx_math))
    call = mgpu_launch.mosaic_kernel(body, platform=platform, out_shape=[out], grid=(programs,),
                                     grid_names=("rows",), compiler_params=params, name=math_.name)

    def run(x: jax.Array, *others: jax.Array) -> jax.Array:
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"{math_.name} was built for shape {tuple(shape)}, got {tuple(x.shape)}")
        if len(others) != n_cols + n_vectors:
            raise ValueError(f"{math_.name} takes x, {n_cols} column and {n_vectors} per-row inputs, "
                             f"got {1 + len(others)} arrays")
        cols = [c.astype(dtype).reshape(C) for c in others[:n_cols]]
        vectors = [v.astype(jnp.int32).reshape(rows) for v in others[n_cols:]]
        (y,) = call(x.reshape(rows, C) if p.aligned else x.reshape(-1), *cols, *vectors)
        return y.reshape(shape[:-1] if math_.result is not None else shape)

    return run


def protocol(kernel: RowKernel, math_: StagedMath) -> tuple[Callable[..., Any], ...]:
    """(check_config, footprint, default_config, build) of a row kernel module: `math_`'s staged
    rows on gpu-mosaic, `kernel`'s (the row engine's) on every other target."""

    def check_config(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> str | None:
        """None if `config` can run on `shape` and `target`, else a short reason."""
        if target != TARGET:
            return kernel.check_config(config, shape, dtype, target)
        try:
            plan(math_, config, shape, dtype)
        except (ValueError, NotImplementedError) as err:
            return str(err)
        return None

    def footprint(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
        """On-chip bytes of one program (Mosaic GPU: the staged row; else the row engine's)."""
        if target == TARGET:
            return plan(math_, config, shape, dtype).footprint
        return kernel.footprint(config, shape, dtype, target)

    def default_config_(shape: tuple[int, ...], target: str) -> dict[str, Any]:
        """A safe config for any shape with exactly the knobs of `target`."""
        return default_config(shape) if target == TARGET else kernel.default_config(shape, target)

    def build_(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform) -> Any:
        """The Pallas kernel of `config`: the staged rows, or the row engine's strategies."""
        if platform.target == TARGET:
            return build(math_, config, shape, dtype, platform)
        return kernel.build(config, shape, dtype, platform)

    return check_config, footprint, default_config_, build_
