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
"""
from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import rows, softmax

NAME = "softmax_two_pass"
SHAPE_NAMES = ("rows", "cols")
TARGETS = ("interpret", "tpu", "gpu-triton")
MEMORY_PARAMS = rows.MEMORY_PARAMS
MATH = softmax.MATH
STRATEGIES = {"tpu": ("fori_loop", "emit_pipeline", "grid"), "interpret": ("fori_loop", "grid"),
              "gpu-triton": ("fori_loop",)}
KERNEL = rows.RowKernel(MATH, SHAPE_NAMES, strategies=STRATEGIES)
check_config, footprint, build, shape_of = (KERNEL.check_config, KERNEL.footprint, KERNEL.build,
                                            KERNEL.shape_of)

reference = softmax.reference
make_inputs = softmax.make_inputs


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: the online max/sum and the normalize pass."""
    return 8 * math.prod(shape)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: read x once, write y once."""
    return 2 * math.prod(shape) * jnp.dtype(dtype).itemsize


def default_config(shape: tuple[int, ...], target: str) -> dict[str, Any]:
    """A safe config for any shape: 8 (or all) rows, the widest chunk up to 512 that divides."""
    n_rows, cols = shape
    if target == "gpu-triton":
        config = rows.RowConfigTriton(block_rows=1, strategy="fori_loop", rows_per_program=1,
                                      block_cols=min(1024, pl.next_power_of_2(cols) // 2),
                                      num_stages=2)
    else:
        tile = 2 * rows.SUBLANES if target == "tpu" else rows.SUBLANES   # (16, 128) bf16 tiles too
        block_cols = next((c for c in (512, 256, 128) if cols % c == 0 and c < cols), cols)
        config = rows.CONFIG_TYPES[target](
            block_rows=tile if n_rows % tile == 0 else n_rows, block_cols=block_cols,
            strategy="emit_pipeline" if target == "tpu" else "fori_loop")
    return config.to_dict(KERNEL.knobs(len(shape), target))
