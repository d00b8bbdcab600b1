# gpu-mosaic attention's committed defaults at head dims up to 64 (plain: the pipelined kernel; 32 in
# the 64-byte swizzle, 40 as 48 in the 32-byte one) against the warp-specialized kernel at the same
# swizzle; CUPTI kernel time beside cuDNN (JAX's) and torch SDPA, each config validated.
# Usage: bash THIS [KERNEL:SHAPE ...] (OUT set)
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cases=${@:-flash_attention:2x8x4096x40 flash_attention:8x12x577x64 flash_attention:4x16x2048x64
  flash_attention:16x16x1024x32 flash_attention_causal:16x16x1024x32}
for case in $cases; do
  k=${case%%:*} s=${case#*:}
  timeout 120 python3 bench/kernel_profile.py --kernel $k --shape $s --target gpu-mosaic --config '{}' \
    --config '{"mgpu_pipeline": "warp_specialized", "ws_schedule": "intra_overlap"}' \
    --column cudnn --column torch_sdpa --settle-s 1 --out $OUT/${k}_$s.json 2>&1 \
    | grep "us per call\|Error" | grep -v "xla (jax"
done
