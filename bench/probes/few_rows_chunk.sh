# The Mosaic GPU norms' few-row default (a row over a cluster's blocks in 1024-column chunks) against
# 2048-column chunks and exact math, the tuned winner's at 4 x 16384. CUPTI kernel time per call.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for spec in "layer_norm 4x16384" "layer_norm 2x32768" "rms_norm 2x32768" "layer_norm 16x16384"; do
  set -- $spec
  timeout 60 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $1 --shape $2 --config '{}' \
    --config '{"block_cols":2048}' --config '{"block_cols":2048,"approx_math":0}' --config '{"approx_math":0}' \
    --settle-s 1 --out $OUT/$1_$2.json 2>&1 | grep -E "per call in kernels|rror" | sed "s/^/$1 $2: /"
done
