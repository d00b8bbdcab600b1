"""Flash attention forward, non-causal: O = softmax(Q K^T / sqrt(D)) V, per batch entry and head.

Q, K, V and O are (batch, heads, seq, head_dim). The kernels, their strategies and knobs and
the TPU VMEM model are in `kernels.attention_core`, shared with `kernels.flash_attention_causal`.
"""
from __future__ import annotations

from kernels import attention_core

NAME = "flash_attention"
CAUSAL = False
(SHAPE_NAMES, TARGETS, reference, make_inputs, shape_of, flops, bytes_moved, footprint, default_config,
 check_config, build) = attention_core.variant(causal=CAUSAL)
PARALLEL_DIMS = ("batch", "heads")  # every query attends every key: seq stays whole
