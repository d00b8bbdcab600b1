"""The table of a side-by-side run of two builds (bench/probes/ab_trees.sh): per case and
config, each round's kernel time per call (CUPTI, us) in build A and build B, and B / A of
their medians.

    python3 bench/probes/ab_summary.py OUT [--a base --b patched]

OUT holds A1, A2, ... and B1, B2, ... folders (one per round) of bench/kernel_profile.py JSONs,
one per case, named alike in every round.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path


def rounds(out: Path, prefix: str) -> list[Path]:
    """OUT's folders of one build, in round order (prefix followed by the round number)."""
    found = [p for p in out.iterdir() if p.is_dir() and re.fullmatch(re.escape(prefix) + r"\d+", p.name)]
    return sorted(found, key=lambda p: int(p.name[len(prefix):]))


def times(folders: list[Path]) -> dict[tuple[str, str], list[float]]:
    """(case file, config) -> its kernel time per call in each round that has it."""
    table: dict[tuple[str, str], list[float]] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            for row in json.loads(path.read_text()).get("rows", []):
                if row.get("sum_us_per_call") is not None:
                    table.setdefault((path.stem, row["config"]), []).append(float(row["sum_us_per_call"]))
    return table


def summary(out: Path, a: str = "base", b: str = "patched") -> str:
    """The Markdown table comparing build `a` with build `b` under OUT."""
    ta, tb = times(rounds(out, a)), times(rounds(out, b))
    if not ta or not tb:
        raise SystemExit(f"{out}: no {a}N/ and {b}N/ folders of kernel_profile JSONs")
    lines = [f"| case | config | {a} (us) | {b} (us) | {b} / {a} |", "|---|---|---|---|---|"]
    for key in sorted(set(ta) | set(tb)):
        xs, ys = ta.get(key, []), tb.get(key, [])
        ratio = f"{statistics.median(ys) / statistics.median(xs):.3f}" if xs and ys else ""
        cells = [", ".join(f"{v:.1f}" for v in vs) for vs in (xs, ys)]
        lines.append(f"| {key[0]} | `{key[1]}` | {cells[0]} | {cells[1]} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--a", default="base", help="the first build's folder prefix (default base)")
    parser.add_argument("--b", default="patched", help="the second build's folder prefix (default patched)")
    args = parser.parse_args(argv)
    text = summary(args.out, args.a, args.b)
    print(text)
    (args.out / f"ab_{args.a}_{args.b}.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
