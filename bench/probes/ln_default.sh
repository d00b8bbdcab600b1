# Matmul + layer norm 4096^3 on gpu-mosaic: the tuned tiles of the twenty-first session's winner
# with a Triton phase 2 at 2 rows a program and the product in float32 (a default tried and not
# kept), beside the last tuned table's winner, XLA and torch.compile (CUPTI kernel time per call);
# then the tuned table again (bench/probes/ln_table.sh). Usage: bash THIS [table]
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
TRIED='{"mgpu_pipeline":"warp_specialized","block_m":64,"block_n":256,"block_k":64,"wg_split":"m","cluster":"n","max_concurrent_steps":3,"grid_minor":"n","grid_tile_width":8,"delay_release":0,"ln_strategy":"tile_stats","ln_phase2":"triton","ln_rows":2,"ln_store":"float32"}'
WIN='{"block_k":64,"block_m":128,"block_n":128,"cluster":"m","delay_release":0,"grid_minor":"n","grid_tile_width":8,"ln_phase2":"triton","ln_rows":4,"ln_store":"input","ln_strategy":"tile_stats","max_concurrent_steps":3,"mgpu_pipeline":"warp_specialized","store":"tma","wg_split":"n"}'
timeout 240 python3 bench/kernel_profile.py --target gpu-mosaic --kernel matmul_layernorm --shape 4096x4096x4096 \
  --column xla --column torch_compile --config "$TRIED" --config "$WIN" --settle-s 1 --out $OUT/ln_default.json 2>&1 \
  | grep -E "per call in kernels|rror"
[ "$1" = table ] && bash bench/probes/ln_table.sh
