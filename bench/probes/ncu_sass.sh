#!/bin/bash
# Issue 17 on the H200: the SASS of the farm's Triton rms norm against torch.compile's, with
# ncu's per-instruction counters (SourceCounters). Writes $OUT/sass/*.csv.
set -u
D=$OUT/sass; mkdir -p $D
L='"strategy": "fori_loop", "block_rows": 1, "rows_per_program": 1, "num_stages": 1'
ncu --clock-control none --section SourceCounters --kernel-name regex:"rms_norm|triton_" -f -o $D/rms16k \
  python3 bench/probes/ncu_rows.py --kernel rms_norm --shape 16384x16384 \
  --config "{$L, \"block_cols\": 2048, \"num_warps\": 16, \"fold\": \"lanes\"}" > $D/ncu.out 2>&1
ncu -i $D/rms16k.ncu-rep --page source --print-source sass --csv > $D/sass.csv 2>&1
ncu -i $D/rms16k.ncu-rep --page details --csv > $D/details.csv 2>&1
tar czf $D/../sass.tgz -C $D . && rm -rf $D
ls -la $OUT
