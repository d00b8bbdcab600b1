"""SwiGLU, elementwise: out = silu(a) * b = a * sigmoid(a) * b, for a, b of shape (batch, seq, hidden).

Computed in float32, rounded to the input dtype. The kernel, its tiling knobs (typed configs)
and every protocol member but the activation are those of `kernels.glu`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels import glu

NAME = "swiglu"
MEMORY_PARAMS = glu.MEMORY_PARAMS


def silu(a: jax.Array) -> jax.Array:
    """a * sigmoid(a), written with exp so that every backend lowers it."""
    return a / (1.0 + jnp.exp(-a))


# Operations per element: negate, exp, add, divide, multiply.
(SHAPE_NAMES, TARGETS, reference, make_inputs, shape_of, flops, bytes_moved, footprint, default_config,
 check_config, build) = glu.gated_unit(NAME, silu, jax.nn.silu, flops_per_element=5, formula="silu(a) * b")
PARALLEL_DIMS = ("batch", "seq", "hidden")
