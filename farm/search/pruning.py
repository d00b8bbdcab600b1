"""OOM-aware pruning: never compile what cannot fit, learn from what did not.

`static_verdict`: a config whose modelled footprint exceeds the capacity is pruned before
compiling. `Dominance`: a config at least as large as a known `oom` config in every
memory-relevant knob (all other knobs, e.g. the strategy, equal) is pruned too.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from farm.measure.capacity import Capacity
from kernels import protocol


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Why a config is pruned, with the numbers; `invalid` where the kernel's memory model itself
    failed on it (a kernel bug: the config is never compiled, whatever the pruning settings)."""

    reason: str
    footprint_bytes: int | None = None
    capacity_bytes: int | None = None
    invalid: bool = False


def static_verdict(module: Any, config: Mapping[str, Any], shape: tuple[int, ...], dtype: str, target: str,
                   capacity: Capacity) -> tuple[int | None, Verdict | None]:
    """(footprint, verdict): verdict is None when the config may fit."""
    import jax.numpy as jnp

    try:
        footprint = int(module.footprint(dict(config), shape, jnp.dtype(dtype), target))
    except Exception as err:  # noqa: BLE001 - a kernel's model failing on one config fails that config only
        return None, Verdict(f"the kernel's footprint() raised {type(err).__name__}: {str(err)[:300]}", invalid=True)
    if capacity.onchip_bytes is not None and footprint > capacity.onchip_bytes:
        return footprint, Verdict(
            f"footprint {footprint} B exceeds {capacity.memory} capacity {capacity.onchip_bytes} B "
            f"({capacity.source})", footprint, capacity.onchip_bytes)
    hbm_needed = protocol.hook(module, "hbm_bytes")
    needed = int(hbm_needed(shape, jnp.dtype(dtype))) if hbm_needed else int(module.bytes_moved(shape, jnp.dtype(dtype)))
    if capacity.hbm_bytes is not None and needed > capacity.hbm_bytes:
        return footprint, Verdict(f"inputs and outputs need {needed} B of HBM, more than {capacity.hbm_bytes} B "
                                  f"({capacity.source})", needed, capacity.hbm_bytes)
    return footprint, None


def memory_params(module: Any, config: Mapping[str, Any]) -> tuple[str, ...]:
    """The knobs that grow memory: the kernel's MEMORY_PARAMS, else every integer knob."""
    declared = protocol.hook(module, "MEMORY_PARAMS")
    if declared is not None:
        return tuple(p for p in declared if p in config)
    return tuple(k for k, v in config.items() if isinstance(v, int) and not isinstance(v, bool))


class Dominance:
    """The `oom` configs of one task, and the test whether a new config is at least as large."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.oom: list[tuple[int, dict[str, Any]]] = []

    def add(self, trial: int, config: Mapping[str, Any]) -> None:
        """Remember an `oom` config."""
        self.oom.append((trial, dict(config)))

    def dominating(self, config: Mapping[str, Any]) -> int | None:
        """The trial number of a known `oom` config that `config` is at least as large as."""
        grow = memory_params(self.module, config)
        for trial, known in self.oom:
            if set(known) != set(config):
                continue
            same = all(config[k] == known[k] for k in config if k not in grow)
            if same and all(config[k] >= known[k] for k in grow):
                return trial
        return None
