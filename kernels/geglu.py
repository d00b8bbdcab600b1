"""GeGLU, elementwise: out = gelu(a) * b for a, b of shape (batch, seq, hidden).

GELU is the tanh approximation (`jax.nn.gelu(approximate=True)`, PyTorch's
`gelu(approximate="tanh")`): gelu(a) = a / 2 * (1 + tanh(sqrt(2 / pi) * (a + 0.044715 a^3))).
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

NAME = "geglu"

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_tanh(a: jax.Array) -> jax.Array:
    """GELU, tanh approximation."""
    return 0.5 * a * (1.0 + jnp.tanh(SQRT_2_OVER_PI * (a + 0.044715 * a * a * a)))


def reference(a: jax.Array, b: jax.Array) -> jax.Array:
    """gelu(a) * b (tanh approximation) in plain jax.numpy, computed in float32."""
    gelu = jax.nn.gelu(a.astype(jnp.float32), approximate=True)
    return (gelu * b.astype(jnp.float32)).astype(a.dtype)


def flops(shape: tuple[int, ...]) -> int:
    """Approximate floating-point operations: cube, scale, add, scale, tanh, add, two halves, gate."""
    return 11 * math.prod(shape)


def build(config: dict[str, Any], shape: tuple[int, ...], dtype: Any,
          platform: Platform) -> Callable[..., Any]:
    """The Pallas GeGLU for `config` on `platform`: a function of (a, b)."""
    return glu.build(gelu_tanh, NAME, config, shape, dtype, platform)
