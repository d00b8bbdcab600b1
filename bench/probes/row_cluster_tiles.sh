# Matmul 4096^3 on Mosaic GPU with the tiles a row-complete layer-norm epilogue needs (a block of
# 64 x 512: two warpgroups side by side along n, 256 columns each; 8 blocks cover a 4096-wide row)
# against the tiles the tile_stats winner runs, and cuBLAS; CUPTI kernel time per call.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
prof() {  # kernel shape out configs...
  local k=$1 s=$2 o=$3; shift 3
  timeout 200 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $k --shape $s "$@" --settle-s 1 \
    --out $OUT/$o.json 2>&1 | grep -E "per call in kernels|rror" | sed "s/^/$k $s: /"
}
WS='"mgpu_pipeline":"warp_specialized","delay_release":0,"grid_minor":"n","grid_tile_width":8'
prof matmul_layernorm 4096x4096x4096 ln --column xla \
  --config "{$WS,\"block_k\":64,\"block_m\":64,\"block_n\":256,\"cluster\":\"n\",\"ln_phase2\":\"triton\",\"ln_rows\":8,\"ln_store\":\"input\",\"ln_strategy\":\"tile_stats\",\"max_concurrent_steps\":3,\"wg_split\":\"m\"}"
# a 64 x 512 block stages 72 KB of operands a step: two steps fit shared memory, three do not
prof matmul 4096x4096x4096 mm --column xla \
  --config "{$WS,\"block_k\":64,\"block_m\":64,\"block_n\":256,\"cluster\":\"n\",\"max_concurrent_steps\":3,\"wg_split\":\"m\"}" \
  --config "{$WS,\"block_k\":64,\"block_m\":64,\"block_n\":256,\"cluster\":\"none\",\"max_concurrent_steps\":2,\"wg_split\":\"n\"}" \
  --config "{$WS,\"block_k\":64,\"block_m\":64,\"block_n\":256,\"cluster\":\"n\",\"max_concurrent_steps\":2,\"wg_split\":\"n\"}" \
  --config "{$WS,\"block_k\":64,\"block_m\":64,\"block_n\":256,\"cluster\":\"m\",\"max_concurrent_steps\":2,\"wg_split\":\"n\"}" \
  --config "{$WS,\"block_k\":64,\"block_m\":64,\"block_n\":256,\"cluster\":\"none\",\"max_concurrent_steps\":2,\"wg_split\":\"n\",\"grid_minor\":\"m\"}" \
  --config "{$WS,\"block_k\":64,\"block_m\":64,\"block_n\":256,\"cluster\":\"n\",\"max_concurrent_steps\":2,\"wg_split\":\"n\",\"delay_release\":1}"
