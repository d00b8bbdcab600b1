#!/usr/bin/env bash
# Issue 17 on the H200: where the Mosaic GPU staged rows (kernels/rows/mosaic.py) lose time
# against torch.compile at the same shape: ncu's throughput, occupancy, launch, warp-state
# (stall reasons) and memory sections of each config and of torch.compile's kernel, one
# profiled launch each (after a warm-up call). Cases on stdin as staged_rows.sh takes them:
# KERNEL SHAPE CONFIG_JSON [CONFIG_JSON ...] (JSON without spaces, over the kernel's default).
#   bash bench/probes/ncu_staged.sh $OUT/ncu < bench/probes/ncu_staged.txt
# Writes OUT/N_KERNEL_SHAPE.csv (ncu's raw details) and prints a summary per profiled kernel.
set -uo pipefail
out=${1:?usage: ncu_staged.sh OUT_DIR < CASES}
mkdir -p "$out"
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
n=0
while read -r kernel shape configs; do
  [[ -z "$kernel" || "$kernel" == \#* ]] && continue
  n=$((n + 1))
  args=(); for c in $configs; do args+=(--config "$c"); done
  name="$out/${n}_${kernel}_${shape}"
  echo "== $kernel $shape: ${configs// / | } | torch.compile"
  # ncu_rows.py runs each config, then torch.compile's kernel, 1 + 2 times: every launch of the
  # farm's kernels (Mosaic GPU) and torch.compile's (Triton), not XLA's conversions.
  ncu --clock-control none --csv --page details $S --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    --kernel-name regex:"mosaic|triton|norm" \
    python3 bench/probes/ncu_rows.py --target gpu-mosaic --kernel "$kernel" --shape "$shape" "${args[@]}" \
    > "$name.csv" 2> "$name.err" < /dev/null
  python3 bench/probes/ncu_summary.py "$name.csv"
  grep -iE "^==ERROR|error:" "$name.err" | head -3
done
