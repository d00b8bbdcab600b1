#!/bin/bash
# Issue 17 on the H200: where rows split over a cluster's blocks lose time against the copy
# ceiling: ncu's throughput, occupancy, launch and warp-state (stall reason) sections of the
# Mosaic GPU softmax split over a cluster (8192 x 128256 and x 151936, the tuned winners)
# against a block per row at 8192 x 50304 (95% of copy). Writes $OUT/ncu_cluster/*.csv and a
# summary of each on stdout.
set -u
D=$OUT/ncu_cluster; mkdir -p $D
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis"
probe() {  # NAME KERNEL SHAPE CONFIG
  local name=$1 kernel=$2 shape=$3 config=$4
  ncu --clock-control none --csv --page details $S --kernel-name regex:"mosaic_gpu_kernel" --launch-skip 1 --launch-count 1 \
    python3 bench/probes/ncu_rows.py --target gpu-mosaic --kernel $kernel --shape $shape --config "$config" \
    > $D/$name.csv 2> $D/$name.err
  python3 - $D/$name.csv <<'PY'
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
keep = ("Duration", "Memory Throughput", "DRAM Throughput", "Achieved Occupancy", "Theoretical Occupancy",
        "Block Limit", "Cluster", "Warp Cycles Per Issued Instruction", "Registers Per Thread",
        "Shared Memory Configuration Size", "Dynamic Shared Memory Per Block", "Waves Per SM", "Stall")
for r in csv.DictReader(lines):
    if any(k in r["Metric Name"] for k in keep):
        print(f'  {r["Section Name"][:22]:22} {r["Metric Name"][:48]:48} {r["Metric Value"]:>14} {r["Metric Unit"]}')
PY
  grep -iE "warn|error" $D/$name.err | head -3
}
echo "== softmax 8192x151936, 6 blocks a cluster, 2048-column chunks"
probe sm151936_k6 softmax 8192x151936 '{"cluster": 6, "block_cols": 2048}'
echo "== softmax 8192x128256, 4 blocks a cluster, 4096-column chunks"
probe sm128256_k4 softmax 8192x128256 '{"cluster": 4, "block_cols": 4096}'
echo "== softmax 8192x50304, a block per row"
probe sm50304 softmax 8192x50304 '{"block_cols": 4096}'
