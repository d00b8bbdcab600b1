# Issue 17, as run on the H200 (results: bench/results/h200/rows_probe/). The "resident" Triton
# strategy it measures (a row held in registers as unrolled chunks) ran 3-7x slower than the
# two-walk winners and was removed; its configs are now refused by name.
set -x
S="python3 bench/configs_side_by_side.py --dtype bfloat16 --target gpu-triton"
R='"block_rows": 1, "rows_per_program": 1, "num_stages": 1'
res() { echo "{\"strategy\": \"resident\", \"block_cols\": $1, \"num_warps\": $2, $R}"; }
fori() { echo "{\"strategy\": \"fori_loop\", \"block_cols\": $1, \"num_warps\": $2, $R}"; }
for C in 50257 50256; do
$S --kernel softmax --shape 8192x$C --out $OUT/softmax_$C.json --config "$(fori 1024 2)" \
  --config "$(res 2048 16)" --config "$(res 4096 16)" --config "$(res 2048 32)" --config "$(res 4096 32)" --config "$(res 8192 32)" --config "$(res 1024 32)" 2>&1 | grep -v Warning
done
$S --kernel softmax --shape 8192x32000 --out $OUT/softmax_32000.json --config "$(fori 4096 8)" \
  --config "$(res 2048 8)" --config "$(res 4096 16)" --config "$(res 2048 16)" --config "$(res 4096 32)" --config "$(res 8192 32)" 2>&1 | grep -v Warning
for C in 50257 32000; do
$S --kernel cross_entropy --shape 8192x$C --out $OUT/ce_$C.json --config '{"strategy": "fori_loop", "block_cols": 2048, "num_warps": 2, "num_stages": 4, "block_rows": 1}' \
  --config '{"strategy": "resident", "block_cols": 2048, "num_warps": 8, "num_stages": 1, "block_rows": 1}' \
  --config '{"strategy": "resident", "block_cols": 4096, "num_warps": 16, "num_stages": 1, "block_rows": 1}' \
  --config '{"strategy": "resident", "block_cols": 4096, "num_warps": 32, "num_stages": 1, "block_rows": 1}' \
  --config '{"strategy": "resident", "block_cols": 2048, "num_warps": 4, "num_stages": 1, "block_rows": 1}' \
  --config '{"strategy": "resident", "block_cols": 1024, "num_warps": 4, "num_stages": 1, "block_rows": 1}' 2>&1 | grep -v Warning
done
