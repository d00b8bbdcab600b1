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


def tma_bounds_as_on_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make Pallas's GPU interpreter treat a copy past a global array's end as Hopper's TMA does:
    reads past the end give zeros, and a write's part past the end is dropped (the rest lands).
    The interpreter instead raises on such reads and drops the whole of such a write, so the
    Mosaic GPU kernels' part blocks (a sequence, m, n or k no block divides, run without padding
    copies) could only be checked on a GPU. Patches private names of JAX's interpreter (as of JAX
    0.10); skips where they moved. While this is on, plain loads past an array's end read zeros
    too, and writes past a shared-memory allocation's end are clipped: bugs it no longer catches."""
    callbacks = pytest.importorskip("jax._src.pallas.mosaic_gpu.interpret.gpu_callbacks")
    memory = pytest.importorskip("jax._src.pallas.mosaic.interpret.shared_memory")
    import numpy as np

    if not (hasattr(callbacks, "_handle_out_of_bounds_read") and hasattr(memory.Buffer, "set_in_bounds_portion")):
        pytest.skip("this JAX's GPU interpreter has moved the names the TMA bounds emulation patches")

    def zeros_past_the_end(ret: Any, full_read_shape: tuple[int, ...], shape: Any, dtype: Any, *args: Any,
                           **kwargs: Any) -> Any:
        out = np.zeros(full_read_shape, dtype=dtype)
        if ret is not None:  # the read's part inside the array comes first along every axis
            out[tuple(slice(s) for s in ret.shape)] = ret
        return out

    def setitem(self: Any, rnge: Any, value: Any) -> None:
        self.set_in_bounds_portion(rnge, value)

    monkeypatch.setattr(callbacks, "_handle_out_of_bounds_read", zeros_past_the_end)
    monkeypatch.setattr(memory.Buffer, "__setitem__", setitem)
