# Matmul + layer norm 4096^3 on gpu-mosaic, tuned and tabled against every column (the fused-kernel
# goal of issue 18 is >= 1.1x XLA's unfused).
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 540 python3 bench/seed_table.py --tune 100 --trials 400 --target gpu-mosaic --check all --budget-s 200 \
  --finalist-sustain 0.3 --shape matmul_layernorm:4096x4096x4096 --out $OUT/table 2>&1 | tail -40
