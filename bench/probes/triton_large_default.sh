# The gpu-triton matmul family's default tiles (64 x 64 x 32, group_m 1, 4 warps, 3 stages) against
# larger tile candidates at large products, users' odd shapes included; CUPTI kernel time per call
# beside XLA (cuBLAS) and torch, one process a shape. Usage: bash THIS [KERNEL:SHAPE ...]
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
specs=${*:-matmul:4096x4096x4096 matmul:4096x11008x4096 matmul:3000x14336x1000 matmul:1024x4224x1024 matmul:2048x2048x2048 matmul_layernorm:4096x11008x4096 bmm:16x2048x2048x2048}
for spec in $specs; do
  k=${spec%%:*} S=${spec##*:}
  echo "== $k $S"
  timeout 120 python3 bench/kernel_profile.py --target gpu-triton --kernel $k --shape $S --config '{}' \
    --config '{"block_m":128,"block_n":128,"block_k":64,"group_m":8,"num_warps":4,"num_stages":3}' \
    --config '{"block_m":128,"block_n":128,"block_k":64,"group_m":8,"num_warps":8,"num_stages":4}' \
    --config '{"block_m":128,"block_n":256,"block_k":64,"group_m":8,"num_warps":8,"num_stages":3}' \
    --config '{"block_m":64,"block_n":128,"block_k":64,"group_m":8,"num_warps":4,"num_stages":4}' \
    --config '{"block_m":128,"block_n":64,"block_k":64,"group_m":8,"num_warps":4,"num_stages":4}' \
    --column torch --settle-s 1 --out $OUT/triton_${k}_$S.json 2>&1 | grep -E "per call in kernels|rror" \
    | sed -E 's/"ln_[a-z_]+":[^,]*,//g; s/"split_k":1//'
done
