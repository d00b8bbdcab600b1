# Matmul + layer norm on gpu-mosaic, the default's tiles and bf16 product: XLA's phase 2 against the
# Triton phase 2 (now any n, in power-of-two chunks of the row: phase2_chunk) at ROWS rows a program,
# side by side with XLA in one process a shape. CUPTI kernel time per call, relative error printed.
# Usage: bash THIS [SHAPE:ROWS[,ROWS...] ...]
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cases=${*:-4096x4096x4096:2 4096x5120x5120:1,2 4096x3072x3072:2 4096x6144x4096:1,2 4096x14336x4096:1 2048x7168x4096:1,2 4096x8192x4096:1}
for case in $cases; do
  S=${case%%:*}; R=${case##*:}
  args=(--config '{"ln_store":"input","ln_phase2":"xla","ln_rows":8}')
  for r in ${R//,/ }; do args+=(--config "{\"ln_store\":\"input\",\"ln_phase2\":\"triton\",\"ln_rows\":$r}"); done
  echo "== $S"
  timeout 200 python3 bench/kernel_profile.py --target gpu-mosaic --kernel matmul_layernorm --shape $S \
    "${args[@]}" --settle-s 1 --out $OUT/any_width_$S.json 2>&1 | grep -E "per call in kernels|rror|^ +[0-9.]+ us .*(tile_stats|fusion)" \
    | sed -E "s/\"(block_k|block_m|block_n|cluster|delay_release|grid_minor|grid_tile_width|max_concurrent_steps|mgpu_pipeline|store|ln_strategy|wg_split|ln_store)\":[^,}]*,?//g" | cut -c1-140
done
