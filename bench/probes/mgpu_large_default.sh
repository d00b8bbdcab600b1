# The matmul family's Mosaic GPU default ('{}': LARGE_TILES, the warp-specialized tiles of the tuned
# winners, at products of 1024 rows and columns or more) against the former default (the singly
# pipelined 128 x 128 tiles, given explicitly) and XLA; CUPTI kernel time per call, one process per
# row. Then bench/probes/ln_large_default.sh (matmul + layer norm).
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
OLD='{"mgpu_pipeline":"pipelined","block_m":128,"block_n":128,"block_k":64,"wg_split":"n","cluster":"none","max_concurrent_steps":4,"grid_minor":"n","grid_tile_width":1,"delay_release":0}'
for spec in matmul:4096x4096x4096 matmul:8192x8192x8192 matmul:4096x14336x4096 matmul:2048x2048x2048 \
            bmm:64x2048x2048x2048 broadcast_matmul:64x2048x2048x2048 matmul_subtiled_epilogue:4096x4096x4096; do
  k=${spec%%:*} S=${spec##*:}
  timeout 150 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $k --shape $S --column xla \
    --config '{}' --config "$OLD" --settle-s 1 --out $OUT/mm_${k}_$S.json 2>&1 | grep -E "per call in kernels|rror" \
    | sed -E "s/\{\"block_k\".*(\"mgpu_pipeline\":\"[a-z_]+\").*/\1/; s/^/$k $S: /"
done
bash bench/probes/ln_large_default.sh
(cd $OUT && tar czf raw.tgz *.json && rm -f *.json)  # one file back: the device returns few
