# gpu-mosaic attention, the warp-specialized kernel one block a tile (the default) against one
# block a SM looping over the tiles (ws_grid persistent, the K/V ring running on from one tile into
# the next; persistent_q_ahead, O staged apart and the next Q loaded ahead), in both schedules;
# CUPTI kernel time beside cuDNN (JAX's) and torch SDPA, each config validated. Usage: bash THIS [KERNEL:SHAPE ...] (OUT set)
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cases=${@:-flash_attention:16x32x512x128 flash_attention_causal:16x32x512x128 flash_attention:2x32x1024x128
  flash_attention_causal:2x32x1024x128 flash_attention:32x12x197x64 flash_attention_causal:32x12x197x64
  flash_attention:4x32x4096x128 flash_attention_causal:4x32x4096x128}
mkdir -p $OUT
ws='"mgpu_pipeline": "warp_specialized", "block_q": 64, "block_kv": 128'
for case in $cases; do
  k=${case%%:*} s=${case#*:}
  timeout 150 python3 bench/kernel_profile.py --kernel $k --shape $s --target gpu-mosaic --config '{}' \
    --config "{$ws, \"ws_schedule\": \"intra_overlap\", \"ws_grid\": \"persistent\"}" \
    --config "{$ws, \"ws_schedule\": \"pingpong\", \"ws_grid\": \"persistent\"}" \
    --config "{$ws, \"ws_schedule\": \"intra_overlap\", \"ws_grid\": \"persistent\", \"max_concurrent_steps\": 3}" \
    --config "{$ws, \"ws_schedule\": \"intra_overlap\", \"ws_grid\": \"persistent_q_ahead\"}" \
    --config "{$ws, \"ws_schedule\": \"pingpong\", \"ws_grid\": \"persistent_q_ahead\"}" \
    --column cudnn --column torch_sdpa --settle-s 1 --out $OUT/${k}_$s.json > $OUT/${k}_$s.log 2>&1
  rc=$?
  grep "us per call\|Error\|error" $OUT/${k}_$s.log | grep -v "xla (jax"
  [ $rc = 124 ] && { echo "$case: timed out (a hang?); the rest skipped"; break; }
done
