"""Typed configs of the row engine: one frozen dataclass per target, each knob's default once.

`from_dict` is the only way in from a dict (a search space's point, a bundle's row): it refuses
unknown knobs by name. `__post_init__` checks what needs no shape; `check(shape, math)` checks
the rest and returns the `Plan` every builder and the footprint read.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from jax.experimental import pallas as pl

from kernels.rows.contract import RowMath

LANES, SUBLANES = 128, 8
STRATEGIES = {
    "interpret": ("one_pass", "fori_loop", "grid"),
    "tpu": ("one_pass", "fori_loop", "emit_pipeline", "grid"),
    "gpu-triton": ("one_pass", "fori_loop", "split_cols"),
}
STREAMED = ("emit_pipeline", "grid")  # strategies that keep only column chunks on chip
LAYOUTS = ("column", "lane")
FOLDS = ("chunk", "lanes")  # Triton fori_loop: per-row statistics per chunk, or per lane
MAX_UNROLLED = 32  # chunks of a row that Triton's fori_loop may unroll into straight-line code
MAX_SPANS = 1024  # chunks of a row that Triton's split_cols spreads over programs
# Triton fori_loop with column outputs over several blocks of rows a program (unroll=1): float32
# partial sums of the whole row held in registers, at most this many a thread.
HELD_PARTIALS_PER_THREAD = 64
# The knobs whose growth never shrinks the footprint (for the farm's OOM dominance pruning).
MEMORY_PARAMS = ("block_batch", "block_rows", "block_cols", "buffers", "num_stages")
# Knobs of earlier versions, named in the refusal so that an old config can be translated.
RENAMED = {"passes": "Triton's passes=1 is now strategy='one_pass', passes=2 strategy='fori_loop'"}

C = TypeVar("C")


def is_pow2(n: int) -> bool:
    """Whether n is a positive power of two."""
    return n > 0 and n & (n - 1) == 0


def check_pow2(name: str, value: int, bounds: tuple[int, int]) -> None:
    """Raise, naming the knob, unless `value` is a power of two within `bounds` (inclusive)."""
    if not (is_pow2(value) and bounds[0] <= value <= bounds[1]):
        raise ValueError(f"{name} must be a power of two in [{bounds[0]}, {bounds[1]}], got {value}")


def from_dict(cls: type[C], config: Mapping[str, Any], where: str) -> C:
    """The typed config `cls` of a dict of knobs; refuses unknown knobs and unreadable values.

    `where` names the kernel and target in the messages, e.g. "softmax on tpu"."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(config) - set(fields))
    if unknown:
        hints = "".join(f"; {RENAMED[k]}" for k in unknown if k in RENAMED)
        raise ValueError(f"{where}: unknown knob(s) {unknown}; {cls.__name__} takes "
                         f"{sorted(fields)}{hints}")
    missing = [n for n, f in fields.items() if n not in config
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{where}: config lacks the knob(s) {missing}")
    values = {}
    for name, value in config.items():
        kind = str(fields[name].type)
        try:
            if value is None and "None" in kind:
                values[name] = None
            elif kind.startswith("int"):
                if isinstance(value, bool) or int(value) != value:
                    raise ValueError
                values[name] = int(value)
            else:
                values[name] = str(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: knob {name}={value!r} is not a valid {kind}") from None
    return cls(**values)


def split_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(batch, rows, cols) of a 2-D or 3-D shape; refuses other ranks."""
    if len(shape) == 2:
        return (1, *shape)
    if len(shape) == 3:
        return tuple(shape)
    raise NotImplementedError(f"row-wise kernels take 2-D or 3-D shapes, got {shape}")


@dataclasses.dataclass(frozen=True)
class RowConfig:
    """The knobs every target reads.

    block_rows: rows per block; strategy: how a row is walked (see `kernels.rows`);
    block_cols: the column chunk of the looped and streamed strategies (one_pass ignores it;
    the spaces pin it at 128 there); block_batch: batch entries per block of a 3-D shape.
    On TPU and in interpret mode a block of more rows or columns than the shape has takes all
    of them (`check`), so a power of two names "all the rows" at any row count.
    """

    block_rows: int
    strategy: str = "one_pass"
    block_cols: int = LANES
    block_batch: int = 1

    TARGET = ""

    def __post_init__(self) -> None:
        for name in ("block_rows", "block_cols", "block_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        allowed = STRATEGIES[self.TARGET]
        if self.strategy not in allowed:
            raise NotImplementedError(f"strategy {self.strategy!r} is not available on "
                                      f"{self.TARGET}; expected one of {allowed}")

    def to_dict(self, names: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The knobs as a dict (only `names`, in that order, when given)."""
        values = dataclasses.asdict(self)
        return values if names is None else {n: values[n] for n in names}

    def check(self, shape: tuple[int, ...], math_: RowMath) -> Plan:
        """The plan of this config for `shape`; raises with a plain message when it cannot work."""
        batch, rows, cols = split_shape(shape)
        # A block of more rows or columns than the shape has is one block of all of them (a
        # full-dimension block, legal on TPU at any size): 3 rows take block_rows 4 unpadded, a
        # row of 3000 columns block_cols 4096 as one chunk.
        block_cols = cols if self.strategy == "one_pass" else min(self.block_cols, cols)
        bb, br = self.block_batch, min(self.block_rows, rows)
        # Partial row blocks: interpret mode pads them, but column outputs would sum the padding,
        # and on TPU interpret mode (JAX 0.10) mis-shapes them when outputs are aliased, as
        # validation's poisoned outputs are; emit_pipeline slices whole row blocks. So on TPU the
        # rows are padded to whole blocks with zeros by a copy (`Plan.pad_rows`), and the kernel
        # masks the padded rows out of column outputs' sums (`blocked.real_rows`); in interpret
        # mode kernels with column outputs take blocks that divide the rows.
        whole_rows = self.TARGET == "tpu" or math_.col_outputs
        pad = -rows % br if self.TARGET == "tpu" else 0
        # Likewise a row no chunk divides (50257 columns): on TPU the columns are padded to whole
        # chunks with the math's `pad` by a copy, the padded columns masked (`valid`) in the folds.
        pad_cols = -cols % block_cols if self.TARGET == "tpu" else 0
        cols += pad_cols
        if batch % bb or cols % block_cols or (whole_rows and (rows + pad) % br):
            part = (f"block_cols={block_cols} must divide the row length {cols}" if cols % block_cols
                    else f"block_rows={br} must divide the {rows} rows" if rows % br
                    else f"block_batch={bb} must divide the batch {batch}")
            raise ValueError(f"blocks ({bb}, {br}, {block_cols}) must divide the shape "
                             f"({batch}, {rows}, {cols}): {part}")
        return Plan(self, batch, rows + pad, cols, block_cols, pad_rows=pad, row_block=br, pad_cols=pad_cols)


@dataclasses.dataclass(frozen=True)
class RowConfigInterpret(RowConfig):
    """Generic Pallas interpret mode: the TPU strategies but emit_pipeline, one buffer."""

    TARGET = "interpret"


@dataclasses.dataclass(frozen=True)
class RowConfigTPU(RowConfig):
    """Mosaic TPU. buffers: per pipelined block (pl.Buffered), 1 or 2 for the pallas_call's
    BlockSpecs, up to 4 for emit_pipeline's input chunks (its outputs use min(buffers, 2)).
    stats_layout: per-row vectors (vector inputs, results) as (rows, 1) "column" blocks, or
    lane-dense 1-D "lane" blocks (2-D shapes)."""

    buffers: int = 2
    stats_layout: str = "column"

    TARGET = "tpu"

    def __post_init__(self) -> None:
        super().__post_init__()
        most = 4 if self.strategy == "emit_pipeline" else 2
        if not 1 <= self.buffers <= most:
            raise ValueError(f"buffers={self.buffers} must be 1 or 2 for strategy {self.strategy}"
                             f" (1 to 4 with emit_pipeline)")
        if self.stats_layout not in LAYOUTS:
            raise ValueError(f"stats_layout must be one of {list(LAYOUTS)}, got {self.stats_layout!r}")

    def check(self, shape: tuple[int, ...], math_: RowMath) -> Plan:
        p = super().check(shape, math_)
        br, bc, rows, cols = p.block_rows, p.block_cols, p.rows, p.cols
        if (br % SUBLANES and br != rows) or (bc % LANES and bc != cols):
            raise ValueError(f"TPU block ({br}, {bc}): the last two dimensions must be divisible "
                             f"by {SUBLANES} and {LANES} respectively (block_rows a multiple of 8, "
                             f"block_cols of 128), or equal the array's ({rows - p.pad_rows}, {p.row_cols})")
        if self.stats_layout == "lane" and math_.has_vectors:
            if p.batch != 1 or len(shape) != 2:
                raise NotImplementedError("stats_layout 'lane' takes 2-D shapes")
            if br != rows and br % 1024 and not (is_pow2(br) and br >= 128):
                raise ValueError(f"block_rows={br} must be a power of two >= 128, a multiple of 1024 "
                                 f"or all {rows} rows for lane-dense per-row vectors on TPU")
        return p


@dataclasses.dataclass(frozen=True)
class RowConfigTriton(RowConfig):
    """Pallas Triton: whole refs in global memory, masked power-of-two tiles, any shape.

    rows_per_program: rows one program covers, in a loop over blocks of block_rows (None: one
    block). num_warps, num_stages: Triton compiler params, always passed explicitly.
    fold: how fori_loop folds its chunks into statistics: "chunk" (per row, a reduction per
    chunk) or "lanes" (per lane, one reduction per row after the loop; kernels with a
    `LaneFold` only). unroll: 1 writes fori_loop's walks over a row's chunks (at most
    MAX_UNROLLED) as straight-line code instead of loops. prefetch: 1 has a one_pass program
    that loops over several blocks of rows load the next block while it computes this one
    (the loaded tiles are the loop's carry), and load the column inputs once.
    strategy split_cols: one program per block of rows and chunk of block_cols columns (a row's
    chunks spread over programs, for rows too few to fill the chip): a first kernel writes each
    chunk's statistics, a second combines a row's and maps the chunk (kernels whose math has a
    span combine, `RowMath.span_combine`; one block of rows per program)."""

    rows_per_program: int | None = None
    num_warps: int = 4
    num_stages: int = 3
    fold: str = "chunk"
    unroll: int = 0
    prefetch: int = 0

    TARGET = "gpu-triton"

    def __post_init__(self) -> None:
        super().__post_init__()
        looped = self.strategy == "fori_loop"
        chunked = self.strategy != "one_pass"
        for name in ("block_rows", "block_cols") if chunked else ("block_rows",):
            if not is_pow2(getattr(self, name)):
                raise ValueError(f"Triton blocks are powers of two; {name}={getattr(self, name)}")
        if self.block_batch != 1:
            raise ValueError("Triton handles one batch entry per program (block_batch=1)")
        if self.rows_per_program is not None and self.rows_per_program % self.block_rows:
            raise ValueError(f"rows_per_program={self.rows_per_program} must be a multiple of "
                             f"block_rows={self.block_rows}")
        if self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"num_warps and num_stages must be positive, got {self.num_warps} "
                             f"and {self.num_stages}")
        if self.fold not in FOLDS:
            raise ValueError(f"fold must be one of {list(FOLDS)}, got {self.fold!r}")
        if self.fold == "lanes" and not looped:
            raise ValueError("fold='lanes' folds the chunks of strategy 'fori_loop'; "
                             f"strategy {self.strategy!r} takes fold='chunk'")
        if self.unroll not in (0, 1) or (self.unroll and not looped):
            raise ValueError(f"unroll must be 0 or 1 (1: strategy 'fori_loop' only), got {self.unroll} "
                             f"with strategy {self.strategy!r}")
        if self.prefetch not in (0, 1) or (self.prefetch and chunked):
            raise ValueError(f"prefetch must be 0 or 1 (1: strategy 'one_pass' only), got {self.prefetch} "
                             f"with strategy {self.strategy!r}")
        if self.strategy == "split_cols" and self.rows_per_program not in (None, self.block_rows):
            raise ValueError(f"split_cols gives a program one block of rows: rows_per_program must be "
                             f"block_rows ({self.block_rows}), got {self.rows_per_program}")
        if self.prefetch and (self.rows_per_program or self.block_rows) <= self.block_rows:
            raise ValueError(f"prefetch=1 loads a program's next block of rows: it needs rows_per_program "
                             f"> block_rows ({self.block_rows}), got {self.rows_per_program}")

    def check(self, shape: tuple[int, ...], math_: RowMath) -> Plan:
        batch, rows, cols = split_shape(shape)
        looped = self.strategy == "fori_loop"
        if self.fold == "lanes" and math_.lanes is None:
            raise ValueError(f"{math_.name} has no per-lane fold; it takes fold='chunk'")
        # A flat window (kernels.rows.triton.flat_rows) may start up to 15 bytes early.
        if self.unroll and pl.cdiv(cols + 15, self.block_cols) > MAX_UNROLLED:
            raise ValueError(f"unroll=1 writes out every chunk: {cols} columns in chunks of "
                             f"{self.block_cols} exceed {MAX_UNROLLED} chunks")
        if looped and math_.col_outputs and self.rows_per_program not in (None, self.block_rows):
            # The program's partial sums of every chunk stay in registers over its blocks of rows:
            # each chunk's own values, so the chunks must be straight-line code (unroll=1).
            held = math_.col_outputs * pl.cdiv(cols, self.block_cols) * self.block_cols
            if not self.unroll:
                raise ValueError("with column outputs, fori_loop takes rows_per_program == block_rows "
                                 "unless unroll=1 (its partial sums then stay in registers)")
            if held > HELD_PARTIALS_PER_THREAD * 32 * self.num_warps:
                raise ValueError(f"fori_loop over {self.rows_per_program // self.block_rows} blocks of rows holds "
                                 f"{held} float32 partial sums in registers: over "
                                 f"{HELD_PARTIALS_PER_THREAD} a thread with {self.num_warps} warps")
        if self.strategy == "split_cols":
            spans = pl.cdiv(cols, self.block_cols)
            if math_.span_combine is None:
                raise ValueError(f"{math_.name} cannot combine the statistics of a row's spans; "
                                 "it takes strategy one_pass or fori_loop")
            if not 2 <= spans <= MAX_SPANS:
                raise ValueError(f"split_cols spreads a row's chunks over 2 to {MAX_SPANS} programs: "
                                 f"{cols} columns in chunks of {self.block_cols} make {spans}")
            return Plan(self, batch, rows, cols, self.block_cols)
        return Plan(self, batch, rows, cols, self.block_cols if looped else pl.next_power_of_2(cols))


CONFIG_TYPES: dict[str, type[RowConfig]] = {
    "interpret": RowConfigInterpret, "tpu": RowConfigTPU, "gpu-triton": RowConfigTriton}


@dataclasses.dataclass(frozen=True)
class Plan:
    """A config checked against a shape: the blocking every builder and the footprint use."""

    config: RowConfig
    batch: int
    rows: int
    cols: int
    block_cols: int  # the chunk, resolved: the whole row (TPU, interpret) or its padded width
    pad_rows: int = 0  # rows of zeros the TPU kernel runs past the shape's (rows includes them)
    row_block: int = 0  # the block of rows, resolved (0: the config's block_rows)
    pad_cols: int = 0  # columns of the math's `pad` the TPU kernel runs past the shape's (cols includes them)

    @property
    def target(self) -> str:
        return self.config.TARGET

    @property
    def row_cols(self) -> int:
        """The shape's row length (`cols` less the padded columns): what the math divides by."""
        return self.cols - self.pad_cols

    @property
    def strategy(self) -> str:
        return self.config.strategy

    @property
    def block_rows(self) -> int:
        return self.row_block or self.config.block_rows

    @property
    def block_batch(self) -> int:
        return self.config.block_batch

    @property
    def buffers(self) -> int:
        """Buffers per pipelined block (1 off TPU)."""
        return getattr(self.config, "buffers", 1)

    @property
    def lane(self) -> bool:
        """Whether per-row vectors are lane-dense 1-D blocks (TPU only)."""
        return getattr(self.config, "stats_layout", "column") == "lane"

    @property
    def rows_per_program(self) -> int:
        return getattr(self.config, "rows_per_program", None) or self.block_rows

    @property
    def row_blocks(self) -> int:
        """Blocks of rows along the rows axis (TPU, interpret) or programs (Triton)."""
        return pl.cdiv(self.rows, self.rows_per_program)

    @property
    def col_blocks(self) -> int:
        """Column chunks a streamed row is cut into."""
        return pl.cdiv(self.cols, self.block_cols)

    @property
    def partials(self) -> int:
        """Partial sums each column output is split into: one per block of rows."""
        return (self.batch // self.block_batch) * self.row_blocks
