"""Row softmax in two passes over column blocks: first an online max and sum, then normalize.

Pass 1 folds each column block of x into the running max m and the sum l of exp(x - m)
(rescaled by exp(m_old - m_new) whenever the max grows); pass 2 writes exp(x - m) / l. Rows
of any length stream through a fixed on-chip block; the math is `kernels.softmax`'s.
Config knobs (the strategies are those of `kernels.rowwise`):
  block_rows, block_cols  the block of rows and the column chunk streamed.
  strategy  TPU (and interpret, without emit_pipeline):
      fori_loop      rows in one VMEM block, both passes over VMEM column slices (one HBM read);
      emit_pipeline  rows stay in HBM, each pass streams the column blocks (two HBM reads);
      grid           a (rows, 2, column blocks) grid, Mosaic pipelines both passes.
  buffers   TPU: buffers per pipelined block.
  rows_per_program, num_warps, num_stages  Triton: always the column loop (passes=2).
"""
from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import rowwise, softmax
from kernels.lowering import Platform

NAME = "softmax_two_pass"
SHAPE_NAMES = ("rows", "cols")
TARGETS = ("interpret", "tpu", "gpu-triton")
MEMORY_PARAMS = rowwise.MEMORY_PARAMS
MATH = softmax.MATH
STRATEGIES = ("fori_loop", "emit_pipeline", "grid")

reference = softmax.reference
make_inputs = softmax.make_inputs


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: the online max/sum and the normalize pass."""
    return 8 * math.prod(shape)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: read x once, write y once."""
    return 2 * math.prod(shape) * jnp.dtype(dtype).itemsize


def _two_pass(config: dict[str, Any], target: str) -> dict[str, Any]:
    """The config with the column loop made explicit, refusing the one-pass choices."""
    if target == "gpu-triton":
        if int(config.get("passes", 2)) != 2:
            raise ValueError("softmax_two_pass always loops over column blocks (passes=2)")
        return {**config, "passes": 2}
    strategy = config.get("strategy", "fori_loop")
    if strategy not in STRATEGIES:
        raise ValueError(f"softmax_two_pass streams column blocks; strategy must be one of "
                         f"{STRATEGIES}, got {strategy!r}")
    return {**config, "strategy": strategy}


def footprint(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
    """On-chip bytes of one program (see `kernels.rowwise.footprint`)."""
    return rowwise.footprint(MATH, _two_pass(config, target), shape, dtype, target)


def default_config(shape: tuple[int, ...], target: str) -> dict[str, Any]:
    """A safe config for any shape: 8 (or all) rows, the widest chunk up to 512 that divides."""
    rows, cols = shape
    if target == "gpu-triton":
        return {"block_rows": 1, "block_cols": min(1024, pl.next_power_of_2(cols) // 2),
                "rows_per_program": 1, "num_warps": 4, "num_stages": 2}
    tile = 2 * rowwise.SUBLANES if target == "tpu" else rowwise.SUBLANES   # (16, 128) bf16 tiles too
    block_rows = tile if rows % tile == 0 else rows
    block_cols = next((c for c in (512, 256, 128) if cols % c == 0 and c < cols), cols)
    if target == "tpu":
        return {"block_rows": block_rows, "block_cols": block_cols, "strategy": "emit_pipeline", "buffers": 2}
    return {"block_rows": block_rows, "block_cols": block_cols, "strategy": "fori_loop"}


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
    """The Pallas two-pass softmax for `config` on `platform`: a function of x."""
    if len(shape) != 2:
        raise NotImplementedError(f"softmax_two_pass takes (rows, cols), got {shape}")
    return rowwise.build(MATH, _two_pass(config, platform.target), shape, dtype, platform)
