#!/usr/bin/env bash
# Clustered rows (kernels/rows/mosaic.py) with the blocks' statistics exchanged through global
# memory and through the peers' shared memory, side by side in one run (CUPTI kernel time).
# The FARM_CLUSTER_EXCHANGE switch it sets exists at commit 92acaa5 only (check it out to rerun the
# comparison); later commits keep the shared-memory exchange, and both runs of a case take it.
# On the H200:  bash bench/probes/cluster_exchange.sh $OUT/exchange < bench/probes/cluster_exchange.txt
set -euo pipefail
out=${1:?usage: cluster_exchange.sh OUT_DIR < CASES}
mkdir -p "$out"
source bench/probes/lib.sh
n=0
while read -r kernel shape configs; do
  [[ -z "$kernel" || "$kernel" == \#* ]] && continue
  n=$((n + 1))
  for exchange in gmem smem; do
    echo "== $kernel $shape exchange=$exchange"
    # shellcheck disable=SC2086  # one config per word
    FARM_CLUSTER_EXCHANGE=$exchange PROFILE_TARGET=gpu-mosaic \
      profile_configs "$out/${n}_${kernel}_${shape}_${exchange}.json" "$kernel" "$shape" $configs < /dev/null 2>&1 \
      | grep -E "per call in kernels|Error|error" | cut -c1-160
  done
done
