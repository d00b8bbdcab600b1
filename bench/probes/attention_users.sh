# gpu-mosaic attention's defaults at users' shapes (head dims 64 and 128, short and long sequences,
# small and large batches), CUPTI kernel time against cuDNN (JAX's) and torch SDPA; every config
# validated against the float32 reference. Usage: bash THIS [KERNEL:SHAPE ...] (OUT set)
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cases=${@:-flash_attention:8x12x577x64 flash_attention:4x16x2048x64 flash_attention_causal:4x16x2048x64
  flash_attention:1x32x8192x128 flash_attention_causal:1x32x8192x128 flash_attention:16x32x512x128
  flash_attention_causal:16x32x512x128 flash_attention:2x32x1024x128 flash_attention_causal:2x32x1024x128}
for case in $cases; do
  k=${case%%:*} s=${case#*:}
  timeout 120 python3 bench/kernel_profile.py --kernel $k --shape $s --target gpu-mosaic --config '{}' \
    ${EXTRA:+--config "$EXTRA"} --column cudnn --column torch_sdpa --settle-s 1 --out $OUT/${k}_$s.json 2>&1 \
    | grep "us per call" | grep -v "xla (jax"
done
