# Matmul + layer norm on gpu-mosaic, the default's tiles with the four pairs of product dtype (f32 or
# bf16: ln_store input) and phase 2 (XLA's, or the Triton phase 2 at ln_rows ROWS); run at c693b68,
# when the default was the first pair (f32, XLA's phase 2), which it wrote as '{}';
# side by side with XLA in one process a shape. CUPTI kernel time per call, relative error printed.
# Usage: bash THIS [SHAPE:ROWS ...]   (ROWS 0: the XLA pairs only; before ecd014f the Triton phase 2
# took only power-of-two n)
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cases=${*:-4096x4096x4096:2 4096x2048x2048:2 4096x8192x4096:1 8192x4096x4096:2 2048x4096x4096:2 512x4096x4096:2 4096x5120x5120:0}
for case in $cases; do
  S=${case%%:*}; R=${case##*:}
  # each pair spelled out, so that the probe measures the same four whatever the default is
  args=(--config '{"ln_store":"float32","ln_phase2":"xla","ln_rows":8}' --config '{"ln_store":"input","ln_phase2":"xla","ln_rows":8}')
  if [ "$R" != 0 ]; then
    args+=(--config "{\"ln_store\":\"float32\",\"ln_phase2\":\"triton\",\"ln_rows\":$R}" --config "{\"ln_store\":\"input\",\"ln_phase2\":\"triton\",\"ln_rows\":$R}")
  fi
  echo "== $S"
  timeout 200 python3 bench/kernel_profile.py --target gpu-mosaic --kernel matmul_layernorm --shape $S \
    "${args[@]}" --settle-s 1 --out $OUT/default_$S.json 2>&1 | grep -E "per call in kernels|rror" | sed -E "s/\"(block_k|cluster|delay_release|grid_minor|grid_tile_width|max_concurrent_steps|store|ln_strategy)\":[^,}]*,?//g"
done
