"""Device time of plain elementwise passes over the bytes of RMS norm backward at 8192 x 8192
bf16 (x and dy read, dx written: 384 MiB), by their mix of reads and writes: a copy of as many
bytes (one read a write), and torch's x + dy into a third tensor (two reads a write). Each op:
100 calls queued back to back between two CUDA events, after 20 warm-up calls, three rounds.

    python3 bench/probes/read_write_mix.py OUT.json        # on the H200
"""
from __future__ import annotations

import json
import sys

import torch

ROWS = COLS = 8192
CALLS, WARMUP, ROUNDS = 100, 20, 3


def time_us(fn) -> float:
    for _ in range(WARMUP):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(CALLS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / CALLS


def main(out: str) -> None:
    dev = torch.device("cuda", 0)
    x, dy, z = (torch.randn(ROWS, COLS, device=dev, dtype=torch.bfloat16) for _ in range(3))
    flat_in = torch.randn(ROWS * COLS * 3 // 2, device=dev, dtype=torch.bfloat16)
    flat_out = torch.empty_like(flat_in)
    moved = 3 * ROWS * COLS * 2  # bytes read + written by every op below
    ops = {"copy (1 read : 1 write)": lambda: flat_out.copy_(flat_in),
           "x + dy (2 reads : 1 write)": lambda: torch.add(x, dy, out=z),
           "x * dy + x (2 reads : 1 write)": lambda: torch.addcmul(x, x, dy, out=z)}
    rows = []
    for r in range(ROUNDS):
        for name, fn in ops.items():
            us = time_us(fn)
            rows.append({"round": r, "op": name, "us": us, "tb_s": moved / us / 1e6})
            print(f"round {r}  {name:32s} {us:8.1f} us  {moved / us / 1e6:5.2f} TB/s", flush=True)
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "bytes": moved,
                   "calls": CALLS, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
