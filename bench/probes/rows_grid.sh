#!/bin/bash
# Issue 17 on the H200: a grid of Triton row configs at one norm row, with torch.compile's kernel
# and its launch shape beside them (bench/kernel_profile.py). Usage: rows_grid.sh NAME KERNEL SHAPE
# FOLD STRATEGY (env BLOCK_ROWS, BLOCK_COLS, NUM_WARPS, MIN_PER_THREAD narrow or widen the grid;
# env EXTRA adds knobs to every config, e.g. EXTRA='"unroll": 1');
# writes $OUT/rows_grid/NAME.json.
set -u
name=$1 kernel=$2 shape=$3 fold=$4 strategy=${5:-fori_loop}
D=$OUT/rows_grid; mkdir -p $D
args=()
for br in ${BLOCK_ROWS:-1 2 4}; do for bc in ${BLOCK_COLS:-1024 2048 4096 8192}; do for nw in ${NUM_WARPS:-4 8 16 32}; do
  per_thread=$((br * bc / (32 * nw)))
  if [ $per_thread -ge ${MIN_PER_THREAD:-8} ] && [ $per_thread -le 64 ]; then
    args+=(--config "{\"strategy\": \"$strategy\", \"fold\": \"$fold\", \"block_rows\": $br, \"rows_per_program\": $br, \"block_cols\": $bc, \"num_warps\": $nw, \"num_stages\": 1${EXTRA:+, $EXTRA}}")
  fi
done; done; done
python3 bench/kernel_profile.py --target gpu-triton --kernel $kernel --shape $shape --column torch_compile \
  --out $D/$name.json "${args[@]}" > $D/$name.out 2>&1
python3 - $D/$name.json <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if "kernels" in r]
for r in sorted(rows, key=lambda r: r["sum_us_per_call"])[:12]:
    k = r["kernels"][0]
    print(f"{r['sum_us_per_call']:8.1f} us  grid={k.get('grid')} block={k.get('block')} regs={k.get('registers')}  {r['config']}")
PY
