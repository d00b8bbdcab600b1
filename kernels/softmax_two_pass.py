"""Row softmax in two passes over column blocks: first an online max and sum, then normalize.

Pass 1 folds each column block of x into the running max m and the sum l of exp(x - m)
(rescaled by exp(m_old - m_new) whenever the max grows); pass 2 writes exp(x - m) / l. Rows
of any length stream through a fixed on-chip block; the math is `kernels.softmax`'s.
Config knobs: those of the row engine (`kernels.rows`), without one_pass:
  strategy  TPU (and interpret, without emit_pipeline):
      fori_loop      rows in one VMEM block, both passes over VMEM column slices (one HBM read);
      emit_pipeline  rows stay in HBM, each pass streams the column blocks (two HBM reads);
      grid           a (rows, 2, column blocks) grid, Mosaic pipelines both passes.
    Triton: always fori_loop (no strategy knob).
  Mosaic GPU (`kernels/rows/mosaic.py`, the knobs of its staged rows): the row staged once in
      shared memory (one HBM read); pass 1 folds its column chunks (block_cols) on chip into the
      running max and sum, pass 2 maps them in place and the row is written back. Rows longer
      than a block holds: split over the blocks of a cluster, or a staged head and a tail
      streamed twice, their statistics merged.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import rows, softmax
from kernels.rows import mosaic as mosaic_rows

NAME = "softmax_two_pass"
SHAPE_NAMES = ("rows", "cols")
PARALLEL_DIMS = ("rows",)
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")
MEMORY_PARAMS = rows.MEMORY_PARAMS
MATH = dataclasses.replace(softmax.MATH, name=NAME)  # softmax's math, named in errors and profiles as this kernel
STRATEGIES = {"tpu": ("fori_loop", "emit_pipeline", "grid"), "interpret": ("fori_loop", "grid"),
              "gpu-triton": ("fori_loop",)}
KERNEL = rows.RowKernel(MATH, SHAPE_NAMES, strategies=STRATEGIES)
shape_of = KERNEL.shape_of


def _online_fold(acc: tuple[Any, Any], x: jax.Array, stats: Any, valid: Any) -> tuple[jax.Array, jax.Array]:
    """Pass 1 over one staged chunk: the running max and sum of exp(x - max), the sum rescaled
    when the chunk raises the max. Positions outside the row hold -inf and add nothing."""
    del stats, valid
    m, total = acc
    m_new = jnp.maximum(m, jnp.max(x))
    shift = softmax.finite_shift(m_new)
    return m_new, total * jnp.exp(m - shift) + jnp.sum(jnp.exp(x - shift))


def _normalize_staged(x: jax.Array, stats: Any) -> jax.Array:
    """Pass 2 over one staged chunk: exp(x - max) / sum."""
    m, inv_total = stats[0]
    return jnp.exp(x - softmax.finite_shift(m)) * inv_total


# Staged rows (Mosaic GPU): one walk, the online pass 1 (stats[0] = (max, 1 / sum)), then the map.
STAGED = rows.StagedMath(
    NAME, pad=-jnp.inf, merge=lambda a, b: (softmax.merge_spans(a[0], b[0]),),
    walks=(rows.Walk(fold=_online_fold, across=lambda acc: acc, identity=(-math.inf, 0.0),
                     finish=lambda value, stats, cols: (value[0], 1.0 / value[1])),),
    apply=_normalize_staged)
# Mosaic GPU's staged rows on gpu-mosaic, the row engine's strategies on every other target.
check_config, footprint, _staged_default, build = mosaic_rows.protocol(KERNEL, STAGED)
default_gpu_targets = KERNEL.default_gpu_targets

reference = softmax.reference
make_inputs = softmax.make_inputs


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: the online max/sum and the normalize pass."""
    return 8 * math.prod(shape)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: read x once, write y once."""
    return 2 * math.prod(shape) * jnp.dtype(dtype).itemsize


def _staged_default_config(shape: tuple[int, ...]) -> dict[str, Any]:
    """The staged rows' default, a block per row in the widest chunks that stage no more shared
    memory: pass 1 reduces each chunk across the warpgroup twice (its max, its sum), so fewer
    chunks cost less, while a longer padding can cost a block a SM. On the H200 (bf16;
    BENCHMARKS.md): 8192 x 8192 64.9 us in 8192-column chunks, 66.9 in 4096; 8192 x 32000 258.9
    against 263.4; 8192 x 50304 773.6 against 497.5 (57344 columns staged against 53248)."""
    config = _staged_default(shape, mosaic_rows.TARGET)
    if config["strategy"] != mosaic_rows.STRATEGY or config.get("cluster", 1) != 1:
        return config

    def staged(chunk: int) -> list[int | None]:
        """Shared memory a block stages in each float type (None: the row does not fit)."""
        config_ = {**config, "block_cols": chunk}
        return [None if check_config(config_, shape, dtype, mosaic_rows.TARGET) else
                footprint(config_, shape, dtype, mosaic_rows.TARGET) for dtype in (jnp.float32, jnp.bfloat16)]

    chunks = range(mosaic_rows.CHUNKS[1].bit_length() - 1, config["block_cols"].bit_length() - 1, -1)
    widest = next((1 << k for k in chunks if staged(1 << k) == staged(config["block_cols"])), config["block_cols"])
    return {**config, "block_cols": widest}


def default_config(shape: tuple[int, ...], target: str) -> dict[str, Any]:
    """A safe config for any shape: 16 or 8 rows (or all, or the rows padded: TPU), the widest
    chunk up to 512 that divides, else the whole row (TPU, past 4096 columns: chunks of 512, the
    row padded to them) (Mosaic GPU: a staged row, `_staged_default_config`)."""
    n_rows, cols = shape
    if target == mosaic_rows.TARGET:
        return _staged_default_config(shape)
    if target == "gpu-triton":
        # On the H200 at 8192 x 8192 (bf16; bench/results/h200/two_pass/probe1): 4096-column
        # chunks, 4 warps, 1 stage 80.0 us; 2048 and 2 stages 83.2; 1024 and 2 stages 93.7.
        config = rows.RowConfigTriton(block_rows=1, strategy="fori_loop", rows_per_program=1,
                                      block_cols=max(1, min(4096, pl.next_power_of_2(cols) // 2)),
                                      num_stages=1)
    else:
        # the row as one chunk where none divides it (as the power of two past it, taken whole),
        # up to 4096 columns; longer rows on TPU in chunks of 512, padded to them (`Plan.pad_cols`)
        whole_row = pl.next_power_of_2(cols)
        block_cols = next((c for c in (512, 256, 128) if cols % c == 0 and c < cols),
                          512 if target == "tpu" and whole_row > 4096 else whole_row)
        block_rows = rows.SUBLANES if n_rows % rows.SUBLANES == 0 else n_rows
        config = rows.CONFIG_TYPES[target](block_rows=block_rows, block_cols=block_cols,
                                           strategy="emit_pipeline" if target == "tpu" else "fori_loop")
        if target == "tpu":
            # the row engine's TPU rule: all the rows as one block only where it is small, else
            # whole tiles, the rows padded to them (v4's 16 MiB of VMEM did not hold 1000 rows of
            # 3000 columns)
            config = KERNEL.tpu_rows(config, shape)
    return config.to_dict(KERNEL.knobs(len(shape), target))
