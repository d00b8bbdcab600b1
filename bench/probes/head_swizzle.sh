# Mosaic GPU attention's head dim in narrower swizzles: 80 as 80 (32-byte swizzle) or 96 (64-byte)
# against 128 (128-byte, the layout before), 96 as 96; CUPTI kernel time beside cuDNN (JAX's) and
# torch SDPA, every config validated against the float32 reference. Usage: bash THIS (OUT set).
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for k in flash_attention flash_attention_causal; do
  for shape in 1x32x2048x80 4x32x4096x80 1x32x2048x96; do
    timeout 150 python3 bench/kernel_profile.py --kernel $k --shape $shape --target gpu-mosaic \
      --config '{"swizzle": 128}' --config '{"swizzle": 64}' --config '{"swizzle": 32}' \
      --config '{"swizzle": 32, "block_kv": 64}' --config '{"swizzle": 32, "ws_schedule": "pingpong"}' \
      --config '{"swizzle": 32, "ws_schedule": "intra_overlap"}' \
      --column cudnn --column torch_sdpa --settle-s 1 --out $OUT/${k}_$shape.json 2>&1 | grep -v "^    "
  done
done
