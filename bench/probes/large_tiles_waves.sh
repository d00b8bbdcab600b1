# Wave quantization of LARGE_TILES' 128 x 256 blocks at users' widths: 4096 x 6400 makes 800 tiles
# (6.06 waves of 132 SMs), 2048 x 11008 688 (5.2). Smaller blocks against the default ('{}'), beside
# XLA and torch; CUPTI kernel time per call, one process a row. Usage: bash THIS [KERNEL:SHAPE ...]
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
WS='"mgpu_pipeline":"warp_specialized","block_k":64,"wg_split":"m","grid_minor":"n","grid_tile_width":8,"delay_release":0'
specs=${*:-matmul:4096x6400x4096 matmul:2048x11008x4096}
for spec in $specs; do
  k=${spec%%:*} S=${spec##*:}
  echo "== $k $S"
  timeout 200 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $k --shape $S --config '{}' \
    --config "{$WS,\"block_m\":128,\"block_n\":128,\"cluster\":\"n\",\"max_concurrent_steps\":4}" \
    --config "{$WS,\"block_m\":64,\"block_n\":128,\"cluster\":\"n\",\"max_concurrent_steps\":4}" \
    --config "{$WS,\"block_m\":64,\"block_n\":128,\"cluster\":\"m\",\"max_concurrent_steps\":5}" \
    --config "{$WS,\"block_m\":128,\"block_n\":128,\"cluster\":\"m\",\"max_concurrent_steps\":4}" \
    --column torch --settle-s 1 --out $OUT/waves_${k}_$S.json 2>&1 | grep -E "per call in kernels|rror" \
    | sed -E "s/\{\"block_k\":64,(\"block_m\":[0-9]+),(\"block_n\":[0-9]+),(\"cluster\":\"[a-z]+\").*(\"max_concurrent_steps\":[0-9]).*/\1 \2 \3 \4/"
done
