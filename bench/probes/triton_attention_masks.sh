# gpu-triton attention at sequences off its blocks and head dims off powers of two: masked loads
# and stores (after) against Q, K, V padded by copies and O sliced back (before), CUPTI time of
# every kernel of a call, beside cuDNN and torch SDPA, each config validated (poisoned outputs).
# Usage: BEFORE=.before bash bench/probes/before_after.sh bash bench/probes/triton_attention_masks.sh CASE...
cases=${@:-flash_attention:32x12x197x64 flash_attention_causal:32x12x197x64 flash_attention:8x12x577x64
  flash_attention:1x32x2048x80 flash_attention_causal:1x32x2048x80 flash_attention:2x16x1000x128
  flash_attention:4x32x4096x128}
for case in $cases; do
  k=${case%%:*} s=${case#*:}
  timeout 120 python3 bench/kernel_profile.py --kernel $k --shape $s --target gpu-triton --config '{}' \
    $([ "$TREE" = after ] && echo --column cudnn --column torch_sdpa) --settle-s 1 \
    --out $OUT/$TREE/${k}_$s.json 2>&1 | grep "us per call\|rror" | grep -v "xla (jax"
done
