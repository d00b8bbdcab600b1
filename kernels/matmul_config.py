"""The matmul core's problem and its typed configs: one frozen dataclass per target.

Each config class holds its knobs' defaults, their legality (`validate` for the knobs alone,
`check(problem, dtype)` for the rest), its on-chip footprint and its default for a problem.
The knobs themselves are documented in `kernels.matmul_core`.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, NamedTuple, Self

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import mgpu_launch
from kernels.knobs import ConfigError, Knobs, Unsupported, parse, refusal
from kernels.lowering import round_up, triton_dot_buffers
from kernels.mgpu_launch import defaults_shared_memory
from kernels.rows.config import is_pow2


def _identity(acc: jax.Array) -> jax.Array:
    return acc


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What happens to an f32 accumulator tile before it is cast and stored.

    fn(acc, *vectors): acc is an (r, c) f32 tile; each vector is an input of length n, sliced to
    the tile's columns and broadcast to (r, c) f32. full_rows: fn needs whole rows (c == n).
    row_stats: the kernel also returns per-tile row statistics of the f32 product (before fn),
    a (2, n // tile_n, m') f32 array: [0] each row's sum over one tile's tile_n columns, [1] its
    sum of squared deviations from that tile's mean; `combine_row_stats` turns them into each
    row's mean and variance over all n (a split reduction: no program needs whole rows). m' >= m:
    the rows are the kernel's whole row tiles; those past m hold nothing (TMA's 1-D stores of a
    ragged tile's statistics ran on into the next tile's row on the H200: rows 0 to 71 wrong at
    m = 3000 in tiles of 128, thirty-second session), so consumers read the first m.
    """

    fn: Callable[..., jax.Array] = _identity
    vectors: int = 0
    full_rows: bool = False
    row_stats: bool = False


def row_moments(sums: jax.Array, squares: jax.Array, first: jax.Array, n: int,
                keepdims: bool = False, valid: jax.Array | None = None,
                tiles: int | None = None) -> tuple[jax.Array, jax.Array]:
    """(mean, variance) of rows of n columns from per-tile sums and squared deviations, (tiles, ...)
    with the tiles on axis 0, and `first`, each row's sum over its first tile. With `valid` (a
    mask along axis 0) only those of the arrays' entries are the row's `tiles` tiles.

    One pass over the tiles: the sum and the sum of squares of each row about a shift, its first
    tile's mean, which is exact in real arithmetic and cancels only (mean - shift)^2, not mean^2
    as E[x^2] - E[x]^2 would."""
    tile = n // (tiles or sums.shape[0])
    shift = first / tile
    about = sums - tile * shift  # each tile's sum about the shift
    if valid is not None:
        about, squares = jnp.where(valid, about, 0.0), jnp.where(valid, squares, 0.0)
    total = jnp.sum(about, axis=0, keepdims=keepdims)
    spread = jnp.sum(squares + about * about / tile, axis=0, keepdims=keepdims)  # M2 + tile (mean - shift)^2
    return shift + total / n, (spread - total * total / n) / n


def combine_row_stats(stats: jax.Array, n: int, m: int | None = None) -> tuple[jax.Array, jax.Array]:
    """(mean, variance) of each of the first m rows (all, by default) of n columns from per-tile
    `Epilogue.row_stats`, a (2, tiles, m') array (`row_moments`; one reduction, which XLA fuses
    into one kernel, the slice included)."""
    stats = stats if m is None else stats[..., :m]
    return row_moments(stats[0], stats[1], stats[0, 0], n)


@dataclasses.dataclass(frozen=True)
class Problem:
    """C = epilogue(A @ B): A (m, k) or (batch, m, k); B (k, n), or (batch, k, n) unless shared_b."""

    m: int
    n: int
    k: int
    batch: int = 0
    shared_b: bool = False
    epilogue: Epilogue = Epilogue()
    out_dtype: Any = None  # None: the input dtype

    @property
    def batched_b(self) -> bool:
        """Whether B has a batch dimension."""
        return self.batch > 0 and not self.shared_b

    def out_shape(self, dtype: Any) -> jax.ShapeDtypeStruct:
        """The output's shape and dtype."""
        lead = (self.batch,) if self.batch else ()
        return jax.ShapeDtypeStruct(lead + (self.m, self.n), jnp.dtype(self.out_dtype or dtype))


