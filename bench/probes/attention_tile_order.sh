# gpu-mosaic attention's persistent grid (ws_grid persistent_q_ahead) with its tiles taken by head
# (a head's Q tiles one after another: its K/V read from HBM about once) or by Q rank (every head's
# first tile, then every head's second: K/V re-read once a rank where all heads' outgrow L2),
# against a block a tile, beside cuDNN (JAX's) and torch SDPA; CUPTI kernel time, each config
# validated. Usage: [DEADLINE_S=420] bash THIS [KERNEL:SHAPE ...] (OUT set); the results go to $OUT/tile_order.tgz.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cases=${@:-flash_attention:16x32x512x128 flash_attention:4x32x4096x128 flash_attention:2x32x1024x128
  flash_attention_causal:16x32x512x128 flash_attention_causal:4x32x4096x128 flash_attention_causal:4x32x2048x128
  flash_attention:8x32x256x128 flash_attention:8x32x8192x256 flash_attention_causal:8x32x8192x256}
mkdir -p $OUT/tile_order
for case in $cases; do
  k=${case%%:*} s=${case#*:}
  # past DEADLINE_S seconds (default 420) the rest is skipped, so that the archive is written
  [ $SECONDS -gt ${DEADLINE_S:-420} ] && { echo "$case and the rest: skipped (past ${DEADLINE_S:-420} s)"; break; }
  # Q ahead where its second Q/O tile fits shared memory (not at head dim 256), else persistent
  grid=$(python3 -c "import kernels; from kernels.mgpu_launch import defaults_shared_memory as m
k = kernels.load('$k'); s = tuple(map(int, '$s'.split('x'))); c = {**k.default_config(s, 'gpu-mosaic'), 'ws_grid': 'persistent_q_ahead'}
print('persistent_q_ahead' if k.footprint(c, s, 'bfloat16', 'gpu-mosaic') <= m() else 'persistent')")
  echo "$case ($grid)"
  timeout 150 python3 bench/kernel_profile.py --kernel $k --shape $s --target gpu-mosaic --config '{}' \
    --config "{\"ws_grid\": \"$grid\", \"tile_order\": \"by_head\"}" \
    --config "{\"ws_grid\": \"$grid\", \"tile_order\": \"by_q\"}" \
    --config '{"ws_grid": "blocks", "tile_order": "by_head"}' --column cudnn --column torch_sdpa --settle-s 1 \
    --out $OUT/tile_order/${k}_$s.json > $OUT/tile_order/${k}_$s.log 2>&1
  rc=$?
  grep "us per call\|Error\|error" $OUT/tile_order/${k}_$s.log | grep -v "xla (jax"
  [ $rc = 124 ] && { echo "$case: timed out (a hang?); the rest skipped"; break; }
done
tar czf $OUT/tile_order.tgz -C $OUT tile_order && rm -rf $OUT/tile_order
