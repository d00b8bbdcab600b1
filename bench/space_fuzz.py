"""Do random configs of the shipped spaces work at shapes nobody here chose? Draw and see.

    python bench/space_fuzz.py [--seed 0] [--shapes 6] [--configs 4] [--kernel K ...] [--case K:AxB ...]
        [--target T ...] [--lower] [--out FILE]

For each kernel (default: every registered one), --shapes random users' shapes (odd widths, a
vocabulary, ViT's 197 tokens, head dims 80 and 96, rows of one; or the --case shapes) and each
target, the tool enumerates the configs the kernel's shipped space (`search_spaces/K.yaml`) and
the kernel admit there, keeps those that fit the chip a sweep emulates (an H200, a TPU v7), and
draws --configs of them at random. Default mode: each is compiled in interpret mode by the
farm's own `compile_config` and judged by the worker's own validation (poisoned outputs, the
dtype's tolerance), on CPU: `ok`, `wrong_result`, `compile_error` or `run_error`, as a sweep would
record it, without the timing. Targets: interpret, tpu (TPU interpret mode), gpu-triton; gpu-mosaic
(Pallas's GPU interpreter, bf16 only) is slow and only on request. `--lower` instead lowers each
native build for its device (tpu, cuda) at larger shapes, running nothing: trace and lowering
errors at sizes interpret mode cannot reach. Prints a table and every failure; writes one row a
config to --out. Exits 1 when a config failed. The defaults' own check is bench/tpu_deviceless.py
and tests/test_user_shapes.py; this is the spaces'.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels  # noqa: E402
from bench.tpu_deviceless import parse_case  # noqa: E402
from farm.measure import capacity, outcomes  # noqa: E402
from farm.measure.compiler import compile_config, full_text  # noqa: E402
from farm.measure.device import validate_compiled  # noqa: E402
from farm.search.pruning import static_verdict  # noqa: E402
from farm.search.spaces import load_space  # noqa: E402
from farm.search.valid_set import ValidSet  # noqa: E402
from farm.tasks import TuningTask, config_json  # noqa: E402
from kernels.lowering import Platform  # noqa: E402

# Interpret mode runs every program on the CPU: dims that stay small but miss every tile.
SMALL_DIMS = (1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 64, 77, 100, 127, 129, 197, 255, 300, 513)
# Lowering runs nothing: users' sizes (hidden sizes, vocabularies, prompt lengths).
USER_DIMS = (1, 3, 7, 13, 64, 77, 100, 127, 128, 197, 255, 384, 500, 640, 768, 1000, 1023, 1024, 1280,
             2304, 3000, 4000, 4096, 5120, 8192, 11008, 14336, 32000, 50257, 128256)
HEAD_DIMS = (32, 64, 80, 96, 128)
RUN_TARGETS = ("interpret", "tpu", "gpu-triton")
LOWER_TARGETS = {"tpu": "tpu", "gpu-triton": "cuda", "gpu-mosaic": "cuda"}
MAX_ELEMENTS = {False: 1_500_000, True: 2**31 - 1}   # per shape: interpret mode, lowering
REJECTION_DRAWS = 20_000   # draws from a space too large to enumerate, for one task's configs


@dataclasses.dataclass(frozen=True)
class Row:
    """One config at one task: what became of it."""

    kernel: str
    shape: tuple[int, ...]
    dtype: str
    target: str
    config: dict[str, Any]
    outcome: str       # ok, wrong_result, compile_error, run_error ("lowered" / "lowering_error" with --lower)
    error: str = ""    # as a sweep records it (its cause last)


def random_shape(module: Any, rng: random.Random, dims: tuple[int, ...], max_elements: int) -> tuple[int, ...]:
    """A users' shape for `module`: head dims from HEAD_DIMS, the rest from `dims`, at most
    `max_elements` elements."""
    while True:
        shape = tuple(rng.choice(HEAD_DIMS) if name == "head_dim" else rng.choice(dims) for name in module.SHAPE_NAMES)
        if math.prod(shape) <= max_elements:
            return shape


def draw_configs(kernel: str, shape: tuple[int, ...], dtype: str, target: str, count: int,
                 rng: random.Random) -> list[dict[str, Any]]:
    """Up to `count` distinct configs the shipped space and the kernel admit at the task, that
    fit the chip a sweep emulates for `target`, drawn uniformly."""
    space = load_space(ROOT / "search_spaces" / f"{kernel}.yaml")
    if target not in {t.name for t in space.targets}:
        return []
    params = space.params_for(target)
    valid = ValidSet.enumerate(params, space.leaf_check(shape, dtype, target),
                               space.prefix_checks(shape, dtype, target))
    module, chip = kernels.load(kernel), capacity.for_target(target, interpret=True)
    chosen: dict[str, dict[str, Any]] = {}
    for _ in range(REJECTION_DRAWS if valid is None else len(valid)):
        if len(chosen) == count:
            break
        if valid is None:   # too many to enumerate: uniform draws from the product, kept where admitted
            config = {p.name: rng.choice(p.choices) for p in params}
            if config_json(config) in chosen or space.violated(config, shape, dtype, target) is not None:
                continue
        elif (config := valid.pick(rng)) is None:
            break
        else:
            valid.close(config_json(config))
        if static_verdict(module, config, shape, dtype, target, chip)[1] is None:
            chosen[config_json(config)] = config
    return list(chosen.values())


def run_config(kernel: str, shape: tuple[int, ...], dtype: str, target: str, config: dict[str, Any]) -> Row:
    """Compile in interpret mode and validate as a sweep's worker does (no timing)."""
    task = TuningTask(kernel, shape, dtype, target)
    compiled = compile_config(task, config, interpret=True, with_inputs=False, calls=1)
    result = compiled if isinstance(compiled, outcomes.Measurement) else validate_compiled(compiled)
    return Row(kernel, shape, dtype, target, config, result.outcome, result.error or "")


