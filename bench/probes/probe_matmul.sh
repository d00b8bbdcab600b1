#!/bin/bash
# Issue 18 probe on the H200: Mosaic GPU matmul clusters (TMA multicast) and matmul + layer norm
# from tile statistics, side by side with XLA. Writes $OUT/probe_matmul/*.json.
set -u
D=$OUT/probe_matmul; mkdir -p $D
WS='"mgpu_pipeline": "warp_specialized", "max_concurrent_steps": 4'
side() { python3 bench/configs_side_by_side.py --target gpu-mosaic "$@"; }
side --kernel matmul --shape 8192x8192x8192 --out $D/matmul.json \
  --config "{\"block_m\": 128, \"block_n\": 128, \"block_k\": 64, $WS, \"wg_split\": \"n\"}" \
  --config "{\"block_m\": 128, \"block_n\": 128, \"block_k\": 64, $WS, \"wg_split\": \"n\", \"cluster\": \"m\"}" \
  --config "{\"block_m\": 128, \"block_n\": 128, \"block_k\": 64, $WS, \"wg_split\": \"n\", \"cluster\": \"n\"}" \
  --config "{\"block_m\": 64, \"block_n\": 256, \"block_k\": 64, $WS, \"wg_split\": \"m\"}" \
  --config "{\"block_m\": 64, \"block_n\": 256, \"block_k\": 64, $WS, \"wg_split\": \"m\", \"cluster\": \"m\"}" \
  --config "{\"block_m\": 64, \"block_n\": 256, \"block_k\": 64, $WS, \"wg_split\": \"m\", \"cluster\": \"n\"}" \
  --config "{\"block_m\": 128, \"block_n\": 128, \"block_k\": 64, $WS, \"wg_split\": \"n\", \"cluster\": \"m\", \"grid_tile_width\": 8}"
LN='"ln_strategy": "tile_stats", "block_m": 128, "block_n": 128, "block_k": 64'
side --kernel matmul_layernorm --shape 4096x4096x4096 --out $D/matmul_layernorm.json \
  --config "{$LN, $WS, \"wg_split\": \"n\", \"ln_store\": \"input\"}" \
  --config "{$LN, $WS, \"wg_split\": \"n\", \"ln_store\": \"float32\"}" \
  --config "{$LN, $WS, \"wg_split\": \"n\", \"ln_store\": \"input\", \"cluster\": \"m\"}" \
  --config "{$LN, $WS, \"wg_split\": \"m\", \"ln_store\": \"input\", \"block_m\": 64, \"block_n\": 256}" \
  --config "{$LN, \"mgpu_pipeline\": \"pipelined\", \"ln_store\": \"input\", \"block_m\": 64}"
side --kernel matmul --shape 4096x4096x4096 --out $D/matmul4096.json \
  --config "{\"block_m\": 128, \"block_n\": 128, \"block_k\": 64, $WS, \"wg_split\": \"n\"}" \
  --config "{\"block_m\": 128, \"block_n\": 128, \"block_k\": 64, $WS, \"wg_split\": \"n\", \"cluster\": \"m\"}"
side --kernel bmm --shape 64x2048x2048x2048 --out $D/bmm.json \
  --config "{\"block_m\": 128, \"block_n\": 128, \"block_k\": 64, $WS, \"wg_split\": \"n\"}" \
  --config "{\"block_m\": 128, \"block_n\": 128, \"block_k\": 64, $WS, \"wg_split\": \"n\", \"cluster\": \"m\"}" \
  --config "{\"block_m\": 64, \"block_n\": 256, \"block_k\": 64, $WS, \"wg_split\": \"m\", \"cluster\": \"n\"}"
