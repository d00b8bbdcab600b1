# RMS norm backward at hidden sizes no chunk of 512 divides (768, 896, 1280, 2304 columns): the
# gpu-mosaic kernel's small chunks (256 or 128 columns, fewer elements a thread: never timed before)
# against the gpu-triton default, which a deployment runs there (rms_norm_bwd.default_gpu_targets);
# CUPTI kernel time per call, the copy of the same bytes, torch.compile.
# Usage: bash THIS [SHAPE ...] (OUT set); results in $OUT/rms_norm_bwd_narrow/.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
shapes=${@:-8192x768 8192x896 8192x1280 8192x2304}
mkdir -p $OUT/rms_norm_bwd_narrow
for s in $shapes; do
  echo "== rms_norm_bwd $s"
  timeout 120 python3 bench/kernel_profile.py --kernel rms_norm_bwd --shape $s --target gpu-triton \
    --config '{}' --config 'gpu-mosaic:{}' --config 'gpu-mosaic:{"dweight_in":"registers"}' \
    --config 'gpu-mosaic:{"slots":4}' --column torch_compile --copy --settle-s 1 \
    --out $OUT/rms_norm_bwd_narrow/$s.json > $OUT/rms_norm_bwd_narrow/$s.log 2>&1
  grep -E "per call in kernels|rror|copy" $OUT/rms_norm_bwd_narrow/$s.log | grep -v "xla (jax"
done
