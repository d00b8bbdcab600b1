"""Flash attention forward, non-causal: O = softmax(Q K^T / sqrt(D)) V, per batch entry and head.

Q, K, V and O are (batch, heads, seq, head_dim). The kernels, their strategies and knobs and
the TPU VMEM model are in `kernels.attention_core`, shared with `kernels.flash_attention_causal`.
"""
from __future__ import annotations

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

NAME = "flash_attention"
CAUSAL = False
reference, flops, build = attention_core.variant(causal=CAUSAL)
