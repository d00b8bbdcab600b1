"""Row-wise kernels on every target: reduce each row over its last axis, then map the row.

A kernel states its math once, as a `RowMath`:
  rows(*blocks, cols, valid)       the formula on whole rows, held on chip in one piece;
  init, update, finish, apply      the same formula streamed over column chunks: fold every
                                   chunk into per-row statistics, finish them, map each chunk.
`build` turns it into a Pallas call for one config. The inputs are row tensors shaped
(rows, cols) or (batch, rows, cols), then per-column vectors shaped (cols,) (weights, biases).
The outputs are row tensors, then per-column outputs summed over every row (a weight
gradient: each program writes a float32 partial sum, which XLA adds up after the call).
All math is float32; blocks are read once and written once per pass.

Config knobs:
  block_rows        rows per block (TPU: a multiple of 8, or all rows).
  block_batch       batch entries per block (TPU and interpret; default 1).
  strategy          TPU and interpret: how a block of rows is reduced
                      one_pass       the rows in one VMEM block, the formula on whole rows;
                      fori_loop      the rows in one VMEM block, a lax.fori_loop over column
                                     slices (statistics, then outputs) keeps temporaries small;
                      emit_pipeline  the rows stay in HBM; pltpu.emit_pipeline streams column
                                     blocks twice, statistics then outputs (TPU only);
                      grid           a (..., 2, column blocks) grid: phase 0 folds statistics,
                                     phase 1 writes outputs; Mosaic pipelines the blocks.
  block_cols        the column chunk of fori_loop, emit_pipeline and grid (TPU: a multiple of
                    128 dividing cols, or cols), and of Triton's passes=2.
  buffers           TPU: buffers per pipelined block (pl.Buffered): 1 or 2 for the
                    pallas_call's BlockSpecs (all JAX 0.10 lowers there); emit_pipeline takes
                    up to 4 for its input chunks and uses min(buffers, 2) for its outputs.
  passes            Triton: 1 = the rows' columns padded to a power of two and held in
                    registers, one read; 2 = a loop over column chunks for the statistics,
                    then a second one for the outputs (the re-read mostly hits L2).
  rows_per_program  Triton: rows one program covers, in a loop over blocks of block_rows.
  num_warps, num_stages  Triton compiler params.
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

from kernels import tpu_mesh
from kernels.lowering import Platform, pallas_call

F32 = jnp.float32
Stats = tuple[jax.Array, ...]

TPU_STRATEGIES = ("one_pass", "fori_loop", "emit_pipeline", "grid")
INTERPRET_STRATEGIES = ("one_pass", "fori_loop", "grid")
STREAMED = ("emit_pipeline", "grid")  # strategies that keep only column chunks on chip
# The knobs whose growth never shrinks the footprint (for the farm's OOM dominance pruning).
MEMORY_PARAMS = ("block_batch", "block_rows", "block_cols", "buffers", "num_stages")
LANES, SUBLANES = 128, 8
# A per-column vector occupies whole (8, 128) tiles of 32-bit words in VMEM.
VECTOR_BYTES_PER_COL = SUBLANES * 4
DEFAULT_VMEM_LIMIT = 16 * 2**20


@dataclasses.dataclass(frozen=True)
class RowMath:
    """The math of a row-wise kernel, on float32 blocks whose last axis is the columns.

    rows(*blocks, cols, valid) -> outputs: the formula on whole rows.
    init(shape) -> stats: empty per-row statistics, each of `shape` (..., 1).
    update(stats, *chunk, valid) -> stats: fold one column chunk into the statistics.
    finish(stats, cols) -> row values: what `apply` needs, from the folded statistics.
    apply(row_values, *chunk) -> outputs: the outputs of one column chunk.
    Outputs are the row outputs, then per-element contributions to the column outputs.
    `valid` is None when every column of the block is real, else a (1, width) bool mask;
    masked-off elements of row inputs read as `pad`, of column inputs as 0.
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
    pad: float = 0.0

    @functools.cached_property
    def n_stats(self) -> int:
        """How many per-row statistics `init` makes."""
        return len(jax.eval_shape(lambda: self.init((1, 1))))


