#!/usr/bin/env bash
# Staged rows (kernels/rows/mosaic.py) at shapes nobody tuned for: odd widths, a few rows, rows in
# pieces; each kernel's gpu-mosaic default and a variant, numerics checked against the float32
# reference by bench/kernel_profile.py. On the H200: bash bench/probes/staged_odd_shapes.sh $OUT/odd
set -euo pipefail
out=${1:?usage: staged_odd_shapes.sh OUT_DIR}
mkdir -p "$out"
source bench/probes/lib.sh
n=0
while read -r kernel shape dtype configs; do
  [[ -z "$kernel" || "$kernel" == \#* ]] && continue
  n=$((n + 1))
  # shellcheck disable=SC2086  # one config per word
  PROFILE_TARGET=gpu-mosaic PROFILE_ARGS="--dtype $dtype" \
    profile_configs "$out/${n}_${kernel}_${shape}.json" "$kernel" "$shape" $configs < /dev/null 2>&1 \
    | grep -E "per call in kernels|Error" | cut -c1-200 | sed "s/^/$kernel $shape $dtype: /"
done <<'CASES'
softmax 3x50257 bfloat16 {} {"block_cols":1024,"approx_math":0}
softmax 1x1001 float32 {}
batch_softmax 2x3x1001 bfloat16 {}
cross_entropy 5x50257 bfloat16 {}
cross_entropy 2x151936 bfloat16 {} {"piece_cols":4096,"slots":4}
cross_entropy 7x131072 float32 {}
rms_norm 3x5120 bfloat16 {} {"stream_cols":1,"block_cols":1024}
layer_norm 1x3136 bfloat16 {} {"stream_cols":1,"block_cols":1024}
layer_norm 9x16384 float32 {"stream_cols":1,"block_cols":2048}
CASES
