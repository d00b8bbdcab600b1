# The Mosaic GPU norms' default at a few rows (a row over the blocks of a cluster,
# kernels/rows/mosaic.py _few_rows_cluster) against a block per row, CUPTI kernel time per call.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for k in layer_norm rms_norm; do for s in 4x16384 2x32768 16x5120 4x2048 16x16384; do
  timeout 100 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $k --shape $s --config '{}' \
    --config '{"cluster":1,"block_cols":4096,"stream_cols":0}' --settle-s 1 --out $OUT/${k}_$s.json 2>&1 \
    | grep -E "per call in kernels" | sed "s/^/$k $s /"
done; done
