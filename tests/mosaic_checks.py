"""Checks shared by the Mosaic GPU kernels' tests."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest


def mosaic_smem_bytes(lower: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> int:
    """The shared memory Mosaic GPU itself counts for the kernel `lower()` lowers (for CUDA, on
    any machine): with its bound set to one byte, lowering fails and names the count. Skips where
    this JAX does not expose the bound."""
    core = pytest.importorskip("jax.experimental.mosaic.gpu.core")
    if not hasattr(core, "_SMEM_SIZE_BOUND"):
        pytest.skip("this JAX does not expose Mosaic GPU's shared-memory bound")
    with monkeypatch.context() as patched:
        patched.setattr(core, "_SMEM_SIZE_BOUND", 1)
        with pytest.raises(ValueError, match="exceeds available shared memory") as info:
            lower()
    return int(re.search(r"smem_bytes=(\d+)", str(info.value)).group(1))
