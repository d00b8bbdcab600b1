"""RMS norm backward on Mosaic GPU: rows taken in turn through shared-memory slots, dweight summed
on chip.

The row engine's staged rows (`kernels.rows.mosaic`) give each row its own block, which suits
row maps; the backward also sums dweight = sum over rows of dy * x * r, and a block per row
would write a float32 partial row per row (twice the bytes of dx). Here each block (one
warpgroup) takes `rows_per_program` consecutive rows in turn:

  - x and dy of a row arrive together in one of `slots` shared-memory slots by bulk copies
    (`cp.async.bulk`), the weight once per block, staged whole;
  - walk: chunks of `block_cols` columns give sum(x^2) and sum(dy * w * x) of the row, so
    r = rsqrt(mean(x^2) + eps) and c = r^3 mean(dy * w * x);
  - once this walk is done, the row `slots - 1` ahead is copied into the slot of the previous
    row, whose write-back has read it out by then (the block waits for that read only);
  - map: dx = r dy w - c x, written in place over x's slot and written back in one bulk copy,
    and dy * x * r added into the block's float32 dweight row (in shared memory, or in
    registers: `dweight_in`);
  - the block ends by writing its dweight row: XLA adds the (blocks, cols) partials, a few MB.

Every byte of x and dy is read once from HBM and dx written once. Rows must be whole 128-byte
units (bulk copies into shared memory) and fit the slots beside the weight and the float32
dweight row (227 KiB a block on sm_90; at 8192 bf16 columns, 3 slots take 144 KiB); chunks must
divide the row. Other shapes: gpu-triton. A chunk holds 8 bytes a thread of the warpgroup's 128
(512 bf16 columns); rows that no chunk of 512 divides (hidden sizes 768, 896, 1280, 2304) take
chunks of 256 or 128 columns with fewer elements a thread (`vector_size`), lowered for CUDA on
CPU but not yet timed on a device: a deployment runs gpu-triton's default there
(`kernels.rms_norm_bwd.default_gpu_targets`). Tested in Pallas's GPU interpreter on CPU; on the H200
at 8192 x 8192 bf16: 103-104 us of kernels (dweight in shared memory, 3 slots, 64 rows a block,
4096-column chunks), against 112-114 us for Triton's tuned kernel, 168 us for XLA and 96 us for a
copy of the same bytes (BENCHMARKS.md).

Config knobs: strategy "smem_rows"; block_rows 1; rows_per_program (a power of two, 1 to 1024:
rows a block takes in turn; blocks = rows / rows_per_program, the last block's rows fewer when it
does not divide); slots (2 to 4); block_cols (a power of two, 128 to 8192, dividing the row);
approx_math (1: Mosaic GPU's approximate rsqrt); dweight_in, "smem" (the block's float32 dweight
row in shared memory beside the slots, added to chunk by chunk) or "registers" (rows of up to
8192 columns: each thread holds its cols / 128 sums, and the row takes the slots' shared memory
only once the rows are done, so that two blocks fit a SM at 8192 bf16 columns); stream_cols, 0
(the weight staged whole in shared memory) or 2 (read chunk by chunk from global memory, an L2
hit after the first rows, as the row engine's stream_cols 2: 16 KB less shared memory a block at
8192 bf16 columns, so that 3 slots and dweight in registers fit two blocks a SM; measured slower
there, 116-120 us against 106, and left out of the search space).

Measured and not kept (H200, 8192 x 8192 bf16, BENCHMARKS.md, twenty-first session): 16-byte
shared-memory accesses (20% slower), the weight converted once to a float32 row, and a row's x
and dy held in registers from the walk to the map (both no faster): fewer instructions or
shared-memory reads a row do not move this kernel.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import mgpu_launch
from kernels.lowering import Platform
from kernels.rows.config import check_pow2, from_dict

TARGET = "gpu-mosaic"
STRATEGY = "smem_rows"
SLOTS = (2, 4)
CHUNKS = (128, 8192)
FULL_CHUNK = 512  # the smallest chunk of 8 bytes a thread in 16-bit types; smaller ones are untimed
ROWS_PER_PROGRAM = (1, 1024)
COPY_BYTES = 128  # a bulk copy into shared memory moves whole units of this many bytes
SMEM_OVERHEAD = 3072  # barriers and the reductions' scratch (as kernels.rows.mosaic's)
SMEM, REGISTERS = "smem", "registers"  # dweight_in: where a block sums its dweight row
DIRECT = 2  # stream_cols: the weight read from global memory (as kernels.rows.mosaic's stream_cols 2)
MAX_REGISTER_VALUES = 64  # dweight_in "registers": float32 values a thread holds (cols / 128)
F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class RowsInTurnConfig:
    """A block takes rows_per_program rows in turn through `slots` slots; chunks of block_cols."""

    block_cols: int
    rows_per_program: int
    slots: int = 3
    block_rows: int = 1
    strategy: str = STRATEGY
    approx_math: int = 1
    dweight_in: str = SMEM
    stream_cols: int = 0

    def __post_init__(self) -> None:
        if self.strategy != STRATEGY:
            raise ValueError(f"strategy must be {STRATEGY!r} on {TARGET}, got {self.strategy!r}")
        if self.block_rows != 1:
            raise ValueError(f"block_rows must be 1 on {TARGET} (rows are taken one at a time), got {self.block_rows}")
        check_pow2("block_cols", self.block_cols, CHUNKS)
        check_pow2("rows_per_program", self.rows_per_program, ROWS_PER_PROGRAM)
        if not SLOTS[0] <= self.slots <= SLOTS[1]:
            raise ValueError(f"slots must be in {list(SLOTS)}, got {self.slots}")
        if self.dweight_in not in (SMEM, REGISTERS):
            raise ValueError(f"dweight_in must be {SMEM!r} or {REGISTERS!r}, got {self.dweight_in!r}")
        if self.stream_cols not in (0, DIRECT):
            raise ValueError(f"stream_cols must be 0 (the weight staged in shared memory) or {DIRECT} (read chunk by "
                             f"chunk from global memory), got {self.stream_cols!r}")
        if self.approx_math not in (0, 1):
            raise ValueError(f"approx_math must be 0 or 1, got {self.approx_math!r}")


def footprint_bytes(config: RowsInTurnConfig, cols: int, itemsize: int) -> int:
    """Shared memory of one block: the weight (unless read from global memory), and x and dy in
    each slot beside the float32 dweight row (dweight_in "smem") or, dweight in registers, the
    larger of the slots and that row (it takes their memory once the rows are done)."""
    slots, dweight = 2 * config.slots * cols * itemsize, 4 * cols
    staged = max(slots, dweight) if config.dweight_in == REGISTERS else slots + dweight
    weight = 0 if config.stream_cols == DIRECT else cols * itemsize
    return weight + staged + SMEM_OVERHEAD


def plan(config: Mapping[str, Any], shape: tuple[int, ...], dtype: Any, name: str) -> RowsInTurnConfig:
    """The typed config, checked against `shape` and `dtype`; raises with a plain message."""
    typed = from_dict(RowsInTurnConfig, {"strategy": STRATEGY, "block_rows": 1, **config}, f"{name} on {TARGET}")
    if len(shape) != 2:
        raise NotImplementedError(f"{name} on {TARGET} takes (rows, cols), got {tuple(shape)}")
    rows, cols = shape
    itemsize = jnp.dtype(dtype).itemsize
    if itemsize not in (2, 4):
        raise NotImplementedError(f"{name} on {TARGET} takes 16- or 32-bit floats, got {jnp.dtype(dtype)}")
    if cols * itemsize % COPY_BYTES:
        raise ValueError(f"{name} on {TARGET}: rows of {cols} columns ({cols * itemsize} bytes) are not whole "
                         f"{COPY_BYTES}-byte units (gpu-triton takes any width)")
    if cols % typed.block_cols:
        raise ValueError(f"{name} on {TARGET}: block_cols ({typed.block_cols}) must divide the row ({cols} columns)")
    if typed.rows_per_program > rows:
        raise ValueError(f"{name} on {TARGET}: rows_per_program ({typed.rows_per_program}) exceeds the rows ({rows})")
    if typed.dweight_in == REGISTERS and cols // 128 > MAX_REGISTER_VALUES:
        raise ValueError(f"{name} on {TARGET}: dweight_in {REGISTERS!r} holds cols / 128 float32 values a thread, at "
                         f"most {MAX_REGISTER_VALUES} ({128 * MAX_REGISTER_VALUES} columns), not {cols // 128}; "
                         f"use {SMEM!r}")
    used = footprint_bytes(typed, cols, itemsize)
    if used > mgpu_launch.SMEM_BYTES:
        raise ValueError(f"{typed.slots} slots of x and dy, the weight and the float32 dweight row of {cols} columns "
                         f"take {used} bytes of shared memory; a block has {mgpu_launch.SMEM_BYTES} on sm_90 "
                         f"(fewer slots, or gpu-triton)")
    return typed


def default_config(shape: tuple[int, ...]) -> dict[str, Any]:
    """dweight in shared memory, the most slots (3, else 2) that fit a float32 row (so that the
    config runs in either dtype; where none does, a 16-bit row), chunks of up to 4096 columns
    dividing the row (down to 128 where 512 does not divide it), rows_per_program giving about
    one block a SM. On the H200 at 8192 x 8192 bf16 (CUPTI, two runs): 3 slots (a bf16 row's
    best; a float32 row's 3 slots do not fit) 103.8 and 104.1 us; 8192-column chunks 104.8; 4
    slots 109.6; dweight in registers 105.1-106.6 (2 slots, two blocks a SM) and 106.0 (3 slots);
    the weight read from global memory 108.5-120.2; Triton's tuned kernel 114.3 (BENCHMARKS.md)."""
    rows, cols = shape
    chunk = next((c for c in (4096, 2048, 1024, 512, 256) if cols % c == 0), CHUNKS[0])

    def fits(slots: int, itemsize: int) -> bool:
        return footprint_bytes(RowsInTurnConfig(chunk, 1, slots), cols, itemsize) <= mgpu_launch.SMEM_BYTES

    slots = next((k for size in (4, 2) for k in (3, 2) if fits(k, size)), 2)
    per = 1
    while per * 2 <= ROWS_PER_PROGRAM[1] and per * 2 <= rows and rows / (per * 2) >= mgpu_launch.DEFAULT_NUM_SMS / 2:
        per *= 2
    return {"strategy": STRATEGY, "block_rows": 1, "block_cols": chunk, "rows_per_program": per,
            "slots": slots, "approx_math": 1, "dweight_in": SMEM}


def vector_size(chunk: int, dtype: Any) -> int:
    """Elements a thread takes of a chunk loaded from shared memory: 8 bytes of `dtype`, fewer
    where the warpgroup's 128 threads would run past a small chunk (Mosaic GPU's own choice)."""
    return min(8 // jnp.dtype(dtype).itemsize, chunk // 128)


def _strided(value: jax.Array, dtype: Any, interpret: bool) -> jax.Array:
    """`value` (a chunk) in the layout of a chunk of `dtype` loaded from shared memory, so that a
    float32 chunk (the dweight row) meets the inputs' chunks in one layout."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if interpret:
        return value
    return plgpu.layout_cast(value, plgpu.Layout.WG_STRIDED(value.shape, vec_size=vector_size(value.shape[0], dtype)))


def build(config: Mapping[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform, *, eps: float,
          name: str = "rms_norm_bwd") -> Callable[..., tuple[jax.Array, jax.Array]]:
    """The Mosaic GPU RMS norm backward: a function of (x, dy, weight) giving (dx, dweight)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    cfg = plan(config, shape, dtype, name)
    dtype = jnp.dtype(dtype)
    rows, cols = shape
    chunk, S, per = cfg.block_cols, cfg.slots, cfg.rows_per_program
    n_chunks = cols // chunk
    blocks = pl.cdiv(rows, per)
    in_bounds = plgpu.OOBFillMode.PROMISE_IN_BOUNDS
    in_registers = cfg.dweight_in == REGISTERS

    def at(ref: Any, j: Any) -> Any:
        return ref.at[pl.ds(j * chunk, chunk)]

    def f32_chunk(ref: Any) -> jax.Array:
        """A float32 chunk of the dweight row, in the inputs' chunks' layout."""
        if platform.interpret:
            return ref[...]
        return plgpu.load(ref, (), layout=plgpu.Layout.WG_STRIDED((chunk,), vec_size=vector_size(chunk, dtype)))

    def zeros() -> jax.Array:
        return _strided(jnp.zeros((chunk,), F32), dtype, platform.interpret)

    def body(x_gmem, dy_gmem, w_gmem, dx_gmem, dw_gmem):
        block = lax.axis_index("blocks")
        first = block * per
        count = jnp.minimum(per, rows - first)  # this block's rows (the last block's may be fewer)

        def rows_in_turn(x_smem, dy_smem, loaded, w_smem, w_loaded, dw_smem):
            """Walk and map the block's rows; returns the dweight row's chunks when they are
            held in registers (else they are summed into dw_smem, zeroed here first)."""
            def load(i: Any, slot: Any) -> None:
                """Row first + i's x and dy into `slot`."""
                plgpu.copy_gmem_to_smem(x_gmem.at[first + i], x_smem.at[slot], loaded.at[slot], oob_mode=in_bounds)
                plgpu.copy_gmem_to_smem(dy_gmem.at[first + i], dy_smem.at[slot], loaded.at[slot], oob_mode=in_bounds)

            for k in range(min(S - 1, per)):
                pl.when(k < count)(lambda k=k: load(k, k))
            if not in_registers:
                def zero(j: Any, carry: Any) -> Any:
                    at(dw_smem, j)[...] = zeros()
                    return carry

                lax.fori_loop(0, n_chunks, zero, 0)
            if w_loaded is not None:
                plgpu.barrier_wait(w_loaded)

            def weight(j: Any) -> jax.Array:
                """Chunk j of the weight, from its staged copy or (stream_cols 2) global memory."""
                return at(w_gmem if w_smem is None else w_smem, j)[...].astype(F32)

            def row(i: Any, acc: Any) -> Any:
                slot = lax.rem(i, S)
                plgpu.barrier_wait(loaded.at[slot])
                xs, dys = x_smem.at[slot], dy_smem.at[slot]

                def fold(j: Any, sums: Any) -> Any:
                    x = at(xs, j)[...].astype(F32)
                    g = at(dys, j)[...].astype(F32) * weight(j)
                    return sums[0] + x * x, sums[1] + g * x

                x0 = at(xs, 0)[...].astype(F32)
                g0 = at(dys, 0)[...].astype(F32) * weight(0)
                sum_xx, sum_gx = lax.fori_loop(1, n_chunks, fold, (x0 * x0, g0 * x0))
                r = lax.rsqrt(jnp.sum(sum_xx) / cols + eps)
                c = r * r * r * (jnp.sum(sum_gx) / cols)

                # The row slots - 1 ahead, into the previous row's slot once its write-back read it.
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                ahead = i + S - 1
                pl.when(ahead < count)(lambda: load(ahead, lax.rem(ahead, S)))

                def apply(j: Any) -> jax.Array:
                    """dx of chunk j in place over x; returns the chunk's dy * x * r."""
                    x_ref = at(xs, j)
                    x = x_ref[...].astype(F32)
                    dy = at(dys, j)[...].astype(F32)
                    x_ref[...] = (r * dy * weight(j) - c * x).astype(dtype)
                    return dy * x * r

                if in_registers:
                    acc = tuple(a + apply(j) for j, a in enumerate(acc))
                else:
                    def add(j: Any, carry: Any) -> Any:
                        dw_ref = at(dw_smem, j)
                        dw_ref[...] = f32_chunk(dw_ref) + apply(j)
                        return carry

                    lax.fori_loop(0, n_chunks, add, 0)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(xs, dx_gmem.at[first + i])
                return acc

            acc = tuple(zeros() for _ in range(n_chunks)) if in_registers else 0
            acc = lax.fori_loop(0, count, row, acc)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the slots read out: their memory may go
            return acc

        def write_dweight(dw_smem: Any, acc: Any) -> None:
            if in_registers:
                for j, a in enumerate(acc):
                    at(dw_smem, j)[...] = a
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(dw_smem, dw_gmem.at[block])
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the write read out: the block may end

        slot_buffers = (plgpu.SMEM((S, cols), dtype), plgpu.SMEM((S, cols), dtype),
                        plgpu.Barrier(num_arrivals=2, num_barriers=S))
        dw_buffer = plgpu.SMEM((cols,), F32)

        def with_weight(w_smem: Any, w_loaded: Any) -> None:
            if w_smem is not None:
                plgpu.copy_gmem_to_smem(w_gmem, w_smem, w_loaded, oob_mode=in_bounds)
            if in_registers:  # the slots, then the dweight row in the same shared memory
                acc = pl.run_scoped(lambda *slots: rows_in_turn(*slots, w_smem, w_loaded, None), *slot_buffers)
                pl.run_scoped(lambda dw_smem: write_dweight(dw_smem, acc), dw_buffer)
                return

            def beside(x_smem, dy_smem, loaded, dw_smem):
                rows_in_turn(x_smem, dy_smem, loaded, w_smem, w_loaded, dw_smem)
                write_dweight(dw_smem, None)

            pl.run_scoped(beside, *slot_buffers, dw_buffer)

        if cfg.stream_cols == DIRECT:
            with_weight(None, None)
        else:
            pl.run_scoped(with_weight, plgpu.SMEM((cols,), dtype), plgpu.Barrier(num_arrivals=1))

    out_shape = [jax.ShapeDtypeStruct((rows, cols), dtype), jax.ShapeDtypeStruct((blocks, cols), F32)]
    params = plgpu.CompilerParams(approx_math=bool(cfg.approx_math))
    call = mgpu_launch.mosaic_kernel(body, platform=platform, out_shape=out_shape, grid=(blocks,),
                                     grid_names=("blocks",), compiler_params=params, name=name)

    def backward(x: jax.Array, dy: jax.Array, weight: jax.Array) -> tuple[jax.Array, jax.Array]:
        if tuple(x.shape) != tuple(shape) or tuple(dy.shape) != tuple(shape):
            raise ValueError(f"{name} was built for shape {tuple(shape)}, got x {tuple(x.shape)}, dy {tuple(dy.shape)}")
        dx, partials = call(x.astype(dtype), dy.astype(dtype), weight.astype(dtype).reshape(cols))
        return dx, jnp.sum(partials, axis=0).astype(dtype)

    return backward
