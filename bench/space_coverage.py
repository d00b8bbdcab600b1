"""What each kernel's shipped search space holds at users' shapes: per target, how many configs its
constraints and the kernel admit, and whether the kernel's default is among them. A task whose
space holds none is answered `invalid` by a sweep (no tuned config for that shape); a default
outside the space is never measured by a sweep. CPU only, no compiling. Prints a table and writes
its rows (JSON).

    python bench/space_coverage.py [--case KERNEL:AxBxC ...] [--target tpu ...] [--dtype float32]
        [--out FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels  # noqa: E402
from bench.tpu_deviceless import USER_CASES, parse_case  # noqa: E402
from farm.search.spaces import load_space  # noqa: E402
from farm.search.valid_set import ValidSet  # noqa: E402
from kernels.protocol import task_default  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Row:
    """One task: the configs its space admits (-1: too many to enumerate) and the default's place."""

    kernel: str
    shape: tuple[int, ...]
    target: str
    dtype: str
    configs: int
    default: str   # "in the space", "refused by the kernel", or the constraint it breaks


def coverage(kernel: str, shape: tuple[int, ...], target: str, dtype: str) -> Row:
    """The space's configs at `shape` on `target` (constraints and the kernel's own check) and
    where the kernel's default stands."""
    space = load_space(ROOT / "search_spaces" / f"{kernel}.yaml")
    module = kernels.load(kernel)
    valid = ValidSet.enumerate(space.params_for(target), space.leaf_check(shape, dtype, target),
                               space.prefix_checks(shape, dtype, target))
    default = task_default(module, shape, target, dtype)
    refusal = module.check_config(default, shape, dtype, target)
    broken = space.violated(default, shape, dtype, target)
    where = "refused by the kernel" if refusal else "in the space" if broken is None else f"breaks {broken}"
    return Row(kernel, shape, target, dtype, -1 if valid is None else len(valid), where)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append",
                        help="KERNEL:AxBxC (default: bench/tpu_deviceless.py's users' cases)")
    parser.add_argument("--target", action="append", help="only these targets (default: each space's, but interpret)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, default=Path("bench/results/cpu/space_coverage.json"))
    args = parser.parse_args()
    rows: list[Row] = []
    print(f"{'kernel':26} {'shape':20} {'target':11} {'configs':>7}  default")
    for kernel, shape in (parse_case(c) for c in (args.case or USER_CASES)):
        space = load_space(ROOT / "search_spaces" / f"{kernel}.yaml")
        for target in (t.name for t in space.targets):
            if (args.target and target not in args.target) or (not args.target and target == "interpret"):
                continue
            row = coverage(kernel, shape, target, args.dtype)
            rows.append(row)
            count = "many" if row.configs < 0 else str(row.configs)
            print(f"{kernel:26} {'x'.join(map(str, shape)):20} {target:11} {count:>7}  {row.default[:90]}")
    empty = [r for r in rows if r.configs == 0]
    outside = [r for r in rows if r.default.startswith("breaks")]
    print(f"{len(rows)} tasks: {len(empty)} with no config in the space, {len(outside)} whose default is outside it")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
