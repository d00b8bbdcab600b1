#!/bin/bash
# Issue 18 on the H200: where the fused kernels' time goes (bench/kernel_profile.py), the sweep's
# winners against XLA. Writes $OUT/profile/*.json.
set -u
D=$OUT/profile; mkdir -p $D
W='"block_m": 128, "block_n": 128, "mgpu_pipeline": "warp_specialized", "grid_minor": "n"'
python3 bench/kernel_profile.py --kernel matmul_layernorm --shape 4096x4096x4096 --out $D/matmul_layernorm.json \
  --config "{$W, \"block_k\": 64, \"cluster\": \"m\", \"grid_tile_width\": 8, \"ln_store\": \"input\", \"ln_strategy\": \"tile_stats\", \"max_concurrent_steps\": 3, \"wg_split\": \"n\"}" \
  --config "{$W, \"block_k\": 64, \"cluster\": \"m\", \"grid_tile_width\": 8, \"ln_store\": \"float32\", \"ln_strategy\": \"tile_stats\", \"max_concurrent_steps\": 2, \"wg_split\": \"n\"}"
python3 bench/kernel_profile.py --kernel matmul_subtiled_epilogue --shape 4096x4096x4096 --out $D/matmul_subtiled_epilogue.json \
  --config "{$W, \"block_k\": 128, \"epi_m\": 64, \"epi_n\": 64, \"grid_tile_width\": 4, \"max_concurrent_steps\": 2, \"wg_split\": \"n\"}"
python3 bench/kernel_profile.py --kernel matmul --shape 4096x4096x4096 --out $D/matmul4096.json \
  --config "{$W, \"block_k\": 64, \"cluster\": \"m\", \"grid_tile_width\": 8, \"max_concurrent_steps\": 4, \"wg_split\": \"n\"}"
