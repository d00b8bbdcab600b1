"""Flash attention forward, non-causal: O = softmax(Q K^T / sqrt(D)) V, per batch entry and head.

Q, K, V and O are (batch, heads, seq, head_dim). The kernels, their strategies and knobs and
the TPU VMEM model are in `kernels.attention_core`, shared with `kernels.flash_attention_causal`.
"""
from __future__ import annotations

from typing import Any

import jax

from kernels import attention_core
from kernels.attention_core import (  # noqa: F401 - the shared protocol members
    SHAPE_NAMES,
    TARGETS,
    bytes_moved,
    check_config,
    default_config,
    footprint,
    make_inputs,
    shape_of,
)
from kernels.lowering import Platform

NAME = "flash_attention"
CAUSAL = False


def reference(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Non-causal attention in plain jax.numpy, computed in float32."""
    return attention_core.attention_reference(q, k, v, causal=CAUSAL)


def flops(shape: tuple[int, ...]) -> int:
    """4 b h s^2 d for Q K^T and P V."""
    return attention_core.attention_flops(shape, causal=CAUSAL)


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
    """The Pallas non-causal attention for `config`: a function of (q, k, v)."""
    return attention_core.build(config, shape, dtype, platform, causal=CAUSAL)
