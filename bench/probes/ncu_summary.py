"""Summarise ncu's `--csv --page details` output: a line per profiled launch (kernel, duration,
DRAM, memory and L2 throughput, L2 hit rate, achieved occupancy, registers, shared memory,
cycles per issued instruction), then its largest stall reasons
(`smsp__average_warps_issue_stalled_*`, cycles a warp spends stalled per issued instruction).

    python3 bench/probes/ncu_summary.py FILE.csv
"""
from __future__ import annotations

import collections
import csv
import sys

COLUMNS = (("Duration", "time"), ("DRAM Throughput", "dram%"), ("Memory Throughput", "mem%"),
           ("L2 Cache Throughput", "l2%"), ("L2 Hit Rate", "l2hit%"), ("Achieved Occupancy", "occ%"),
           ("Registers Per Thread", "regs"),
           ("Dynamic Shared Memory Per Block", "smem"), ("Block Limit Registers", "lim_regs"),
           ("Block Limit Shared Mem", "lim_smem"), ("Warp Cycles Per Issued Instruction", "cpi"),
           ("Issued Warp Per Scheduler", "issued"))
STALL = "smsp__average_warps_issue_stalled_"


def summarise(path: str, stalls: int = 5) -> list[str]:
    """A line per profiled launch, then its `stalls` largest stall reasons."""
    lines = [line for line in open(path, errors="replace") if line.startswith('"')]
    launches: dict[tuple[str, str], dict[str, str]] = collections.defaultdict(dict)
    for row in csv.DictReader(lines):
        metric = row.get("Metric Name", "")
        key = (row["ID"], row["Kernel Name"])
        # The first of a repeated name: "Memory Throughput" is SpeedOfLight's percentage, then
        # MemoryWorkloadAnalysis's bytes a second.
        unit = "" if metric.startswith(STALL) else row["Metric Unit"]
        launches[key].setdefault(metric, f'{row["Metric Value"]}{unit}')
    out = []
    for (launch, kernel), metrics in launches.items():
        shown = " ".join(f"{short}={metrics[name]}" for name, short in COLUMNS if name in metrics)
        out.append(f"{launch:>3} {kernel[:34]:34} {shown}")
        stalled = sorted(((float(v.replace(",", "")), k[len(STALL):].replace("_per_issue_active.ratio", ""))
                          for k, v in metrics.items() if k.startswith(STALL) and k.endswith("_per_issue_active.ratio")
                          and v.replace(",", "").replace(".", "", 1).isdigit()), reverse=True)
        if stalled:
            out.append("      stalls: " + " ".join(f"{name}={value:.2f}" for value, name in stalled[:stalls]))
    return out


if __name__ == "__main__":
    print("\n".join(summarise(sys.argv[1])))
