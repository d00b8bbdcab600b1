# RMS norm backward at rows wider than registers hold (REGISTER_ROW, 8192 columns): the gpu-triton
# default (fori_loop, one row a program: a float32 partial dweight row per row, rows x cols x 4
# bytes written and summed again by XLA) against one_pass with the padded row in 16 warps' registers
# and 8 to 64 rows a program, and fori_loop with 8 rows a program; the gpu-mosaic default beside;
# CUPTI kernel time per call (every kernel of the call, XLA's partial sum included), the copy of
# the same bytes, torch.compile; and fori_loop over 32 or 64 rows a program with each chunk's
# partial held in registers (unroll=1, 2048- or 4096-column chunks).
# Usage: bash THIS [SHAPE ...] (OUT set); results in $OUT/rms_norm_bwd_wide/.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
shapes=${@:-8192x16384 16384x16384 4096x12288}
ONE='"strategy":"one_pass","block_cols":128,"block_rows":1,"num_warps":16,"num_stages":1'
HELD='"strategy":"fori_loop","block_rows":1,"num_warps":8,"num_stages":2,"unroll":1'
mkdir -p $OUT/rms_norm_bwd_wide
for s in $shapes; do
  echo "== rms_norm_bwd $s"
  timeout 150 python3 bench/kernel_profile.py --kernel rms_norm_bwd --shape $s --target gpu-triton \
    --config '{}' --config "{$ONE,\"rows_per_program\":8}" --config "{$ONE,\"rows_per_program\":32}" \
    --config "{$ONE,\"rows_per_program\":64}" --config "{$ONE,\"rows_per_program\":32,\"prefetch\":1}" \
    --config '{"strategy":"fori_loop","block_rows":8,"rows_per_program":8,"block_cols":1024,"num_warps":16,"num_stages":2}' \
    --config "{$HELD,\"block_cols\":2048,\"rows_per_program\":32}" --config "{$HELD,\"block_cols\":2048,\"rows_per_program\":64}" \
    --config "{$HELD,\"block_cols\":4096,\"rows_per_program\":32,\"num_warps\":16}" \
    --config 'gpu-mosaic:{}' --column torch_compile --copy --settle-s 1 \
    --out $OUT/rms_norm_bwd_wide/$s.json > $OUT/rms_norm_bwd_wide/$s.log 2>&1
  grep -E "per call in kernels|rror|copy" $OUT/rms_norm_bwd_wide/$s.log | grep -v "xla (jax"
done
