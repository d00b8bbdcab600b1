# gpu-mosaic attention at head dim 64: the warp-specialized default against the pipelined kernel
# (64-row Q blocks, 64- or 128-row K/V blocks, 2 steps), plain and causal; CUPTI kernel time beside
# cuDNN (JAX's) and torch SDPA, each config validated. Usage: bash THIS [KERNEL:SHAPE ...] (OUT set)
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cases=${@:-flash_attention_causal:4x16x2048x64 flash_attention:4x32x4096x64 flash_attention_causal:4x32x4096x64
  flash_attention:1x32x8192x64 flash_attention:32x12x197x64}
for case in $cases; do
  k=${case%%:*} s=${case#*:}
  timeout 120 python3 bench/kernel_profile.py --kernel $k --shape $s --target gpu-mosaic --config '{}' \
    --config '{"mgpu_pipeline": "pipelined", "ws_schedule": "pingpong", "block_q": 64, "block_kv": 64, "max_concurrent_steps": 2}' \
    --config '{"mgpu_pipeline": "pipelined", "ws_schedule": "pingpong", "block_q": 64, "block_kv": 128, "max_concurrent_steps": 2}' \
    --column cudnn --column torch_sdpa --settle-s 1 --out $OUT/${k}_$s.json 2>&1 \
    | grep "us per call" | grep -v "xla (jax"
done
