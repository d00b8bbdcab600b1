"""Masked stores to global memory, for outputs that TMA cannot address (Mosaic GPU).

TMA writes an output only when its rows are whole 16-byte units and, through the kernels' swizzled
tiles, whole groups of 8 rows and 128-byte column units. A vocabulary of 50257 columns (rows of
100514 bytes) or 1001 tokens is neither, so such outputs used to be written padded and sliced back:
a copy of the whole product (412 MB at 4096 x 50257). `store_tile` writes a warpgroup's tile,
staged in shared memory, straight into the unpadded output instead: each warp writes consecutive
elements of a row, skipping those past the output's edge, in stores as wide as the row width
allows (2 bytes at an odd width, 16 at a multiple of 8: a row's start is aligned to no more).

Measured on the H200 (BENCHMARKS.md) and not kept:
- stores straight from the WGMMA registers: a warp's store touches 8 rows, 4 bytes each; 1.6x
  the time of the padded kernel and its slice at 4096 x 50257;
- 1-D TMA copies of each tile row into the product as a flat array: they fault (illegal
  instruction), since a TMA copy's innermost coordinate must be a multiple of 16 bytes;
- at odd widths, 16-byte units gathered at each row's offset (funnel shifts) and 4-byte pairs:
  15% and 35% slower than one element at a time. The stores run while the tensor cores wait,
  and their address arithmetic costs more than the wider stores save.

Lane-level Mosaic GPU code inlined into a Pallas kernel (`plgpu.inline_mgpu`).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

WARPGROUP = 128  # threads


def vector_width(n: int, itemsize: int) -> int:
    """Elements per store: the most (up to 16 bytes) that a row of n elements holds a whole number
    of, so that each store lies wholly inside or past the row's end and is aligned to its size."""
    width = 16 // itemsize
    while n % width:
        width //= 2
    return width


def store_tile(stage: Any, out_ref: Any, row0: jax.Array, col0: jax.Array) -> None:
    """Store `stage`, an (r, c) shared memory tile (no transforms) that the warpgroup has just
    written, at out_ref[row0:row0 + r, col0:col0 + c], skipping elements at or past out_ref's last
    row or column. Each warp writes consecutive elements of a row, so its stores coalesce. out_ref:
    a 2-D global memory ref (index a batch away first); row0, col0: int32 scalars."""
    from jax.experimental.mosaic.gpu import utils as mu
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, llvm, memref, scf

    rows, cols = out_ref.shape
    tile_rows, tile_cols = stage.shape
    itemsize = jnp.dtype(stage.dtype).itemsize
    width = vector_width(cols, itemsize)
    if (tile_rows * tile_cols) % (WARPGROUP * width) or tile_cols % width:
        raise ValueError(f"a ({tile_rows}, {tile_cols}) tile does not split into {WARPGROUP} threads' "
                         f"stores of {width}")

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType(), plgpu.Layout.WG_SPLAT,
                                  plgpu.Layout.WG_SPLAT))
    def store(_ctx: Any, src: Any, dst: Any, top: Any, left: Any) -> None:
        index = ir.IndexType.get()
        top = arith.index_cast(index, top.registers.item())
        left = arith.index_cast(index, left.registers.item())
        last_row, last_col = mu.c(rows, index), mu.c(cols, index)
        element = ir.MemRefType(src.type).element_type
        thread = arith.index_cast(index, arith.remui(mu.thread_idx(), mu.c(WARPGROUP, ir.IntegerType.get_signless(32))))
        places = []  # (row in the tile, column in the tile) of each of this thread's stores
        for step in range(tile_rows * tile_cols // (WARPGROUP * width)):
            flat = arith.muli(arith.addi(thread, mu.c(step * WARPGROUP, index)), mu.c(width, index))
            places.append((arith.divui(flat, mu.c(tile_cols, index)), arith.remui(flat, mu.c(tile_cols, index))))

        i8, i32, i64 = (ir.IntegerType.get_signless(bits) for bits in (8, 32, 64))
        src_ptr, dst_ptr = mu.memref_ptr(src), mu.memref_ptr(dst)

        def at(ptr: Any, offset: Any, as_int: Any) -> Any:  # element `offset` past ptr
            return mu.getelementptr(ptr, [arith.index_cast(as_int, arith.muli(offset, mu.c(itemsize, index)))], i8)

        def move(r: Any, c: Any, row: Any, col: Any) -> None:
            if width == 1:
                memref.store(memref.load(src, [r, c]), dst, [row, col])
                return
            # Vectors through pointers that state their alignment (width elements): 1.8x faster
            # at 4096 x 50264 than vector.load/vector.store, whose lowering does not state it.
            part = llvm.load(ir.VectorType.get([width], element),
                             at(src_ptr, arith.addi(arith.muli(r, mu.c(tile_cols, index)), c), i32),
                             alignment=width * itemsize)
            llvm.store(part, at(dst_ptr, arith.addi(arith.muli(row, mu.c(cols, index)), col), i64),
                       alignment=width * itemsize)

        mu.warpgroup_barrier()  # every thread's part of the tile is in shared memory
        # Interior tiles (all but the last row and column of tiles) store unmasked; the warpgroup
        # takes one branch or the other, so the test costs one comparison per tile.
        interior = arith.andi(
            arith.cmpi(arith.CmpIPredicate.ule, arith.addi(top, mu.c(tile_rows, index)), last_row),
            arith.cmpi(arith.CmpIPredicate.ule, arith.addi(left, mu.c(tile_cols, index)), last_col))
        branch = scf.IfOp(interior, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            for r, c in places:
                move(r, c, arith.addi(top, r), arith.addi(left, c))
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            for r, c in places:
                row, col = arith.addi(top, r), arith.addi(left, c)
                inside = arith.andi(arith.cmpi(arith.CmpIPredicate.ult, row, last_row),
                                    arith.cmpi(arith.CmpIPredicate.ult, col, last_col))
                with mu.when(inside):
                    move(r, c, row, col)
            scf.yield_([])
        mu.warpgroup_barrier()  # every thread has read the tile: the warpgroup may write it again

    store(stage, out_ref, row0.astype(jnp.int32), col0.astype(jnp.int32))
