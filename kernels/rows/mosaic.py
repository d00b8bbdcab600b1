"""The row engine on Mosaic GPU: each row staged once in shared memory, one HBM read (and write).

Triton cannot hold a vocabulary-wide row on chip (registers spill; it has no explicit shared
memory), so its streamed rows read HBM twice or keep per-lane statistics in registers. Here a
block (one warpgroup, 128 threads) per row copies the row into shared memory in one bulk copy
(`cp.async.bulk`), walks it as often as the kernel's `StagedMath` asks (each walk folds chunks of
`block_cols` columns held in registers into one per-row statistic: softmax's max and sum, a
norm's mean and variance, cross entropy's max and log-sum), then either maps the row in place and
writes it back in one bulk copy, or writes one per-row result. Column inputs (a norm's weight
and bias) are bulk-copied beside the row and waited for only before the map. Other blocks on
the same SM load and store meanwhile. A block ends once its write-back has read its shared
memory, as JAX's Hopper matmul and CUTLASS's epilogues do, not once the write has landed: the
next block starts sooner (layer norm at 16384 x 16384 on the H200: 262 us against 270).

Row lengths: any from 128 columns (shorter rows too when their bytes are whole 128-byte units).
A bulk copy moves 16-byte-aligned spans (into shared memory, whole 128-byte units), so a row
whose byte length is not a multiple of 128 (50257 bf16 columns) is read through a window of the
flattened input that starts at the row's start rounded down to `window_align` bytes, 16 or 128
(up to 7 or 63 bf16 elements of the previous row, masked to `pad` in shared memory, as is
everything past the row's end). Which is faster depends on the shape, for reasons not profiled:
on the H200, softmax at 8192 x 50257 ran 429 us from 16-byte boundaries and 404 from 128-byte
ones (as fast as the aligned 8192 x 50304), cross entropy 223 and 210; at 16384 x 4000 the other
way round, softmax 62.9-63.9 us against 64.3-69.5 and cross entropy 35.4-38.2 against 38.6-50.4
(the larger figures at larger chunks). Unless a config sets it, 128 from 32768 columns, else 16
(a rule from these two shapes: the knob is left out of the search spaces, whose gpu-mosaic
products it would take past what the searcher enumerates); the
last row's window, which would run past the array, copies its whole units and reads the rest
element by element. Such rows are written as their 16-byte-aligned interior in one bulk copy
and the up to 2 x 7 elements at their ends one by one. Kernels with column inputs take rows of
whole 128-byte units only (their columns would sit at a different offset in every window).
Rows (and column inputs) must fit shared memory (227 KiB a block on sm_90: up to about 115,000
bf16 columns with no column inputs); `check_config` refuses longer ones, and a space's task of
such a shape gets no trials on this target, unless the kernel can merge the statistics of pieces
of a row (`StagedMath.merge`: cross entropy): then strategy "smem_pieces" streams rows of any
length (of whole 128-byte units) through `slots` slots of `piece_cols` columns, walking each
piece while the next ones load, and reads the label's logit from global memory. Row maps whose
statistics merge (softmax) take strategy "smem_split" for such rows: the row's head, as long as
shared memory holds beside the slots, is staged in one bulk copy while the tail streams through
the slots twice (walked for statistics, then mapped and written back); the tail's second read
comes from L2 when the tails in flight fit it (132 blocks x the tail). Or such a row is split
over the blocks of a cluster (smem_row with `cluster` 2 to 8, rows of whole 128-byte units,
kernels with a merge, or whose walks combine over spans: the norms, with their column inputs'
runs staged beside the row's): each block stages, walks and maps one run of the row, and the
blocks exchange their statistics through each other's shared memory behind the cluster's
barrier (after the walks, or after each walk); smaller runs put more blocks, that is more
warpgroups, on each SM (softmax at 8192 x 128256 on the H200: 1144 us in 4 blocks against 1487
us for smem_split; rms norm at 2048 x 131072: 323 us in 8 blocks against 400 us for
torch.compile). Where a block holds the row, clusters ran slower (the norms at 4096 to 16384
columns: 1.1-1.7x); the spaces offer
them for longer rows only. Pallas's GPU interpreter has no clusters: these configs run on a GPU
only.

Config knobs, in the row engine's vocabulary: strategy "smem_row" (or "smem_pieces" or
"smem_split", with piece_cols, a power of two from 4096 to 65536, and slots, 2 to 4); block_rows 1 (a block per
row); block_cols, the chunk of the walks (a power of two, 1024 to 8192: 8 to 64 values per
thread); stream_cols (kernels with column inputs), 1 to copy the column inputs in chunk by
chunk, double-buffered, as the map reaches them, instead of whole beside the row: less shared
memory a block, so more blocks (warpgroups) per SM; their copies hit L2 after the first rows
(a cluster's blocks stream their runs of the column inputs the same way: layer norm at 2048 x
131072 in 8 blocks, 348 us against 412 us with the runs staged whole, on the H200); or 2 to load
each chunk of them straight from global memory into registers in the map, no shared memory and
no bulk copies: plain loads, as torch.compile's loads of the weight, the first chunk's issued
before the walks and each next chunk's before the map of this one, so that they overlap its work;
whole chunks only (block_cols divides the row). On the H200: layer norm at 16384 x 16384 269 us
in 8192-column chunks against 287 streamed, at 2048 x 131072 in 4 blocks 328 against 345; rms
norm at 2048 x 131072 287 against 306; rms norm at 16384 columns and the 4096-row norms ran
faster staged whole (BENCHMARKS.md);
window_align (rows not of whole 128-byte units), 16 or 128: the bytes an odd-width row's window
starts on, or None (the default) for the rule above;
approx_math, 1 to let Mosaic GPU use the approximate exp, log and rsqrt (`ex2.approx`: a few
ulp of float32, well within the farm's tolerances; the numerics check of every trial still
applies); cluster (smem_row, kernels with a merge or walks that combine), the blocks sharing a row.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import mgpu_launch
from kernels.lowering import Platform
from kernels.rows.config import check_pow2, from_dict
from kernels.rows.contract import StagedMath
from kernels.rows.kernel import RowKernel

TARGET = "gpu-mosaic"
STRATEGY = "smem_row"  # a block per row, the row staged whole
PIECES = "smem_pieces"  # a block per row, the row streamed through slots in pieces (kernels with merge)
SPLIT = "smem_split"  # a block per row, its head staged, its tail streamed twice (maps with merge)
STRATEGIES = (STRATEGY, PIECES, SPLIT)
PIECE_COLS = (4096, 65536)  # piece_cols bounds
SLOTS = (2, 4)  # slots bounds: pieces in shared memory at once
CLUSTERS = (1, 8)  # cluster bounds (smem_row): blocks of one cluster sharing a row (8: the portable maximum)
DEFAULT_PIECE = (16384, 3)  # piece_cols and slots of the default for rows too long to stage whole
DEFAULT_SPLIT = (8192, 2)  # the same for smem_split: small slots leave the head most of shared memory
VECTOR_BYTES = 16  # what a bulk copy's addresses and sizes are multiples of
COPY_BYTES = 128  # a copy into shared memory moves a multiple of this (one byte count per thread)
WINDOW_ALIGNS = (VECTOR_BYTES, COPY_BYTES)  # window_align: what an odd-width row's window starts on
WIDE_WINDOW_COLS = 32768  # columns (64 KiB of bf16) from which windows start on COPY_BYTES (window_align None)
# Rows of other byte lengths are read through windows up to 2 x COPY_BYTES longer than the row
# (from 128-byte boundaries; COPY_BYTES + 15 from 16-byte ones): from this many columns on, only
# the last row's window can run past the array.
MIN_UNALIGNED_COLS = 128
CHUNKS = (1024, 8192)  # block_cols bounds: 8 to 64 values per thread
DEFAULT_CHUNK = 4096
# Shared memory a block needs beside the staged arrays: the reductions' scratch and the barriers
# (Mosaic GPU counted 2056 bytes for softmax in JAX 0.10; the margin covers later versions').
SMEM_OVERHEAD = 3072
EXCHANGE_FLOATS = 32  # a clustered block's exchange buffer (shared memory): every block's statistics
STREAMED, DIRECT = 1, 2  # stream_cols: through two shared-memory slots; straight from global memory
STREAM_COLS = (0, STREAMED, DIRECT)
F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class StagedRowConfig:
    """A block per row (block_rows 1), the row staged in shared memory (strategy "smem_row"),
    walked in register chunks of block_cols columns; column inputs staged whole beside it
    (stream_cols 0) or chunk by chunk, double-buffered, as the map reaches them (stream_cols 1), or
    loaded chunk by chunk from global memory in the map (stream_cols 2).
    Strategy "smem_pieces" (kernels with a merge and a result) streams the row through `slots`
    slots of piece_cols columns instead; "smem_split" (a merge and a map) stages the row's head
    and streams its tail through the slots twice; smem_row ignores piece_cols and slots.
    cluster > 1 (smem_row, kernels with a merge or walks that combine): the row split over that
    many blocks of a cluster, each staging a run of whole chunks (and of the column inputs, whole
    or streamed)."""

    block_cols: int
    block_rows: int = 1
    strategy: str = STRATEGY
    approx_math: int = 0
    stream_cols: int = 0
    piece_cols: int = DEFAULT_PIECE[0]
    slots: int = DEFAULT_PIECE[1]
    cluster: int = 1
    window_align: int | None = None

    def __post_init__(self) -> None:
        if self.approx_math not in (0, 1):
            raise ValueError(f"approx_math must be 0 or 1 on {TARGET}, got {self.approx_math!r}")
        if self.stream_cols not in STREAM_COLS:
            raise ValueError(f"stream_cols must be one of {STREAM_COLS} on {TARGET} (0 staged whole, 1 streamed "
                             f"through shared memory, {DIRECT} loaded from global memory), got {self.stream_cols!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES} on {TARGET}, got {self.strategy!r}")
        check_pow2("piece_cols", self.piece_cols, PIECE_COLS)
        if not SLOTS[0] <= self.slots <= SLOTS[1]:
            raise ValueError(f"slots must be in [{SLOTS[0]}, {SLOTS[1]}], got {self.slots}")
        if not CLUSTERS[0] <= self.cluster <= CLUSTERS[1]:
            raise ValueError(f"cluster must be in [{CLUSTERS[0]}, {CLUSTERS[1]}] on {TARGET}, got {self.cluster}")
        if self.cluster > 1 and self.strategy != STRATEGY:
            raise ValueError(f"cluster > 1 splits a row staged whole ({STRATEGY}) over the blocks of a cluster; "
                             f"{self.strategy} takes cluster 1")
        if self.block_rows != 1:
            raise ValueError(f"block_rows must be 1 on {TARGET} (a block per row), got {self.block_rows}")
        check_pow2("block_cols", self.block_cols, CHUNKS)
        if self.window_align not in (None, *WINDOW_ALIGNS):
            raise ValueError(f"window_align must be one of {WINDOW_ALIGNS} (bytes) or None (by the row's width) on "
                             f"{TARGET}, got {self.window_align!r}")


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
    def unit(self) -> int:
        """Elements in COPY_BYTES: what a window's length is a multiple of."""
        return COPY_BYTES // self.itemsize

    @property
    def align(self) -> int:
        """Elements a window's start is a multiple of: `window_align` bytes, else (None) COPY_BYTES
        for rows of WIDE_WINDOW_COLS columns or more, VECTOR_BYTES for narrower ones."""
        align = self.config.window_align
        if align is None:
            align = COPY_BYTES if self.cols >= WIDE_WINDOW_COLS else VECTOR_BYTES
        return align // self.itemsize

    @property
    def window(self) -> int:
        """Elements copied in per row: the row, or a span of whole COPY_BYTES that covers it from
        the row's start rounded down to COPY_BYTES."""
        if self.aligned:
            return self.cols
        return pl.cdiv(self.cols + self.align - 1, self.unit) * self.unit

    @property
    def pieces(self) -> bool:
        """Whether the row streams through shared memory in pieces."""
        return self.config.strategy == PIECES

    @property
    def split(self) -> bool:
        """Whether the row's head is staged and its tail streamed in pieces."""
        return self.config.strategy == SPLIT

    @property
    def head(self) -> int:
        """smem_split: the columns staged whole, in whole chunks: what shared memory holds beside
        the slots, short of the whole row (so that a config is valid at any dtype; where a row
        fits whole, smem_row stages it); 0 for other strategies."""
        if not self.split:
            return 0
        free = (mgpu_launch.SMEM_BYTES - SMEM_OVERHEAD) // self.itemsize - self.config.slots * self.config.piece_cols
        chunk = self.config.block_cols
        return min(max(free, 0), self.cols - 1) // chunk * chunk

    @property
    def clustered(self) -> bool:
        """Whether the row is split over the blocks of a cluster."""
        return self.config.cluster > 1

    @property
    def segment(self) -> int:
        """Columns each block of a cluster stages: the row cut into `cluster` runs of whole
        chunks, the last block's (`last_segment`) shorter when they do not divide it evenly."""
        if not self.clustered:
            return self.cols
        chunk = self.config.block_cols
        return pl.cdiv(pl.cdiv(self.cols, self.config.cluster), chunk) * chunk

    @property
    def last_segment(self) -> int:
        """Columns the last block of a cluster stages."""
        return self.cols - (self.config.cluster - 1) * self.segment

    @property
    def staged(self) -> int:
        """Shared-memory elements per staged array: the window rounded up to whole chunks (a
        piece, when the row streams in pieces or its tail does; a segment, when a cluster
        shares the row)."""
        if self.pieces or self.split:
            return self.config.piece_cols
        if self.clustered:
            return self.segment
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
        return (self.rows - 1) * self.cols // self.align * self.align

    @property
    def last_copied(self) -> int:
        """Elements of the last row's window within the array, in whole COPY_BYTES (the rest,
        fewer than COPY_BYTES, is read element by element)."""
        return (self.rows * self.cols - self.last_base) // self.unit * self.unit

    @property
    def col_staged(self) -> int:
        """Shared-memory elements per column input: the whole staged row, or two chunks."""
        if self.config.stream_cols == DIRECT:
            return 0
        return 2 * self.config.block_cols if self.config.stream_cols == STREAMED else self.staged

    @property
    def footprint(self) -> int:
        """Shared-memory bytes of one block: the row and each column input, staged (and a clustered
        block's exchange buffer)."""
        rows = self.config.slots if self.pieces or self.split else 1
        exchange = EXCHANGE_FLOATS * 4 if self.clustered else 0
        staged = (self.head + rows * self.staged + self.col_inputs * self.col_staged) * self.itemsize
        return staged + exchange + SMEM_OVERHEAD


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
    if typed.stream_cols and not math_.col_inputs:
        raise ValueError(f"{name} has no column inputs to stream: stream_cols must be 0")
    if typed.stream_cols == DIRECT and cols % typed.block_cols:
        raise ValueError(f"{name} on {TARGET}: stream_cols {DIRECT} loads whole chunks of the column inputs from "
                         f"global memory, so block_cols ({typed.block_cols}) must divide the row ({cols} columns); "
                         f"stream_cols 0 or 1 take any")
    if (p.pieces or p.split) and not p.aligned:
        raise ValueError(f"{name} on {TARGET}: {typed.strategy} takes rows of whole {COPY_BYTES}-byte units, not "
                         f"{cols} columns ({cols * itemsize} bytes); {STRATEGY} takes any width that fits")
    if p.pieces:
        if math_.merge is None or math_.result is None:
            raise ValueError(f"{name} cannot stream its rows in pieces: {PIECES} is for per-row reductions "
                             f"whose statistics merge (cross entropy); use {STRATEGY}"
                             f"{f' or {SPLIT}' if math_.merge is not None else ''}")
        if not typed.block_cols <= typed.piece_cols < cols:
            raise ValueError(f"{PIECES}: piece_cols must be at least block_cols ({typed.block_cols}) and "
                             f"shorter than the row ({cols}), got {typed.piece_cols}")
    if p.split:
        if math_.merge is None or math_.apply is None or math_.shift or math_.col_inputs:
            raise ValueError(f"{name} on {TARGET}: {SPLIT} stages a row's head and streams its tail twice; it "
                             f"is for row maps whose statistics merge (softmax), without column inputs or "
                             f"shift; use {STRATEGY}")
        if typed.piece_cols < typed.block_cols:
            raise ValueError(f"{SPLIT}: piece_cols must be at least block_cols ({typed.block_cols}), got "
                             f"{typed.piece_cols}")
        if p.head < typed.block_cols:
            raise ValueError(f"{SPLIT}: a head of at least one chunk ({typed.block_cols} columns) short of the "
                             f"row ({cols} columns) must fit shared memory beside {typed.slots} slots of "
                             f"{typed.piece_cols} columns")
    if p.clustered:
        if not math_.splits:
            raise ValueError(f"{name} on {TARGET}: cluster > 1 splits a row over a cluster's blocks, which "
                             f"merge their statistics; it is for kernels with a merge and no column inputs "
                             f"or shift (softmax, cross entropy) or walks that combine (the norms); use "
                             f"cluster 1")
        if not p.aligned:
            raise ValueError(f"{name} on {TARGET}: cluster > 1 takes rows of whole {COPY_BYTES}-byte units, not "
                             f"{cols} columns ({cols * itemsize} bytes); cluster 1 takes any width that fits")
        if math_.exchanged * typed.cluster > EXCHANGE_FLOATS:
            raise ValueError(f"{name} on {TARGET}: {math_.exchanged} statistics from each of {typed.cluster} "
                             f"blocks do not fit the exchange's {EXCHANGE_FLOATS} floats")
        if p.last_segment < 1:
            raise ValueError(f"cluster {typed.cluster}: a row of {cols} columns cut into runs of whole "
                             f"{typed.block_cols}-column chunks leaves the last block nothing; use a smaller "
                             f"cluster or block_cols")
    if not p.aligned and math_.col_inputs:
        raise ValueError(f"{name} on {TARGET}: rows of {cols} columns ({cols * itemsize} bytes) are not whole "
                         f"{COPY_BYTES}-byte units, which a kernel with column inputs needs "
                         f"(gpu-triton takes any width)")
    if not p.aligned and (cols < MIN_UNALIGNED_COLS or rows * cols + p.window >= 2**31):
        short = (f"at least {MIN_UNALIGNED_COLS} columns" if cols < MIN_UNALIGNED_COLS else
                 f"fewer than 2**31 elements in all, not {rows * cols}")
        raise ValueError(f"{name} on {TARGET}: rows of {cols} columns ({cols * itemsize} bytes, not whole "
                         f"{COPY_BYTES}-byte units) are read through a window, which needs {short} "
                         f"(gpu-triton takes any width)")
    if p.footprint > mgpu_launch.SMEM_BYTES and (p.pieces or p.split):
        raise ValueError(f"{typed.slots} slots of {typed.piece_cols} columns stage {p.footprint} bytes of shared "
                         f"memory; a block has {mgpu_launch.SMEM_BYTES} on sm_90")
    if p.footprint > mgpu_launch.SMEM_BYTES:
        arrays = 1 + (typed.stream_cols == 0) * math_.col_inputs  # staged whole: the row, column inputs
        staged = (mgpu_launch.SMEM_BYTES - SMEM_OVERHEAD) // (arrays * itemsize)
        larger = "; or a cluster of more blocks, each staging a part" if math_.splits and \
            typed.cluster < CLUSTERS[1] else ""
        raise ValueError(f"a row of {cols} columns stages {p.footprint} bytes of shared memory; a "
                         f"block has {mgpu_launch.SMEM_BYTES} on sm_90 (rows up to about "
                         f"{staged - p.config.block_cols} columns{' a block' if p.clustered else ''}{larger})")
    return p


