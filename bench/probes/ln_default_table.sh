# Matmul + layer norm on gpu-mosaic: the untuned default config (no --tune: seed_table falls back to
# the kernel's default) tabled against every column, 30 samples a column, at users' shapes.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
shapes=""
for s in ${*:-4096x4096x4096 4096x2048x2048 2048x4096x4096 8192x4096x4096 4096x8192x4096 4096x5120x5120}; do
  shapes="$shapes --shape matmul_layernorm:$s"
done
timeout 560 python3 bench/seed_table.py --target gpu-mosaic --check all --repetitions 30 $shapes --out $OUT/table 2>&1 \
  | grep -vE "Warning|warn|^\s*$|_fork_exec|self.pid" | tail -40
