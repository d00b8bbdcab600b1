# Mosaic GPU staged rows: the chunk (block_cols) at row widths just above a power of two, where a
# wider chunk pads the staged row (2560 -> 4096 columns). CUPTI kernel time per call.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for spec in "softmax 65536x2560" "softmax 8192x5120" "softmax 32768x3072" "rms_norm 4096x5120" "layer_norm 4096x5120" \
            "cross_entropy 65536x2560" "softmax 4096x12288"; do
  set -- $spec
  timeout 100 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $1 --shape $2 --config '{}' \
    --config '{"block_cols":1024}' --config '{"block_cols":2048}' --config '{"block_cols":4096}' --settle-s 1 \
    --out $OUT/$1_$2.json 2>&1 | grep -E "per call in kernels: \{|rror" | sed "s/^/$1 $2: /"
done
