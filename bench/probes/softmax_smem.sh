#!/bin/bash
# Issue 17 on the H200: softmax with each row staged in shared memory (Mosaic GPU, strategy
# smem_row) against the Triton winners and torch's own softmax (shared memory too), CUPTI kernel
# time and each config's numerics (bench/kernel_profile.py). Writes $OUT/softmax_smem/*.json.
set -u
D=$OUT/softmax_smem; mkdir -p $D
S='"block_rows": 1, "strategy": "smem_row"'
for spec in "32000:4096:8" "50257:1024:2"; do
  IFS=: read cols tbc tnw <<< "$spec"
  python3 bench/kernel_profile.py --target gpu-mosaic --kernel softmax --shape 8192x$cols --column torch \
    --out $D/softmax_$cols.json \
    --config "{$S, \"block_cols\": 1024}" --config "{$S, \"block_cols\": 2048}" --config "{$S, \"block_cols\": 4096}" \
    --config "gpu-triton:{\"strategy\": \"fori_loop\", \"block_rows\": 1, \"rows_per_program\": 1, \"block_cols\": $tbc, \"num_warps\": $tnw, \"num_stages\": 1}" \
    2>&1 | grep -v "^ \|Warning\|warn"
done