def default_config(math_: StagedMath, shape: tuple[int, ...]) -> dict[str, Any]:
    """Chunks of `default_chunk` columns. Approximate math (`ex2.approx`, as Triton's exp):
    as fast or faster at every shape measured (cross entropy 8192 x 32000: 118 against 142 us).
    Knobs the kernel has: stream_cols with column inputs; with a merge, piece_cols and slots,
    and the rows in pieces (a map: a staged head and a streamed tail, for rows of whole 128-byte
    units) when a float32 row would not fit a block whole; with walks that combine (the norms),
    the cluster knob, and the column inputs streamed, else the fewest blocks of a cluster, when a
    float32 row would not fit a block beside them (when none fits a float32 row, a 16-bit one),
    each block then reading its runs of the column inputs from global memory where the chunks
    divide the row, else streaming them (on the H200, layer norm at 2048 x 131072 in 8 blocks:
    412 us staged whole, 345 streamed, 339 from global memory in 4096-column chunks; rms norm 306
    streamed in 6 blocks, 287 from global memory in 8)."""
    cols = shape[-1]
    chunk = default_chunk(cols)
    config = {"block_rows": 1, "strategy": STRATEGY, "block_cols": chunk, "approx_math": 1}
    if math_.col_inputs:
        config["stream_cols"] = 0
    if math_.splits:
        config["cluster"] = 1
    if math_.merge is not None:
        config.update(piece_cols=DEFAULT_PIECE[0], slots=DEFAULT_PIECE[1])
        if 4 * cols + SMEM_OVERHEAD > mgpu_launch.SMEM_BYTES:
            blocks = _default_cluster(cols, chunk)
            if math_.result is not None:
                config["strategy"] = PIECES
            elif cols % (COPY_BYTES // 2) == 0 and blocks is not None:  # whole 128-byte units
                config.update(cluster=blocks, block_cols=_balanced_chunk(cols, blocks, chunk))
            elif cols % (COPY_BYTES // 2) == 0:
                config.update(strategy=SPLIT, piece_cols=DEFAULT_SPLIT[0], slots=DEFAULT_SPLIT[1])
    elif math_.combines:  # a float32 row too long for a block: column inputs streamed, or a cluster
        changes = ({}, {"stream_cols": 1}, *({"cluster": k} for k in range(2, CLUSTERS[1] + 1)))
        fitting = [change for dtype in (F32, jnp.bfloat16) for change in changes  # else a 16-bit one
                   if _fits(math_, {**config, **change}, shape, dtype)]
        config.update(fitting[0] if fitting else {})
        if config.get("cluster", 1) == 1:
            config.update(_few_rows_cluster(math_, config, shape))
        if config.get("cluster", 1) > 1 and math_.col_inputs:  # the blocks' runs of the column inputs
            # from global memory where the chunks divide the row (no more shared memory than streamed)
            config["stream_cols"] = DIRECT if cols % config["block_cols"] == 0 else STREAMED
    return config


PADDING_SLACK = 1 / 8  # how much longer than 1024-column chunks' a wider chunk's padded row may be


def default_chunk(cols: int) -> int:
    """The widest chunk up to DEFAULT_CHUNK (32 values per thread) whose padded row (the row in
    whole chunks: what a block stages and walks) is at most PADDING_SLACK longer than in
    1024-column chunks. On the H200 (bf16; BENCHMARKS.md): 4096 was the fastest of 1024, 2048
    and 4096 for softmax at 8192 x 32000 and 8192 x 50257 (4% longer padded); where 4096 would
    pad a row by a third or more, 1024 won: softmax at 65536 x 2560 158.6 us against 197.7,
    cross entropy there 104.6 against 134.4, layer norm at 4096 x 5120 22.9 against 31.4."""
    def padded(chunk: int) -> int:
        return pl.cdiv(cols, chunk) * chunk

    widest = min(DEFAULT_CHUNK, max(CHUNKS[0], 1 << max(cols - 1, 1).bit_length()))
    chunks = [CHUNKS[0] << k for k in range((widest // CHUNKS[0]).bit_length())]
    return max(c for c in chunks if padded(c) <= (1 + PADDING_SLACK) * padded(CHUNKS[0]))


FEW_ROWS = 16   # rows (of every batch entry) whose blocks of a cluster of 8 still make one wave on a GPU


def _few_rows_cluster(math_: StagedMath, config: dict[str, Any], shape: tuple[int, ...]) -> dict[str, Any]:
    """For up to FEW_ROWS rows longer than four 1024-column chunks, a row over the most blocks of
    a cluster (up to 8) that each get a chunk or more, in 1024-column chunks (2048 where each of
    8 blocks gets one): a block per row leaves most of the GPU idle. On the H200 (bf16;
    bench/results/h200/device_clock/ln_cluster.txt) layer norm ran 3.3 -> 2.1 us at 4 x 16384
    (XLA 2.0), 5.3 -> 2.6 at 2 x 32768 (XLA 5.9), 2.4 -> 1.9 at 16 x 5120, rms norm 4.5 -> 2.3
    at 2 x 32768 (XLA 3.2); at 4 x 2048, 2 blocks lost (1.5 -> 1.8). In 2048-column chunks
    (bench/results/h200/few_rows_chunk/): layer norm 2.11 -> 2.05 at 4 x 16384, 2.55 -> 2.48 at
    2 x 32768, 2.40 -> 2.34 at 16 x 16384, rms norm 2.29 -> 2.13 at 2 x 32768. No change ({})
    for more rows, shorter rows, or where no cluster fits."""
    rows, cols = math.prod(shape[:-1]), shape[-1]
    if rows > FEW_ROWS or cols <= 4 * CHUNKS[0]:
        return {}
    chunk = 2 * CHUNKS[0] if cols >= CLUSTERS[1] * 2 * CHUNKS[0] else CHUNKS[0]
    for blocks in range(min(CLUSTERS[1], cols // chunk), 1, -1):
        change = {"cluster": blocks, "block_cols": chunk}
        if _fits(math_, {**config, **change}, shape, jnp.bfloat16):
            return change
    return {}


def _fits(math_: StagedMath, config: dict[str, Any], shape: tuple[int, ...], dtype: Any) -> bool:
    """Whether `config` can run `shape` in `dtype`."""
    try:
        plan(math_, config, shape, dtype)
    except (ValueError, NotImplementedError):
        return False
    return True


def _balanced_chunk(cols: int, blocks: int, chunk: int) -> int:
    """`chunk`, or half of it when the runs of whole chunks leave the cluster's last block less
    than 4/5 of a run (the others wait for it at the barrier). Measured on the H200 (softmax,
    bf16, 8192 x 151936 in 5 blocks): 4096-column chunks, the last run 64% of the others, 1551
    us; 2048, 95%, 1481 us. At 8192 x 128256 in 4 blocks (91% either way) 4096 ran 1167 us and
    2048 1203 us."""
    def last_share(size: int) -> float:
        run = pl.cdiv(pl.cdiv(cols, blocks), size) * size
        return (cols - (blocks - 1) * run) / run

    half = chunk // 2
    return half if half >= CHUNKS[0] and last_share(chunk) < 0.8 <= last_share(half) else chunk


def _default_cluster(cols: int, chunk: int) -> int | None:
    """The fewest blocks of a cluster (2 to 8) whose runs of `cols` take at most 64 KiB in 16-bit
    types (three blocks a SM) and fit a block in 32-bit ones; else the fewest that fit; None if
    none. Measured on the H200 (bf16, 8192 rows): 4 blocks at 128256 columns were the fastest
    of 2, 3, 4, 5, 6 and 8; at 151936, 5 blocks (this rule) ran 1481 us in 2048-column chunks
    (`_balanced_chunk`), 6 blocks of 2048-column chunks, the best, 1468 us; smem_split 1812 us."""
    def run(blocks: int) -> int:
        return pl.cdiv(pl.cdiv(cols, blocks), chunk) * chunk

    def fits(blocks: int) -> bool:  # a float32 run, the exchange buffer
        return 4 * (run(blocks) + EXCHANGE_FLOATS) + SMEM_OVERHEAD <= mgpu_launch.SMEM_BYTES

    fitting = [k for k in range(2, CLUSTERS[1] + 1) if cols - (k - 1) * run(k) >= 1 and fits(k)]
    return next((k for k in fitting if 2 * run(k) <= 64 * 1024), fitting[0] if fitting else None)


def _cluster_sync(*steps: str) -> None:
    """Steps of the cluster's hardware barrier (`barrier.cluster`), inlined NVVM ops: "arrive"
    (release semantics: this thread's writes so far, into global memory or a peer's shared
    memory, are ordered before its peers' waits), "arrive_relaxed" (no ordering) and "wait"
    (acquire, for every thread of every block of the cluster). Pallas exposes no such barrier
    (its ClusterBarrier is an mbarrier, without cluster-scope ordering of plain stores)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jaxlib.mlir.dialects import nvvm

    ops = {"arrive": nvvm.cluster_arrive, "arrive_relaxed": nvvm.cluster_arrive_relaxed, "wait": nvvm.cluster_wait}

    @plgpu.inline_mgpu()
    def sync(ctx: Any) -> None:
        del ctx
        for step in steps:
            ops[step](aligned=True)

    sync()


def _send_to_peers(xchg_smem: Any, start: int, width: int, blocks: int) -> None:
    """Copy floats [start + b width, start + b width + width) of this block's `xchg_smem` (b, its
    rank in the cluster) to the same floats of every block's `xchg_smem` (`st.shared::cluster`
    through `mapa`). Mosaic GPU 0.11 cannot lower a scalar store through `plgpu.cluster_ref`
    (the indexed peer ref's offset is lost), hence the NVVM-level copy, inlined."""
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, gpu, memref

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
    def send(ctx: Any, ref: Any) -> None:
        del ctx
        index = ir.IndexType.get()

        def const(value: int) -> Any:
            return arith.constant(index, value)

        rank = gpu.cluster_block_id(gpu.Dimension.x)
        first = arith.addi(arith.muli(rank, const(width)), const(start))
        positions = [arith.addi(first, const(i)) for i in range(width)]
        values = [memref.load(ref, [at]) for at in positions]
        for peer in range(blocks):
            peer_ref = mgpu_utils.get_cluster_ref(ref, gpu.Dimension.x, const(peer), generic=False)
            for at, value in zip(positions, values):
                memref.store(value, peer_ref, [at])

    send(xchg_smem)


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
    rows, C, chunk, V, A = p.rows, p.cols, p.config.block_cols, p.vector, p.align
    n_chunks = p.staged // chunk
    n_cols, n_vectors = math_.col_inputs, math_.vector_inputs
    stream, direct = p.config.stream_cols == STREAMED, p.config.stream_cols == DIRECT
    staged_cols = p.config.stream_cols == 0  # the column inputs copied in whole, waited for before the map
    full_chunks, tail = divmod(C, chunk)  # column inputs' chunks (streamed): whole ones, then the rest
    # Every copy stays within its array, so Mosaic GPU issues a bulk copy (a tiled TMA copy
    # would move at most 256 elements along a dimension).
    in_bounds = plgpu.OOBFillMode.PROMISE_IN_BOUNDS

    def chunk_at(ref: Any, j: Any) -> Any:
        return ref.at[pl.ds(j * chunk, chunk)]

    # Shared memory of the column inputs (none when they are read from global memory) and the
    # barrier their copies arrive at (two slots' when streamed).
    n_staged = 0 if direct else n_cols
    col_buffers = [plgpu.SMEM((p.col_staged,), dtype) for _ in range(n_staged)]
    cols_loaded = [plgpu.Barrier(num_arrivals=n_cols, num_barriers=2 if stream else 1)] if n_staged else []

    def column_streamer(col_gmems: Any, col_smems: Any, cols_loaded: Any, start: Any, whole: Any,
                        rest: int) -> Callable[[Any], None]:
        """load(j): chunk j of every column input's run that starts at column `start` (whole chunks
        while j < whole, then `rest` columns at j == whole) into slot j % 2 of its shared buffer,
        arriving at cols_loaded[j % 2]. Call it for the run's chunks only."""
        def load(j: Any) -> None:
            slot = lax.rem(j, 2)
            for size, when in ((chunk, j < whole), (rest, j == whole)):
                if size:
                    @pl.when(when)
                    def _(size=size):
                        plgpu.commit_smem()  # the slot's last reads (chunk j - 2) are done
                        for col_gmem, col_smem in zip(col_gmems, col_smems):
                            plgpu.copy_gmem_to_smem(col_gmem.at[pl.ds(start + j * chunk, size)],
                                                    col_smem.at[pl.ds(slot * chunk, size)],
                                                    cols_loaded.at[slot], oob_mode=in_bounds)
        return load

    def column_chunks(col_gmems: Any, col_smems: Any, cols_loaded: Any, start: Any, whole: Any, rest: int,
                      chunks: Any) -> Callable[[Any], list[jax.Array]]:
        """at(j): chunk j of every column input's run that starts at column `start`, for the map:
        from its whole staged copy (stream_cols 0, copied in and waited for by the caller); from
        two shared slots (1: chunk 0 copied in now, chunk j + 1, while j + 1 < chunks, as chunk j
        is taken; `column_streamer` with whole and rest); both float32. Or from global memory (2:
        whole chunks, in their own dtype, which `map_chunks` converts)."""
        if direct:  # as loaded (not float32): `map_chunks` holds the next chunk's in registers
            return lambda j: [c.at[pl.ds(start + j * chunk, chunk)][...] for c in col_gmems]
        if not stream:
            return lambda j: [chunk_at(c, j)[...].astype(F32) for c in col_smems]
        load = column_streamer(col_gmems, col_smems, cols_loaded, start, whole, rest)
        load(0)

        def at(j: Any) -> list[jax.Array]:
            pl.when(j + 1 < chunks)(lambda: load(j + 1))
            plgpu.barrier_wait(cols_loaded.at[lax.rem(j, 2)])
            return [chunk_at(c, lax.rem(j, 2))[...].astype(F32) for c in col_smems]
        return at

    def map_chunks(x_smem: Any, stats: Any, first: Any, last: Any, cols_at: Callable[[Any], list[jax.Array]],
                   ahead: list[jax.Array] | None = None) -> None:
        """Chunks [first, last) of the staged row mapped in place by `apply`, with the column
        inputs' same chunks (`column_chunks`). Read from global memory (stream_cols 2), chunk
        j + 1's are loaded before chunk j is mapped, so that their loads overlap its work;
        `ahead`, chunk `first`'s, loaded by the caller before the walks, when given."""
        if direct:
            def apply_ahead(j: Any, cols: list[jax.Array]) -> list[jax.Array]:
                following = cols_at(jnp.minimum(j + 1, last - 1))
                ref = chunk_at(x_smem, j)
                ref[...] = math_.apply(ref[...].astype(F32), stats, *(c.astype(F32) for c in cols)).astype(dtype)
                return following

            lax.fori_loop(first, last, apply_ahead, cols_at(first) if ahead is None else ahead)
            return

        def apply(j: Any, carry: Any) -> Any:
            ref = chunk_at(x_smem, j)
            cols = cols_at(j)
            ref[...] = math_.apply(ref[...].astype(F32), stats, *cols).astype(dtype)
            return carry

        lax.fori_loop(first, last, apply, 0)

    def walk_span(x_smem: Any, head: Any, length: Any, unaligned: bool, shortest: int | None = None,
                  shift: jax.Array | None = None,
                  exchange: Callable[[int, Any], Any] | None = None) -> tuple[jax.Array, ...]:
        """The walks' statistics of `length` columns staged from position `head` of x_smem.
        A traced `length` (a cluster's blocks stage runs of two lengths) needs `shortest`, the
        least it can be; chunks are walked up to the longest, x_smem's size. `shift` replaces the
        span's first element as the shift (`StagedMath.shift`); `exchange(i, value)`, when given,
        turns walk i's value for the span into the row's (a cluster's blocks combining theirs),
        which is then finished for the whole row."""
        if shortest is None:
            shortest, spanned = length, pl.cdiv(length + (A - 1 if unaligned else 0), chunk)
        else:
            spanned = x_smem.shape[0] // chunk
        # Chunks that may hold positions outside the span (before it: the first, when unaligned;
        # after it: those reaching past the shortest offset + length), masked to `pad` once and
        # walked with a validity mask; the rest are walked in one loop.
        edge_chunks = sorted({j for j in range(spanned) if (j + 1) * chunk > shortest} | ({0} if unaligned else set()))
        loop_end = min([j for j in edge_chunks if j > 0], default=spanned)

        def valid_at(j: int) -> jax.Array:
            position = _positions(chunk, dtype, platform.interpret) + j * chunk
            return (position >= head) & (position < head + length)

        for j in edge_chunks:
            ref = chunk_at(x_smem, j)
            ref[...] = jnp.where(valid_at(j), ref[...].astype(F32), math_.pad).astype(dtype)

        if math_.shift:
            stats: tuple[jax.Array, ...] = (x_smem[head].astype(F32) if shift is None else shift,)
        else:
            stats = ()
        for i, walk in enumerate(math_.walks):
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
            value = walk.across(acc) if exchange is None else exchange(i, walk.across(acc))
            cols = length if exchange is None else C
            stats = (*stats, value if walk.finish is None else walk.finish(value, stats, cols))
        return stats

    def pieces_body(x_gmem, *refs):
        """smem_pieces: the row streams through `slots` slots of P columns; each piece is walked,
        its slot refilled with the piece `slots` further on, and its statistics merged."""
        vector_gmems, o_gmem = refs[:-1], refs[-1]
        row = lax.axis_index("rows")
        P, S = p.config.piece_cols, p.config.slots
        n_pieces = pl.cdiv(C, P)
        tail = C - (n_pieces - 1) * P

        def scoped(slot_smem, loaded):
            def load(k: Any, slot: Any) -> None:
                """Piece k into `slot`: P columns, or the tail for the last piece."""
                def copy(size: int) -> None:
                    plgpu.commit_smem()  # the slot's last reads (the walks of piece k - S) are done
                    plgpu.copy_gmem_to_smem(x_gmem.at[row, pl.ds(k * P, size)], slot_smem.at[slot, pl.ds(0, size)],
                                            loaded.at[slot], oob_mode=in_bounds)
                if isinstance(k, int):
                    if k < n_pieces:
                        copy(P if k < n_pieces - 1 else tail)
                    return
                pl.when(k < n_pieces - 1)(lambda: copy(P))
                pl.when(k == n_pieces - 1)(lambda: copy(tail))

            for k in range(min(S, n_pieces)):
                load(k, k)
            vectors = tuple(v[row] for v in vector_gmems)

            def piece(k: Any, slot: Any, length: int) -> tuple[jax.Array, ...]:
                plgpu.barrier_wait(loaded.at[slot])
                stats = walk_span(slot_smem.at[slot], 0, length, False)
                load(k + S, slot)
                return stats

            total = piece(0, 0, P)
            total = lax.fori_loop(1, n_pieces - 1, lambda k, t: math_.merge(t, piece(k, lax.rem(k, S), P)), total)
            total = math_.merge(total, piece(n_pieces - 1, (n_pieces - 1) % S, tail))
            o_gmem[row] = math_.result(total, lambda i: x_gmem[row, i].astype(F32), *vectors, cols=C)

        pl.run_scoped(scoped, plgpu.SMEM((S, P), dtype), plgpu.Barrier(num_arrivals=1, num_barriers=S))

    def split_body(x_gmem, o_gmem):
        """smem_split: the row's head (H columns) is copied into shared memory in one bulk copy
        while its tail streams through `slots` slots of P columns twice: 2n visits of its n
        pieces, the first n walked for statistics, the last n mapped and written back, each slot
        refilled S visits on. Between the passes the head is walked and the statistics merged;
        the head is mapped and written last, as the tail's writes drain."""
        row = lax.axis_index("rows")
        P, S, H = p.config.piece_cols, p.config.slots, p.head
        n = pl.cdiv(C - H, P)
        last = C - H - (n - 1) * P  # the tail's last piece
        visits = 2 * n

        def scoped(head_smem, slot_smem, head_loaded, loaded):
            def load(v: Any, slot: Any) -> None:
                """Visit v's piece (v mod n) into `slot`; nothing past the last visit."""
                def copy(k: Any, size: int) -> None:
                    plgpu.commit_smem()  # the slot's last reads (visit v - S, or its write-back) are done
                    plgpu.copy_gmem_to_smem(x_gmem.at[row, pl.ds(H + k * P, size)], slot_smem.at[slot, pl.ds(0, size)],
                                            loaded.at[slot], oob_mode=in_bounds)
                if isinstance(v, int):
                    if v < visits:
                        copy(v % n, P if v % n < n - 1 else last)
                    return
                k = lax.rem(v, n)
                pl.when((v < visits) & (k < n - 1))(lambda: copy(k, P))
                pl.when((v < visits) & (k == n - 1))(lambda: copy(k, last))

            plgpu.copy_gmem_to_smem(x_gmem.at[row, pl.ds(0, H)], head_smem, head_loaded, oob_mode=in_bounds)
            for v in range(min(S, visits)):
                load(v, v)

            def walked(v: Any, slot: Any, size: int) -> tuple[jax.Array, ...]:
                plgpu.barrier_wait(loaded.at[slot])
                stats = walk_span(slot_smem.at[slot], 0, size, False)
                load(v + S, slot)
                return stats

            tail = walked(0, 0, P if n > 1 else last)
            if n > 2:
                tail = lax.fori_loop(1, n - 1, lambda v, t: math_.merge(t, walked(v, lax.rem(v, S), P)), tail)
            if n > 1:
                tail = math_.merge(tail, walked(n - 1, (n - 1) % S, last))
            plgpu.barrier_wait(head_loaded)
            head = walk_span(head_smem, 0, H, False)
            row_stats = math_.merge(head, tail)
            head_stats = row_stats if math_.rebase is None else math_.rebase(head, row_stats)

            def mapped(x: jax.Array) -> jax.Array:
                """A chunk of the row as read (f32) mapped to the output: the walks' rewrites, then apply."""
                for walk in math_.walks:
                    if walk.rewrite is not None:
                        x = walk.rewrite(x, row_stats)
                return math_.apply(x, row_stats)

            def written(v: Any, slot: Any, size: int) -> None:
                plgpu.barrier_wait(loaded.at[slot])
                piece = slot_smem.at[slot]

                def map_chunk(j: Any, carry: int) -> int:
                    ref = chunk_at(piece, j)
                    ref[...] = mapped(ref[...].astype(F32)).astype(dtype)
                    return carry

                lax.fori_loop(0, pl.cdiv(size, chunk), map_chunk, 0)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(piece.at[pl.ds(0, size)], o_gmem.at[row, pl.ds(H + (v - n) * P, size)])
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # read out before the slot is refilled
                load(v + S, slot)

            if n > 1:
                lax.fori_loop(n, visits - 1, lambda v, c: (written(v, lax.rem(v, S), P), c)[1], 0)
            written(visits - 1, (visits - 1) % S, last)

            def map_head(j: Any, carry: int) -> int:
                ref = chunk_at(head_smem, j)
                ref[...] = math_.apply(ref[...].astype(F32), head_stats).astype(dtype)
                return carry

            lax.fori_loop(0, H // chunk, map_head, 0)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(head_smem, o_gmem.at[row, pl.ds(0, H)])
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the write read out: the block may end

        pl.run_scoped(scoped, plgpu.SMEM((H,), dtype), plgpu.SMEM((S, P), dtype), plgpu.Barrier(num_arrivals=1),
                      plgpu.Barrier(num_arrivals=1, num_barriers=S))

    def cluster_body(x_gmem, *refs):
        """smem_row over a cluster: block k of the row's cluster stages columns [k S, k S + S) (the
        last block the rest) and its run of the column inputs (whole, or streamed: stream_cols).
        Kernels with a merge walk the run and send its statistics to every block of the cluster:
        each block stores them into its part of every block's exchange buffer in shared memory
        (`_send_to_peers`); after the cluster's barrier (release, then acquire: every block's stores
        are seen by all) each block reads its own buffer, in block order, so that every block merges
        the same values the same way. Kernels whose walks combine exchange each walk's value the
        same way, one barrier a walk, and finish it for the whole row (the shift, if any, is the
        row's first element, read from global memory). Then each block maps its run and writes it
        back, or block 0 writes the row's result. A block arrives at the barrier as it starts and
        waits before its first store to a peer, whose shared memory exists only once it runs.
        (Measured on the H200: 2-7% faster than an exchange through a line of global memory a row.)"""
        col_gmems, vector_gmems = refs[:n_cols], refs[n_cols:n_cols + n_vectors]
        o_gmem = refs[-1]
        row, block = lax.axis_index("rows"), lax.axis_index("cluster")
        K, S, L = p.config.cluster, p.segment, p.last_segment
        last_block = block == K - 1

        def each_run(f: Callable[[int], None]) -> None:
            """f(columns of this block's run), for runs of S and for the last block's L."""
            if L == S:
                return f(S)
            pl.when(block < K - 1)(lambda: f(S))
            pl.when(block == K - 1)(lambda: f(L))

        def scoped(x_smem, col_smems, loaded, cols_loaded, xchg_smem):
            _cluster_sync("arrive_relaxed")  # this block has started
            started: list[bool] = []

            def exchanged(base: int, values: Any) -> list[Any]:
                """Every block's `values` (a tuple of floats, or of tuples of them: floats base..
                of a block's part of the exchange), in block order, once all blocks have sent theirs."""
                leaves, tree = jax.tree.flatten(values)
                width = len(leaves)
                if not started:  # every block has started: its shared memory can be written
                    _cluster_sync("wait")
                    started.append(True)
                for i, value in enumerate(leaves):
                    xchg_smem[base + block * width + i] = value.astype(F32)
                _send_to_peers(xchg_smem, base, width, K)
                _cluster_sync("arrive", "wait")  # every block's values sent, and seen
                return [jax.tree.unflatten(tree, [xchg_smem[base + k * width + i] for i in range(width)])
                        for k in range(K)]

            def combined(i: int, value: Any) -> Any:
                """Walk i's value for the whole row: every block's, combined in block order."""
                walk = math_.walks[i]
                base = K * sum(w.width for w in math_.walks[:i])
                parts = exchanged(base, tuple(value) if isinstance(value, tuple) else (value,))
                return functools.reduce(walk.combine, parts if isinstance(value, tuple) else [p[0] for p in parts])

            each_run(lambda size: plgpu.copy_gmem_to_smem(x_gmem.at[row, pl.ds(block * S, size)],
                                                          x_smem.at[pl.ds(0, size)], loaded, oob_mode=in_bounds))
            cols_at = column_chunks(col_gmems, col_smems, cols_loaded, block * S,
                                    jnp.where(last_block, L // chunk, S // chunk), L % chunk,
                                    jnp.where(last_block, pl.cdiv(L, chunk), S // chunk))
            ahead = cols_at(0) if direct and math_.result is None else None  # in flight through the walks
            for col_gmem, col_smem in zip(col_gmems, col_smems if staged_cols else ()):  # waited for
                each_run(lambda size, c=col_gmem, sm=col_smem: plgpu.copy_gmem_to_smem(
                    c.at[pl.ds(block * S, size)], sm.at[pl.ds(0, size)], cols_loaded, oob_mode=in_bounds))
            vectors = tuple(v[row] for v in vector_gmems)
            shift = x_gmem[row, 0].astype(F32) if math_.shift else None
            plgpu.barrier_wait(loaded)
            length = jnp.where(last_block, L, S)
            if math_.combines:
                scale = walk_span(x_smem, 0, length, False, shortest=L, shift=shift, exchange=combined)
            else:
                run = walk_span(x_smem, 0, length, False, shortest=L)
                total = functools.reduce(math_.merge, exchanged(0, run))  # in block order, the same in every block
                scale = total if math_.rebase is None else math_.rebase(run, total)  # result kernels: total
            if math_.result is not None:
                @pl.when(block == 0)
                def _():
                    o_gmem[row] = math_.result(scale, lambda i: x_gmem[row, i].astype(F32), *vectors, cols=C)
                return
            if n_cols and staged_cols:
                plgpu.barrier_wait(cols_loaded)
            map_chunks(x_smem, scale, 0, pl.cdiv(L, chunk), cols_at, ahead)
            if S > L:  # the last block has no more
                pl.when(block < K - 1)(lambda: map_chunks(x_smem, scale, pl.cdiv(L, chunk), S // chunk, cols_at))
            plgpu.commit_smem()
            each_run(lambda size: plgpu.copy_smem_to_gmem(x_smem.at[pl.ds(0, size)],
                                                          o_gmem.at[row, pl.ds(block * S, size)]))
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the write read out: the block may end

        def allocated(x_smem, *rest):
            col_smems, (loaded, *cols_loaded, xchg_smem) = rest[:n_staged], rest[n_staged:]
            scoped(x_smem, col_smems, loaded, cols_loaded[0] if cols_loaded else None, xchg_smem)

        pl.run_scoped(allocated, plgpu.SMEM((S,), dtype), *col_buffers, plgpu.Barrier(num_arrivals=1),
                      *cols_loaded, plgpu.SMEM((EXCHANGE_FLOATS,), F32))

    def body(x_gmem, *refs):
        if p.clustered:
            return cluster_body(x_gmem, *refs)
        if p.pieces:
            return pieces_body(x_gmem, *refs)
        if p.split:
            return split_body(x_gmem, *refs)
        col_gmems, vector_gmems, o_gmem = refs[:n_cols], refs[n_cols:n_cols + n_vectors], refs[-1]
        row = lax.axis_index("rows")

        def scoped(x_smem, col_smems, loaded, cols_loaded):
            if p.aligned:
                head, start = 0, row * C
                plgpu.copy_gmem_to_smem(x_gmem.at[row], x_smem.at[pl.ds(0, C)], loaded, oob_mode=in_bounds)
            else:  # a window of the flattened rows, from the row's start rounded down to window_align bytes
                start = row * C
                base = lax.div(start, A) * A
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
            cols_at = column_chunks(col_gmems, col_smems, cols_loaded, 0, full_chunks, tail, n_chunks)
            ahead = cols_at(0) if direct and math_.result is None else None  # in flight through the walks
            for col_gmem, col_smem in zip(col_gmems, col_smems if staged_cols else ()):
                plgpu.copy_gmem_to_smem(col_gmem, col_smem.at[pl.ds(0, C)], cols_loaded, oob_mode=in_bounds)
            vectors = tuple(v[row] for v in vector_gmems)
            plgpu.barrier_wait(loaded)

            stats = walk_span(x_smem, head, C, not p.aligned)

            if math_.result is not None:
                o_gmem[row] = math_.result(stats, lambda i: x_smem[head + i].astype(F32), *vectors, cols=C)
                return
            if n_cols and staged_cols:
                plgpu.barrier_wait(cols_loaded)
            map_chunks(x_smem, stats, 0, n_chunks, cols_at, ahead)
            plgpu.commit_smem()
            if p.aligned:
                plgpu.copy_smem_to_gmem(x_smem.at[pl.ds(0, C)], o_gmem.at[row])
            else:
                # The aligned interior in one bulk copy, the ends element by element.
                lead = lax.rem(V - lax.rem(head, V), V)  # elements before the row's first 16-byte boundary
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
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the write read out: the block may end

        def allocated(x_smem, *rest):
            col_smems = rest[:n_staged]
            scoped(x_smem, col_smems, rest[n_staged], rest[n_staged + 1] if cols_loaded else None)

        pl.run_scoped(allocated, plgpu.SMEM((p.staged,), dtype), *col_buffers, plgpu.Barrier(num_arrivals=1),
                      *cols_loaded)

    if math_.result is not None:
        out = jax.ShapeDtypeStruct((rows,), F32)
    else:
        out = jax.ShapeDtypeStruct((rows, C) if p.aligned else (rows * C,), dtype)
    params = plgpu.CompilerParams(approx_math=bool(p.config.approx_math))
    if p.clustered and platform.interpret:
        raise NotImplementedError(f"{math_.name}: cluster > 1 runs on a GPU only (Pallas's GPU interpreter has "
                                  f"no clusters)")
    cluster = dict(cluster=(p.config.cluster,), cluster_names=("cluster",)) if p.clustered else {}
    call = mgpu_launch.mosaic_kernel(body, platform=platform, out_shape=[out], grid=(rows,),
                                     grid_names=("rows",), compiler_params=params, name=math_.name, **cluster)

    def run(x: jax.Array, *others: jax.Array) -> jax.Array:
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"{math_.name} was built for shape {tuple(shape)}, got {tuple(x.shape)}")
        if len(others) != n_cols + n_vectors:
            raise ValueError(f"{math_.name} takes x, {n_cols} column and {n_vectors} per-row inputs, "
                             f"got {1 + len(others)} arrays")
        cols = [c.astype(dtype).reshape(C) for c in others[:n_cols]]
        vectors = [v.astype(jnp.int32).reshape(rows) for v in others[n_cols:]]
        y = call(x.reshape(rows, C) if p.aligned else x.reshape(-1), *cols, *vectors)[0]
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
        return default_config(math_, shape) if target == TARGET else kernel.default_config(shape, target)

    def build_(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform) -> Any:
        """The Pallas kernel of `config`: the staged rows, or the row engine's strategies."""
        if platform.target == TARGET:
            return build(math_, config, shape, dtype, platform)
        return kernel.build(config, shape, dtype, platform)

    return check_config, footprint, default_config_, build_
