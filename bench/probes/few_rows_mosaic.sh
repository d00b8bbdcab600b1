# The seed table at a few long rows on gpu-mosaic (the Triton rows were tuned in the twenty-eighth
# session): every trial on the device clock; the table's CUPTI section compares device time.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 560 python3 bench/seed_table.py --tune 60 --trials 24 --target gpu-mosaic --shape softmax:3x50257 \
  --shape rms_norm:2x32768 --shape layer_norm:4x16384 --shape cross_entropy:8x128256 --shape softmax:16x128256 \
  --check all --no-compile --budget-s 420 --out $OUT/table 2>&1 | grep -vE "WARNING|INFO|fork|_fork_exec|warn" | tail -40
