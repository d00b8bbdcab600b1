"""Causal flash attention forward: key j attends to query i only when j <= i.

The same kernels as `kernels.flash_attention` (`kernels.attention_core`: strategies, knobs, VMEM
model), built causal: key blocks after a query block's last row are skipped (on gpu-mosaic
"pipelined": masked).
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

NAME = "flash_attention_causal"
CAUSAL = True
reference, flops, build = attention_core.variant(causal=CAUSAL)
