"""Masked stores from registers to global memory, for outputs that TMA cannot address (Mosaic GPU).

TMA writes an output only when its rows are whole 16-byte units and, through the kernels' swizzled
tiles, whole groups of 8 rows and 128-byte column units. A vocabulary of 50257 columns (rows of
100514 bytes) or 1001 tokens is neither, so such outputs used to be written padded and sliced back:
a copy of the whole product (412 MB at 4096 x 50257). `store_tile` writes a warpgroup's tile from
its registers straight into the unpadded output instead, each thread its own elements, skipping
those past the output's edge: a thread's two neighbouring elements in one 4-byte store when the
row width is even, one 2-byte store each when it is odd (an odd row's start is 2-byte aligned).

Lane-level Mosaic GPU code inlined into a Pallas kernel (`plgpu.inline_mgpu`); the value must be in
the WGMMA register layout (an accumulator tile, sliced along 64-row and 8-column boundaries).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def vector_width(n: int) -> int:
    """Elements per store: the WGMMA layout's 2 neighbouring elements of a thread when a row of n
    holds whole pairs (each pair then lies wholly inside or past the row's end, and is aligned to
    its size), else 1."""
    return 2 if n % 2 == 0 else 1


def store_tile(value: jax.Array, out_ref: Any, row0: jax.Array, col0: jax.Array) -> None:
    """Store `value`, an (r, c) tile in the WGMMA layout, at out_ref[row0:row0 + r, col0:col0 + c],
    skipping elements at or past out_ref's last row or column. out_ref: a 2-D global memory ref
    (index a batch away first); row0, col0: int32 scalars."""
    from jax.experimental.mosaic.gpu import utils as mu
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, memref, scf, vector

    rows, cols = out_ref.shape
    width = vector_width(cols)

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType(), plgpu.Layout.WG_SPLAT,
                                  plgpu.Layout.WG_SPLAT))
    def store(_ctx: Any, tile: Any, dst: Any, top: Any, left: Any) -> None:
        index = ir.IndexType.get()
        top = arith.index_cast(index, top.registers.item())
        left = arith.index_cast(index, left.registers.item())
        last_row, last_col = mu.c(rows, index), mu.c(cols, index)
        element = ir.VectorType(tile.registers.flat[0].type).element_type
        places = [(reg, arith.addi(top, r), arith.addi(left, c))
                  for reg, (r, c) in zip(tile.registers.flat, tile.layout.thread_idxs(tile.shape), strict=True)]

        def pieces(reg: Any, col: Any) -> list[tuple[Any, Any]]:  # (value, column) of each store
            count = ir.VectorType(reg.type).shape[0] // width
            if count == 1:
                return [(reg, col)]
            return [(vector.extract(reg, [], [p]) if width == 1 else vector.extract_strided_slice(
                ir.VectorType.get([width], element), reg, [p * width], [width], [1]),
                arith.addi(col, mu.c(p * width, index))) for p in range(count)]

        def put(part: Any, row: Any, col: Any) -> None:
            if width == 1:
                memref.store(part, dst, [row, col])
            else:
                vector.store(part, dst, [row, col])

        # Interior tiles (all but the last row and column of tiles) store unmasked; the warpgroup
        # takes one branch or the other, so the test costs one comparison per tile.
        tile_rows, tile_cols = tile.shape
        interior = arith.andi(
            arith.cmpi(arith.CmpIPredicate.ule, arith.addi(top, mu.c(tile_rows, index)), last_row),
            arith.cmpi(arith.CmpIPredicate.ule, arith.addi(left, mu.c(tile_cols, index)), last_col))
        branch = scf.IfOp(interior, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            for reg, row, col in places:
                for part, at in pieces(reg, col):
                    put(part, row, at)
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            for reg, row, col in places:
                in_rows = arith.cmpi(arith.CmpIPredicate.ult, row, last_row)
                for part, at in pieces(reg, col):
                    with mu.when(arith.andi(in_rows, arith.cmpi(arith.CmpIPredicate.ult, at, last_col))):
                        put(part, row, at)
            scf.yield_([])

    store(value, out_ref, row0.astype(jnp.int32), col0.astype(jnp.int32))

