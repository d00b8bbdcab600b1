"""Check the compute-bound kernels' GPU versions on a GPU: numerics first, then speed.

    python bench/check_gpu_kernels.py [--only NAME ...] [--target gpu-mosaic] [--seed-shapes] [--no-time]
    python bench/check_gpu_kernels.py --interpret     # no GPU: tiny shapes in Pallas's interpreters
    python bench/check_gpu_kernels.py --ragged units  # the matmul family and attention at shapes no tile divides

Every row builds one config with poisoned outputs (unwritten elements are NaN), compares it with
the kernel's float32 reference (farm.measure.validate) at a check shape (the seed shape with fewer batch
entries/heads, so the reference fits), then times the unpoisoned build (farm.measure.timing) at the
check shape, or at the seed shape with --seed-shapes. The configs are the ones expected to be
fast on an H100/H200; an "xla" row times `jax.jit(reference)` on the same bf16 inputs.
--ragged shrinks the check shapes so that no tile divides them: "units" takes 24, 64 and 64 off
a matmul's m, n and k and 24 off attention's sequence, keeping rows in groups of 8 and columns
in 64s, which the Mosaic GPU kernels take as they are (TMA fills and clips the edge tiles);
"odd" takes 23, 63 and 63 (attention: 23), which every target pads (`MatmulConfig.padded`,
`AttentionConfig.padded_seq`); there each Mosaic GPU matmul-family row also runs with store
"threads" (the product stored at its own size, `kernels.mgpu_store`). A config the kernel
refuses at such a shape is a row marked "refused", not a failure. With --interpret the gpu-mosaic
rows are left out: Pallas's GPU interpreter cannot read past an array's edge as TMA does.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels  # noqa: E402
from farm.measure import (
    timing,  # noqa: E402
    validate,  # noqa: E402
)
from kernels.lowering import Platform  # noqa: E402

WS = {"mgpu_pipeline": "warp_specialized"}
PIPE = {"mgpu_pipeline": "pipelined"}
TRITON = {"num_warps": 8, "num_stages": 3}


def _mm(bm: int, bn: int, bk: int, **knobs) -> dict:
    return {"block_m": bm, "block_n": bn, "block_k": bk, **knobs}


MATMUL_CONFIGS = [
    ("gpu-mosaic", _mm(128, 128, 64, max_concurrent_steps=4, grid_tile_width=8, **WS)),
    ("gpu-mosaic", _mm(128, 128, 64, max_concurrent_steps=4, wg_split="m", grid_tile_width=8, **WS)),
    ("gpu-mosaic", _mm(128, 128, 64, max_concurrent_steps=4, **PIPE)),
    ("gpu-mosaic", _mm(128, 256, 64, max_concurrent_steps=3, epi_n=128, **PIPE)),
    ("gpu-triton", _mm(128, 256, 64, group_m=8, **TRITON)),
    ("gpu-triton", _mm(128, 128, 64, group_m=8, num_warps=4, num_stages=4)),
    ("gpu-mosaic", _mm(64, 128, 128, max_concurrent_steps=3, wg_split="m", grid_minor="m", **WS)),
]
# (m, n, k) taken off the check shapes by --ragged (batch dimensions are kept).
RAGGED = {"units": (24, 64, 64), "odd": (23, 63, 63)}
ATTENTION_CONFIGS = {  # by head_dim
    256: [("gpu-mosaic", {"block_q": 64, "block_kv": 64, "max_concurrent_steps": 2, **WS}),
          ("gpu-mosaic", {"block_q": 64, "block_kv": 64, "max_concurrent_steps": 2, "ws_schedule": "intra_overlap",
                          **WS}),
          ("gpu-mosaic", {"block_q": 64, "block_kv": 64, "max_concurrent_steps": 2, **PIPE}),
          ("gpu-triton", {"block_q": 64, "block_kv": 32, "num_warps": 8, "num_stages": 2})],
    128: [("gpu-mosaic", {"block_q": 64, "block_kv": 128, "max_concurrent_steps": 2, **WS}),
          ("gpu-mosaic", {"block_q": 64, "block_kv": 128, "max_concurrent_steps": 2, "ws_schedule": "intra_overlap",
                          **WS}),
          ("gpu-mosaic", {"block_q": 128, "block_kv": 64, "max_concurrent_steps": 3, **PIPE}),
          ("gpu-triton", {"block_q": 128, "block_kv": 64, "num_warps": 8, "num_stages": 2})],
}


def cases() -> list[tuple[str, str, dict, tuple, tuple, tuple]]:
    """(kernel, target, config, check shape, seed shape, tiny interpret shape) rows."""
    rows = []
    rows_m = {"gpu-mosaic": 256, "gpu-triton": 1024}  # tiny shapes: enough row tiles for group_m
    for target, config in MATMUL_CONFIGS:
        rows.append(("matmul", target, config, (2048, 2048, 2048), (8192, 8192, 8192),
                     (rows_m[target], 256, 128)))
    # a decode step's few rows and long K: K split over 4 programs a tile (split_k)
    rows.append(("matmul", "gpu-triton", _mm(16, 64, 128, split_k=4, group_m=1, num_warps=4, num_stages=4),
                 (64, 4096, 14336), (16, 4096, 14336), (64, 256, 1024)))
    for name in ("bmm", "broadcast_matmul"):
        for target, config in MATMUL_CONFIGS[::2]:
            rows.append((name, target, config, (8, 1024, 1024, 1024), (64, 2048, 2048, 2048),
                         (2, rows_m[target], 256, 128)))
    rows.append(("broadcast_matmul", "gpu-mosaic", {**MATMUL_CONFIGS[0][1], "fold_batch": True},
                 (8, 1024, 1024, 1024), (64, 2048, 2048, 2048), (2, 64, 256, 128)))
    for target, config in [("gpu-mosaic", _mm(128, 128, 64, max_concurrent_steps=4, epi_n=64, **WS)),
                           ("gpu-mosaic", _mm(128, 128, 64, max_concurrent_steps=4, epi_n=32, **WS)),
                           ("gpu-mosaic", _mm(128, 128, 64, max_concurrent_steps=4, epi_n=64, **PIPE)),
                           ("gpu-triton", _mm(128, 256, 64, group_m=8, epi_n=128, **TRITON))]:
        rows.append(("matmul_subtiled_epilogue", target, config, (2048, 2048, 2048), (4096, 4096, 4096),
                     (rows_m[target], 256, 128)))
    rows.append(("matmul_layernorm", "gpu-triton", _mm(128, 256, 64, ln_strategy="two_phase", ln_rows=4,
                                                       group_m=8, **TRITON),
                 (2048, 4096, 2048), (4096, 4096, 4096), (1024, 256, 128)))
    rows.append(("matmul_layernorm", "gpu-mosaic", _mm(64, 128, 64, ln_strategy="tile_stats", ln_store="input",
                                                       max_concurrent_steps=5, wg_split="m", **WS),
                 (2048, 4096, 2048), (4096, 4096, 4096), (256, 256, 128)))
    # the Triton phase 2 at widths that are not powers of two: 33 tiles a row padded to 64, chunks of
    # 2048 and a masked one of 128 columns (4224); 40 tiles, five chunks of 1024 (5120)
    rows.append(("matmul_layernorm", "gpu-mosaic", _mm(64, 128, 64, ln_strategy="tile_stats", ln_store="input",
                                                       ln_phase2="triton", ln_rows=1, max_concurrent_steps=5,
                                                       wg_split="m", **WS),
                 (1024, 4224, 1024), (4096, 5120, 5120), (256, 384, 128)))
    for name in ("flash_attention", "flash_attention_causal"):
        for (b, h, s, d) in ((8, 32, 8192, 256), (4, 32, 4096, 128)):
            for target, config in ATTENTION_CONFIGS[d]:
                tiny = (1, 1, 256, 64) if target == "gpu-mosaic" else (1, 1, 256, 32)
                rows.append((name, target, config, (1, 4, s, d), (b, h, s, d), tiny))
    return rows


def _knobs(config: dict) -> str:
    short = {"block_m": "m", "block_n": "n", "block_k": "k", "block_q": "q", "block_kv": "kv",
             "max_concurrent_steps": "steps", "mgpu_pipeline": "", "num_warps": "w", "num_stages": "s"}
    return " ".join(f"{short.get(k, k)}{'=' if short.get(k, k) else ''}{v}" for k, v in config.items())


def ragged(name: str, shape: tuple, kind: str) -> tuple:
    """A matmul-family shape (..., m, n, k) with RAGGED[kind] taken off m, n and k; an attention
    shape (batch, heads, seq, head_dim) with its first cut taken off seq."""
    if "attention" in name:
        return shape[:2] + (shape[2] - RAGGED[kind][0],) + shape[3:]
    return shape[:-3] + tuple(d - cut for d, cut in zip(shape[-3:], RAGGED[kind]))


def store_variants(name: str, target: str, config: dict, kind: str | None) -> list[dict]:
    """The config, and at shapes off the grid (--ragged odd) its twin whose threads store the
    product (the Mosaic GPU matmul family's store knob; row statistics keep TMA)."""
    if kind == "odd" and target == "gpu-mosaic" and "attention" not in name and name != "matmul_layernorm":
        return [config, {**config, "store": "threads"}]
    return [config]


def check(name: str, target: str, config: dict, shape: tuple, time_shape: tuple | None,
          interpret: bool) -> dict:
    """One row: relative error at `shape`, then the median time at `time_shape` (None: skip)."""
    module = kernels.load(name)
    dtype = jnp.bfloat16
    row = {"kernel": name, "target": target, "config": _knobs(config), "shape": "x".join(map(str, shape))}
    refused = module.check_config(config, shape, dtype, target)
    if refused:
        return row | {"ok": None, "failure": f"refused: {refused[:100]}"}
    try:
        row["smem_kib"] = module.footprint(config, shape, dtype, target) / 1024
        inputs = module.make_inputs(shape, dtype, jax.random.key(0))
        fn = module.build(config, shape, dtype, Platform(target, interpret=interpret, poison_outputs=True))
        out = jax.jit(fn)(*inputs)
        row["error"] = validate.relative_error(out, module.reference(*validate.upcast(inputs)))
        row["ok"] = row["error"] <= validate.tolerance("bfloat16", module)
        if time_shape is not None and row["ok"]:
            row.update(_time(module, jax.jit(module.build(config, time_shape, dtype, Platform(target))),
                             time_shape))
    except Exception as err:  # noqa: BLE001 - every failure is a row
        row["ok"] = False
        row["failure"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:100]}"
        if os.environ.get("CHECK_VERBOSE"):
            traceback.print_exc()
    return row


