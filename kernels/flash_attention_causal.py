"""Causal flash attention forward: key j attends to query i only when j <= i.

The same kernels as `kernels.flash_attention` (`kernels.attention_core`: strategies, knobs, VMEM
model), built causal: key blocks after a query block's last row are skipped (on gpu-mosaic
"pipelined": masked).
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

NAME = "flash_attention_causal"
CAUSAL = True


def reference(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal attention in plain jax.numpy, computed in float32."""
    return attention_core.attention_reference(q, k, v, causal=CAUSAL)


def flops(shape: tuple[int, ...]) -> int:
    """2 b h s^2 d: half of the non-causal count."""
    return attention_core.attention_flops(shape, causal=CAUSAL)


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any, platform: Platform):
    """The Pallas causal attention for `config`: a function of (q, k, v)."""
    return attention_core.build(config, shape, dtype, platform, causal=CAUSAL)
