# Matmul + layer norm 4096^3 (tile_stats, the winner's tiles): phase 2's rows a program (ln_rows)
# and what runs it (Triton or XLA), CUPTI kernel time per call; the per-kernel split is in the JSON.
# Usage: bash THIS [SHAPE]
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
S=${1:-4096x4096x4096}
WS='"mgpu_pipeline":"warp_specialized","delay_release":0,"grid_minor":"n","grid_tile_width":8,"block_k":64,"block_m":64,"block_n":256,"cluster":"n","max_concurrent_steps":3,"wg_split":"m","ln_strategy":"tile_stats","ln_store":"input"'
args=()
for r in 1 2 4 8 16; do args+=(--config "{$WS,\"ln_phase2\":\"triton\",\"ln_rows\":$r}"); done
args+=(--config "{$WS,\"ln_phase2\":\"xla\",\"ln_rows\":8}")
timeout 300 python3 bench/kernel_profile.py --target gpu-mosaic --kernel matmul_layernorm --shape $S --column xla \
  "${args[@]}" --settle-s 1 --out $OUT/ln_phase2_$S.json 2>&1 | grep -E "per call in kernels|rror"
python3 - "$OUT/ln_phase2_$S.json" <<'PY'
import json, sys
for row in json.load(open(sys.argv[1]))["rows"]:
    kernels = ", ".join(f"{k['kernel'][:28]} {k['us_per_call']:.1f}" for k in row.get("kernels", []))
    print(f"{row['sum_us_per_call']:7.1f}  {str(row['config'])[-40:]:40s}  {kernels}")
PY
