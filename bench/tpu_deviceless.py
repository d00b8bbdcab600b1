"""Every kernel's TPU default at users' shapes, compiled for a TPU without a chip: libtpu's own
compiler (Mosaic TPU included), deviceless for a one-chip topology, in a farm compile child as a TPU
worker starts them (`farm.measure.compile_pool`). Needs `pip install libtpu`. Prints a table and
writes its rows (JSON). This is the strongest evidence for the TPU target a machine without a TPU
gives: the compiler accepts the kernel; no TPU ran it.

    python bench/tpu_deviceless.py [--topology v6e:1x1] [--case KERNEL:AxBxC ...] [--config JSON]
        [--dtype float32] [--space N] [--out FILE]

--space N also compiles N configs of the kernel's shipped space (search_spaces/KERNEL.yaml) that
its constraints and the kernel admit at the case's shape, spread evenly over them.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels  # noqa: E402
from farm.measure import compile_pool  # noqa: E402
from farm.tasks import TuningTask  # noqa: E402
from kernels.protocol import task_default  # noqa: E402

# Shapes nobody here chose: vocabularies, hidden sizes, odd widths, ViT's 197 tokens, head dim 80,
# few rows, products no tile divides (besides a seed-like shape per kernel).
USER_CASES = (
    "softmax:8192x50257", "softmax:3x151936", "softmax:4096x4000", "softmax:7x128256",
    "softmax_two_pass:8192x50257", "softmax_two_pass:1000x3000",
    "batch_softmax:4x77x50257", "batch_softmax:2x3x1000",
    "cross_entropy:8192x32000", "cross_entropy:7x151936", "cross_entropy:1000x50257",
    "rms_norm:4096x5120", "rms_norm:3x14336", "rms_norm:1000x4000",
    "rms_norm_bwd:8192x8192", "rms_norm_bwd:77x5120",
    "layer_norm:4096x5120", "layer_norm:1x16384", "layer_norm:1000x1000",
    "welford:8192x8192", "welford:7x50257",
    "swiglu:8x2048x11008", "swiglu:1x77x1000", "geglu:16x16384x4096", "geglu:3x197x3072",
    "matmul:1001x4224x1000", "matmul:1x4096x11008", "matmul:8x11008x4096", "matmul:77x50257x768",
    "bmm:32x1x128x4096", "bmm:12x197x197x64", "broadcast_matmul:8x1000x4096x1000",
    "matmul_layernorm:4096x5120x5120", "matmul_layernorm:77x768x3072",
    "matmul_subtiled_epilogue:1001x4224x1000",
    "flash_attention:32x12x197x64", "flash_attention:1x32x4001x128", "flash_attention:1x32x2048x80",
    "flash_attention:4x32x4096x128",
    "flash_attention_causal:32x12x197x64", "flash_attention_causal:1x32x4097x128",
    "flash_attention_causal:2x8x1000x96",
)


@dataclasses.dataclass(frozen=True)
class Row:
    """One case: its default config and what the compiler said."""

    kernel: str
    shape: tuple[int, ...]
    topology: str
    dtype: str
    source: str        # "default" or "space"
    config: dict
    outcome: str       # "compiled", "refused by the kernel", or the farm's outcome (compile_error)
    compile_s: float
    bytes: int
    error: str = ""


def parse_case(text: str) -> tuple[str, tuple[int, ...]]:
    """KERNEL:AxBxC -> (kernel, shape)."""
    kernel, _, dims = text.partition(":")
    if kernel not in kernels.REGISTRY:
        raise SystemExit(f"--case {text!r}: unknown kernel {kernel!r}; expected one of {sorted(kernels.REGISTRY)}")
    try:
        shape = tuple(int(d) for d in dims.split("x"))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise SystemExit(f"--case {text!r}: expected KERNEL:AxBxC with positive integer dims")
    return kernel, shape


def space_configs(kernel: str, shape: tuple[int, ...], count: int, dtype: str) -> list[dict]:
    """Up to `count` TPU configs of the kernel's shipped space legal at `shape`, spread evenly."""
    from farm.search.spaces import load_space

    space = load_space(ROOT / "search_spaces" / f"{kernel}.yaml")
    module = kernels.load(kernel)
    legal = [c for c in space.configs("tpu") if space.violated(c, shape, dtype, "tpu") is None
             and module.check_config(c, shape, dtype, "tpu") is None]
    step = max(1, len(legal) // count) if count else len(legal) + 1
    return legal[::step][:count]


def run_case(pool: compile_pool.CompilePool, kernel: str, shape: tuple[int, ...], topology: str,
             timeout_s: float, override: dict | None = None, config: dict | None = None,
             dtype: str = "bfloat16") -> Row:
    """Compile `config` (None: the kernel's TPU default updated by `override`) at `shape` for
    `topology` in the pool's child."""
    module = kernels.load(kernel)
    source = "default" if config is None else "space"
    if config is None:
        config = {**task_default(module, shape, "tpu", dtype), **(override or {})}
    refusal = module.check_config(config, shape, dtype, "tpu")
    if refusal is not None:
        return Row(kernel, shape, topology, dtype, source, config, "refused by the kernel", 0.0, 0, refusal)
    reply = pool.compile(TuningTask(kernel, shape, dtype, "tpu"), config, interpret=False,
                         timeout_s=timeout_s, topology=topology)
    if isinstance(reply, compile_pool.Portable):
        return Row(kernel, shape, topology, dtype, source, config, "compiled", reply.compile_s,
                   len(reply.executable[0]) + len(reply.check_executable[0]))
    if isinstance(reply, compile_pool.NotPortable):
        return Row(kernel, shape, topology, dtype, source, config, "not portable", 0.0, 0, reply.reason)
    return Row(kernel, shape, topology, dtype, source, config, reply.outcome, reply.compile_s, 0,
               (reply.error or "")[-2000:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", action="append",
                        help="one-chip TPU topology (default v5e:1x1, v6e:1x1, v5p:1x1x1, v4:1x1x1, tpu7x:1x1x1)")
    parser.add_argument("--case", action="append", help="KERNEL:AxBxC (default: the users' cases above)")
    parser.add_argument("--config", type=json.loads, default=None,
                        help="JSON knobs over each case's default, e.g. '{\"block_rows\": 8}'")
    parser.add_argument("--dtype", default="bfloat16", help="the inputs' dtype (bfloat16, float32, ...)")
    parser.add_argument("--space", type=int, default=0, help="also compile N configs of each kernel's space")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per compile")
    parser.add_argument("--out", type=Path, default=Path("bench/results/cpu/tpu_deviceless.json"))
    args = parser.parse_args()
    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise SystemExit("libtpu is missing: pip install libtpu (it compiles for TPU without a chip)") from None
    cases = [parse_case(c) for c in (args.case or USER_CASES)]
    topologies = args.topology or ["v5e:1x1", "v6e:1x1", "v5p:1x1x1", "v4:1x1x1", "tpu7x:1x1x1"]
    pool = compile_pool.CompilePool(1, compile_pool.TPU_CHILD_ENV)
    rows: list[Row] = []
    started = time.perf_counter()
    try:
        print(f"{'kernel':26} {'shape':22} {'topology':9} {'config':7} {'outcome':24} {'compile s':>9} {'KB':>6}")
        for topology in topologies:
            for kernel, shape in cases:
                configs = [None] + space_configs(kernel, shape, args.space, args.dtype)
                for config in configs:
                    row = run_case(pool, kernel, shape, topology, args.timeout_s, args.config, config, args.dtype)
                    rows.append(row)
                    shape_text = "x".join(map(str, shape))
                    print(f"{kernel:26} {shape_text:22} {topology:9} {row.source:7} {row.outcome:24} "
                          f"{row.compile_s:9.2f} {row.bytes // 1024:6}", flush=True)
                    if row.error:
                        print(f"    {row.config}: " + row.error.strip().splitlines()[-1][:300], flush=True)
    finally:
        pool.close()
    failed = [r for r in rows if r.outcome != "compiled"]
    print(f"{len(rows) - len(failed)} of {len(rows)} compiled in {time.perf_counter() - started:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    tmp.replace(args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
