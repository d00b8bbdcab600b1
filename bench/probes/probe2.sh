# Flat 16-byte-aligned windows for odd row widths (issue 17): the same configs at 8192x50257
# (flat windows) and 8192x50256 (aligned rows, the old path) side by side per width.
S="python3 bench/configs_side_by_side.py --dtype bfloat16 --target gpu-triton"
f() { echo "{\"strategy\": \"fori_loop\", \"block_cols\": $1, \"num_warps\": $2, \"num_stages\": $3, \"block_rows\": 1}"; }
for C in 50257 50256; do
$S --kernel softmax --shape 8192x$C --out $OUT/softmax_flat_$C.json --config "$(f 1024 2 1)" --config "$(f 4096 8 2)" \
  --config "$(f 2048 4 1)" --config "$(f 4096 4 1)" --config "$(f 8192 16 1)" --config "$(f 2048 8 2)" 2>&1 | grep -v Warning
$S --kernel cross_entropy --shape 8192x$C --out $OUT/ce_flat_$C.json --config "$(f 2048 2 4)" --config "$(f 2048 4 3)" \
  --config "$(f 4096 8 2)" --config "$(f 1024 1 3)" --config "$(f 4096 4 2)" 2>&1 | grep -v Warning
done
