# Layer norm 4x16384 (a few long rows) on Mosaic GPU: a row split over the blocks of a cluster
# against one block per row, and the Triton split_cols winner and XLA, CUPTI kernel time per call.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
B='"block_rows":1,"strategy":"smem_row","approx_math":1'
timeout 300 python3 bench/kernel_profile.py --target gpu-mosaic --kernel layer_norm --shape 4x16384 \
  --config "{$B,\"block_cols\":4096,\"stream_cols\":0,\"cluster\":1}" \
  --config "{$B,\"block_cols\":2048,\"stream_cols\":0,\"cluster\":2}" \
  --config "{$B,\"block_cols\":1024,\"stream_cols\":0,\"cluster\":4}" \
  --config "{$B,\"block_cols\":1024,\"stream_cols\":0,\"cluster\":8}" \
  --config "{$B,\"block_cols\":1024,\"stream_cols\":2,\"cluster\":8}" \
  --config "{$B,\"block_cols\":2048,\"stream_cols\":2,\"cluster\":4}" \
  --config 'gpu-triton:{"block_cols":512,"block_rows":1,"fold":"chunk","num_stages":1,"num_warps":1,"rows_per_program":1,"strategy":"split_cols","unroll":0}' \
  --settle-s 3 --out $OUT/ln_cluster.json 2>&1 | grep -v "^W0000\|^I0000" | tail -40
