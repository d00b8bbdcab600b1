# gpu-mosaic attention's default at short sequences (ws_grid persistent_q_ahead up to
# kernels/attention_config.py: PERSISTENT_SEQ / PERSISTENT_CAUSAL_SEQ, one block a tile past them)
# against the other grid, beside cuDNN (JAX's) and torch SDPA; CUPTI kernel time, each config
# validated. Usage: bash THIS [KERNEL:SHAPE ...] (OUT set)
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cases=${@:-flash_attention:32x12x197x64 flash_attention:8x32x256x128 flash_attention:16x16x128x128
  flash_attention:16x32x512x128 flash_attention:2x32x1024x128 flash_attention_causal:32x12x197x64
  flash_attention_causal:8x32x256x128 flash_attention_causal:16x32x512x128 flash_attention_causal:8x16x1024x64
  flash_attention_causal:2x8x1000x96 flash_attention_causal:4x32x2048x128}
mkdir -p $OUT
for case in $cases; do
  k=${case%%:*} s=${case#*:}
  other=$(python3 -c "import kernels; c = kernels.load('$k').default_config(tuple(map(int, '$s'.split('x'))), 'gpu-mosaic'); print('blocks' if c['ws_grid'] != 'blocks' else 'persistent_q_ahead')")
  echo "$case: default against ws_grid $other"
  timeout 120 python3 bench/kernel_profile.py --kernel $k --shape $s --target gpu-mosaic --config '{}' \
    --config "{\"ws_grid\": \"$other\"}" --column cudnn --column torch_sdpa --settle-s 1 \
    --out $OUT/${k}_$s.json > $OUT/${k}_$s.log 2>&1
  rc=$?
  grep "us per call\|Error\|error" $OUT/${k}_$s.log | grep -v "xla (jax"
  [ $rc = 124 ] && { echo "$case: timed out (a hang?); the rest skipped"; break; }
done
