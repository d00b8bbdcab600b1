#!/bin/bash
# Issue 17 on the H200: what torch.compile generates for the rows where it beats the farm, and
# where each column's device time goes (bench/kernel_profile.py with --column). The farm's
# configs are the winners of bench/results/h200/{device_time_batched,user_shapes,vocab}, plus
# one-pass configs at 16384 columns. Writes $OUT/inductor/*.json and inductor's Triton source
# ($OUT/inductor/*.log, TORCH_LOGS=output_code).
set -u
D=$OUT/inductor; mkdir -p $D
T='"strategy": "one_pass", "block_rows": 1, "rows_per_program": 1, "num_stages": 1'
source bench/probes/lib.sh
run() {  # NAME KERNEL SHAPE CONFIG...
  local name=$1; shift
  TORCH_LOGS=output_code PROFILE_ARGS="--column torch_compile --column torch" \
    profile_configs $D/$name.json "$@" > $D/$name.out 2> $D/$name.log
  grep -v "^ " $D/$name.out | head -20; grep -E "^ " $D/$name.out | head -30
}
run rms16k rms_norm 16384x16384 \
  '{"block_cols": 8192, "block_rows": 1, "num_stages": 3, "num_warps": 16, "rows_per_program": 1, "strategy": "fori_loop"}' \
  "{$T, \"num_warps\": 8}" "{$T, \"num_warps\": 16}" "{$T, \"num_warps\": 32}"
run rms8k rms_norm 8192x8192 \
  '{"block_cols": 128, "block_rows": 2, "num_stages": 1, "num_warps": 32, "rows_per_program": 2, "strategy": "one_pass"}' \
  "{$T, \"num_warps\": 8}" "{$T, \"num_warps\": 16}"
run ln16k layer_norm 16384x16384 \
  '{"block_cols": 8192, "block_rows": 1, "num_stages": 3, "num_warps": 8, "rows_per_program": 1, "strategy": "fori_loop"}' \
  "{$T, \"num_warps\": 16}" "{$T, \"num_warps\": 32}"
run swiglu16k swiglu 16x16384x4096 \
  '{"block_cols": 64, "block_size": 4096, "blocks_per_program": 1, "num_stages": 1, "num_warps": 16, "tiling": "flat"}' \
  '{"block_cols": 64, "block_size": 1024, "blocks_per_program": 1, "num_stages": 1, "num_warps": 4, "tiling": "flat"}'
run softmax50257 softmax 8192x50257 \
  '{"block_cols": 1024, "block_rows": 1, "num_stages": 1, "num_warps": 2, "rows_per_program": 1, "strategy": "fori_loop"}'