@dataclasses.dataclass(frozen=True)
class Plan:
    """A config checked against a shape and a target: the blocking every builder uses."""

    target: str
    batch: int
    rows: int
    cols: int
    block_batch: int
    block_rows: int
    block_cols: int
    strategy: str
    buffers: int
    passes: int
    rows_per_program: int

    @property
    def row_blocks(self) -> int:
        """Blocks of rows along the rows axis (TPU, interpret) or programs (Triton)."""
        if self.target == "gpu-triton":
            return pl.cdiv(self.rows, self.rows_per_program)
        return self.rows // self.block_rows

    @property
    def col_blocks(self) -> int:
        """Column chunks a streamed row is cut into."""
        return pl.cdiv(self.cols, self.block_cols)

    @property
    def partials(self) -> int:
        """Partial sums each column output is split into: one per block of rows."""
        if self.target == "gpu-triton":
            return self.batch * self.row_blocks
        return (self.batch // self.block_batch) * self.row_blocks


def split_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(batch, rows, cols) of a 2-D or 3-D shape; refuses other ranks."""
    if len(shape) == 2:
        return (1, *shape)
    if len(shape) == 3:
        return tuple(shape)
    raise NotImplementedError(f"row-wise kernels take 2-D or 3-D shapes, got {shape}")


def plan(config: dict[str, Any], shape: tuple[int, ...], target: str) -> Plan:
    """Check `config` for `shape` on `target`; raises with a plain message when it cannot work."""
    batch, rows, cols = split_shape(shape)
    block_rows = int(config["block_rows"])
    block_batch = int(config.get("block_batch", 1))
    if target == "gpu-triton":
        passes = int(config.get("passes", 1))
        if passes not in (1, 2):
            raise ValueError(f"passes must be 1 or 2, got {passes}")
        block_cols = int(config["block_cols"]) if passes == 2 else pl.next_power_of_2(cols)
        rows_per_program = int(config.get("rows_per_program", block_rows))
        for name, value in (("block_rows", block_rows), ("block_cols", block_cols)):
            if value & (value - 1):
                raise ValueError(f"Triton blocks are powers of two; {name}={value}")
        if block_batch != 1:
            raise ValueError("Triton handles one batch entry per program (block_batch=1)")
        if rows_per_program % block_rows:
            raise ValueError(f"rows_per_program={rows_per_program} must be a multiple of "
                             f"block_rows={block_rows}")
        return Plan(target, batch, rows, cols, 1, block_rows, block_cols, "one_pass"
                    if passes == 1 else "looped", 1, passes, rows_per_program)
    if target not in ("tpu", "interpret"):
        raise NotImplementedError(f"row-wise kernels do not support target {target!r}")
    strategy = str(config.get("strategy", "one_pass"))
    allowed = TPU_STRATEGIES if target == "tpu" else INTERPRET_STRATEGIES
    if strategy not in allowed:
        raise NotImplementedError(f"strategy {strategy!r} is not available on {target}; "
                                  f"expected one of {allowed}")
    block_cols = cols if strategy == "one_pass" else int(config.get("block_cols", cols))
    buffers = int(config.get("buffers", 2)) if target == "tpu" else 1
    if batch % block_batch or rows % block_rows or cols % block_cols:
        raise ValueError(f"blocks ({block_batch}, {block_rows}, {block_cols}) must divide the "
                         f"shape ({batch}, {rows}, {cols})")
    if target == "tpu" and ((block_rows % SUBLANES and block_rows != rows)
                            or (block_cols % LANES and block_cols != cols)):
        raise ValueError(f"TPU block ({block_rows}, {block_cols}): the last two dimensions must "
                         f"be divisible by {SUBLANES} and {LANES} respectively, or equal the "
                         f"array's ({rows}, {cols})")
    if target == "tpu":
        most = 2 if strategy != "emit_pipeline" else 4
        if not 1 <= buffers <= most:
            raise ValueError(f"buffers={buffers} must be in 1..{most} for strategy {strategy}")
    return Plan(target, batch, rows, cols, block_batch, block_rows, block_cols, strategy,
                buffers, 1, block_rows)


def default_config(math_: RowMath, shape: tuple[int, ...], target: str) -> dict[str, Any]:
    """A config that works for any shape, with every knob the target reads: small row blocks;
    streamed when rows are long. Knobs a strategy ignores take the spaces' placeholder (block_cols
    128 with whole rows)."""
    batch, rows, cols = split_shape(shape)
    if target == "gpu-triton":
        width = pl.next_power_of_2(cols)
        if width <= 8192:
            return {"block_rows": 1, "rows_per_program": 1, "num_warps": 4 if width <= 4096 else 8,
                    "num_stages": 1, "passes": 1, "block_cols": LANES}
        return {"block_rows": 1, "rows_per_program": 1, "num_warps": 8, "num_stages": 2, "passes": 2,
                "block_cols": 4096}
    # TPU: 16 rows make whole (16, 128) tiles of 16-bit types too (the default knows no dtype).
    tile = 2 * SUBLANES if target == "tpu" else SUBLANES
    block_rows = tile if rows % tile == 0 else rows
    config: dict[str, Any] = {"block_rows": block_rows, "strategy": "one_pass", "block_cols": LANES}
    if target == "tpu" and cols % LANES == 0:
        if footprint(math_, config, shape, jnp.float32, target) > DEFAULT_VMEM_LIMIT // 2:
            block_cols = max(c for c in (128, 256, 512, 1024) if cols % c == 0)
            config = {"block_rows": block_rows, "strategy": "emit_pipeline", "block_cols": block_cols}
    if target == "tpu":
        config["buffers"] = 2
    if len(shape) == 3:
        config["block_batch"] = 1
    return config


def footprint(math_: RowMath, config: dict[str, Any], shape: tuple[int, ...], dtype: Any,
              target: str) -> int:
    """On-chip bytes of one program.

    TPU (interpret: the same with one buffer): the pipelined row blocks (input buffers x
    inputs + min(buffers, 2) x outputs, at the dtype's width; a whole row block for one_pass
    and fori_loop, a column chunk for emit_pipeline and grid), column vectors at 32 bytes a
    column (whole (8, 128) tiles; resident inputs single-, outputs double-buffered, below),
    float32 temporaries of one chunk (inputs and outputs), and the statistics scratch of the
    streamed strategies (rows padded to 8, 128 lanes, float32). Column vectors: grid buffers
    their chunks like the rows; emit_pipeline streams input chunks and keeps each program's
    column outputs as one double-buffered block; one_pass and fori_loop keep whole vectors.
    Triton: shared memory only. Register tiles do not count: Triton spills rather than fails
    (measured on the H200: tiles modelled at 262-336 KB compiled and ran; bench/oom_probe.py),
    and the spaces' register constraints keep them small. What is left: passes=2 stages
    num_stages - 1 row-input chunks (block_rows x block_cols, dtype width) ahead of the loop,
    and each row reduction combines its warps' partial results in float32 scratch
    (block_rows x num_warps).
    """
    p = plan(config, shape, target)
    nri, nci, nro, nco = math_.row_inputs, math_.col_inputs, math_.row_outputs, math_.col_outputs
    if target == "gpu-triton":
        scratch = 4 * p.block_rows * int(config.get("num_warps", 4))
        if p.passes == 1:
            return scratch
        in_flight = int(config.get("num_stages", 3)) - 1  # loads the loop pipeliner keeps ahead
        return scratch + in_flight * nri * p.block_rows * p.block_cols * jnp.dtype(dtype).itemsize
    itemsize = jnp.dtype(dtype).itemsize
    in_buffers, out_buffers = p.buffers, min(p.buffers, 2)
    streamed = p.strategy in STREAMED
    resident = p.block_cols if streamed else p.cols
    block = p.block_batch * p.block_rows
    rows_io = (in_buffers * nri + out_buffers * nro) * block * resident * itemsize
    if p.strategy == "grid":
        vector_cols = (in_buffers * nci + out_buffers * nco) * p.block_cols
    elif p.strategy == "emit_pipeline":  # column outputs: one VMEM block per program
        vector_cols = in_buffers * nci * p.block_cols + 2 * nco * p.cols
    else:
        vector_cols = (nci + 2 * nco) * p.cols
    vectors = vector_cols * VECTOR_BYTES_PER_COL
    temporaries = (nri + nro) * block * p.block_cols * 4
    stats = 0
    if streamed:
        stats = math_.n_stats * p.block_batch * _round_up(p.block_rows, SUBLANES) * LANES * 4
    return rows_io + vectors + temporaries + stats


def build(math_: RowMath, config: dict[str, Any], shape: tuple[int, ...], dtype: Any,
          platform: Platform) -> Callable[..., Any]:
    """The Pallas kernel of `math_` for `config`: a function of (row inputs, column inputs)."""
    p = plan(config, shape, platform.target)
    dtype = jnp.dtype(dtype)
    if platform.target == "gpu-triton":
        call = _build_triton(math_, p, dtype, platform, config)
        vector_shape = (1, p.cols)
    else:
        call = _build_blocked(math_, p, dtype, platform, config, shape)
        vector_shape = (1, 1, p.cols)
    if p.strategy == "emit_pipeline":  # emit_pipeline reads the TPU's tiling while tracing
        call = tpu_mesh.traced_for_tpu(call)
    n_rows_in = math_.row_inputs

    expected = [tuple(shape)] * n_rows_in + [(p.cols,)] * math_.col_inputs

    def run(*inputs: jax.Array) -> Any:
        got = [tuple(x.shape) for x in inputs]
        if got != expected:
            raise ValueError(f"{math_.name} was built for input shapes {expected}, got {got}")
        row_ins = [x.reshape(p.batch, p.rows, p.cols) for x in inputs[:n_rows_in]]
        col_ins = [v.reshape(vector_shape) for v in inputs[n_rows_in:]]
        outs = call(*row_ins, *col_ins)
        row_outs = [o.reshape(shape) for o in outs[:math_.row_outputs]]
        col_outs = [jnp.sum(o, axis=0).reshape(p.cols).astype(dtype)
                    for o in outs[math_.row_outputs:]]
        results = (*row_outs, *col_outs)
        return results[0] if len(results) == 1 else results

    return run


def _round_up(value: int, multiple: int) -> int:
    return pl.cdiv(value, multiple) * multiple


def _split(refs: tuple[Any, ...], math_: RowMath) -> tuple[list[Any], ...]:
    """(row inputs, column inputs, row outputs, column outputs, scratch) of a kernel's refs."""
    counts = (math_.row_inputs, math_.col_inputs, math_.row_outputs, math_.col_outputs)
    groups, start = [], 0
    for count in counts:
        groups.append(list(refs[start:start + count]))
        start += count
    groups.append(list(refs[start:]))
    return tuple(groups)


