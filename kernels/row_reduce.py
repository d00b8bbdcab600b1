"""Per-row reductions streamed over column blocks, shared by `welford` and `cross_entropy`.

A kernel states its math as a `RowReduction`: the state of one block of columns (`block`),
how two states combine (`merge`, associative, with `init` as identity), and the per-row
results (`finish`). This module turns that into a Pallas kernel for each target, with the
way a row is walked as a config knob:

  strategy (TPU and interpret)
    one_pass       the whole row is one block: block, then finish.
    fori_loop      the whole row is one VMEM block; a `lax.fori_loop` folds column slices
                   of `block_cols` into the state, so f32 temporaries stay slice-sized.
    grid           a second, "arbitrary" grid axis walks column blocks of `block_cols`;
                   the state lives in VMEM scratch between grid steps.
    emit_pipeline  (TPU only) the input stays in HBM; `pltpu.emit_pipeline` streams column
                   blocks into VMEM with `buffers` buffers, folding each into the state.
  strategy (gpu-triton)
    one_pass       the row, padded to a power of two and masked, is one register block.
    fori_loop      a loop over masked column blocks of `block_cols` (any row length).

Other knobs: block_rows (rows per program), block_cols, buffers (TPU: input buffers, 1 or 2
for BlockSpecs, any count >= 1 for emit_pipeline), stats_layout (TPU: per-row vectors as
(rows, 1) "column" arrays, or lane-dense 1-D "lane" arrays), num_warps and num_stages (Triton).
Per-row results are float32 arrays of shape (rows,).

TPU shape rules, refused up front: block_rows dividing the rows and a multiple of 8 or all
rows ("column"), or a power of two >= 128, a multiple of 1024 or all rows ("lane"); block_cols
a multiple of 128 dividing the row, or the whole row. interpret: block_cols divides the row,
row blocks may be partial. gpu-triton: powers of two, any shape (padding and masks).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.lowering import Platform, pallas_call

State = tuple[jax.Array, ...]

STRATEGIES = {
    "interpret": ("one_pass", "fori_loop", "grid"),
    "tpu": ("one_pass", "fori_loop", "grid", "emit_pipeline"),
    "gpu-triton": ("one_pass", "fori_loop"),
}
LAYOUTS = ("column", "lane")
# The knobs that grow on-chip memory (farm.pruning: a config at least as large as one that ran
# out of memory in all of these, the rest equal, is pruned).
MEMORY_PARAMS = ("block_rows", "block_cols", "buffers", "num_stages")


@dataclasses.dataclass(frozen=True)
class RowReduction:
    """The math of a per-row reduction, as a monoid over blocks of columns.

    state: the NamedTuple class of the per-row state; each field a (block_rows, 1) f32 array.
    init(block_rows) -> state             the identity of `merge`.
    block(x, cols, valid, *row_inputs)    the state of one block: x (r, c) f32, cols (1, c)
        int32 global column ids, valid (1, c) bool or None (GPU padding; padded x holds `pad`),
        row_inputs (r, 1) per-row operands such as labels.
    merge(a, b) -> state                  the state of the two blocks together.
    finish(state) -> results              per-row results, each (r, 1) f32.
    """

    state: type
    init: Callable[[int], State]
    block: Callable[..., State]
    merge: Callable[[State, State], State]
    finish: Callable[[State], State]
    n_outputs: int
    pad: float = 0.0


def vmem_limit(footprint_bytes: int) -> int:
    """The scoped VMEM limit for a TPU kernel: 1.5 x footprint + 4 MiB, in [32 MiB, the chip's VMEM]."""
    from kernels.tpu_mesh import vmem_capacity_bytes

    return min(vmem_capacity_bytes(), max(32 * 2**20, footprint_bytes * 3 // 2 + 4 * 2**20))


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def check_config(config: dict[str, Any], shape: tuple[int, ...], target: str) -> None:
    """Refuse a config the target cannot run, with a message naming the knob and the rule."""
    rows, cols = shape
    strategy = config["strategy"]
    if target not in STRATEGIES:
        raise NotImplementedError(f"target {target!r} is not supported; expected one of "
                                  f"{list(STRATEGIES)}")
    if strategy not in STRATEGIES[target]:
        raise NotImplementedError(f"strategy {strategy!r} is not available on {target}; "
                                  f"expected one of {list(STRATEGIES[target])}")
    br = int(config["block_rows"])
    bc = int(config.get("block_cols", cols))
    if br < 1 or bc < 1:
        raise ValueError(f"block_rows and block_cols must be positive, got {br} and {bc}")
    looped = strategy != "one_pass"
    if target == "gpu-triton":
        if not _is_pow2(br) or (looped and not _is_pow2(bc)):
            raise ValueError(f"Triton blocks must be powers of two, got block_rows={br}, "
                             f"block_cols={bc}")
        return
    if looped and cols % bc:
        raise ValueError(f"block_cols={bc} must divide the row length {cols}")
    if target != "tpu":
        return
    layout = config.get("stats_layout", "column")
    if layout not in LAYOUTS:
        raise ValueError(f"stats_layout must be one of {list(LAYOUTS)}, got {layout!r}")
    if layout == "column" and br % 8 and br != rows:
        raise ValueError(f"block_rows={br} must be a multiple of 8 or all {rows} rows on TPU")
    if layout == "lane" and br != rows and br % 1024 and not (_is_pow2(br) and br >= 128):
        raise ValueError(f"block_rows={br} must be a power of two >= 128, a multiple of 1024 "
                         f"or all {rows} rows for lane-dense per-row vectors on TPU")
    if looped and bc % 128 and bc != cols:
        raise ValueError(f"block_cols={bc} must be a multiple of 128 or the whole row ({cols})")
    buffers = int(config.get("buffers", 2))
    if buffers < 1 or (strategy != "emit_pipeline" and buffers > 2):
        raise ValueError(f"buffers={buffers}: BlockSpec pipelines take 1 or 2 buffers on TPU "
                         "(more only with emit_pipeline)")
    # Partial row blocks are refused: TPU interpret mode (JAX 0.10) mis-shapes them when outputs
    # are aliased, as validation's poisoned outputs are; emit_pipeline slices whole row blocks.
    if rows % br:
        raise ValueError(f"block_rows={br} must divide the {rows} rows on TPU")


def footprint(reduction: RowReduction, config: dict[str, Any], shape: tuple[int, ...], dtype: Any,
              target: str, n_row_inputs: int = 0) -> int:
    """On-chip bytes of one program.

    TPU / interpret: buffers x the input block (block_rows x window; window = the row, or
    block_cols for grid and emit_pipeline) + two f32 temporaries of the columns computed at
    once (the row for one_pass, else block_cols) + the per-row vectors: outputs and row inputs
    (double-buffered on TPU) and, for grid and emit_pipeline, the f32 (block_rows, 1) state
    buffers. A (block_rows, 1) f32 vector fills 128 lanes (block_rows x 512 bytes, rows rounded
    up to 8); a lane-dense one takes block_rows x 4 bytes (rounded up to 128 rows).
    gpu-triton: shared memory only (register tiles spill rather than fail; measured on the H200,
    bench/oom_probe.py): num_stages - 1 pipelined block_rows x block_cols input tiles for
    fori_loop, and the f32 scratch where each row reduction combines its warps (block_rows x
    num_warps).
    """
    rows, cols = shape
    item = jnp.dtype(dtype).itemsize
    strategy = config["strategy"]
    br = int(config["block_rows"])
    bc = int(config.get("block_cols", cols))
    if target == "gpu-triton":
        scratch = 4 * br * int(config.get("num_warps", 4))
        stages = int(config.get("num_stages", 1)) - 1 if strategy == "fori_loop" else 0
        return scratch + max(stages, 0) * br * bc * item  # loads pipelined through shared memory
    window = bc if strategy in ("grid", "emit_pipeline") else cols  # x block held in VMEM
    slice_ = cols if strategy == "one_pass" else bc                # columns computed at once
    buffers = int(config.get("buffers", 2)) if target == "tpu" else 1
    lane = config.get("stats_layout", "column") == "lane" and target == "tpu"
    vector = _align(br, 128) * 4 if lane else _align(br, 8) * 128 * 4  # (br, 1) pads to 128 lanes
    column = _align(br, 8) * 128 * 4
    n_state = len(reduction.state._fields)
    state = n_state * column if strategy in ("grid", "emit_pipeline") else 0
    row_io = (2 if target == "tpu" else 1) * (reduction.n_outputs + n_row_inputs) * vector
    return buffers * br * window * item + 2 * br * slice_ * 4 + row_io + state


def default_config(shape: tuple[int, ...], target: str) -> dict[str, Any]:
    """A safe config: 16 or 8 rows per program (TPU), 1 (GPU); rows over 16384 in column blocks."""
    rows, cols = shape
    long_row = cols > 16384
    if target == "gpu-triton":
        return {"strategy": "fori_loop" if long_row else "one_pass", "block_rows": 1,
                "block_cols": 2048 if long_row else 64, "num_warps": 8 if long_row else 4,
                "num_stages": 2 if long_row else 1}
    block_cols = next((c for c in (2048, 1024, 512, 256, 128) if cols % c == 0 and c < cols), cols)
    config = {"strategy": "grid" if long_row else "one_pass",
              "block_rows": next((b for b in (16, 8) if rows % b == 0), rows),
              "block_cols": block_cols if long_row else 64}
    if target == "tpu":
        config |= {"buffers": 2, "stats_layout": "column"}
    return config


# ---------------------------------------------------------------------------------------------
# TPU and interpret: BlockSpec pipelines, a fori_loop over slices, or emit_pipeline.

def _read_rows(refs: tuple[Any, ...]) -> tuple[jax.Array, ...]:
    return tuple(r[...].reshape(r.shape[0], 1) for r in refs)


def _write_rows(refs: tuple[Any, ...], values: State) -> None:
    for ref, value in zip(refs, values):
        ref[...] = value.reshape(ref.shape).astype(ref.dtype)


def _col_ids(start: Any, width: int) -> jax.Array:
    return start + jax.lax.broadcasted_iota(jnp.int32, (1, width), 1)


def _one_pass_body(*refs: Any, reduction: RowReduction, n_in: int) -> None:
    x_ref, row_refs, out_refs = refs[0], refs[1:n_in], refs[n_in:]
    x = x_ref[...].astype(jnp.float32)
    state = reduction.block(x, _col_ids(0, x.shape[1]), None, *_read_rows(row_refs))
    _write_rows(out_refs, reduction.finish(state))


def _fori_loop_body(*refs: Any, reduction: RowReduction, n_in: int, block_cols: int) -> None:
    x_ref, row_refs, out_refs = refs[0], refs[1:n_in], refs[n_in:]
    row_inputs = _read_rows(row_refs)

    def fold(j: Any, state: State) -> State:
        start = pl.multiple_of(j * block_cols, block_cols)
        x = x_ref[:, pl.ds(start, block_cols)].astype(jnp.float32)
        here = reduction.block(x, _col_ids(start, block_cols), None, *row_inputs)
        return reduction.merge(state, here)

    state = jax.lax.fori_loop(0, x_ref.shape[1] // block_cols, fold, reduction.init(x_ref.shape[0]))
    _write_rows(out_refs, reduction.finish(state))


def _grid_body(*refs: Any, reduction: RowReduction, n_in: int, n_out: int, block_cols: int) -> None:
    x_ref, row_refs = refs[0], refs[1:n_in]
    out_refs, state_refs = refs[n_in:n_in + n_out], refs[n_in + n_out:]
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _start() -> None:
        _write_rows(state_refs, reduction.init(x_ref.shape[0]))

    x = x_ref[...].astype(jnp.float32)
    here = reduction.block(x, _col_ids(j * block_cols, block_cols), None, *_read_rows(row_refs))
    _write_rows(state_refs, reduction.merge(reduction.state(*(r[...] for r in state_refs)), here))

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish() -> None:
        _write_rows(out_refs, reduction.finish(reduction.state(*(r[...] for r in state_refs))))


def _emit_pipeline_body(*refs: Any, reduction: RowReduction, n_in: int, n_out: int,
                        block_rows: int, block_cols: int, buffers: int) -> None:
    from jax.experimental.pallas import tpu as pltpu

    x_hbm, row_refs = refs[0], refs[1:n_in]
    out_refs, state_refs, start_ref = refs[n_in:n_in + n_out], refs[n_in + n_out:-1], refs[-1]
    row_inputs = _read_rows(row_refs)
    _write_rows(state_refs, reduction.init(block_rows))
    start_ref[0] = 0

    def fold(x_ref: Any) -> None:
        start = start_ref[0]
        x = x_ref[...].astype(jnp.float32)
        here = reduction.block(x, _col_ids(start, block_cols), None, *row_inputs)
        _write_rows(state_refs, reduction.merge(reduction.state(*(r[...] for r in state_refs)), here))
        start_ref[0] = start + block_cols

    rows = x_hbm.at[pl.ds(pl.multiple_of(pl.program_id(0) * block_rows, block_rows), block_rows)]
    spec = pl.BlockSpec((block_rows, block_cols), lambda j: (0, j), pipeline_mode=pl.Buffered(buffers))
    pltpu.emit_pipeline(fold, grid=(x_hbm.shape[1] // block_cols,), in_specs=[spec])(rows)
    _write_rows(out_refs, reduction.finish(reduction.state(*(r[...] for r in state_refs))))


def _build_blocked(reduction: RowReduction, config: dict[str, Any], shape: tuple[int, ...],
                   dtype: Any, platform: Platform, n_row_inputs: int,
                   name: str) -> Callable[..., tuple[jax.Array, ...]]:
    from jax.experimental.pallas import tpu as pltpu

    rows, cols = shape
    strategy = config["strategy"]
    br = int(config["block_rows"])
    bc = int(config.get("block_cols", cols))
    tpu = platform.target == "tpu"
    lane = config.get("stats_layout", "column") == "lane" or not tpu
    buffers = int(config.get("buffers", 2))
    mode = pl.Buffered(buffers) if tpu and strategy != "emit_pipeline" else None
    n_in, n_out = 1 + n_row_inputs, reduction.n_outputs
    vec_shape = (rows,) if lane else (rows, 1)
    n_row_blocks = pl.cdiv(rows, br)

    if strategy == "grid":
        grid = (n_row_blocks, cols // bc)
        x_spec = pl.BlockSpec((br, bc), lambda i, j: (i, j), pipeline_mode=mode)
        vec_spec = (pl.BlockSpec((br,), lambda i, j: (i,)) if lane
                    else pl.BlockSpec((br, 1), lambda i, j: (i, 0)))
        semantics = ("parallel", "arbitrary")
    else:
        grid = (n_row_blocks,)
        if strategy == "emit_pipeline":
            x_spec = pl.BlockSpec(memory_space=pl.ANY)
        else:
            x_spec = pl.BlockSpec((br, cols), lambda i: (i, 0), pipeline_mode=mode)
        vec_spec = (pl.BlockSpec((br,), lambda i: (i,)) if lane
                    else pl.BlockSpec((br, 1), lambda i: (i, 0)))
        semantics = ("parallel",)

    n_state = len(reduction.state._fields)
    scratch: list[Any] = []
    if strategy == "one_pass":
        body = functools.partial(_one_pass_body, reduction=reduction, n_in=n_in)
    elif strategy == "fori_loop":
        body = functools.partial(_fori_loop_body, reduction=reduction, n_in=n_in, block_cols=bc)
    elif strategy == "grid":
        body = functools.partial(_grid_body, reduction=reduction, n_in=n_in, n_out=n_out, block_cols=bc)
        scratch = [pltpu.VMEM((br, 1), jnp.float32) for _ in range(n_state)]
    else:
        body = functools.partial(_emit_pipeline_body, reduction=reduction, n_in=n_in, n_out=n_out,
                                 block_rows=br, block_cols=bc, buffers=buffers)
        scratch = [pltpu.VMEM((br, 1), jnp.float32) for _ in range(n_state)]
        scratch.append(pltpu.SMEM((1,), jnp.int32))

    tpu_params = None
    if tpu:
        needed = footprint(reduction, config, shape, dtype, platform.target, n_row_inputs)
        tpu_params = {"dimension_semantics": semantics, "vmem_limit_bytes": vmem_limit(needed)}
    call = pallas_call(
        body, platform=platform, config=config,
        out_shape=tuple(jax.ShapeDtypeStruct(vec_shape, jnp.float32) for _ in range(n_out)),
        grid=grid, in_specs=[x_spec, *[vec_spec] * n_row_inputs], out_specs=tuple([vec_spec] * n_out),
        scratch_shapes=scratch, tpu_params=tpu_params, name=name,
    )

    def reduce_rows(x: jax.Array, *row_inputs: jax.Array) -> tuple[jax.Array, ...]:
        outs = call(x, *(r.reshape(vec_shape) for r in row_inputs))
        return tuple(o.reshape(rows) for o in outs)

    if tpu:
        from kernels.tpu_mesh import traced_for_tpu

        return traced_for_tpu(reduce_rows)
    return reduce_rows


# ---------------------------------------------------------------------------------------------
# Triton: one program per block of rows, masked loads, any row length.

def _triton_body(*refs: Any, reduction: RowReduction, n_in: int, strategy: str, block_rows: int,
                 block_cols: int) -> None:
    from jax.experimental.pallas import triton as pltriton

    x_ref, row_refs, out_refs = refs[0], refs[1:n_in], refs[n_in:]
    rows, cols = x_ref.shape
    row_start = pl.program_id(0) * block_rows
    row_ok = row_start + jnp.arange(block_rows) < rows
    row_window = pl.ds(row_start, block_rows)
    row_inputs = tuple(pltriton.load(r.at[row_window], mask=row_ok, other=0)[:, None]
                       for r in row_refs)

    def block_at(start: Any, width: int) -> State:
        col_ids = start + jnp.arange(width)[None, :]
        valid = col_ids < cols
        x = pltriton.load(x_ref.at[row_window, pl.ds(start, width)], mask=row_ok[:, None] & valid,
                          other=reduction.pad)
        return reduction.block(x.astype(jnp.float32), col_ids, valid, *row_inputs)

    if strategy == "one_pass":
        state = block_at(0, pl.next_power_of_2(cols))
    else:
        state = jax.lax.fori_loop(
            0, pl.cdiv(cols, block_cols),
            lambda j, s: reduction.merge(s, block_at(j * block_cols, block_cols)),
            reduction.init(block_rows))
    for ref, value in zip(out_refs, reduction.finish(state)):
        pltriton.store(ref.at[row_window], value.reshape(block_rows).astype(ref.dtype), mask=row_ok)


def _build_triton(reduction: RowReduction, config: dict[str, Any], shape: tuple[int, ...],
                  platform: Platform, n_row_inputs: int,
                  name: str) -> Callable[..., tuple[jax.Array, ...]]:
    rows, cols = shape
    br = int(config["block_rows"])
    body = functools.partial(
        _triton_body, reduction=reduction, n_in=1 + n_row_inputs, strategy=config["strategy"],
        block_rows=br, block_cols=int(config.get("block_cols", cols)))
    call = pallas_call(
        body, platform=platform, config=config, grid=(pl.cdiv(rows, br),), name=name,
        out_shape=tuple(jax.ShapeDtypeStruct((rows,), jnp.float32)
                        for _ in range(reduction.n_outputs)))

    def reduce_rows(x: jax.Array, *row_inputs: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(call(x, *row_inputs))

    return reduce_rows


def build(reduction: RowReduction, config: dict[str, Any], shape: tuple[int, ...], dtype: Any,
          platform: Platform, *, n_row_inputs: int = 0,
          name: str = "row_reduce") -> Callable[..., tuple[jax.Array, ...]]:
    """A function of (x, *row_inputs) returning the reduction's per-row results, each (rows,) f32."""
    if len(shape) != 2:
        raise NotImplementedError(f"{name} takes a 2-D (rows, cols) input, got shape {shape}")
    check_config(config, shape, platform.target)
    if platform.target == "gpu-triton":
        return _build_triton(reduction, config, shape, platform, n_row_inputs, name)
    return _build_blocked(reduction, config, shape, dtype, platform, n_row_inputs, name)