def lower_config(kernel: str, shape: tuple[int, ...], dtype: str, target: str, config: dict[str, Any]) -> Row:
    """Lower the native build for the target's device; nothing runs."""
    module = kernels.load(kernel)
    try:
        args = jax.eval_shape(lambda: module.make_inputs(shape, jnp.dtype(dtype), jax.random.key(0)))
        fn = module.build(config, shape, jnp.dtype(dtype), Platform(target))
        jax.jit(fn).trace(*args).lower(lowering_platforms=(LOWER_TARGETS[target],))
    except Exception as err:  # noqa: BLE001 - every failure is a row
        return Row(kernel, shape, dtype, target, config, "lowering_error", full_text(err)[:outcomes.ERROR_CHARS])
    return Row(kernel, shape, dtype, target, config, "lowered")


def failed(row: Row) -> bool:
    """Whether the row is a defect: anything but ok / lowered."""
    return row.outcome not in (outcomes.OK, "lowered")


def table(rows: list[Row]) -> str:
    """Per kernel and target: tasks, configs, and each outcome's count."""
    groups: dict[tuple[str, str], list[Row]] = collections.defaultdict(list)
    for row in rows:
        groups[(row.kernel, row.target)].append(row)
    lines = [f"{'kernel':26} {'target':11} {'tasks':>5} {'configs':>7}  outcomes"]
    for (kernel, target), group in groups.items():
        counts = collections.Counter(r.outcome for r in group)
        tasks = len({(r.shape, r.dtype) for r in group})
        lines.append(f"{kernel:26} {target:11} {tasks:>5} {len(group):>7}  "
                     + ", ".join(f"{n} {outcome}" for outcome, n in counts.most_common()))
    bad = [r for r in rows if failed(r)]
    lines.append(f"{len(rows)} configs, {len(bad)} failed")
    lines += [f"  {r.kernel} {'x'.join(map(str, r.shape))} {r.dtype} {r.target} {r.outcome}: "
              f"{json.dumps(r.config, sort_keys=True)}: {r.error.splitlines()[-1] if r.error else ''}" for r in bad]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shapes", type=int, default=6, help="random users' shapes per kernel")
    parser.add_argument("--configs", type=int, default=4, help="configs per task")
    parser.add_argument("--kernel", action="append", help="only these kernels (default: every registered one)")
    parser.add_argument("--case", action="append", help="KERNEL:AxB instead of random shapes")
    parser.add_argument("--target", action="append", help=f"default: {', '.join(RUN_TARGETS)} "
                        f"(--lower: {', '.join(LOWER_TARGETS)})")
    parser.add_argument("--lower", action="store_true", help="lower native builds at users' sizes, run nothing")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/cpu/space_fuzz.json")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    targets = tuple(args.target or (LOWER_TARGETS if args.lower else RUN_TARGETS))
    if args.case:
        cases = [parse_case(c) for c in args.case]
    else:
        names = args.kernel or list(kernels.REGISTRY)
        cases = [(name, random_shape(kernels.load(name), rng, USER_DIMS if args.lower else SMALL_DIMS,
                                     MAX_ELEMENTS[args.lower]))
                 for name in names for _ in range(args.shapes)]
    started, rows = time.perf_counter(), []
    for kernel, shape in cases:
        for target in targets:
            if target not in kernels.load(kernel).TARGETS:
                continue
            dtype = "bfloat16" if args.lower or target == "gpu-mosaic" else rng.choice(["float32", "bfloat16"])
            for config in draw_configs(kernel, shape, dtype, target, args.configs, rng):
                check = lower_config if args.lower else run_config
                rows.append(check(kernel, shape, dtype, target, config))
        print(f"{kernel} {'x'.join(map(str, shape))}: {len(rows)} configs so far, "
              f"{sum(map(failed, rows))} failed, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print(table(rows))
    print(f"{time.perf_counter() - started:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    tmp.replace(args.out)
    return 1 if any(failed(r) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
