"""The GPU's clocks, power, temperature and clock-event reasons, read from `nvidia-smi`.

A benchmark samples them around a timing so that a figure that moved between two timings of the
same kernel can be put down to the device's clocks, or not. Where `nvidia-smi` is missing or
fails (a CPU machine), `sample` returns None: the clocks are a note beside a figure, never a
reason to stop a benchmark.

    python bench/gpu_clocks.py          # one sample of the first visible GPU, as JSON
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable

TIMEOUT_S = 5.0
# Renamed from clocks_throttle_reasons.active in recent drivers; the old name is the fallback.
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")
# Bits of the reasons mask (nvidia-smi -q's "Clocks Event Reasons"), the ones that slow a timing.
REASON_BITS = {0x1: "idle", 0x2: "applications clocks", 0x4: "power cap", 0x8: "hardware slowdown",
               0x10: "sync boost", 0x20: "thermal (software)", 0x40: "thermal (hardware)", 0x80: "power brake",
               0x100: "display clocks"}


@dataclasses.dataclass(frozen=True)
class ClockSample:
    """One reading: SM and memory clocks (MHz), board power (W), temperature (C), active reasons."""
    sm_mhz: float
    mem_mhz: float
    power_w: float | None
    temperature_c: float | None
    reasons: tuple[str, ...] = ()

    def brief(self) -> str:
        """`1980/3201 MHz, 412 W, 48 C` plus the reasons, if any."""
        parts = [f"{self.sm_mhz:.0f}/{self.mem_mhz:.0f} MHz"]
        if self.power_w is not None:
            parts.append(f"{self.power_w:.0f} W")
        if self.temperature_c is not None:
            parts.append(f"{self.temperature_c:.0f} C")
        return ", ".join(parts + list(self.reasons))


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:   # "[N/A]", "[Not Supported]"
        return None


def reasons(mask: str) -> tuple[str, ...]:
    """The named reasons of a mask as nvidia-smi prints it (`0x0000000000000004`); unknown bits by value."""
    value = int(mask, 16) if mask.strip().lower().startswith("0x") else 0
    named = [name for bit, name in REASON_BITS.items() if value & bit]
    rest = value & ~sum(REASON_BITS)
    return tuple(named + ([f"0x{rest:x}"] if rest else []))


def parse(line: str, with_reasons: bool) -> ClockSample | None:
    """A ClockSample from one line of `--format=csv,noheader,nounits` over FIELDS (and a reasons
    field last, when `with_reasons`); None when the clocks are not numbers."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != len(FIELDS) + with_reasons:
        return None
    sm, mem, power, temp = (_number(c) for c in cells[:4])
    if sm is None or mem is None:
        return None
    return ClockSample(sm, mem, power, temp, reasons(cells[4]) if with_reasons else ())


def visible_index() -> str:
    """nvidia-smi's index of the first GPU this process sees (CUDA_VISIBLE_DEVICES), else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first if first else "0"


def sample(index: str | None = None) -> ClockSample | None:
    """The clocks of GPU `index` (default: the first visible) now, or None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    for extra in (*REASON_FIELDS, None):
        fields = FIELDS + ((extra,) if extra else ())
        try:
            done = subprocess.run([smi, "-i", index or visible_index(), f"--query-gpu={','.join(fields)}",
                                   "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                  timeout=TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode == 0 and done.stdout.strip():
            return parse(done.stdout.strip().splitlines()[0], extra is not None)
    return None


def settle(below_w: float, max_s: float, poll_s: float = 0.25, read: Callable[[], ClockSample | None] = sample,
           plateau_s: float = 1.0, plateau_w: float = 5.0) -> tuple[float, ClockSample | None]:
    """Wait until the GPU draws at most `below_w` watts, or its power has stopped falling (less
    than `plateau_w` lower than `plateau_s` seconds before: a GPU that idles above `below_w`, or
    one another process keeps busy), or `max_s` seconds have passed: so that every column of a
    check starts from the same, cooled state rather than from the power (and, under a power cap,
    the lower SM clock) the previous column left. Returns the seconds waited and the last sample;
    (0.0, None) at once without nvidia-smi or a power reading."""
    start = time.monotonic()
    found = read()
    seen: list[tuple[float, float]] = []  # (when, watts) of the readings so far
    while found is not None and found.power_w is not None and found.power_w > below_w:
        now = time.monotonic()
        if now - start >= max_s:
            break
        before = [watts for when, watts in seen if now - when >= plateau_s]
        if before and before[-1] - found.power_w < plateau_w:
            break
        seen.append((now, found.power_w))
        time.sleep(poll_s)
        found = read()
    if found is None or found.power_w is None:
        return 0.0, found
    return time.monotonic() - start, found


if __name__ == "__main__":
    found = sample()
    print(json.dumps(dataclasses.asdict(found) if found else None))
