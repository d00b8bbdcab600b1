#!/bin/bash
# Issue 18 probe on the H200: the matmul sweep's winner at 8192^3 against delay_release and
# pipeline depth variants, side by side with XLA. Writes $OUT/probe_matmul2/matmul.json.
set -u
D=$OUT/probe_matmul2; mkdir -p $D
T='"block_m": 128, "block_n": 128, "block_k": 64, "mgpu_pipeline": "warp_specialized", "cluster": "m"'
cfg() { echo "{$T, \"wg_split\": \"$1\", \"max_concurrent_steps\": $2, \"delay_release\": $3, \"grid_tile_width\": $4}"; }
python3 bench/configs_side_by_side.py --target gpu-mosaic --kernel matmul --shape 8192x8192x8192 \
  --out $D/matmul.json --config "$(cfg m 3 0 16)" --config "$(cfg m 4 0 16)" --config "$(cfg m 4 1 16)" \
  --config "$(cfg m 3 1 16)" --config "$(cfg n 4 0 16)" --config "$(cfg n 4 1 16)" --config "$(cfg n 4 1 8)" \
  --config "{\"block_m\": 128, \"block_n\": 128, \"block_k\": 128, \"mgpu_pipeline\": \"warp_specialized\", \"cluster\": \"m\", \"wg_split\": \"m\", \"max_concurrent_steps\": 2, \"delay_release\": 1, \"grid_tile_width\": 16}"
