# Attention at head dims off the kernels grid on the device: each default validated (head_dims.py),
# CUPTI kernel time of both GPU targets' defaults against cuDNN (JAX's) and torch SDPA at a head dim
# 80 model's shape (32 heads, 2048 tokens), then a farm sweep of bench/tasks/users_odd_shapes_3.jsonl
# (head dims 40, 80, 96; matmul + layer norm's Triton default at wide rows). Usage: bash THIS
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 bench/probes/head_dims.py 2>&1 | tee $OUT/head_dims.txt
for k in flash_attention flash_attention_causal; do
  timeout 120 python3 bench/kernel_profile.py --kernel $k --shape 1x32x2048x80 --target gpu-mosaic \
    --config '{}' --config 'gpu-triton:{}' --column cudnn --column torch_sdpa --settle-s 1 \
    --out $OUT/profile_$k.json 2>&1 | grep -v "^    "
done
TRIALS=2 SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-240} bash bench/probes/users_odd_defaults.sh bench/tasks/users_odd_shapes_3.jsonl
