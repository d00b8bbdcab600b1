#!/bin/bash
# Issue 18 probe on the H200: FA3's two schedules together (overlap_pingpong, built twice and
# removed) against each alone, side by side with XLA. Writes $OUT/probe_attention2/; kept results
# in bench/results/h200/attention_overlap/probes/overlap_pingpong{,_turns}/.
set -u
D=$OUT/probe_attention2; mkdir -p $D
cfg() { echo "{\"block_q\": 64, \"block_kv\": $1, \"mgpu_pipeline\": \"warp_specialized\", \"max_concurrent_steps\": $2, \"ws_schedule\": \"$3\"}"; }
for k in flash_attention flash_attention_causal; do
  python3 bench/configs_side_by_side.py --target gpu-mosaic --kernel $k --shape 4x32x4096x128 --out $D/$k.json \
    --config "$(cfg 128 2 pingpong)" --config "$(cfg 128 2 intra_overlap)" --config "$(cfg 128 2 overlap_pingpong)" \
    --config "$(cfg 64 4 intra_overlap)" --config "$(cfg 64 4 overlap_pingpong)" --config "$(cfg 128 3 overlap_pingpong)"
done
