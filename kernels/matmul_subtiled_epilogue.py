"""Matmul with a bias + SiLU epilogue stored in sub-tiles: C = silu(A @ B + bias).

The f32 accumulator tile (block_m, block_n) is not transformed and stored in one piece: the
epilogue walks it in (epi_m, epi_n) sub-tiles, each reading its slice of the bias, applying
bias + SiLU, casting and storing on its own. Small sub-tiles keep the epilogue's temporaries
(TPU vregs/VMEM, GPU registers) and, on Mosaic GPU, the SMEM staging of the TMA stores small,
leaving room for deeper operand pipelines; large ones mean fewer, bigger stores.
Knobs: epi_n (every target), epi_m (tpu, gpu-mosaic); the rest as in `kernels.matmul_core`.
On Triton each epi_n-wide sub-tile keeps its own accumulator through the K loop.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from kernels import matmul_core
from kernels.lowering import Platform

NAME = "matmul_subtiled_epilogue"
SHAPE_NAMES = ("m", "n", "k")
PARALLEL_DIMS = ("m", "n")
TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")


def _bias_silu(acc: jax.Array, bias: jax.Array) -> jax.Array:
    x = acc + bias
    return x / (1.0 + jnp.exp(-x))


EPILOGUE = matmul_core.Epilogue(fn=_bias_silu, vectors=1)


def _problem(shape: tuple[int, ...]) -> matmul_core.Problem:
    m, n, k = shape
    return matmul_core.Problem(m, n, k, epilogue=EPILOGUE)


def reference(a: jax.Array, b: jax.Array, bias: jax.Array) -> jax.Array:
    """silu(A @ B + bias) in plain jax.numpy, computed in float32."""
    x = jnp.dot(a, b, preferred_element_type=jnp.float32) + bias.astype(jnp.float32)
    return jax.nn.silu(x).astype(a.dtype)


def make_inputs(shape: tuple[int, ...], dtype: Any, key: jax.Array) -> tuple[jax.Array, ...]:
    """Random A (m, k), B (k, n) and bias (n,), normal; the bias on the scale of A @ B."""
    m, n, k = shape
    ka, kb, kc = jax.random.split(key, 3)
    return (jax.random.normal(ka, (m, k), jnp.float32).astype(dtype),
            jax.random.normal(kb, (k, n), jnp.float32).astype(dtype),
            (k ** 0.5 * jax.random.normal(kc, (n,), jnp.float32)).astype(dtype))


def shape_of(a: jax.Array, b: jax.Array, bias: jax.Array) -> tuple[int, ...]:
    """(m, n, k) of A (m, k) and B (k, n)."""
    return a.shape[0], b.shape[1], a.shape[1]


def flops(shape: tuple[int, ...]) -> int:
    """2 m n k multiply-adds plus the epilogue (about 5 per output)."""
    m, n, k = shape
    return 2 * m * n * k + 5 * m * n


def bytes_moved(shape: tuple[int, ...], dtype: Any) -> int:
    """Fewest bytes through device memory: A, B and bias read once, C written once."""
    m, n, k = shape
    return (m * k + k * n + n + m * n) * jnp.dtype(dtype).itemsize


def footprint(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> int:
    """On-chip bytes of one program (VMEM on TPU, shared memory on GPU); see matmul_core."""
    return matmul_core.footprint(_problem(shape), config, dtype, target)


def default_config(shape: tuple[int, ...], target: str, dtype: Any = None) -> dict[str, Any]:
    """The plain matmul default (at the inputs' dtype; None: bfloat16) with the epilogue split in
    halves along the columns."""
    config = matmul_core.default(_problem(shape), target, dtype)
    bn = config.block_n
    align = 128 if target == "tpu" else 16
    knobs = {"epi_n": bn // 2 if bn // 2 >= align and bn % 2 == 0 else bn}
    if target == "tpu":
        knobs["epi_m"] = config.block_m
    elif target == "gpu-mosaic":
        knobs["epi_m"] = min(64, config.block_m)
    return dataclasses.replace(config, **knobs).to_dict()


def check_config(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, target: str) -> str | None:
    """None when `build` accepts the config, else why not."""
    return matmul_core.check_config(_problem(shape), config, dtype, target)


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
    """The Pallas matmul with sub-tiled epilogue for `config`: a function of (a, b, bias)."""
    return matmul_core.build(_problem(shape), config, dtype, platform)
