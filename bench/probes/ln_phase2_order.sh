# Matmul + layer norm (tile_stats, the tuned tiles, a bf16 product): the Triton phase 2's programs
# taking the rows in order (forward) or the last rows first (reverse: those phase 1 wrote last,
# which may still be in L2), side by side with XLA; two rounds (two processes) a shape.
# CUPTI kernel time per call; each config's per-kernel split is printed and in the JSON.
# Usage: bash THIS [SHAPE:ROWS ...]
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
WS='"mgpu_pipeline":"warp_specialized","delay_release":0,"grid_minor":"n","grid_tile_width":8,"block_k":64,"block_m":64,"block_n":256,"cluster":"n","max_concurrent_steps":3,"wg_split":"m","ln_strategy":"tile_stats","ln_store":"input","ln_phase2":"triton"'
cases=${*:-4096x4096x4096:2 4096x8192x4096:1 4096x2048x2048:2 8192x4096x4096:2}
for round in 1 2; do
  for case in $cases; do
    S=${case%%:*}; R=${case##*:}
    echo "== $S rows $R round $round"
    timeout 240 python3 bench/kernel_profile.py --target gpu-mosaic --kernel matmul_layernorm --shape $S --column xla \
      --config "{$WS,\"ln_rows\":$R,\"ln_order\":\"forward\"}" --config "{$WS,\"ln_rows\":$R,\"ln_order\":\"reverse\"}" \
      --settle-s 1 --out $OUT/order_${S}_r$round.json 2>&1 | grep -vE "^\s*$|Warning|warn" | cut -c1-150
  done
done
