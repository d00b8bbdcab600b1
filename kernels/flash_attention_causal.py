"""Causal flash attention forward: key j attends to query i only when j <= i.

The same kernels as `kernels.flash_attention` (`kernels.attention_core`: strategies, knobs, VMEM
model), built causal: key blocks after a query block's last row are skipped (on gpu-mosaic
"pipelined": masked).
"""
from __future__ import annotations

from kernels import attention_core

NAME = "flash_attention_causal"
CAUSAL = True
(SHAPE_NAMES, TARGETS, reference, make_inputs, shape_of, flops, bytes_moved, footprint, default_config,
 check_config, build) = attention_core.variant(causal=CAUSAL)
PARALLEL_DIMS = ("batch", "heads")  # a query attends the keys before it: seq stays whole