def _time(module, fn, shape: tuple) -> dict:
    inputs = module.make_inputs(shape, jnp.bfloat16, jax.random.key(1))
    t = timing.time_calls(fn, [inputs], warmup=2, repetitions=10)
    return {"ms": t.median_s * 1e3, "tflops": module.flops(shape) / t.median_s / 1e12,
            "time_shape": "x".join(map(str, shape))}


def xla_row(name: str, shape: tuple) -> dict:
    """The time of `jax.jit(reference)` on the same bf16 inputs (XLA's own kernels)."""
    module = kernels.load(name)
    row = {"kernel": name, "target": "xla", "config": "jax.jit(reference)", "shape": "x".join(map(str, shape)),
           "ok": True}
    try:
        row.update(_time(module, jax.jit(module.reference), shape))
    except Exception as err:  # noqa: BLE001
        row["failure"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:100]}"
    return row


def print_table(rows: list[dict]) -> None:
    """Rows as an aligned text table."""
    head = ("kernel", "target", "config", "shape", "smem KiB", "rel err", "ok", "ms", "TFLOP/s", "note")
    lines = [head]
    for r in rows:
        lines.append((r["kernel"], r["target"], r["config"], r.get("time_shape", r["shape"]),
                      f"{r['smem_kib']:.0f}" if "smem_kib" in r else "",
                      f"{r['error']:.2e}" if "error" in r else "",
                      {True: "yes", False: "NO", None: "-"}[r.get("ok", False)],
                      f"{r['ms']:.3f}" if "ms" in r else "", f"{r['tflops']:.0f}" if "tflops" in r else "",
                      r.get("failure", "")))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(str(v).ljust(w) for v, w in zip(line, widths)).rstrip())