# TPU and interpret: blocks through BlockSpecs, the math on VMEM values.

def _store(row_out: list[Any], col_out: list[Any], results: tuple[jax.Array, ...],
           cols: Any, vector_cols: Any = None) -> None:
    """Write one chunk's outputs; column contributions are summed over the block's rows."""
    n_rows = len(row_out)
    if len(results) != n_rows + len(col_out):
        raise ValueError(f"the math returned {len(results)} outputs, expected "
                         f"{n_rows + len(col_out)}")
    for ref, value in zip(row_out, results[:n_rows]):
        ref[:, :, cols] = value.astype(ref.dtype)
    vector_cols = cols if vector_cols is None else vector_cols
    for ref, value in zip(col_out, results[n_rows:]):
        ref[:, :, vector_cols] = jnp.sum(value, axis=(0, 1), keepdims=True)


def _read(refs: list[Any], cols: Any = slice(None)) -> list[jax.Array]:
    return [ref[:, :, cols].astype(F32) for ref in refs]


def _load_stats(refs: list[Any]) -> Stats:
    return tuple(ref[...] for ref in refs)


def _save_stats(refs: list[Any], stats: Stats) -> None:
    for ref, value in zip(refs, stats, strict=True):
        ref[...] = value


def _whole_rows_body(*refs: Any, math_: RowMath, p: Plan) -> None:
    row_in, col_in, row_out, col_out, _ = _split(refs, math_)
    if p.strategy == "one_pass":
        _store(row_out, col_out, math_.rows(*_read(row_in + col_in), cols=p.cols, valid=None),
               slice(None))
        return

    def chunk(j: jax.Array) -> Any:
        return pl.ds(pl.multiple_of(j * p.block_cols, p.block_cols), p.block_cols)

    def fold(j: jax.Array, stats: Stats) -> Stats:
        return math_.update(stats, *_read(row_in + col_in, chunk(j)), valid=None)

    stats = lax.fori_loop(0, p.col_blocks, fold, math_.init((p.block_batch, p.block_rows, 1)))
    row_values = math_.finish(stats, p.cols)

    def write(j: jax.Array, carry: int) -> int:
        _store(row_out, col_out, math_.apply(row_values, *_read(row_in + col_in, chunk(j))),
               chunk(j))
        return carry

    lax.fori_loop(0, p.col_blocks, write, 0)


