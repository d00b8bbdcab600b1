# The two-pass softmax's seed row (8192x8192) against JAX's Pallas softmax, torch.compile and a copy of
# its bytes; the one-pass softmax (Triton, Mosaic GPU) at the same shape. CUPTI kernel time per call.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
S=${SHAPE:-8192x8192}
timeout 240 python3 bench/kernel_profile.py --target gpu-triton --kernel softmax_two_pass --shape $S \
  --config '{}' \
  --config '{"block_cols":4096,"num_warps":4,"num_stages":1,"rows_per_program":1}' \
  --config '{"block_cols":4096,"num_warps":8,"num_stages":1,"rows_per_program":1}' \
  --config '{"block_cols":2048,"num_warps":4,"num_stages":2,"rows_per_program":1}' \
  --config '{"block_cols":4096,"num_warps":16,"num_stages":1,"rows_per_program":1,"unroll":1}' \
  --config '{"block_cols":1024,"num_warps":4,"num_stages":3,"rows_per_program":1,"unroll":1}' \
  --column pallas_ops_triton --column torch_compile --copy --settle-s 1 --out $OUT/two_pass.json 2>&1 \
  | grep -E "per call in kernels|error|Error" | head -30
timeout 200 python3 bench/kernel_profile.py --target gpu-mosaic --kernel softmax --shape $S \
  --config '{}' --config '{"block_cols":2048}' --config '{"block_cols":8192}' \
  --config 'gpu-triton:{}' --settle-s 1 --out $OUT/softmax.json 2>&1 | grep -E "per call in kernels|error|Error" | head
