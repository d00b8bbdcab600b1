# The committed head-dim swizzle defaults on the device: validated at ragged sequences (head_dims.py),
# CUPTI kernel time against the 128-byte swizzle (padding copies included) and cuDNN (JAX's) and torch
# SDPA at head dims 96 and 40, the narrower swizzles at head dim 128 (where the default keeps 128), then
# a farm sweep of bench/tasks/head_dims_mosaic.jsonl (the search's swizzle knob). Usage: bash THIS
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 bench/probes/head_dims.py 2>&1 | tee $OUT/head_dims.txt
profile() {  # KERNEL SHAPE CONFIG...
  local k=$1 s=$2; shift 2
  timeout 150 python3 bench/kernel_profile.py --kernel $k --shape $s --target gpu-mosaic "$@" \
    --column cudnn --column torch_sdpa --settle-s 1 --out $OUT/${k}_$s.json 2>&1 | grep "us per call"
}
for k in flash_attention flash_attention_causal; do
  profile $k 4x32x4096x96 --config '{}' --config '{"swizzle": 128}'
done
profile flash_attention 2x8x4096x40 --config '{}' --config '{"swizzle": 128}'
profile flash_attention 4x32x4096x128 --config '{}' --config '{"swizzle": 64}' --config '{"swizzle": 32}'
TRIALS=12 SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-200} bash bench/probes/users_odd_defaults.sh bench/tasks/head_dims_mosaic.jsonl
