# The two-pass softmax's Mosaic GPU default chunk at wider rows (CUPTI), then its seed row tuned
# (gpu-mosaic) beside every column.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for s in 8192x50304 8192x32000; do
  timeout 120 python3 bench/kernel_profile.py --target gpu-mosaic --kernel softmax_two_pass --shape $s \
    --config '{}' --config '{"block_cols":4096}' --settle-s 1 --out $OUT/tp_$s.json 2>&1 \
    | grep -E "per call in kernels|rror" | sed "s/^/$s: /"
done
timeout 400 python3 bench/seed_table.py --tune 60 --trials 32 --shape softmax_two_pass:8192x8192 --target gpu-mosaic \
  --check all --budget-s 200 --out $OUT/table 2>&1 | tail -30