def fit(dim: int, preferred: int, align: int) -> int:
    """The largest of preferred, preferred/2, ... (down to preferred/8, at least align) dividing
    dim; if none does, preferred, or dim rounded up to align when that is smaller: a ragged last
    tile (padded, or run part-empty) costs less than tiles too small to use the chip (3000 rows
    on TPU: 256-row tiles over 3072, not 8-row tiles)."""
    block = preferred
    while block >= max(align, preferred // 8):
        if dim % block == 0:
            return block
        block //= 2
    return min(preferred, round_up(dim, align))


def _sizes(problem: Problem, dtype: Any) -> tuple[int, int]:
    return jnp.dtype(dtype).itemsize, jnp.dtype(problem.out_dtype or dtype).itemsize


@dataclasses.dataclass(frozen=True)
class MatmulConfig(Knobs):
    """Knobs of every target: the tile and epi_n (epilogue sub-tile columns; None: the whole tile)."""

    block_m: int
    block_n: int
    block_k: int
    epi_n: int | None = None

    # (preferred, align) of block_m, block_n and block_k in `default` (see `fit`); per target.
    DEFAULT_TILES: ClassVar[tuple[tuple[int, int], ...]] = ()
    # Whether this target's kernel implements `Epilogue.row_stats`.
    ROW_STATS: ClassVar[bool] = False

    def validate(self) -> None:
        """Tiles are positive."""
        if min(self.block_m, self.block_n, self.block_k, 1 if self.epi_n is None else self.epi_n) < 1:
            raise ConfigError(f"blocks must be positive, got {self.to_dict()}")

    def program_tile(self) -> tuple[int, int]:
        """(rows, columns) of C one program computes."""
        return self.block_m, self.block_n

    def padded(self, problem: Problem, dtype: Any) -> Problem:
        """The problem this target's kernel runs: m, n and k rounded up to whole tiles (n kept
        when the epilogue needs whole rows). `matmul_core.build` pads the inputs with zeros to
        it and slices the product back, so any shape takes any tile: the zeros add nothing to
        the sums, and the rows and columns past the problem's are dropped."""
        (bm, bn), bk = self.program_tile(), self.block_k
        n = problem.n if problem.epilogue.full_rows else round_up(problem.n, bn)
        return dataclasses.replace(problem, m=round_up(problem.m, bm), n=n, k=round_up(problem.k, bk))

    def check(self, problem: Problem, dtype: Any) -> None:
        """Refuse an epilogue sub-tile that does not divide the tile, a tile short of whole rows
        for an epilogue needing them, and row statistics where the kernel keeps none. Tiles need
        not divide the problem (see `padded`)."""
        bn = self.program_tile()[1]
        if problem.epilogue.full_rows and bn != problem.n:
            raise ConfigError(f"this epilogue needs whole rows: block_n must be n = {problem.n}, got {bn}")
        epi_n = bn if self.epi_n is None else self.epi_n
        if bn % epi_n:
            raise ConfigError(f"epi_n = {epi_n} must divide block_n = {bn}")
        if problem.epilogue.full_rows and epi_n != bn:
            raise ConfigError("this epilogue needs whole rows: epi_n must equal block_n")
        if problem.epilogue.row_stats and (not self.ROW_STATS or problem.batch):
            raise Unsupported(f"{type(self).__name__}: row statistics are implemented for unbatched "
                              "Mosaic GPU matmuls only")
        if problem.epilogue.row_stats and (problem.n % bn or self.padded(problem, dtype).n != problem.n):
            raise ConfigError(f"row statistics are kept per whole tile of real columns: block tiles of {bn} "
                              f"columns must divide n = {problem.n}")

    @classmethod
    def default(cls, problem: Problem, dtype: Any = jnp.bfloat16) -> Self:
        """Tiles as large as DEFAULT_TILES prefers, dividing the problem where one does (`fit`; all
        of n when the epilogue needs whole rows); every other knob at its default. dtype: the
        inputs' (the targets whose tiles it sizes say so)."""
        (m, m_align), (n, n_align), (k, k_align) = cls.DEFAULT_TILES
        full = problem.epilogue.full_rows
        return cls(fit(problem.m, m, m_align), problem.n if full else fit(problem.n, n, n_align),
                   fit(problem.k, k, k_align))


@dataclasses.dataclass(frozen=True)
class TpuMatmulConfig(MatmulConfig):
    """Mosaic TPU: the K strategy, its tile buffers, and epi_m (None: block_m)."""

    k_strategy: Literal["grid", "emit_pipeline", "resident"] = "grid"
    buffers: int = 2
    epi_m: int | None = None

    # The default: the K loop as a grid axis (k_strategy's default), tiles up to 256 x 256 x 512.
    DEFAULT_TILES = ((256, 8), (256, 128), (512, 128))
    # Mosaic's own pipeline takes 1 or 2 buffers; emit_pipeline 2 or 3.
    BUFFERS = {"grid": (1, 2), "resident": (1, 2), "emit_pipeline": (2, 3)}

    def validate(self) -> None:
        """buffers within what the K strategy's pipeline takes."""
        super().validate()
        low, high = self.BUFFERS[self.k_strategy]
        if not low <= self.buffers <= high:
            raise Unsupported(f"k_strategy {self.k_strategy!r} takes buffers in {(low, high)}, got {self.buffers}")

    def epilogue_tile(self) -> tuple[int, int]:
        """(epi_m, epi_n) with their defaults resolved."""
        return (self.block_m if self.epi_m is None else self.epi_m,
                self.block_n if self.epi_n is None else self.epi_n)

    def check(self, problem: Problem, dtype: Any) -> None:
        """The common checks, and epi_m dividing block_m."""
        super().check(problem, dtype)
        epi_m = self.epilogue_tile()[0]
        if self.block_m % epi_m:
            raise ConfigError(f"epi_m = {epi_m} must divide block_m = {self.block_m}")

    def footprint(self, problem: Problem, dtype: Any) -> int:
        """VMEM: input tiles x buffers, the output tile double-buffered, the f32 accumulator, the
        epilogue's f32 temporaries (two sub-tiles) and the vectors ((8, block_n) f32 tiles)."""
        bm, bn, bk = self.block_m, self.block_n, self.block_k
        item, out_item = _sizes(problem, dtype)
        depth = self.padded(problem, dtype).k if self.k_strategy == "resident" else bk
        epi_m, epi_n = self.epilogue_tile()
        return (self.buffers * (bm * depth + depth * bn) * item + 2 * bm * bn * out_item + bm * bn * 4
                + 2 * epi_m * epi_n * 4 + 2 * problem.epilogue.vectors * 8 * bn * 4)



@dataclasses.dataclass(frozen=True)
class InterpretMatmulConfig(MatmulConfig):
    """Plain Pallas (the Triton kernel without compiler params): group_m row tiles per column
    sweep; split_k programs per output tile (1: K not split), each summing one run of K into a
    float32 partial product that a reduction adds up before the epilogue (few rows, long K: a
    decode step's down projection has too few output tiles to keep every SM streaming B)."""

    group_m: int = 1
    split_k: int = 1

    # The default: small tiles, up to 64 x 64 x 32.
    DEFAULT_TILES = ((64, 16), (64, 16), (32, 16))
    MAX_SPLIT_K = 64
    # The float32 partial products of a split K, at most (a bound, not a tuning preference).
    MAX_PARTIAL_BYTES = 1 << 30

    def validate(self) -> None:
        """group_m is positive; split_k within 1 to MAX_SPLIT_K."""
        super().validate()
        if self.group_m < 1:
            raise ConfigError(f"group_m must be positive, got {self.group_m}")
        if not 1 <= self.split_k <= self.MAX_SPLIT_K:
            raise ConfigError(f"split_k must be in 1..{self.MAX_SPLIT_K}, got {self.split_k}")

    def padded(self, problem: Problem, dtype: Any) -> Problem:
        """As `MatmulConfig.padded`, with k a whole number of block_k steps in each of the splits."""
        runs = super().padded(problem, dtype)
        return dataclasses.replace(runs, k=round_up(problem.k, self.block_k * self.split_k))

    def partial_bytes(self, problem: Problem, dtype: Any) -> int:
        """Bytes of the float32 partial products a split K writes (0 when K is not split)."""
        if self.split_k == 1:
            return 0
        runs = self.padded(problem, dtype)
        return self.split_k * max(problem.batch, 1) * runs.m * runs.n * 4

    def check(self, problem: Problem, dtype: Any) -> None:
        """The common checks, group_m dividing the row tiles, and a split K's partial products
        within MAX_PARTIAL_BYTES."""
        super().check(problem, dtype)
        tiles_m = pl.cdiv(problem.m, self.block_m)
        if tiles_m % self.group_m:
            raise ConfigError(f"group_m = {self.group_m} must divide the {tiles_m} row tiles")
        if self.partial_bytes(problem, dtype) > self.MAX_PARTIAL_BYTES:
            raise Unsupported(f"split_k = {self.split_k}: its float32 partial products would take "
                              f"{self.partial_bytes(problem, dtype) / 2**20:.0f} MiB, over the "
                              f"{self.MAX_PARTIAL_BYTES >> 20} MiB bound")

    def footprint(self, problem: Problem, dtype: Any) -> int:
        """The A and B panels of a program (its run of K) and its f32 accumulator."""
        item = jnp.dtype(dtype).itemsize
        bm, bn, depth = self.block_m, self.block_n, self.padded(problem, dtype).k // self.split_k
        return (bm * depth + depth * bn) * item + bm * bn * 4



@dataclasses.dataclass(frozen=True)
class TritonMatmulConfig(InterpretMatmulConfig):
    """Triton: the plain kernel's knobs and Triton's compiler params."""

    num_warps: int = 4
    num_stages: int = 3

    def footprint(self, problem: Problem, dtype: Any) -> int:
        """Shared memory: Triton stages each K step's operand tiles (see `triton_dot_buffers`)."""
        item = jnp.dtype(dtype).itemsize
        bm, bn, bk = self.block_m, self.block_n, self.block_k
        return triton_dot_buffers(self.num_stages, self.num_warps, bm) * (bm * bk + bk * bn) * item

    @classmethod
    def default(cls, problem: Problem, dtype: Any = jnp.bfloat16) -> TritonMatmulConfig:
        """Small tiles (`InterpretMatmulConfig.DEFAULT_TILES`), but products of at least
        TRITON_LARGE rows and columns (each batch entry's) take 128-row tiles, 8 of them a column
        sweep (or 4, or 1: group_m divides the row tiles), and 256 columns in 8 warps (else 128 in
        4) where that leaves TRITON_MIN_TILES tiles and no 256-column tile is ragged where 128
        columns are not (a ragged tile pads B and slices C back). On the H200 (BENCHMARKS.md,
        thirty-third session; us against the small tiles): matmul 4096^3 181.7 / 448.8 (XLA
        183.7), 8192^3 1406.8 (XLA 1451.5), 4096 x 11008 x 4096 496.5 / 1252.3, 1001 x 50257 x
        4096 1035.0 / 2183.6; in 128 x 128 tiles 1024 x 4224 x 1024 14.4 / 30.3 (128 x 256:
        38.9) and 512 x 4096 x 4096 29.1 / 51.7 (128 x 256, 64 tiles: 42.1). The large tiles
        stage 144 KiB of bf16 operands: within sm80's and sm90's shared memory (163 and 227 KiB
        a block), not sm86's or sm89's 99 KiB, where the deployment's registry, which knows its
        GPU (`defaults_shared_memory`), gets the 128-column tiles. float32
        operands take twice the bytes: the 128-column tiles then (192 KiB). The tiles fit
        `defaults_shared_memory()` (an H200's 227 KiB unless the caller names another GPU's)."""
        config = cls._power_of_two_tiles(super().default(problem, dtype), problem)
        if min(problem.m, problem.n) < TRITON_LARGE or problem.epilogue.full_rows:
            return config
        tiles_m = pl.cdiv(problem.m, 128)
        wide = (problem.n % 256 == 0 or problem.n % 128 != 0) and (
            tiles_m * pl.cdiv(problem.n, 256) * max(problem.batch, 1) >= TRITON_MIN_TILES)
        large = dataclasses.replace(config, block_m=128, block_k=fit(problem.k, 64, 16),
                                    group_m=next(g for g in (8, 4, 1) if tiles_m % g == 0), num_stages=3)
        candidates = [dataclasses.replace(large, block_n=256, num_warps=8)] if wide else []
        candidates.append(dataclasses.replace(large, block_n=128, num_warps=4))
        candidates = [cls._power_of_two_tiles(c, problem) for c in candidates]
        return next((c for c in candidates if c.footprint(problem, dtype) <= defaults_shared_memory()), config)

    @staticmethod
    def _power_of_two_tiles(config: TritonMatmulConfig, problem: Problem) -> TritonMatmulConfig:
        """`config` with each tile that `fit` rounded to no power of two (35 rows: 48) raised to the
        next power of two, which Triton's arrays must be (the padded rows and columns are zeros);
        block_n kept where the epilogue needs whole rows."""
        raised = {name: pl.next_power_of_2(size) for name, size in
                  (("block_m", config.block_m), ("block_n", config.block_n), ("block_k", config.block_k))
                  if not is_pow2(size) and not (name == "block_n" and problem.epilogue.full_rows)}
        return dataclasses.replace(config, **raised)

    def check(self, problem: Problem, dtype: Any) -> None:
        """The plain kernel's checks, and tiles of powers of two (Triton's arrays must be; any
        shape takes such tiles, padded to whole tiles)."""
        super().check(problem, dtype)
        for name, size in (("block_m", self.block_m), ("block_n", self.block_n), ("block_k", self.block_k),
                           ("epi_n", self.epi_n)):
            if size is not None and not is_pow2(size):
                hint = ("an epilogue over whole rows needs n a power of two on gpu-triton (use two phases)"
                        if name == "block_n" and problem.epilogue.full_rows
                        else "any shape takes them: the problem is padded to whole tiles")
                raise Unsupported(f"gpu-triton tiles are powers of two (Triton's arrays must be), got {name} = "
                                  f"{size}; {hint}")


# TritonMatmulConfig.default's large tiles: from this many rows and columns, with 256 columns where
# they make at least TRITON_MIN_TILES tiles (an H200 has 132 SMs: 64 tiles of 128 x 256 left half
# of them idle at 512 x 4096 x 4096).
TRITON_LARGE, TRITON_MIN_TILES = 512, 128

# Shared memory Mosaic GPU adds to a kernel's own buffers (barriers, alignment). JAX 0.10.2 adds at
# most 1 KiB; JAX 0.11.2 on the H200 counted up to 1616 bytes more than that for the same configs
# (232528 bytes for one this model, with 1 KiB, put at 230912), so the model allows 2.75 KiB.
MGPU_SMEM_OVERHEAD = 2816
# The Mosaic GPU default of products of at least LARGE rows and columns: the warp-specialized
# tiles of the tuned winners (matmul at 8192^3, matmul + layer norm at 4096^3). On the H200
# (BENCHMARKS.md, thirtieth session; us, against the singly pipelined 128 x 128 tiles): matmul
# 4096^3 171.5 / 197.4, 8192^3 1366.9 / 1708.5, 4096 x 14336 x 4096 603.5 / 893.5, 2048^3 23.5 /
# 24.5; bmm and broadcast matmul 64 x 2048^3 1424.7 / 1588.5 and 1392.5 / 1591.6; the subtiled
# epilogue 4096^3 179.3 / 218.0; matmul + layer norm 4096^3 207.9 / 236.1.
LARGE = 1024
LARGE_TILES = {"mgpu_pipeline": "warp_specialized", "block_m": 64, "block_n": 256, "block_k": 64,
               "wg_split": "m", "cluster": "n", "max_concurrent_steps": 3, "grid_minor": "n",
               "grid_tile_width": 8, "delay_release": 0}
# What the kernel's swizzled TMA layouts address (Mosaic GPU's TileTransform of a copy's global
# view): rows in groups of 8, columns in 128-byte units (the widest swizzle).
MGPU_ROW_UNIT, MGPU_COL_BYTES = 8, 128


# tail_split: a split piece's cost beyond its share of a tile's K loop, as a fraction of a whole
# tile's time: its pipeline's fill and drain, and its partial product stored twice (high and low
# halves) and read back by the sum. An estimate, not a measurement: it only decides how many row
# bands a split covers; whether a split pays at all is the search's to measure.
TAIL_PIECE_COST = 0.15
# ... and a split is planned only where the model shortens the busiest slot by this fraction at
# least: within it, the search would time configs the model cannot tell from the unsplit one.
TAIL_MIN_GAIN = 0.02


class TailPlan(NamedTuple):
    """Which tiles of a warp-specialized product run split along K (the tail_split knob), and
    which persistent slot runs which of their pieces.

    The persistent loop deals the whole tiles round-robin, so the first `head_tiles % blocks`
    slots run one tile more than the others. The pieces are dealt to even that out: each of the
    other slots (the light ones) takes `light_pieces` of them, in order, then each of the first
    slots `heavy_pieces`, until none are left."""

    bands: int  # cluster row bands, the last of the last batch entry's, whose tiles are split
    splits: int  # runs of K per split tile
    head_tiles: int  # cluster tiles the persistent loop runs whole, before the split ones
    pieces: int  # split tiles x splits
    blocks: int  # the persistent grid: clusters launched, one a slot
    light_pieces: int  # pieces each slot with the fewer whole tiles runs (at most)
    heavy_pieces: int  # ... each slot with one whole tile more
    makespan: float  # the busiest slot's work in whole tiles (the model's)
    whole: float  # ... with no split: the number of waves

    def first_piece(self, slot: Any) -> Any:
        """The first piece persistent slot `slot` runs: the light slots' pieces come first, then
        the heavy ones'."""
        heavy = self.head_tiles % self.blocks
        return jnp.where(slot >= heavy, (slot - heavy) * self.light_pieces,
                         (self.blocks - heavy) * self.light_pieces + slot * self.heavy_pieces)

    def pieces_of(self, slot: Any) -> Any:
        """How many pieces persistent slot `slot` runs (from `first_piece` on)."""
        share = jnp.where(slot >= self.head_tiles % self.blocks, self.light_pieces, self.heavy_pieces)
        return jnp.clip(self.pieces - self.first_piece(slot), 0, share)


@functools.lru_cache(maxsize=4096)
def tail_plan(bands: int, tiles_per_band: int, batches: int, slots: int, splits: int) -> TailPlan:
    """How many of the last batch entry's `bands` row bands (each of `tiles_per_band` cluster
    tiles) to split `splits` ways along K so that the busiest of `slots` persistent slots ends
    soonest (bands 0: no split shortens it enough). A product whose tiles are not a whole
    number of waves leaves slots idle through its last wave; its last bands' tiles, split into
    runs of K (pieces, each 1 / splits of a tile plus TAIL_PIECE_COST), fill them instead, where
    that gains at least TAIL_MIN_GAIN. Splits of up to two waves' tiles are weighed (more cannot
    fill a last wave better); cached, as a search checks one shape's configs by the thousand."""
    tiles = batches * bands * tiles_per_band
    weight = 1.0 / splits + TAIL_PIECE_COST
    blocks = min(slots, tiles)
    whole = float(pl.cdiv(tiles, blocks))
    best = TailPlan(0, splits, tiles, 0, blocks, 0, 0, whole, whole)
    most = min(bands, max(1, 2 * slots // tiles_per_band)) if splits > 1 else 0
    for tail in range(1, most + 1):
        head, pieces = tiles - tail * tiles_per_band, tail * tiles_per_band * splits
        grid = min(slots, head + pieces)
        heavy, low = head % grid, head // grid  # heavy slots run low + 1 whole tiles
        for heavy_pieces in range(pl.cdiv(pieces, max(heavy, 1)) + 1):
            heavy_cost = low + 1 + heavy_pieces * weight if heavy else 0.0
            if heavy_cost >= best.makespan:
                break  # more pieces on the heavy slots only make them later
            left = max(pieces - heavy * heavy_pieces, 0)
            if grid == heavy and left:
                continue
            light_pieces = pl.cdiv(left, grid - heavy) if grid > heavy else 0
            cost = max(low + light_pieces * weight, heavy_cost)
            if cost < best.makespan - 1e-9 and cost <= whole * (1 - TAIL_MIN_GAIN):
                best = TailPlan(tail, splits, head, pieces, grid, light_pieces, heavy_pieces, cost, whole)
            if not heavy:
                break  # no heavy slots: heavy_pieces changes nothing
    return best


class MosaicTiles(NamedTuple):
    """A Mosaic GPU config's tiles with defaults resolved."""

    bm: int  # one compute warpgroup's tile
    bn: int
    bk: int
    cta_m: int  # one block's tile (two warpgroup tiles when warp-specialized)
    cta_n: int
    epi_m: int
    epi_n: int
    wgs: int  # compute warpgroups per block
    slots: int  # SMEM staging slots of the epilogue's stores
    steps: int  # pipeline depth


@dataclasses.dataclass(frozen=True)
class MosaicGpuMatmulConfig(MatmulConfig):
    """Mosaic GPU (Hopper): pipeline kind and depth, warpgroup split, tile order, epilogue tile,
    cluster.

    epi_m and epi_n: None means 64 (at most the warpgroup's tile). cluster ("none" | "m" | "n"):
    the warp-specialized kernel runs blocks in pairs (a 2-block cluster) whose tiles lie side by
    side along m or n; the operand both blocks share (B along m, A along n) is fetched once and
    multicast by TMA to both blocks' shared memory, halving its L2 traffic. delay_release (0 | 1,
    warp-specialized only): WGMMAs left in flight when a K step ends; with 1, a step's operand
    slots are released one step late, so the tensor cores never wait for the issuing warpgroup.
    store ("tma" | "threads"): how a product off the TMA grid (`padded` pads its m or n) is
    written: "tma" writes it padded and slices it back (a copy of the product); "threads" has the
    warpgroups' threads store it at its own size from a tile staged in shared memory
    (`kernels.mgpu_store`), no slice, but more store instructions. Refused for products on the
    grid, which TMA writes whole. tail_split (warp-specialized only; 1: off): the last row bands'
    tiles run as tail_split runs of K each (pieces), dealt to the persistent slots that the whole
    tiles leave idle in their last wave, and their partial products are summed after the kernel
    (`tail`, `tail_plan`): a stream-K of the tail, for products whose tiles are not a whole
    number of waves (4096 x 6400: 6.06 waves of 128 x 256 tiles on 132 SMs).
    """

    mgpu_pipeline: Literal["warp_specialized", "pipelined"] = "pipelined"
    max_concurrent_steps: int = 4
    wg_split: Literal["m", "n"] = "n"
    grid_minor: Literal["m", "n"] = "n"
    grid_tile_width: int = 1
    epi_m: int | None = None
    cluster: Literal["none", "m", "n"] = "none"
    delay_release: int = 0
    store: Literal["tma", "threads"] = "tma"
    tail_split: int = 1

    ROW_STATS = True
    MAX_TAIL_SPLIT = 16

    def validate(self) -> None:
        """A pipeline at least two steps deep, a positive tile width, clusters only when
        warp-specialized."""
        super().validate()
        if self.max_concurrent_steps < 2:
            raise Unsupported("gpu-mosaic: max_concurrent_steps must be at least 2")
        if self.grid_tile_width < 1:
            raise ConfigError(f"grid_tile_width must be positive, got {self.grid_tile_width}")
        if self.cluster != "none" and not self.warp_specialized:
            raise Unsupported("gpu-mosaic: cluster applies to the warp_specialized pipeline only")
        if self.delay_release not in (0, 1) or (self.delay_release and not self.warp_specialized):
            raise Unsupported(f"gpu-mosaic: delay_release is 0, or 1 with warp_specialized; got {self.delay_release}")
        if self.store not in ("tma", "threads"):
            raise ConfigError(f"store must be 'tma' or 'threads', got {self.store!r}")
        if not 1 <= self.tail_split <= self.MAX_TAIL_SPLIT:
            raise ConfigError(f"tail_split must be in 1..{self.MAX_TAIL_SPLIT}, got {self.tail_split}")
        if self.tail_split > 1 and not self.warp_specialized:
            raise Unsupported("gpu-mosaic: tail_split applies to the warp_specialized pipeline only")

    @property
    def cluster_size(self) -> int:
        """Blocks per cluster: 2 when clustered, else 1."""
        return 1 if self.cluster == "none" else 2

    def cluster_tile(self) -> tuple[int, int]:
        """(rows, columns) of C one cluster computes."""
        cta_m, cta_n = self.program_tile()
        return cta_m * (2 if self.cluster == "m" else 1), cta_n * (2 if self.cluster == "n" else 1)

    @property
    def warp_specialized(self) -> bool:
        """Whether the kernel is the persistent warp-specialized one."""
        return self.mgpu_pipeline == "warp_specialized"

    def program_tile(self) -> tuple[int, int]:
        """One block's tile: two warpgroup tiles side by side along wg_split when warp-specialized."""
        split = self.wg_split if self.warp_specialized else None
        return self.block_m * (2 if split == "m" else 1), self.block_n * (2 if split == "n" else 1)

    def tiles(self) -> MosaicTiles:
        """The tiles with defaults resolved."""
        bm, bn = self.block_m, self.block_n
        epi_m = min(64 if self.epi_m is None else self.epi_m, bm)
        epi_n = min(64 if self.epi_n is None else self.epi_n, bn)
        return MosaicTiles(bm, bn, self.block_k, *self.program_tile(), epi_m, epi_n,
                           wgs=2 if self.warp_specialized else 1,
                           slots=min(2, (bm * bn) // (epi_m * epi_n)), steps=self.max_concurrent_steps)

    def padded(self, problem: Problem, dtype: Any) -> Problem:
        """The problem the kernel runs. TMA copies skip what lies past an array's edge (zeros in,
        nothing out), so the kernel takes ragged edge tiles as they are, with no copies, within
        what its swizzled layouts address: rows in whole groups of 8 and columns (n and k) in
        whole 128-byte units (64 bf16). Only a dimension short of those (m = 1001, n = 50257)
        is padded, to whole units, or to one tile when shorter than one."""
        t = self.tiles()
        item, out_item = _sizes(problem, dtype)
        return dataclasses.replace(
            problem, m=max(round_up(problem.m, MGPU_ROW_UNIT), t.cta_m),
            n=max(round_up(problem.n, MGPU_COL_BYTES // min(item, out_item)), t.cta_n),
            k=max(round_up(problem.k, MGPU_COL_BYTES // item), t.bk))

    def writes(self, problem: Problem, dtype: Any) -> Problem:
        """The product the kernel writes: `padded(problem)`'s, sliced back afterwards, or with
        store "threads" the product's own (m, n); the operands are padded either way."""
        runs = self.padded(problem, dtype)
        return dataclasses.replace(runs, m=problem.m, n=problem.n) if self.stores_direct else runs

    def off_grid(self, problem: Problem, dtype: Any) -> bool:
        """Whether `padded` pads the product's m or n: TMA cannot write it at its own size."""
        runs = self.padded(problem, dtype)
        return (runs.m, runs.n) != (problem.m, problem.n)

    @property
    def stores_direct(self) -> bool:
        """Whether the threads store the product rather than TMA (the store knob)."""
        return self.store == "threads"

    def check(self, problem: Problem, dtype: Any) -> None:
        """The common checks, and what WGMMA and this kernel support."""
        super().check(problem, dtype)
        if problem.epilogue.full_rows:
            raise Unsupported("gpu-mosaic: epilogues over whole rows are not implemented")
        if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
            raise Unsupported(f"gpu-mosaic matmul takes bfloat16 or float16, not {jnp.dtype(dtype)}")
        t = self.tiles()
        cluster_m, cluster_n = self.cluster_tile()
        runs = self.padded(problem, dtype)
        tiles_m, tiles_n = pl.cdiv(runs.m, t.cta_m), pl.cdiv(runs.n, t.cta_n)
        if tiles_m % (cluster_m // t.cta_m) or tiles_n % (cluster_n // t.cta_n):
            raise ConfigError(f"cluster {self.cluster!r}: the ({tiles_m}, {tiles_n}) block tiles of (m, n) = "
                              f"({problem.m}, {problem.n}) must pair up in clusters of ({cluster_m}, {cluster_n})")
        if t.bm % 64 or t.bn % 64 or t.bk % 64 or t.bn > 256:
            raise Unsupported("gpu-mosaic: block_m, block_n, block_k must be multiples of 64, block_n <= 256")
        if t.bm % t.epi_m or t.bn % t.epi_n or t.epi_m % 64:
            raise Unsupported("gpu-mosaic: epi_m (a multiple of 64) and epi_n must divide the tile")
        k_steps = pl.cdiv(runs.k, t.bk)
        if self.warp_specialized and self.delay_release and k_steps <= self.delay_release:
            raise Unsupported(f"gpu-mosaic: delay_release {self.delay_release} needs more K steps than that; k = "
                              f"{problem.k} is {k_steps} step(s) of block_k {t.bk} (the warp-specialized "
                              f"pipeline never releases those slots, so the next tile's copies would overtake "
                              f"them): delay_release 0, or a block_k that takes k in two steps or more")
        if self.stores_direct and problem.epilogue.row_stats:
            raise Unsupported("gpu-mosaic: store 'threads' does not write row statistics (TMA does)")
        if self.stores_direct and not self.off_grid(problem, dtype):
            raise Unsupported(f"gpu-mosaic: store 'threads' is for products off the TMA grid; ({problem.m}, "
                              f"{problem.n}) with these tiles is on it, and TMA writes it whole")
        if self.tail_split > 1:
            self._check_tail(problem, dtype, k_steps)

    def _check_tail(self, problem: Problem, dtype: Any, k_steps: int) -> None:
        """A split tail needs runs of K that fill the pipeline, TMA stores, and a last wave to fill."""
        split = self.tail_split
        if problem.epilogue.row_stats or self.stores_direct:
            raise Unsupported("gpu-mosaic: tail_split sums whole products after the kernel: not with row "
                              "statistics or store 'threads'")
        if k_steps % split or k_steps // split < max(self.max_concurrent_steps, self.delay_release + 1):
            raise Unsupported(f"gpu-mosaic: tail_split {split} needs the {k_steps} K steps of block_k "
                              f"{self.block_k} (k = {problem.k}) in {split} equal runs of at least "
                              f"max_concurrent_steps ({self.max_concurrent_steps}) steps each")
        plan = self.tail(problem, dtype)
        if not plan.bands:
            raise Unsupported(f"gpu-mosaic: tail_split {split} shortens nothing at (m, n) = ({problem.m}, "
                              f"{problem.n}): its {plan.head_tiles} cluster tiles make {plan.whole:.0f} "
                              f"wave(s) of {plan.blocks} slots that a split of the last bands does not "
                              f"shorten (`tail_plan`)")

    def tail(self, problem: Problem, dtype: Any, sms: int | None = None) -> TailPlan:
        """The tiles tail_split splits (`tail_plan`) on a GPU of `sms` SMs (None: `num_sms()`,
        the GPU being traced for, else an H200's)."""
        cluster_m, cluster_n = self.cluster_tile()
        runs = self.padded(problem, dtype)
        slots = (mgpu_launch.num_sms() if sms is None else sms) // self.cluster_size
        return tail_plan(pl.cdiv(runs.m, cluster_m), pl.cdiv(runs.n, cluster_n), max(problem.batch, 1),
                         slots, self.tail_split)

    def footprint(self, problem: Problem, dtype: Any) -> int:
        """Shared memory: the pipeline's operand slots, each compute warpgroup's output staging slots
        (one when the threads store the product: store "threads"), vector tiles and row
        statistics, plus MGPU_SMEM_OVERHEAD for barriers and alignment (at least what Mosaic GPU
        itself counts: tests/test_kernels_matmul_family.py)."""
        t = self.tiles()
        item, out_item = _sizes(problem, dtype)
        operands = t.steps * (t.cta_m * t.bk + t.bk * t.cta_n) * item
        slots = 1 if self.stores_direct else t.slots
        staging = t.wgs * slots * t.epi_m * t.epi_n * out_item
        vectors = t.wgs * problem.epilogue.vectors * t.bn * item
        stats = t.wgs * 2 * t.bm * 4 if problem.epilogue.row_stats else 0
        return operands + staging + vectors + stats + MGPU_SMEM_OVERHEAD

    @classmethod
    def default(cls, problem: Problem, dtype: Any = jnp.bfloat16) -> MosaicGpuMatmulConfig:
        """The singly pipelined kernel with 64-aligned tiles (ragged at the edges when none divides);
        a product off the TMA grid stored by the threads (measured faster than the slice on the
        H200 at 4096 x 50257 and 1001 rows: BENCHMARKS.md, twenty-fourth session). Products of at
        least LARGE rows and columns (each batch entry's) take LARGE_TILES where they apply and fit."""
        config = cls(fit(problem.m, 128, 64), fit(problem.n, 128, 64), 64)
        if config.off_grid(problem, dtype) and not problem.epilogue.row_stats:
            return dataclasses.replace(config, store="threads")
        if min(problem.m, problem.n) < LARGE:
            return config
        # LARGE_TILES' clusters pair n tiles; where the n tiles are odd (11008 columns: 43), m
        # tiles pair instead, or none. On the H200 (BENCHMARKS.md, thirty-second session; us)
        # matmul 4096 x 11008 x 4096 ran 476.6 clustered along m, 481.4 unclustered and 625.4 in
        # the pipelined tiles; matmul + layer norm 4096 x 6400 x 4096 329.8, 330.8 and 377.1.
        for cluster in ("n", "m", "none"):
            large = dataclasses.replace(config, **{**LARGE_TILES, "cluster": cluster})
            if (refusal(lambda: large.check(problem, jnp.bfloat16)) is None
                    and large.footprint(problem, dtype) <= defaults_shared_memory()):
                return large
        return config


CONFIGS: dict[str, type[MatmulConfig]] = {
    "tpu": TpuMatmulConfig, "gpu-triton": TritonMatmulConfig, "gpu-mosaic": MosaicGpuMatmulConfig,
    "interpret": InterpretMatmulConfig,
}


def parse_config(config: Mapping[str, Any], target: str, *extra: type[Knobs]) -> tuple[Any, ...]:
    """(the target's MatmulConfig, *one config per `extra` class) from one flat dict."""
    if target not in CONFIGS:
        raise ConfigError(f"unknown target {target!r}; expected one of {sorted(CONFIGS)}")
    return parse(config, CONFIGS[target], *extra)


def as_config(config: Mapping[str, Any] | MatmulConfig, target: str) -> MatmulConfig:
    """`config` as the target's typed config (a dict is parsed; a typed config is checked for type)."""
    if isinstance(config, MatmulConfig):
        if not isinstance(config, CONFIGS[target]):
            raise ConfigError(f"a {type(config).__name__} is no {target} config")
        return config
    return parse_config(config, target)[0]
