"""The fastest a kernel can physically run: its bytes over the memory bandwidth, its flops over the peak.

A timing below this floor is a measurement error (the clock missed device work, or a cache
served what the roofline counts as memory traffic), never a result. Peaks are the vendors'
datasheet figures for the device kinds we know (above anything a kernel reaches: the H200's
copy measured 4.26 TB/s against a 4.8 TB/s peak); for other devices, the bandwidth of a copy
measured on the device, with ROOFLINE_SLACK of headroom, and no flops floor.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp

# Headroom over a measured copy when no datasheet peak is known (a kernel that only reads, or
# reads much more than it writes, may outrun a copy a little).
ROOFLINE_SLACK = 1.15


@dataclasses.dataclass(frozen=True)
class Peaks:
    """A device's ceilings: bytes/s of device memory, and dense bf16 flop/s (None: unknown)."""

    bandwidth: float
    flops: float | None
    source: str


# Datasheet peaks (HBM bandwidth; dense bf16 tensor-core or MXU flop/s) by device-kind substring.
DATASHEET = {
    "h200": Peaks(4.8e12, 989e12, "datasheet:h200"),
    "h100": Peaks(3.35e12, 989e12, "datasheet:h100 sxm"),
    "a100": Peaks(2.04e12, 312e12, "datasheet:a100 80gb"),
    "tpu v5 lite": Peaks(819e9, 197e12, "datasheet:v5e"),
    "tpu v5": Peaks(2.765e12, 459e12, "datasheet:v5p"),
    "tpu v6 lite": Peaks(1.64e12, 918e12, "datasheet:v6e"),
    "tpu7x": Peaks(7.37e12, 2307e12, "datasheet:v7x"),
}


def datasheet(device_kind: str) -> Peaks | None:
    """The datasheet peaks of a device kind, None for one we do not know (or a CPU)."""
    kind = device_kind.lower()
    for name, peaks in DATASHEET.items():   # longer, more specific names come first where it matters
        if name in kind:
            return peaks
    return None


def measured_copy_bandwidth(nbytes: int = 1 << 30, repetitions: int = 5) -> float:
    """Bytes/s (read plus written) of a device-memory copy of `nbytes`, the best of `repetitions`."""
    x = jnp.ones(nbytes // 4, jnp.float32)
    copy = jax.jit(lambda a: a + 0.0)
    jax.block_until_ready(copy(x))
    best = float("inf")
    for _ in range(repetitions):
        started = time.perf_counter()
        jax.block_until_ready(copy(x))
        best = min(best, time.perf_counter() - started)
    return 2 * nbytes / best


def peaks_for_device() -> Peaks | None:
    """This process's first device's peaks: the datasheet's, else a measured copy with slack;
    None on a CPU (its timings in interpret mode have no roofline worth checking)."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return None
    known = datasheet(device.device_kind)
    if known is not None:
        return known
    return Peaks(measured_copy_bandwidth() * ROOFLINE_SLACK, None, "measured copy x slack")


def floor_s(module: Any, shape: tuple[int, ...], dtype: Any, peaks: Peaks | None) -> float | None:
    """Seconds below which a call of `module` at `shape` cannot run on a device with `peaks`."""
    if peaks is None:
        return None
    bound = module.bytes_moved(shape, dtype) / peaks.bandwidth
    if peaks.flops:
        bound = max(bound, module.flops(shape) / peaks.flops)
    return bound
