#!/usr/bin/env bash
# Mosaic GPU staged rows (kernels/rows/mosaic.py): device time of configs beside torch.compile
# and beside a copy of as many bytes (kernel_profile --copy: the copy ceiling at that size).
# Cases on stdin, a line each: KERNEL SHAPE CONFIG_JSON [CONFIG_JSON ...] (JSON without spaces).
# On the H200:  bash bench/probes/staged_rows.sh $OUT/staged < bench/probes/staged_rows.txt
# (PROFILE_TARGET=gpu-triton for cases of Triton configs, as bench/probes/triton_rows.txt;
# PROFILE_ARGS= for the configs and XLA only, without torch.compile and the copy)
# (about 6 minutes for the shipped cases; JSON per case: N_KERNEL_SHAPE.json)
set -euo pipefail
out=${1:?usage: staged_rows.sh OUT_DIR < CASES}
mkdir -p "$out"
source bench/probes/lib.sh
n=0
while read -r kernel shape configs; do
  [[ -z "$kernel" || "$kernel" == \#* ]] && continue
  n=$((n + 1))
  # shellcheck disable=SC2086  # one config per word
  PROFILE_TARGET=${PROFILE_TARGET:-gpu-mosaic} PROFILE_ARGS=${PROFILE_ARGS-"--column torch_compile --copy"} \
    profile_configs "$out/${n}_${kernel}_${shape}.json" "$kernel" "$shape" $configs < /dev/null 2>&1 \
    | grep -E "per call in kernels" | cut -c1-160
done
