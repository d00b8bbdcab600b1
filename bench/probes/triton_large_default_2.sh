# The gpu-triton matmul family's large default (TritonMatmulConfig.default: 128-row tiles, 256
# columns and 8 warps where 256 divides n, else 128 and 4) as '{}', against the earlier small
# default (64 x 64 x 32, group_m 1, 4 warps) and variants: matmul + layer norm's two_phase rows a
# program (its row kernel's warps now follow its elements, matmul_layernorm.row_warps), and
# products under LARGE rows; CUPTI kernel time per call beside XLA and torch. Usage: bash THIS
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
SMALL='{"block_m":64,"block_n":64,"block_k":32,"group_m":1,"num_warps":4,"num_stages":3}'
T128='"block_m":128,"block_n":128,"block_k":64,"num_warps":4,"num_stages":3'
T256='"block_m":128,"block_n":256,"block_k":64,"num_warps":8,"num_stages":3'
profile() {  # KERNEL SHAPE CONFIG...
  local k=$1 S=$2; shift 2; echo "== $k $S"
  local args=(); for c in "$@"; do args+=(--config "$c"); done
  timeout 100 python3 bench/kernel_profile.py --target gpu-triton --kernel $k --shape $S "${args[@]}" \
    --column torch --settle-s 1 --out $OUT/${k}_$S.json 2>&1 | grep -E "per call in kernels|rror" \
    | sed -E 's/"split_k":1//; s/"ln_store":"float32",//; s/"ln_strategy":"two_phase",//'
}
profile matmul_layernorm 4096x11008x4096 '{}' '{"ln_rows":1}' '{"ln_rows":2}' "$SMALL"
profile matmul_layernorm 3000x14336x1000 '{}' '{"ln_rows":1}' '{"ln_rows":2}'
profile matmul_layernorm 1024x4224x1024 '{}' '{"ln_rows":1}' '{"ln_rows":4}' "{$T128,\"num_warps\":8}" "$SMALL"
profile matmul_layernorm 4096x4096x4096 '{}' '{"ln_rows":1}' '{"ln_rows":4}' "$SMALL"
profile matmul 512x4096x4096 '{}' "{$T128,\"group_m\":4}" "{$T256,\"group_m\":4}"
profile matmul 1001x50257x4096 '{}' "{$T128,\"group_m\":8}" "{$T256,\"group_m\":8}"
profile matmul 3000x14336x1000 '{}' "$SMALL"
profile matmul 8192x8192x8192 '{}' "{$T128,\"group_m\":8}"
profile matmul_subtiled_epilogue 4096x4096x4096 '{}' "$SMALL"
profile broadcast_matmul 64x2048x2048x2048 '{}' "$SMALL"
