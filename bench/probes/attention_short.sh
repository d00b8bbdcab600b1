# gpu-mosaic attention at short sequences and head dim 64: the default against the pipelined kernel
# (one warpgroup a block, more blocks a SM) and smaller K/V blocks; CUPTI kernel time beside cuDNN
# (JAX's) and torch SDPA, each config validated. Usage: bash THIS [KERNEL:SHAPE ...] (OUT set)
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cases=${@:-flash_attention:8x12x577x64 flash_attention:16x32x512x128 flash_attention_causal:16x32x512x128
  flash_attention:4x16x2048x64}
for case in $cases; do
  k=${case%%:*} s=${case#*:}
  timeout 140 python3 bench/kernel_profile.py --kernel $k --shape $s --target gpu-mosaic --config '{}' \
    --config '{"block_kv": 64}' \
    --config '{"mgpu_pipeline": "pipelined", "ws_schedule": "pingpong", "block_q": 64, "block_kv": 64, "max_concurrent_steps": 2}' \
    --config '{"mgpu_pipeline": "pipelined", "ws_schedule": "pingpong", "block_q": 64, "block_kv": 128, "max_concurrent_steps": 2}' \
    --config '{"mgpu_pipeline": "pipelined", "ws_schedule": "pingpong", "block_q": 64, "block_kv": 64, "max_concurrent_steps": 3}' \
    --config '{"mgpu_pipeline": "pipelined", "ws_schedule": "pingpong", "block_q": 128, "block_kv": 64, "max_concurrent_steps": 2}' \
    --column cudnn --column torch_sdpa --settle-s 1 --out $OUT/${k}_$s.json 2>&1 \
    | grep "us per call" | grep -v "xla (jax"
done
