#!/usr/bin/env bash
# Mosaic GPU staged rows (kernels/rows/mosaic.py): device time of chunk sizes, exact against
# approximate math, for the kernels that stage rows, beside torch.compile. On the H200:
#   bash bench/probes/staged_rows.sh $OUT/staged    (needs a GPU; JSON per kernel and shape)
set -euo pipefail
out=${1:?usage: staged_rows.sh OUT_DIR}
mkdir -p "$out"
cases=${CASES:-"cross_entropy:8192x32000 cross_entropy:8192x50257 softmax:8192x50257 rms_norm:16384x16384 layer_norm:16384x16384 layer_norm:4096x8192"}
for case in $cases; do
  kernel=${case%%:*}; shape=${case#*:}
  args=()
  for chunk in ${CHUNKS:-1024 2048 4096}; do
    for approx in 0 1; do args+=(--config "{\"block_cols\": $chunk, \"approx_math\": $approx}"); done
  done
  python3 bench/kernel_profile.py --target gpu-mosaic --kernel "$kernel" --shape "$shape" --column torch_compile \
    --out "$out/${kernel}_${shape}.json" "${args[@]}" 2>&1 | grep -v Warning | tail -n 30
done
