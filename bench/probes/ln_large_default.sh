# Matmul + layer norm on gpu-mosaic: the default ('{}': LARGE_TILES for products of 1024 rows and
# columns or more, XLA's phase 2, the product in float32) against the former default (the plain
# matmul's singly pipelined 128 x 128 tiles, given explicitly) and XLA, in one process per shape;
# CUPTI kernel time per call, the per-kernel split printed from the JSON.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
OLD='{"mgpu_pipeline":"pipelined","block_m":128,"block_n":128,"block_k":64,"wg_split":"n","cluster":"none","max_concurrent_steps":4,"grid_minor":"n","grid_tile_width":1,"delay_release":0}'
for S in 4096x4096x4096 4096x2048x2048 4096x8192x4096 4096x5120x5120; do
  timeout 200 python3 bench/kernel_profile.py --target gpu-mosaic --kernel matmul_layernorm --shape $S --column xla \
    --config '{}' --config "$OLD" --settle-s 1 --out $OUT/default_$S.json > /dev/null 2>&1
  python3 - "$OUT/default_$S.json" $S <<'PY'
import json, sys
for row in json.load(open(sys.argv[1]))["rows"]:
    c = row["config"]
    c = c if isinstance(c, str) else json.dumps(c)
    knobs = " ".join(f"{k}={v}" for k, v in json.loads(c).items() if k in ("mgpu_pipeline", "block_m", "block_n", "ln_phase2", "ln_store")) if c.startswith("{") else c
    kernels = ", ".join(f"{k['kernel'][:24]} {k['us_per_call']:.1f}" for k in row.get("kernels", []))
    print(f"{sys.argv[2]} {row['sum_us_per_call']:7.1f}  {knobs:72s}  {kernels}")
PY
done
