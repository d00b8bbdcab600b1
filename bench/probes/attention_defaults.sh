# Flash attention's defaults on both GPU targets against the blocks the tuned winners took
# (BENCHMARKS.md: Triton 128-row Q blocks in 3 stages; Mosaic GPU 128-row K/V blocks), at the seed
# shape and a head dim 80 model's; CUPTI kernel time per call beside cuDNN (JAX) and torch SDPA.
# Usage: bash THIS [KERNEL:SHAPE ...]
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
specs=${*:-flash_attention:4x32x4096x128 flash_attention:1x32x2048x80 flash_attention_causal:4x32x4096x128 flash_attention_causal:1x32x2048x80}
for spec in $specs; do
  k=${spec%%:*} S=${spec##*:}
  echo "== $k $S"
  timeout 140 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $k --shape $S --config '{}' \
    --config '{"block_kv":128}' --config '{"block_kv":128,"ws_schedule":"intra_overlap"}' \
    --config 'gpu-triton:{}' --config 'gpu-triton:{"block_q":128,"block_kv":64,"num_stages":3}' \
    --config 'gpu-triton:{"block_q":128,"block_kv":32,"num_stages":3}' \
    --config 'gpu-triton:{"block_q":128,"block_kv":64,"num_warps":8,"num_stages":3}' \
    --config 'gpu-triton:{"block_q":64,"block_kv":64,"num_stages":3}' \
    --column cudnn --column torch_sdpa --settle-s 1 --out $OUT/${k}_$S.json 2>&1 | grep -E "per call in kernels|rror"
done
