#!/bin/bash
# Issue 17 on the H200: hardware counters (ncu) of the farm's Triton norm kernels against
# torch.compile's at the same launch shape: DRAM bytes, L2 hit rate, occupancy, time.
# Writes $OUT/ncu/*.csv.
set -u
D=$OUT/ncu; mkdir -p $D
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__inst_executed.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed
L='"strategy": "fori_loop", "block_rows": 1, "rows_per_program": 1, "num_stages": 1'
probe() {  # NAME KERNEL SHAPE CONFIG...
  local name=$1 kernel=$2 shape=$3; shift 3
  local args=(); for c in "$@"; do args+=(--config "$c"); done
  ncu --clock-control none --csv --metrics $M --kernel-name regex:"$kernel|triton_" \
    python3 bench/probes/ncu_rows.py --kernel $kernel --shape $shape "${args[@]}" > $D/$name.csv 2> $D/$name.err
  python3 - $D/$name.csv <<'PY'
import csv, sys, collections
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
table = collections.defaultdict(dict)
for r in csv.DictReader(lines):
    table[(r["ID"], r["Kernel Name"][:40])][r["Metric Name"]] = r["Metric Value"]
for (i, name), m in table.items():
    print(i, name, " ".join(f"{k.split('__')[1][:28]}={v}" for k, v in m.items()))
PY
}
probe rms16k rms_norm 16384x16384 "{$L, \"block_cols\": 2048, \"num_warps\": 16, \"fold\": \"lanes\"}" \
  "{$L, \"block_cols\": 8192, \"num_warps\": 16, \"fold\": \"chunk\"}"
probe ln16k layer_norm 16384x16384 "{$L, \"block_cols\": 8192, \"num_warps\": 8, \"fold\": \"chunk\"}"
