"""On-chip bytes of one program of the row engine, for pruning before compiling."""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from kernels.lowering import round_up
from kernels.rows.config import LANES, STREAMED, SUBLANES, Plan
from kernels.rows.contract import RowMath

# A per-column vector occupies whole (8, 128) tiles of 32-bit words in VMEM.
VECTOR_BYTES_PER_COL = SUBLANES * 4


def footprint(math_: RowMath, p: Plan, dtype: Any) -> int:
    """On-chip bytes of one program.

    TPU (interpret: the same with one buffer): the pipelined row blocks (input buffers x
    inputs + min(buffers, 2) x outputs, at the dtype's width; a whole row block for one_pass
    and fori_loop, a column chunk for emit_pipeline and grid); column vectors at 32 bytes a
    column (whole (8, 128) tiles; grid buffers their chunks like the rows; emit_pipeline streams
    input chunks and keeps each program's column outputs as one double-buffered block; one_pass
    and fori_loop keep whole vectors, inputs single-, outputs double-buffered); float32
    temporaries of one chunk: one per row input and output, at least two (a reduction's f32
    copy and one derived value, such as x - mean); per-row vectors (vector inputs and results,
    double-buffered on TPU): a (rows, 1) block fills 128 lanes (block_rows x 512 bytes, rows
    rounded up to 8), a lane-dense one block_rows x 4 bytes (rows rounded up to 128); the
    statistics scratch of the streamed strategies (rows padded to 8, 128 lanes, float32); and, in
    the "column" layout, the per-row values a loop or pipeline carries between chunks as (rows, 1)
    float32 blocks, the statistics and the results (libtpu, deviceless for v4: welford at 2048
    rows a block needed 4-7 MiB more than the model counted without them; bench/oom_probe.py
    --tpu --near).
    Triton: shared memory only. Register tiles do not count: Triton spills rather than fails
    (measured on the H200: tiles modelled at 262-336 KB compiled and ran; bench/oom_probe.py),
    and the spaces' register constraints keep them small. What is left: fori_loop stages
    num_stages - 1 row-input chunks (block_rows x block_cols, dtype width) ahead of the loop,
    and each row reduction combines its warps' partial results in float32 scratch
    (block_rows x num_warps); one_pass and split_cols have no loop.
    """
    nri, nci, nro, nco = math_.row_inputs, math_.col_inputs, math_.row_outputs, math_.col_outputs
    itemsize = jnp.dtype(dtype).itemsize
    if p.target == "gpu-triton":
        scratch = 4 * p.block_rows * p.config.num_warps
        if p.strategy in ("one_pass", "split_cols"):  # no loop, nothing staged ahead
            return scratch
        in_flight = p.config.num_stages - 1  # loads the loop pipeliner keeps ahead
        return scratch + in_flight * nri * p.block_rows * p.block_cols * itemsize
    tpu = p.target == "tpu"
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
    temporaries = max(2, nri + nro) * block * p.block_cols * 4
    column = p.block_batch * round_up(p.block_rows, SUBLANES) * LANES * 4  # a (rows, 1) f32 block
    per_row = round_up(p.block_rows, LANES) * 4 if p.lane else column
    row_vectors = (2 if tpu else 1) * (math_.vector_inputs + math_.results) * per_row
    stats = math_.n_stats * column if streamed else 0
    working = 0 if p.lane or p.strategy == "one_pass" else (math_.n_stats + math_.results) * column
    return rows_io + vectors + temporaries + row_vectors + stats + working
