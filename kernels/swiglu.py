"""SwiGLU, elementwise: out = silu(a) * b = a * sigmoid(a) * b, for a, b of shape (batch, seq, hidden).

Computed in float32, rounded to the input dtype. The tiling knobs (typed configs) are those of `kernels.glu`.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from kernels import glu
from kernels.glu import (  # noqa: F401 - protocol names shared by every gated unit
    MEMORY_PARAMS,
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

NAME = "swiglu"


def silu(a: jax.Array) -> jax.Array:
    """a * sigmoid(a), written with exp so that every backend lowers it."""
    return a / (1.0 + jnp.exp(-a))


def reference(a: jax.Array, b: jax.Array) -> jax.Array:
    """silu(a) * b in plain jax.numpy, computed in float32."""
    return (jax.nn.silu(a.astype(jnp.float32)) * b.astype(jnp.float32)).astype(a.dtype)


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: negate, exp, add, divide, multiply per element."""
    return 5 * math.prod(shape)


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any,
          platform: Platform) -> Callable[..., Any]:
    """The Pallas SwiGLU for `config` on `platform`: a function of (a, b)."""
    return glu.build(silu, NAME, config, shape, dtype, platform)
