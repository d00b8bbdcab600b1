# The split tail (tail_split: the last row bands' tiles as runs of K, dealt to the slots the whole
# tiles leave idle) against the default at products whose tiles are not whole waves: 4096 x 6400
# (6.06 waves of LARGE_TILES' cluster tiles on 132 SMs), 2048 x 11008 (5.2), 1024 x 14336 x 4096
# (3.4), bmm 3 x 1024 x 2048 x 1024 (1.45) and 4096 x 11008 (10.4), beside XLA and torch;
# CUPTI kernel time per call, every config validated. The splits the kernel refuses at a shape
# (no tail to split, K not in equal runs) are left out. One process a row. Usage: bash THIS [KERNEL:SHAPE ...]
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
specs=${*:-matmul:4096x6400x4096 matmul:2048x11008x4096 matmul:1024x14336x4096 bmm:3x1024x2048x1024 matmul:4096x11008x4096}
for spec in $specs; do
  k=${spec%%:*} S=${spec##*:}
  echo "== $k $S"
  mapfile -t args < <(python3 - "$k" "$S" <<'PY'
import sys, jax.numpy as jnp, kernels
name, shape = sys.argv[1], tuple(int(x) for x in sys.argv[2].split("x"))
module = kernels.load(name)
default = module.default_config(shape, "gpu-mosaic")
print("--config"); print("{}")
for split in (2, 3, 4, 6, 8):
    why = module.check_config({**default, "tail_split": split}, shape, jnp.bfloat16, "gpu-mosaic")
    if why is None:
        print("--config"); print('{"tail_split": %d}' % split)
    else:
        print(f"tail_split {split} refused: {why[:160]}", file=sys.stderr)
PY
)
  timeout 240 python3 bench/kernel_profile.py --target gpu-mosaic --kernel $k --shape $S "${args[@]}" \
    --column torch --settle-s 1 --out $OUT/tail_split_${k}_$S.json 2>&1 | grep -E "per call in kernels|rror" | cut -c1-300
done
