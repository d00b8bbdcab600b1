# Products whose n is an odd number of LARGE_TILES' 256-column tiles (11008: LLaMA-7B's MLP, 6400):
# the 2-block clusters along n do not apply there. The Mosaic GPU default ('{}') against LARGE_TILES
# clustered along m instead, and unclustered, beside XLA; CUPTI kernel time per call, one process a row.
# Usage: bash THIS [KERNEL:SHAPE ...]
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
LARGE='"mgpu_pipeline":"warp_specialized","block_m":64,"block_n":256,"block_k":64,"wg_split":"m","max_concurrent_steps":3,"grid_minor":"n","grid_tile_width":8,"delay_release":0'
specs=${*:-matmul:4096x11008x4096 matmul:2048x11008x4096 matmul_layernorm:4096x6400x4096 matmul:4096x6400x4096}
for spec in $specs; do
  k=${spec%%:*} S=${spec##*:}
  echo "== $k $S"
  timeout 150 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $k --shape $S \
    --config '{}' --config "{$LARGE,\"cluster\":\"m\"}" --config "{$LARGE,\"cluster\":\"none\"}" \
    --column torch --settle-s 1 --out $OUT/odd_${k}_$S.json 2>&1 | grep -E "per call in kernels|rror" \
    | sed -E "s/\{\"block_k\".*(\"cluster\":\"[a-z]+\").*(\"mgpu_pipeline\":\"[a-z_]+\").*/\1 \2/"
done
