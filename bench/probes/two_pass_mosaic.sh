# The two-pass softmax on Mosaic GPU (one online walk over the staged row, then the map) against
# softmax's staged rows (the max, exp stored and summed, then a scale: three walks), CUPTI kernel
# time per call; the GPU-only numerics tests of the staged rows first. Usage: bash THIS [table]
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_staged_rows.py -k "clustered_rows_match or two_pass" 2>&1 | tail -3
prof() {  # kernel shape out configs...
  local k=$1 s=$2 o=$3; shift 3
  timeout 150 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $k --shape $s "$@" --settle-s 1 \
    --out $OUT/$o.json 2>&1 | grep -E "per call in kernels|rror" | sed "s/^/$k $s: /"
}
prof softmax_two_pass 8192x8192 tp8k --config '{}' --config '{"block_cols":8192}' --config '{"block_cols":2048}' \
  --config '{"block_cols":8192,"approx_math":0}' --config 'gpu-triton:{"block_cols":4096,"num_warps":4,"num_stages":1}' \
  --column pallas_ops_triton --copy
prof softmax 8192x8192 sm8k --config '{"block_cols":8192}' --config '{}'
for spec in "8192x128256 {\"cluster\":4,\"block_cols\":4096}" "8192x151936 {\"cluster\":6,\"block_cols\":2048}" \
            "8192x50304 {}" "8192x32000 {}"; do
  set -- $spec
  prof softmax_two_pass $1 tp_$1 --config "$2" --copy
  prof softmax $1 sm_$1 --config "$2"
done
if [ "$1" = table ]; then
  timeout 330 python3 bench/seed_table.py --tune 60 --trials 32 --shape softmax_two_pass:8192x8192 --target gpu-mosaic \
    --check all --budget-s 200 --out $OUT/table 2>&1 | tail -25
fi
