# gpu-mosaic attention at sequences off the 8-row grid (ViT's 197 and 577 tokens, CLIP's 257, a
# 1025-token image): the default, which now runs such a sequence unpadded (warp-specialized, Q, K,
# V and O copied through a row-tiled view), against the pipelined kernel, which pads by copies;
# CUPTI kernel time of every kernel of a call, beside cuDNN (JAX's) and torch SDPA, validated.
# Usage: bash THIS [KERNEL:SHAPE ...] (OUT set)
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cases=${@:-flash_attention:32x12x197x64 flash_attention_causal:32x12x197x64 flash_attention:8x12x577x64
  flash_attention:16x16x257x64 flash_attention:4x16x1025x64 flash_attention:16x16x301x32}
mkdir -p $OUT
for case in $cases; do
  k=${case%%:*} s=${case#*:}
  timeout 150 python3 bench/kernel_profile.py --kernel $k --shape $s --target gpu-mosaic --config '{}' \
    --config '{"mgpu_pipeline": "pipelined", "ws_schedule": "pingpong", "block_q": 64, "block_kv": 128}' \
    --column cudnn --column torch_sdpa --settle-s 1 --out $OUT/${k}_$s.json 2>&1 \
    | grep "us per call\|Error\|error" | grep -v "xla (jax"
done
# Head dim 128 (two swizzles: padded since the thirty-sixth session), off the grid against on it:
#   bash THIS flash_attention:1x32x4001x128 flash_attention:1x32x4000x128 \
#     flash_attention_causal:1x32x4001x128 flash_attention_causal:1x32x4000x128 flash_attention:8x16x577x128
