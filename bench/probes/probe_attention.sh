#!/bin/bash
# Issue 18 probe on the H200: warp-specialized Mosaic GPU attention configs at (4, 32, 4096, 128),
# causal and not, side by side with XLA. Writes $OUT/NAME/<kernel>.json.
#   bash bench/probes/probe_attention.sh [NAME [BLOCK_KV:STEPS:WS_SCHEDULE ...]]
# Without arguments: NAME probe_attention, FA3's ping-pong schedule against intra-warpgroup overlap.
set -u
NAME=${1:-probe_attention}; shift || true
CONFIGS=("$@")
if [ ${#CONFIGS[@]} -eq 0 ]; then
  CONFIGS=(128:2:pingpong 128:2:intra_overlap 128:3:intra_overlap 64:3:pingpong 64:3:intra_overlap 128:4:intra_overlap)
fi
D=$OUT/$NAME; mkdir -p $D
ARGS=()
for c in "${CONFIGS[@]}"; do
  IFS=: read -r kv steps schedule <<< "$c"
  ARGS+=(--config "{\"block_q\": 64, \"block_kv\": $kv, \"mgpu_pipeline\": \"warp_specialized\", \"max_concurrent_steps\": $steps, \"ws_schedule\": \"$schedule\"}")
done
for k in flash_attention flash_attention_causal; do
  python3 bench/configs_side_by_side.py --target gpu-mosaic --kernel $k --shape 4x32x4096x128 --out $D/$k.json "${ARGS[@]}"
done
