"""On-chip and device memory per target: what a config must fit in.

TPU VMEM per TensorCore comes from JAX's own TPU info table (v2-v4 16 MiB, v5e 128 MiB, v5p
64 MiB, v6e 128 MiB, v7 64 MiB), read from the device on a TPU. GPU shared memory per block
comes from the device (JAX's `shared_memory_per_block_optin`, else torch) or a table by
device kind (232448 bytes on H100/H200). Interpret-mode runs emulate a named profile.
"""
from __future__ import annotations

import dataclasses
from typing import Any

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Capacity:
    """Bytes a kernel may use: `onchip` (VMEM or shared memory per block) and `hbm`."""

    onchip_bytes: int | None
    hbm_bytes: int | None
    memory: str      # "vmem" | "shared memory" | "none"
    source: str      # where the numbers came from

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (crosses Ray, lands in run.json)."""
        return dataclasses.asdict(self)


NONE = Capacity(None, None, "none", "unknown")

# GPU shared memory per block (opt-in maximum) and HBM by device kind.
_GPUS = {
    "h200": Capacity(232448, 141 * 10**9, "shared memory", "table:h200"),
    "h100": Capacity(232448, 80 * 10**9, "shared memory", "table:h100"),
    "a100": Capacity(166912, 80 * 10**9, "shared memory", "table:a100"),
}
_TPU_GENERATIONS = {"v2": "v2", "v3": "v3", "v4": "v4", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e",
                    "v7": "7", "v7x": "7x"}
# The profile an interpret-mode emulation of a target uses unless told otherwise.
DEFAULT_EMULATED = {"tpu": "v7", "gpu-triton": "h200", "gpu-mosaic": "h200"}


def _tpu_profile(generation: str) -> Capacity:
    from jax.experimental.pallas import tpu as pltpu

    info = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion(_TPU_GENERATIONS[generation]), 1)
    return Capacity(info.vmem_capacity_bytes, info.hbm_capacity_bytes or None, "vmem", f"table:{generation}")


def profiles() -> tuple[str, ...]:
    """Names accepted by `profile`."""
    return (*_TPU_GENERATIONS, *_GPUS)


def profile(name: str) -> Capacity:
    """The capacity of a named device (`v5e`, `v6e`, `v7`, `h200`, ...)."""
    name = name.lower()
    if name in _TPU_GENERATIONS:
        return _tpu_profile(name)
    if name in _GPUS:
        return _GPUS[name]
    raise KeyError(f"unknown capacity profile {name!r}; expected one of {list(profiles())}")


def _gpu_shared_memory(device_index: int = 0) -> int | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(device_index).shared_memory_per_block_optin)


def detect(target: str) -> Capacity:
    """The capacity of this process's first JAX device, for `target` (call on a worker)."""
    import jax

    device = jax.devices()[0]
    stats = (device.memory_stats() or {}) if device.platform != "cpu" else {}
    hbm = stats.get("bytes_limit")
    if device.platform == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        return Capacity(pltpu.get_tpu_info().vmem_capacity_bytes, hbm, "vmem", f"device:{device.device_kind}")
    if device.platform == "gpu":
        smem = getattr(device, "shared_memory_per_block_optin", None) or _gpu_shared_memory()
        kind = device.device_kind.lower()
        table = next((c for name, c in _GPUS.items() if name in kind), NONE)
        return Capacity(smem or table.onchip_bytes, hbm or table.hbm_bytes, "shared memory",
                        f"device:{device.device_kind}" if smem else table.source)
    return NONE


def for_target(target: str, *, interpret: bool, emulate: str | None = None) -> Capacity:
    """The capacity a worker prunes against: the device's, or an emulated profile's."""
    if not interpret:
        return detect(target)
    name = emulate or DEFAULT_EMULATED.get(target)
    return profile(name) if name else NONE
