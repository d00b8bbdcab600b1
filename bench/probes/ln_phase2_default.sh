# Matmul + layer norm on gpu-mosaic at three widths, the default tiles and float32 product: a Triton
# phase 2 of 8192 / n rows a program (a default tried and not kept) against the default's XLA phase
# 2; then the Triton phase 2's rows a program behind the tuned warp-specialized tiles (bf16
# product). CUPTI kernel time per call, the per-kernel split printed from the JSON.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
WS='"mgpu_pipeline":"warp_specialized","delay_release":0,"grid_minor":"n","grid_tile_width":8,"block_k":64,"block_m":64,"block_n":256,"cluster":"n","max_concurrent_steps":3,"wg_split":"m","ln_strategy":"tile_stats","ln_store":"input","ln_phase2":"triton"'
for spec in 4096x4096x4096:2 4096x2048x2048:4 4096x8192x4096:1; do
  S=${spec%%:*}
  args=(--config "{\"ln_phase2\":\"triton\",\"ln_rows\":${spec##*:}}" --config '{"ln_phase2":"xla","ln_rows":8}')
  for r in 1 2 4 8; do args+=(--config "{$WS,\"ln_rows\":$r}"); done
  timeout 200 python3 bench/kernel_profile.py --target gpu-mosaic --kernel matmul_layernorm --shape $S --column xla \
    "${args[@]}" --settle-s 1 --out $OUT/p2_$S.json > /dev/null 2>&1
  python3 - "$OUT/p2_$S.json" $S <<'PY'
import json, sys
for row in json.load(open(sys.argv[1]))["rows"]:
    c = row["config"]
    c = c if isinstance(c, str) else json.dumps(c)
    knobs = " ".join(f"{k}={v}" for k, v in json.loads(c).items() if k in ("ln_phase2", "ln_rows", "ln_store", "mgpu_pipeline")) if c.startswith("{") else c
    kernels = ", ".join(f"{k['kernel'][:24]} {k['us_per_call']:.1f}" for k in row.get("kernels", []))
    print(f"{sys.argv[2]} {row['sum_us_per_call']:7.1f}  {knobs:70s}  {kernels}")
PY
done
