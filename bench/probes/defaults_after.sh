# The GPU defaults as committed ('{}'), each beside the fastest other columns in one process: flash
# attention on both GPU targets (cuDNN and torch SDPA), the gpu-triton matmul family (XLA and
# torch); CUPTI kernel time per call. Then a farm sweep of bench/tasks/users_odd_shapes_3.jsonl
# (2 trials a task) through the user's path. Usage: bash THIS
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for spec in flash_attention:4x32x4096x128 flash_attention_causal:4x32x4096x128 flash_attention:1x32x2048x80 \
            flash_attention_causal:1x32x2048x80 flash_attention_causal:2x32x4096x256; do
  k=${spec%%:*} S=${spec##*:}; echo "== $k $S"
  timeout 100 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $k --shape $S --config '{}' \
    --config 'gpu-triton:{}' --column cudnn --column torch_sdpa --settle-s 1 --out $OUT/${k}_$S.json 2>&1 \
    | grep -E "per call in kernels|rror" | grep -v "xla (jax"
done
for spec in matmul:512x4096x4096 matmul_layernorm:3000x14336x1000 matmul_layernorm:1024x4224x1024 matmul:4096x4096x4096; do
  k=${spec%%:*} S=${spec##*:}; echo "== $k $S"
  timeout 80 python3 bench/kernel_profile.py --target gpu-triton --kernel $k --shape $S --config '{}' \
    --column torch --settle-s 1 --out $OUT/${k}_$S.json 2>&1 | grep -E "per call in kernels|rror"
done
TRIALS=2 SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-200} bash bench/probes/users_odd_defaults.sh bench/tasks/users_odd_shapes_3.jsonl
