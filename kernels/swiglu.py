"""SwiGLU, elementwise: out = silu(a) * b = a * sigmoid(a) * b, for a, b of shape (batch, seq, hidden).

Computed in float32, rounded to the input dtype. The kernel, its tiling knobs (typed configs)
and every protocol member but the activation are those of `kernels.glu`. With approx_math=1
(gpu-triton) silu is computed as a / 2 * (1 + tanh(a / 2)) with tanh.approx.f32.
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


def silu_tanh(a: jax.Array, tanh: glu.Activation = jnp.tanh) -> jax.Array:
    """a * sigmoid(a) as a / 2 * (1 + tanh(a / 2)), with the given tanh (approx_math's form)."""
    return 0.5 * a * (1.0 + tanh(0.5 * a))


# Operations per element: negate, exp, add, divide, multiply.
(SHAPE_NAMES, TARGETS, reference, make_inputs, shape_of, flops, bytes_moved, footprint, default_config,
 check_config, build) = glu.gated_unit(NAME, silu, jax.nn.silu, flops_per_element=5, formula="silu(a) * b",
                                       tanh_act=silu_tanh)
