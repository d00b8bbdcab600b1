"""Layer norm's split_cols map kernel at a few wide rows: which part of the span combination is slow.

Profiles (CUPTI kernel time per call, bench/kernel_profile.profile_calls) the two kernels of
layer norm's split_cols at 4x16384 bf16 with its span combination (Chan's, over every span at
once) and two stand-ins: power sums (the variance from sums of squares about zero, the combined
mean reused), and a wrong one that reuses no combined value (timing only; its error is printed).
On the H200 (bench/results/h200/few_rows/): python3 bench/probes/ln_split_probe.py
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench.kernel_profile import profile_calls  # noqa: E402
from kernels import layer_norm, rows  # noqa: E402
from kernels.lowering import Platform  # noqa: E402


def power_sums(stats: rows.Stats) -> rows.Stats:
    count, mean, m2 = stats
    total = jnp.sum(count, axis=-1, keepdims=True)
    s1 = jnp.sum(count * mean, axis=-1, keepdims=True)
    s2 = jnp.sum(m2 + count * mean * mean, axis=-1, keepdims=True)
    row_mean = s1 / total
    return total, row_mean, s2 - total * row_mean * row_mean


def no_reuse(stats: rows.Stats) -> rows.Stats:
    """Wrong numerics (the spans' own squared deviations only): timing only."""
    count, mean, m2 = stats
    total = jnp.sum(count, axis=-1, keepdims=True)
    return total, jnp.sum(count * mean, axis=-1, keepdims=True) / total, jnp.sum(m2, axis=-1, keepdims=True)


def main() -> None:
    shape = (4, 16384)
    x, w, b = layer_norm.make_inputs(shape, jnp.bfloat16, jax.random.key(0))
    expected = layer_norm.reference(x, w, b).astype(jnp.float32)
    for label, combine in [("chan", None), ("power_sums", power_sums), ("no_reuse", no_reuse)]:
        math_ = layer_norm.MATH if combine is None else dataclasses.replace(layer_norm.MATH, combine=combine)
        kernel = rows.RowKernel(math_, layer_norm.SHAPE_NAMES)
        for chunk, warps in ((2048, 4), (1024, 2)):
            config = {"block_rows": 1, "strategy": "split_cols", "block_cols": chunk, "num_warps": warps,
                      "num_stages": 1}
            fn = jax.jit(kernel.build(config, shape, jnp.bfloat16, Platform("gpu-triton")))
            err = float(jnp.max(jnp.abs(fn(x, w, b).astype(jnp.float32) - expected)))
            times = [(p["kernel"], round(p["us_per_call"], 2)) for p in profile_calls(fn, (x, w, b))]
            print(label, chunk, warps, "max err", round(err, 4), times, flush=True)


if __name__ == "__main__":
    main()
