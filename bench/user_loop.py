"""The user's loop on a model-sized case: run once, tune what it used, pull, run tuned.

    python bench/user_loop.py --out DIR [--time-budget 120] [--small]

1. Run a model's kernels once through `farm.deploy.runtime.tuned` with no tuned bundle, under
   `runtime.record(DIR/misses.jsonl)`: every task the model asked for is recorded as a miss.
2. `farm sweep --tasks DIR/misses.jsonl` tunes exactly those tasks with the shipped spaces.
3. `farm pull DIR/run/bundle --dest DIR/deploy --trust KEY.pub` installs the signed bundle.
4. Run the model's kernels again from the deployment and time, side by side in one process
   (`farm.measure.timing.time_side_by_side`, inputs rotated), the tuned kernel, the kernel at
   its default config, and XLA (`jax.jit` of the kernel's reference).

The model (a decoder layer's memory-bound ops, bfloat16): RMS norm over 4096 and 5120 hidden
units (8192 tokens), SwiGLU at 11008 (8 x 2048 tokens), softmax over vocabularies of 50257 and
128256 (4096 rows). --small runs tiny shapes in interpret mode (a CPU check of the loop).
Prints a table and writes DIR/user_loop.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels  # noqa: E402
from farm.deploy import runtime  # noqa: E402
from farm.measure import timing, validate  # noqa: E402
from kernels.lowering import Platform  # noqa: E402
from kernels.protocol import task_default  # noqa: E402

MODEL = [("rms_norm", (8192, 4096)), ("rms_norm", (8192, 5120)), ("swiglu", (8, 2048, 11008)),
         ("softmax", (4096, 50257)), ("softmax", (4096, 128256))]
SMALL = [("rms_norm", (32, 384)), ("swiglu", (2, 16, 256)), ("softmax", (16, 300))]


def run_model(tasks: list[tuple[str, tuple[int, ...]]], registry: runtime.Registry, dtype: str) -> None:
    """Call every kernel of the model once through the runtime (as a model's forward pass would)."""
    for name, shape in tasks:
        module = kernels.load(name)
        inputs = module.make_inputs(shape, jnp.dtype(dtype), jax.random.key(0))
        jax.block_until_ready(runtime.tuned(name, registry=registry)(*inputs))


def farm(*args: str) -> None:
    """`python -m farm ARGS`, failing loudly."""
    subprocess.run([sys.executable, "-m", "farm", *args], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--time-budget", type=float, default=120.0, help="seconds of tuning (farm sweep)")
    parser.add_argument("--small", action="store_true", help="tiny shapes, interpret mode (CPU)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tasks, dtype = (SMALL, "float32") if args.small else (MODEL, "bfloat16")

    # 1. run once, recording what the model asked for
    misses = out / "misses.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", runtime.TuningMissWarning)
        with runtime.record(misses):
            run_model(tasks, runtime.Registry(), dtype)
    print(f"recorded {len(misses.read_text().splitlines())} missed tasks in {misses}", flush=True)

    # 2. tune them, 3. pull the signed bundle into a deployment
    key = out / "key.pem"
    if not key.exists():
        farm("keygen", str(key))
    run = out / "run"
    farm("sweep", "--tasks", str(misses), "--time-budget", str(args.time_budget), "--key", str(key),
         "--out", str(run), "--quiet", *(["--interpret"] if args.small else []))
    farm("pull", str(run / "bundle"), "--dest", str(out / "deploy"), "--trust", f"{key}.pub")

    # 4. run tuned, and time it against the default config and XLA
    registry = runtime.Registry.load(out / "deploy", [f"{key}.pub"])
    rows = []
    for name, shape in tasks:
        module = kernels.load(name)
        tuned = runtime.tuned(name, registry=registry)
        sets = [module.make_inputs(shape, jnp.dtype(dtype), jax.random.key(i)) for i in range(3)]
        choice = tuned.choice(*sets[0])
        platform = Platform(choice_target(registry, name, shape, dtype), interpret=args.small)
        default = jax.jit(module.build(task_default(module, shape, platform.target, dtype), shape, jnp.dtype(dtype),
                                       platform))
        xla = jax.jit(lambda *xs, m=module: m.reference(*xs))
        error = validate.relative_error(jax.block_until_ready(tuned(*sets[0])),
                                        module.reference(*validate.upcast(sets[0])))
        times = timing.time_side_by_side({"tuned": tuned, "default": default, "xla": xla}, sets,
                                         repetitions=5 if args.small else 15)
        moved = module.bytes_moved(shape, jnp.dtype(dtype))
        row = {"kernel": name, "shape": list(shape), "dtype": dtype, "rule": choice.rule,
               "config": dict(choice.config), "numerics_error": error,
               **{f"{k}_us": t.median_s * 1e6 for k, t in times.items()},
               "tuned_gbps": moved / times["tuned"].median_s / 1e9,
               "vs_xla": times["xla"].median_s / times["tuned"].median_s,
               "vs_default": times["default"].median_s / times["tuned"].median_s}
        rows.append(row)
        print(f"{name:10s} {'x'.join(map(str, shape)):>16s} {choice.rule:8s} tuned {row['tuned_us']:9.1f} us "
              f"({row['tuned_gbps']:6.0f} GB/s)  default {row['default_us']:9.1f}  xla {row['xla_us']:9.1f}  "
              f"vs XLA {row['vs_xla']:.2f}x  vs default {row['vs_default']:.2f}x  err {error:.2g}", flush=True)
    (out / "user_loop.json").write_text(json.dumps({"device": jax.devices()[0].device_kind, "rows": rows},
                                                   indent=1))
    return 0


def choice_target(registry: runtime.Registry, name: str, shape: tuple[int, ...], dtype: str) -> str:
    """The target the runtime picked for this task on this device."""
    platform = jax.devices()[0].platform
    if platform == "gpu":
        return registry.gpu_target(name, shape, dtype)
    return "tpu" if platform == "tpu" else "interpret"


if __name__ == "__main__":
    sys.exit(main())