def _grid_body(*refs: Any, math_: RowMath, p: Plan) -> None:
    row_in, col_in, row_out, col_out, stats_refs = _split(refs, math_)
    phase, j = pl.program_id(2), pl.program_id(3)

    @pl.when((phase == 0) & (j == 0))
    def _init():
        _save_stats(stats_refs, math_.init((p.block_batch, p.block_rows, 1)))

    @pl.when(phase == 0)
    def _fold():
        _save_stats(stats_refs, math_.update(_load_stats(stats_refs), *_read(row_in + col_in),
                                             valid=None))

    @pl.when(phase == 1)
    def _write():
        row_values = math_.finish(_load_stats(stats_refs), p.cols)
        _store(row_out, col_out, math_.apply(row_values, *_read(row_in + col_in)), slice(None))


def _pipeline_body(*refs: Any, math_: RowMath, p: Plan) -> None:
    from jax.experimental.pallas import tpu as pltpu

    row_in, col_in, row_out, col_out, stats_refs = _split(refs, math_)
    bb, br, bc = p.block_batch, p.block_rows, p.block_cols
    window = (pl.ds(pl.program_id(0) * bb, bb), pl.ds(pl.program_id(1) * br, br))
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

    def fold(*chunk_refs: Any) -> None:
        _save_stats(stats_refs, math_.update(_load_stats(stats_refs), *_read(list(chunk_refs)),
                                             valid=None))

    def write(*chunk_refs: Any) -> None:
        row_values = math_.finish(_load_stats(stats_refs), p.cols)
        results = math_.apply(row_values, *_read(list(chunk_refs[:n_in])))
        # Row outputs are the pipeline's chunks; column outputs are whole VMEM blocks, written
        # at the pipeline's step (program_id inside emit_pipeline is its own index).
        step = pl.ds(pl.multiple_of(pl.program_id(0) * bc, bc), bc)
        _store(list(chunk_refs[n_in:]), col_out, results, slice(None), step)

    pltpu.emit_pipeline(fold, grid=(p.col_blocks,), in_specs=in_specs)(*row_in, *col_in)
    pltpu.emit_pipeline(write, grid=(p.col_blocks,), in_specs=in_specs,
                        out_specs=out_specs)(*row_in, *col_in, *row_out)