def main(argv: list[str] | None = None) -> int:
    """Run the checks and print the table; exit status 1 if any kernel is wrong."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="kernel names to check")
    parser.add_argument("--target", choices=["gpu-mosaic", "gpu-triton"], help="one target only")
    parser.add_argument("--seed-shapes", action="store_true", help="time at the seed shapes")
    parser.add_argument("--no-time", action="store_true", help="numerics only")
    parser.add_argument("--interpret", action="store_true", help="no GPU: tiny shapes, interpreters")
    parser.add_argument("--ragged", choices=sorted(RAGGED),
                        help="shapes no tile divides: on the 8-row, 64-column grid (units) or off it (odd)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}", flush=True)
    rows, timed = [], set()
    for name, target, config, check_shape, seed_shape, tiny in cases():
        if (args.only and name not in args.only) or (args.target and target != args.target):
            continue
        if args.ragged:
            if args.interpret and target == "gpu-mosaic":
                continue  # Pallas's GPU interpreter cannot read past an array's edge as TMA does
            check_shape, seed_shape, tiny = (ragged(name, s, args.ragged) for s in (check_shape, seed_shape, tiny))
        shape = tiny if args.interpret else check_shape
        time_shape = None if args.no_time or args.interpret else (seed_shape if args.seed_shapes else check_shape)
        for variant in store_variants(name, target, config, args.ragged):
            rows.append(check(name, target, variant, shape, time_shape, args.interpret))
            verdict = {True: "ok", False: "FAILED", None: "refused"}[rows[-1]["ok"]]
            print(f"  {name} {target} {rows[-1]['config']}: {verdict}", flush=True)
        if time_shape is not None and (name, time_shape) not in timed and "attention" not in name:
            timed.add((name, time_shape))
            rows.append(xla_row(name, time_shape))
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"jax": jax.__version__, "device": jax.devices()[0].device_kind,
                                         "ragged": args.ragged, "rows": rows}, indent=1))
    return 0 if all(r.get("ok") is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
