#!/bin/bash
# Issue 18 on the H200: tile_stats' phase 2 by XLA or by one Triton kernel (ln_rows rows a
# program), kernel by kernel (bench/kernel_profile.py) and side by side with XLA. Writes $OUT/ln2/.
set -u
D=$OUT/ln2; mkdir -p $D
W='"block_m": 128, "block_n": 128, "block_k": 64, "mgpu_pipeline": "warp_specialized", "grid_minor": "n", "cluster": "m", "grid_tile_width": 8, "ln_store": "input", "ln_strategy": "tile_stats", "max_concurrent_steps": 3, "wg_split": "n"'
C=(--config "{$W, \"ln_phase2\": \"xla\"}")
for r in 1 2 4 8; do C+=(--config "{$W, \"ln_phase2\": \"triton\", \"ln_rows\": $r}"); done
python3 bench/kernel_profile.py --kernel matmul_layernorm --shape 4096x4096x4096 --out $D/profile.json "${C[@]}"
python3 bench/configs_side_by_side.py --target gpu-mosaic --kernel matmul_layernorm --shape 4096x4096x4096 \
  --out $D/side_by_side.json "${C[@]}"
