# Softmax rows of one chunk on Mosaic GPU: softmax's three walks (the max; exp stored and summed; a
# scale) against the two-pass softmax's online walk and map, same config. CUPTI kernel time per call.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for spec in "65536x2560 4096" "8192x8192 8192" "16384x4000 4096" "32768x1024 1024" "4096x16384 8192" "8192x5120 8192"; do
  set -- $spec
  for k in softmax softmax_two_pass; do
    timeout 100 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $k --shape $1 \
      --config "{\"block_cols\":$2}" --settle-s 1 --out $OUT/${k}_$1.json 2>&1 \
      | grep -E "per call in kernels: \{|rror" | sed "s/^/$k $1: /"
  done
done
