"""Matrix product: C[m, n] = sum_k A[m, k] B[k, n], accumulated in float32.

Config knobs:
  block_m, block_n, block_k  tile sizes (TPU: multiples of 8 / 128; Triton: powers of two).
  num_warps, num_stages      Triton only.
TPU: a (m, n, k) grid whose K axis is pipelined by Mosaic into a VMEM f32 accumulator.
GPU and interpret: a (m, n) grid; each program loops over K in steps of block_k.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.lowering import Platform, pallas_call

NAME = "matmul"
SHAPE_NAMES = ("m", "n", "k")
TARGETS = ("interpret", "tpu", "gpu-triton")


def reference(a: jax.Array, b: jax.Array) -> jax.Array:
    """A @ B in plain jax.numpy with float32 accumulation."""
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random A (m, k) and B (k, n), normal with unit scale."""
    m, n, k = shape
    ka, kb = jax.random.split(key)
    return (jax.random.normal(ka, (m, k), jnp.float32).astype(dtype),
            jax.random.normal(kb, (k, n), jnp.float32).astype(dtype))


def flops(shape: tuple[int, ...]) -> int:
    """2 m n k multiply-adds."""
    m, n, k = shape
    return 2 * m * n * k


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: A and B read once, C written once."""
    m, n, k = shape
    return (m * k + k * n + m * n) * jnp.dtype(dtype).itemsize


def footprint(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
    """On-chip bytes of one program's tiles (VMEM on TPU, shared memory on GPU)."""
    bm, bn, bk = (int(config[p]) for p in ("block_m", "block_n", "block_k"))
    item = jnp.dtype(dtype).itemsize
    operands = (bm * bk + bk * bn) * item
    if target == "tpu":  # double-buffered operand and output tiles, f32 accumulator
        return 2 * operands + 2 * bm * bn * item + bm * bn * 4
    if target == "gpu-triton":  # one operand tile per pipeline stage
        return int(config.get("num_stages", 3)) * operands
    return operands + bm * bn * 4


def default_config(shape: tuple[int, ...], target: str) -> dict[str, Any]:
    """Tiles that divide common shapes and fit every target's on-chip memory."""
    m, n, k = shape
    if target == "tpu":
        return {"block_m": min(m, 256), "block_n": min(n, 256), "block_k": min(k, 512)}
    config = {"block_m": min(m, 64), "block_n": min(n, 64), "block_k": min(k, 32)}
    if target == "gpu-triton":
        config |= {"num_warps": 4, "num_stages": 3}
    return config


def _tpu_body(a_ref, b_ref, o_ref, acc_ref) -> None:
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _k_loop_body(a_ref, b_ref, o_ref, *, block_k: int) -> None:
    def step(i, acc):
        a = a_ref[:, pl.ds(i * block_k, block_k)]
        b = b_ref[pl.ds(i * block_k, block_k), :]
        return acc + jnp.dot(a, b, preferred_element_type=jnp.float32)

    acc = jnp.zeros(o_ref.shape, jnp.float32)
    acc = jax.lax.fori_loop(0, a_ref.shape[1] // block_k, step, acc)
    o_ref[...] = acc.astype(o_ref.dtype)


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
    """The Pallas matmul for `config` on `platform`: a function of (a, b)."""
    m, n, k = shape
    bm, bn, bk = (int(config[p]) for p in ("block_m", "block_n", "block_k"))
    if m % bm or n % bn or k % bk:
        raise ValueError(f"blocks ({bm}, {bn}, {bk}) must divide the shape {shape}")
    out_shape = jax.ShapeDtypeStruct((m, n), jnp.dtype(dtype))
    if platform.target == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        return pallas_call(
            _tpu_body, platform=platform, config=config, out_shape=out_shape,
            grid=(m // bm, n // bn, k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
            tpu_params={"dimension_semantics": ("parallel", "parallel", "arbitrary")},
            name="matmul",
        )
    return pallas_call(
        functools.partial(_k_loop_body, block_k=bk), platform=platform, config=config,
        out_shape=out_shape, grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        name="matmul",
    )
