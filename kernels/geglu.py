"""GeGLU, elementwise: out = gelu(a) * b for a, b of shape (batch, seq, hidden).

GELU is the tanh approximation (`jax.nn.gelu(approximate=True)`, PyTorch's
`gelu(approximate="tanh")`): gelu(a) = a / 2 * (1 + tanh(sqrt(2 / pi) * (a + 0.044715 a^3))).
Computed in float32, rounded to the input dtype. The kernel, its tiling knobs (typed configs)
and every protocol member but the activation are those of `kernels.glu`.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from kernels import glu

NAME = "geglu"
MEMORY_PARAMS = glu.MEMORY_PARAMS

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_tanh(a: jax.Array) -> jax.Array:
    """GELU, tanh approximation."""
    return 0.5 * a * (1.0 + jnp.tanh(SQRT_2_OVER_PI * (a + 0.044715 * a * a * a)))


# Operations per element: cube, scale, add, scale, tanh, add, two halves, gate.
(SHAPE_NAMES, TARGETS, reference, make_inputs, shape_of, flops, bytes_moved, footprint, default_config,
 check_config, build) = glu.gated_unit(
    NAME, gelu_tanh, functools.partial(jax.nn.gelu, approximate=True), flops_per_element=11,
    formula="gelu(a) * b (tanh approximation)")
PARALLEL_DIMS = ("batch", "seq", "hidden")
