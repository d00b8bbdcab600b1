"""What a sweep's trial budget buys over a task's configs: the searcher driven on the CPU with
synthetic timings (a fixed pseudo-random time per config), as a sweep would drive it, with the
task's valid configs enumerated (`farm.search.valid_set`) and with the enumeration forced off
(rejection sampling over the product: the fallback; forcing it off acts on products over
ENUMERATION_LIMIT, as the default spaces' Mosaic GPU tasks are). Prints a table; writes JSON.

    python bench/searcher_draws.py --out OUT.json [--trials 400] [--spaces ...] [--target gpu-mosaic]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

from farm.measure import outcomes
from farm.search import spaces, valid_set
from farm.search.plan import expand
from farm.search.searcher import Answer, Searcher

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SPACES = ["matmul", "bmm", "broadcast_matmul", "matmul_subtiled_epilogue", "matmul_layernorm"]


def drive(path: Path, target: str, trials: int, enumerate_configs: bool) -> dict[str, Any]:
    """One task's searcher asked until `trials` proposals (or it ends), each told a synthetic time."""
    space = spaces.load_space(path)
    (planned,) = [p for p in expand([space], [target], trials) if p.task.target == target][:1]
    saved = valid_set.PREFIX_CHECK_LIMIT
    valid_set.PREFIX_CHECK_LIMIT = saved if enumerate_configs else 0
    try:
        started = time.perf_counter()
        searcher = Searcher.open(planned, optuna.storages.InMemoryStorage(), seed=0)
        opened_s = time.perf_counter() - started
    finally:
        valid_set.PREFIX_CHECK_LIMIT = saved
    distinct: set[str] = set()
    asked = 0
    while asked < trials and (p := searcher.ask()) is not None:
        asked += 1
        distinct.add(p.key)
        cost = 1e-3 * (1 + int(hashlib.sha1(p.key.encode()).hexdigest()[:8], 16) / 2**32)
        searcher.tell(Answer(p.trial, p.key, outcomes.OK, median_s=cost))
    return {"task": planned.task.key, "product": math.prod(len(p.choices) for p in space.params_for(target)),
            "enumerated": searcher.valid_set is not None,
            "valid_configs": len(searcher.valid_set) if searcher.valid_set is not None else None,
            "open_s": opened_s, "proposals": asked, "distinct": len(distinct), "skipped_draws": searcher.skipped}


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--target", default="gpu-mosaic")
    parser.add_argument("--spaces", nargs="*", default=DEFAULT_SPACES, help="space names under search_spaces/")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = [drive(REPO / "search_spaces" / f"{name}.yaml", args.target, args.trials, on)
            for name in args.spaces for on in (False, True)]
    print(f"{args.trials} trials a task, target {args.target}\n")
    print("| task | product | valid configs enumerated | opening (s) | configs measured (distinct) | "
          "draws skipped (invalid, repeats) |\n|---|---|---|---|---|---|")
    for r in rows:
        enumerated = r["valid_configs"] if r["enumerated"] else "no (rejection sampling)"
        print(f"| {r['task']} | {r['product']:,} | {enumerated} | {r['open_s']:.1f} "
              f"| {r['proposals']} ({r['distinct']}) | {r['skipped_draws']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"trials": args.trials, "target": args.target, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
