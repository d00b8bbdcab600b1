# Staged rows copied in and out by spans (`parts`): the first walk starts on a span once it lands,
# each span is written back once mapped. CUPTI kernel time per call against parts 1; the GPU-only
# numerics tests of the staged rows first.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_staged_rows.py -k "clustered_rows_match or spans" 2>&1 | tail -3
prof() {  # kernel shape base-config parts...
  local k=$1 s=$2 base=$3; shift 3
  local args=()
  for n in "$@"; do args+=(--config "${base%\}},\"parts\":$n}"); done
  timeout 150 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $k --shape $s "${args[@]}" --copy \
    --settle-s 1 --out $OUT/${k}_$s.json 2>&1 | grep -E "per call in kernels|rror" | sed "s/^/$k $s: /"
}
prof softmax 8192x128256 '{"cluster":4,"block_cols":4096}' 1 2 4 8
prof softmax 8192x151936 '{"cluster":6,"block_cols":2048}' 1 2 4 8
prof softmax 8192x50304 '{"block_cols":4096}' 1 2 4 8
prof layer_norm 2048x131072 '{"cluster":4,"block_cols":4096,"stream_cols":2}' 1 2 4 8
prof rms_norm 8192x8192 '{"block_cols":2048}' 1 2 4
prof layer_norm 16384x16384 '{"block_cols":8192,"stream_cols":2}' 1 2
prof rms_norm 16384x16384 '{"block_cols":2048}' 1 2 4 8
