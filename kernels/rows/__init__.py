"""The row engine: one implementation of every row-wise kernel on every target.

A row-wise kernel reduces each row over its last axis and maps the row (softmax, norms and
their backward passes), or reduces it to per-row results (welford, cross_entropy). It states
its math once (`RowMath`, or a `RowReduction` monoid through `reduction_math`) and declares a
`RowKernel`; the engine owns the strategies, grids, pipelines, Triton code, configs and
footprints. Files, by job: `contract` (the math), `config` (typed configs, validation, the
VMEM rule), `footprint`, `blocked` (TPU and interpret lowering), `triton`, `kernel` (the
protocol functions of a kernel module), `mosaic` (Mosaic GPU: each row staged once in shared
memory, for kernels that also state their math as a `StagedMath`; strategy `smem_row`).

The knob vocabulary, the same names on every target:
  strategy      how a row is walked.
                  one_pass       whole rows at once, the formula on them (Triton: the row padded
                                 to a power of two and masked, held in registers; one read).
                  fori_loop      a lax.fori_loop over column chunks of block_cols: fold the
                                 statistics, then (kernels with row or column outputs) a second
                                 loop writes the outputs. TPU and interpret: the rows sit in one
                                 VMEM block and the loop slices it (one HBM read); Triton: each
                                 chunk is a masked load from global memory (the second loop's
                                 re-reads mostly hit L2). Triton's former passes=2.
                  split_cols     Triton only, for rows too few to fill the chip: a program per
                                 block of rows and chunk of block_cols; one kernel writes each
                                 chunk's statistics, a second combines a row's and maps the
                                 chunk (kernels whose math has `RowMath.span_combine`).
                  emit_pipeline  TPU only: the rows stay in HBM; pltpu.emit_pipeline streams
                                 column chunks (statistics, then outputs).
                  grid           TPU and interpret: a (..., phases, column chunks) grid; phase 0
                                 folds the statistics into VMEM scratch, phase 1 writes outputs;
                                 Mosaic pipelines the chunks.
  block_rows    rows per block (TPU: a multiple of 8 or all rows; Triton: a power of two).
  block_cols    the column chunk of fori_loop, split_cols, emit_pipeline and grid (TPU: a multiple of 128
                dividing the row, or the row; Triton: a power of two, any row length). one_pass
                ignores it; the spaces pin it at 128 there.
  block_batch   batch entries per block of a 3-D shape (TPU and interpret; Triton takes 1).
  buffers       TPU: buffers per pipelined block: 1 or 2 (1 to 4 for emit_pipeline's inputs).
  stats_layout  TPU, kernels with per-row vectors: "column" (rows, 1) or lane-dense "lane".
  rows_per_program  Triton: rows one program covers, looping over blocks of block_rows (fori_loop
                with column outputs: unroll=1, each chunk's partial sums held in registers).
  fold          Triton fori_loop, kernels with a `LaneFold`: "chunk" reduces every chunk to
                per-row statistics as it is read; "lanes" keeps per-lane statistics and
                reduces them once per row, after the loop.
  unroll        Triton fori_loop: 1 writes the walks over a row's chunks (at most 32) as
                straight-line code, so that every chunk's loads are in flight at once.
  prefetch      Triton one_pass looping over several blocks of rows (kernels with column
                outputs): 1 loads the next block while this one computes, and the column
                inputs once per program.
  num_warps, num_stages  Triton compiler params (defaults 4 and 3, always passed explicitly).
Shape rules, refused up front with a message (`RowKernel.check_config` says why): blocks divide
the shape on TPU and interpret (interpret allows a partial last block of rows unless the kernel
sums over rows); Triton masks any shape. Each knob's default is written once, in `config`.
"""
from __future__ import annotations

from kernels.rows.config import (
                                 CONFIG_TYPES,
                                 LANES,
                                 MEMORY_PARAMS,
                                 STRATEGIES,
                                 STREAMED,
                                 SUBLANES,
                                 Plan,
                                 RowConfig,
                                 RowConfigInterpret,
                                 RowConfigTPU,
                                 RowConfigTriton,
                                 from_dict,
                                 is_pow2,
                                 split_shape,
)
from kernels.rows.contract import ROW_MAX, LaneFold, RowMath, RowReduction, StagedMath, Stats, Walk, reduction_math
from kernels.rows.kernel import TPU_ROW_BLOCKS, RowKernel, build, tpu_row_block

__all__ = ["CONFIG_TYPES", "ROW_MAX", "LANES", "LaneFold", "MEMORY_PARAMS", "STRATEGIES", "STREAMED", "SUBLANES",
           "Plan", "RowConfig", "RowConfigInterpret", "RowConfigTPU", "RowConfigTriton", "RowKernel",
           "RowMath", "RowReduction", "StagedMath", "Stats", "Walk", "build", "from_dict", "is_pow2",
           "reduction_math", "split_shape", "tpu_row_block", "TPU_ROW_BLOCKS"]
