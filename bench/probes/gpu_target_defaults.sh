# Which GPU target's DEFAULT config runs faster, kernel by kernel: what a deployment gets for a task
# its bundle has no row for (farm.deploy.registry.Registry.gpu_target's last rule). The seed table
# with no bundle and no tuning times each kernel's gpu-triton and gpu-mosaic defaults side by side,
# beside XLA, in one process, interleaved (bench/seed_table.py's method).
# Usage: bash THIS seed            # the seed spaces' shapes
#        bash THIS users           # users' shapes (vocabularies, hidden sizes, ViT, head dim 80)
# (OUT set)
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
common="--columns xla --no-compile --check --repetitions 5 --budget-s 420"
case ${1:-seed} in
  seed) timeout 560 python3 bench/seed_table.py --out $OUT/seed $common ;;
  users) timeout 560 python3 bench/seed_table.py --out $OUT/users $common \
    --shape softmax:8192x50257 --shape softmax:8192x128256 --shape softmax:16384x4000 \
    --shape cross_entropy:8192x32000 --shape cross_entropy:8192x151936 \
    --shape rms_norm:4096x5120 --shape layer_norm:4096x8192 --shape rms_norm_bwd:8192x8192 \
    --shape matmul:1001x50257x4096 --shape matmul:3000x14336x1000 --shape matmul:4096x11008x4096 \
    --shape matmul:16x4096x4096 --shape bmm:12x577x577x64 \
    --shape flash_attention:32x12x197x64 --shape flash_attention:1x32x2048x80 \
    --shape flash_attention_causal:1x32x2048x80 --shape flash_attention:2x16x1000x128 ;;
esac
