"""Row softmax: y[i, :] = exp(x[i, :] - max(x[i, :])) / sum(exp(x[i, :] - max(x[i, :]))).

Config knobs:
  block_rows  rows per program (TPU: a multiple of 8, or all rows).
  num_warps, num_stages  Triton only.
The whole row is one block: on GPU its length is padded to a power of two and masked, so any
row length works; on TPU the row is the full last dimension, which Mosaic accepts.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.lowering import Platform, pallas_call

NAME = "softmax"
SHAPE_NAMES = ("rows", "cols")
TARGETS = ("interpret", "tpu", "gpu-triton")


def reference(x: jax.Array) -> jax.Array:
    """Softmax over the last axis in plain jax.numpy, computed in float32."""
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random logits of the given shape (normal, scale 3, never all zeros)."""
    return (3.0 * jax.random.normal(key, shape, jnp.float32)).astype(dtype),


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: max, subtract, exp, sum, divide per element."""
    return 5 * math.prod(shape)


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: read x once, write y once."""
    return 2 * math.prod(shape) * jnp.dtype(dtype).itemsize


def _padded_cols(cols: int, target: str) -> int:
    return pl.next_power_of_2(cols) if target.startswith("gpu") else cols


def footprint(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
    """On-chip bytes: the input and output blocks (double-buffered on TPU) plus f32 temporaries."""
    rows, cols = shape
    block = int(config["block_rows"]) * _padded_cols(cols, target)
    io = 2 * block * jnp.dtype(dtype).itemsize
    buffers = 2 if target == "tpu" else 1
    return buffers * io + block * 4


def default_config(shape: tuple[int, ...], target: str) -> dict[str, Any]:
    """A safe config for any shape: small row blocks."""
    rows, _ = shape
    if target == "tpu":
        return {"block_rows": 8 if rows % 8 == 0 else rows}
    if target == "gpu-triton":
        return {"block_rows": 1, "num_warps": 4, "num_stages": 1}
    return {"block_rows": 1}


def _softmax_rows(x: jax.Array) -> jax.Array:
    x = x.astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def _blocked_body(x_ref, o_ref) -> None:
    o_ref[...] = _softmax_rows(x_ref[...]).astype(o_ref.dtype)


def _triton_body(x_ref, o_ref, *, block_rows: int, block_cols: int) -> None:
    from jax.experimental.pallas import triton as pltriton

    rows, cols = x_ref.shape
    row_ids = pl.program_id(0) * block_rows + jnp.arange(block_rows)
    mask = (row_ids[:, None] < rows) & (jnp.arange(block_cols)[None, :] < cols)
    window = (pl.ds(pl.program_id(0) * block_rows, block_rows), pl.ds(0, block_cols))
    x = pltriton.load(x_ref.at[window], mask=mask, other=-jnp.inf)
    pltriton.store(o_ref.at[window], _softmax_rows(x).astype(o_ref.dtype), mask=mask)


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
    """The Pallas softmax for `config` on `platform`: a function of x."""
    rows, cols = shape
    block_rows = int(config["block_rows"])
    out_shape = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    grid = (pl.cdiv(rows, block_rows),)
    if platform.target == "gpu-triton":
        import functools

        body = functools.partial(
            _triton_body, block_rows=block_rows, block_cols=_padded_cols(cols, "gpu")
        )
        return pallas_call(body, platform=platform, config=config, out_shape=out_shape, grid=grid,
                           name="softmax")
    spec = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
    tpu_params = {"dimension_semantics": ("parallel",)}
    return pallas_call(_blocked_body, platform=platform, config=config, out_shape=out_shape,
                       grid=grid, in_specs=[spec], out_specs=spec, tpu_params=tpu_params,
                       name="softmax")