def _build_blocked(math_: RowMath, p: Plan, dtype: Any, platform: Platform,
                   config: dict[str, Any], shape: tuple[int, ...]) -> Callable[..., Any]:
    bb, br, bc, C = p.block_batch, p.block_rows, p.block_cols, p.cols
    n_batch, n_rows = p.batch // bb, p.row_blocks
    tpu = platform.target == "tpu"
    mode = None if (not tpu or p.buffers == 2) else pl.Buffered(p.buffers)
    out_shape = tuple(
        [jax.ShapeDtypeStruct((p.batch, p.rows, C), dtype)] * math_.row_outputs
        + [jax.ShapeDtypeStruct((p.partials, 1, C), F32)] * math_.col_outputs)
    stats_scratch = [_vmem((bb, br, 1))] * math_.n_stats
    scratch: list[Any] = []
    if p.strategy in ("one_pass", "fori_loop"):
        body = functools.partial(_whole_rows_body, math_=math_, p=p)
        grid = (n_batch, n_rows)
        row = pl.BlockSpec((bb, br, C), lambda b, i: (b, i, 0), pipeline_mode=mode)
        vector = pl.BlockSpec((1, 1, C), lambda b, i: (0, 0, 0))
        partial = pl.BlockSpec((1, 1, C), lambda b, i: (b * n_rows + i, 0, 0))
        in_specs = [row] * math_.row_inputs + [vector] * math_.col_inputs
        out_specs = [row] * math_.row_outputs + [partial] * math_.col_outputs
        semantics = ("parallel", "parallel")
    elif p.strategy == "grid":
        body = functools.partial(_grid_body, math_=math_, p=p)
        grid = (n_batch, n_rows, 2, p.col_blocks)
        row_in = pl.BlockSpec((bb, br, bc), lambda b, i, ph, j: (b, i, j), pipeline_mode=mode)
        # Outputs stay on block 0 while phase 0 folds statistics; phase 1 fills every block.
        row_out = pl.BlockSpec((bb, br, bc), lambda b, i, ph, j: (b, i, j * ph),
                               pipeline_mode=mode)
        vector = pl.BlockSpec((1, 1, bc), lambda b, i, ph, j: (0, 0, j), pipeline_mode=mode)
        partial = pl.BlockSpec((1, 1, bc), lambda b, i, ph, j: (b * n_rows + i, 0, j * ph),
                               pipeline_mode=mode)
        in_specs = [row_in] * math_.row_inputs + [vector] * math_.col_inputs
        out_specs = [row_out] * math_.row_outputs + [partial] * math_.col_outputs
        scratch = stats_scratch
        semantics = ("parallel", "parallel", "arbitrary", "arbitrary")
    elif p.strategy == "emit_pipeline":
        body = functools.partial(_pipeline_body, math_=math_, p=p)
        grid = (n_batch, n_rows)
        hbm = pl.BlockSpec(memory_space=pl.ANY)
        partial = pl.BlockSpec((1, 1, C), lambda b, i: (b * n_rows + i, 0, 0))
        in_specs = [hbm] * (math_.row_inputs + math_.col_inputs)
        out_specs = [hbm] * math_.row_outputs + [partial] * math_.col_outputs
        scratch = stats_scratch
        semantics = ("parallel", "parallel")
    else:  # plan() admits nothing else
        raise NotImplementedError(p.strategy)
    tpu_params: dict[str, Any] = {"dimension_semantics": semantics}
    needed = footprint(math_, config, shape, dtype, "tpu") if tpu else 0
    if needed > DEFAULT_VMEM_LIMIT * 3 // 4:
        tpu_params["vmem_limit_bytes"] = _round_up(needed * 5 // 4, 2**20)
    return pallas_call(body, platform=platform, config=config, out_shape=out_shape, grid=grid,
                       in_specs=in_specs, out_specs=tuple(out_specs), scratch_shapes=scratch,
                       tpu_params=tpu_params, name=math_.name)


def _vmem(shape: tuple[int, ...]) -> Any:
    """A float32 VMEM scratch buffer (generic interpret mode accepts the same descriptor)."""
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.VMEM(shape, F32)


# Triton: whole refs in global memory, masked loads of power-of-two tiles.

def _triton_body(*refs: Any, math_: RowMath, p: Plan) -> None:
    from jax.experimental.pallas import triton as pltriton

    row_in, col_in, row_out, col_out, _ = _split(refs, math_)
    program, b = pl.program_id(0), pl.program_id(1)
    br, width, C = p.block_rows, p.block_cols, p.cols
    # Masks only where blocks overhang the array, so that full blocks load unmasked.
    ragged_cols = C % width != 0
    ragged_rows = p.rows % p.rows_per_program != 0
    n_row_out = math_.row_outputs

    def load_chunk(rows: jax.Array, row_valid: jax.Array | None, c0: Any, policy: str | None):
        col_valid = (c0 + jnp.arange(width) < C)[None, :] if ragged_cols else None
        mask = _and(row_valid, col_valid)
        window = (b, pl.ds(rows, br), pl.ds(c0, width))
        blocks = [pltriton.load(ref.at[window], mask=mask,
                                other=None if mask is None else math_.pad,
                                eviction_policy=policy).astype(F32) for ref in row_in]
        blocks += [pltriton.load(ref.at[pl.ds(0, 1), pl.ds(c0, width)], mask=col_valid,
                                 other=None if col_valid is None else 0.0).astype(F32)
                   for ref in col_in]
        return blocks, window, mask, col_valid

    def store_chunk(results, window, mask) -> list[jax.Array]:
        for ref, value in zip(row_out, results[:n_row_out]):
            pltriton.store(ref.at[window], value.astype(ref.dtype), mask=mask)
        if mask is not None:
            results = [jnp.where(mask, value, 0.0) for value in results]
        return [jnp.sum(value, axis=0) for value in results[n_row_out:]]

    def row_block(k: Any, sums: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        rows = program * p.rows_per_program + k * br
        row_valid = (rows + jnp.arange(br) < p.rows)[:, None] if ragged_rows else None
        if p.passes == 1:
            blocks, window, mask, valid = load_chunk(rows, row_valid, 0, None)
            contributions = store_chunk(math_.rows(*blocks, cols=C, valid=valid), window, mask)
            return tuple(s + c for s, c in zip(sums, contributions))

        def fold(j: jax.Array, stats: Stats) -> Stats:
            blocks, _, _, valid = load_chunk(rows, row_valid, j * width, "evict_last")
            return math_.update(stats, *blocks, valid=valid)

        stats = lax.fori_loop(0, p.col_blocks, fold, math_.init((br, 1)))
        row_values = math_.finish(stats, C)

        def write(j: jax.Array, carry: int) -> int:
            blocks, window, mask, _ = load_chunk(rows, row_valid, j * width, "evict_first")
            contributions = store_chunk(math_.apply(row_values, *blocks), window, mask)
            # passes=2 covers one block of rows per program: its partial sums are final.
            part = (b * p.row_blocks + program, pl.ds(j * width, width))
            for ref, value in zip(col_out, contributions):
                pltriton.store(ref.at[part], value,
                               mask=j * width + jnp.arange(width) < C if ragged_cols else None)
            return carry

        lax.fori_loop(0, p.col_blocks, write, 0)
        return sums

    sums = tuple(jnp.zeros((width,), F32) for _ in col_out)
    steps = p.rows_per_program // br
    sums = row_block(0, sums) if steps == 1 else lax.fori_loop(0, steps, row_block, sums)
    if p.passes == 1:
        part = (b * p.row_blocks + program, pl.ds(0, width))
        for ref, value in zip(col_out, sums):
            pltriton.store(ref.at[part], value, mask=jnp.arange(width) < C if ragged_cols else None)


def _and(a: jax.Array | None, b: jax.Array | None) -> jax.Array | None:
    """The conjunction of two optional masks (None: everything valid)."""
    if a is None or b is None:
        return b if a is None else a
    return a & b


def _build_triton(math_: RowMath, p: Plan, dtype: Any, platform: Platform,
                  config: dict[str, Any]) -> Callable[..., Any]:
    if p.passes == 2 and math_.col_outputs and p.rows_per_program != p.block_rows:
        raise ValueError("with column outputs, passes=2 takes rows_per_program == block_rows")
    out_shape = tuple(
        [jax.ShapeDtypeStruct((p.batch, p.rows, p.cols), dtype)] * math_.row_outputs
        + [jax.ShapeDtypeStruct((p.partials, p.cols), F32)] * math_.col_outputs)
    body = functools.partial(_triton_body, math_=math_, p=p)
    # The rows axis first: CUDA allows 2**31 - 1 programs there, 65535 on the others.
    return pallas_call(body, platform=platform, config=config, out_shape=out_shape,
                       grid=(p.row_blocks, p.batch), name=math_.name)


def entry_points(math_: RowMath, dims: str, hint: str = "") -> tuple[Callable[..., int],
                                                                    Callable[..., dict[str, Any]],
                                                                    Callable[..., Callable[..., Any]]]:
    """A row-wise kernel module's `footprint`, `default_config` and `build`, all from `math_`.

    `dims` names the shape's axes, e.g. "(rows, cols)"; a shape of another rank is refused,
    with `hint` added to the message."""
    rank = dims.count(",") + 1

    def kernel_footprint(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
        """On-chip bytes of one program (see `kernels.rowwise.footprint`)."""
        return footprint(math_, config, shape, dtype, target)

    def kernel_default_config(shape: tuple[int, ...], target: str) -> dict[str, Any]:
        """A safe config for any shape, with every knob of the target (see `kernels.rowwise.default_config`)."""
        return default_config(math_, shape, target)

    def kernel_build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any,
                     platform: Platform) -> Callable[..., Any]:
        """The Pallas kernel for `config` on `platform`: a function of (row inputs, column inputs)."""
        if len(shape) != rank:
            raise NotImplementedError(f"{math_.name} takes {dims}{hint}, got {shape}")
        return build(math_, config, shape, dtype, platform)

    kernel_footprint.__name__, kernel_default_config.__name__, kernel_build.__name__ = \
        "footprint", "default_config", "build"
    return kernel_footprint, kernel_default_config, kernel_build
