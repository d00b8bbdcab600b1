#!/bin/bash
# Issue 17 on the H200: Triton's per-lane fold (fold: lanes) against the chunk-wise fold and the
# one-pass winners, at the norm rows where torch.compile led; CUPTI kernel times
# (bench/kernel_profile.py, torch.compile's column too). Writes $OUT/lane_fold/*.json.
set -u
D=$OUT/lane_fold; mkdir -p $D
L='"strategy": "fori_loop", "block_rows": 1, "rows_per_program": 1, "fold": "lanes"'
source bench/probes/lib.sh
run() {  # NAME KERNEL SHAPE CONFIG...
  local name=$1; shift
  PROFILE_ARGS="--column torch_compile" profile_configs $D/$name.json "$@" 2>&1 | grep -v "^ " | grep -v Warning
}
lanes() {  # the lane-fold grid: block_cols x num_warps x num_stages
  for bc in 1024 2048 4096; do for nw in 4 8 16; do for ns in 1 3; do
    [ $((bc / (32 * nw))) -ge 8 ] && [ $((bc / (32 * nw))) -le ${1:-64} ] && \
      echo "{$L, \"block_cols\": $bc, \"num_warps\": $nw, \"num_stages\": $ns}"
  done; done; done
}
mapfile -t RMS < <(lanes 64); mapfile -t LN < <(lanes 16)
run rms16k rms_norm 16384x16384 \
  '{"block_cols": 8192, "block_rows": 1, "num_stages": 3, "num_warps": 16, "rows_per_program": 1, "strategy": "fori_loop"}' "${RMS[@]}"
run rms8k rms_norm 8192x8192 \
  '{"block_cols": 128, "block_rows": 2, "num_stages": 1, "num_warps": 32, "rows_per_program": 2, "strategy": "one_pass"}' "${RMS[@]}"
run ln16k layer_norm 16384x16384 \
  '{"block_cols": 8192, "block_rows": 1, "num_stages": 3, "num_warps": 8, "rows_per_program": 1, "strategy": "fori_loop"}' "${LN[@]}"
run ln4k8k layer_norm 4096x8192 \
  '{"block_cols": 128, "block_rows": 2, "num_stages": 2, "num_warps": 8, "rows_per_program": 2, "strategy": "one_pass"}' "${LN[@]}"
