# Attention at head dims off the kernels grid (80, 96) on both GPU targets: each default, validated
# against the float32 reference with poisoned outputs. Usage: python3 bench/probes/head_dims.py
import os, sys; from pathlib import Path
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import jax, jax.numpy as jnp, kernels
from farm.measure import validate
from kernels.lowering import Platform
for name in ("flash_attention", "flash_attention_causal"):
    m = kernels.load(name)
    for shape in [(2, 16, 1000, 80), (1, 8, 1024, 96)]:
        inputs = m.make_inputs(shape, jnp.bfloat16, jax.random.key(0))
        ref = jax.jit(m.reference)(*validate.upcast(inputs))
        for target in ("gpu-triton", "gpu-mosaic"):
            cfg = m.default_config(shape, target)
            try:
                out = jax.jit(m.build(cfg, shape, jnp.bfloat16, Platform(target, poison_outputs=True)))(*inputs)
                print(name, shape, target, "rel", round(float(validate.relative_error(out, ref)), 5), flush=True)
            except Exception as e:
                print(name, shape, target, type(e).__name__, str(e)[:200], flush=True)
