"""How well the footprint model predicts the compiler: fit / no-fit agreement, from sweep logs.

    python bench/oom_report.py RUN_DIR... [--out FILE.json]

Use run folders of sweeps made with static pruning off (`bench/gpu_suite.py --no-static-pruning
--sampler random`), so that configs the model says cannot fit were compiled anyway. A trial's
model verdict is footprint_bytes <= capacity_bytes; the compiler's verdict is `oom` (did not
fit) or `ok` / `wrong_result` / `run_error` (it fit). Compile errors for other reasons, time-outs
and lost workers give no verdict and are counted apart. Also reports, for sweeps with pruning on,
the share of compiles that ended in `oom`.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

FIT = ("ok", "wrong_result", "run_error")


def analyse(records: list[dict]) -> dict:
    """Agreement counts between the model and the compiler."""
    table: Counter = Counter()
    per_kernel: dict[str, Counter] = {}
    for r in records:
        if r.get("footprint_bytes") is None or r.get("capacity_bytes") is None:
            continue
        if r["outcome"] == "pruned":
            table["pruned"] += 1
            continue
        model_fits = r["footprint_bytes"] <= r["capacity_bytes"]
        if r["outcome"] == "oom":
            actual = False
        elif r["outcome"] in FIT:
            actual = True
        else:
            table[f"no verdict ({r['outcome']})"] += 1
            continue
        key = "agree" if model_fits == actual else ("model says fits, oom" if model_fits else "model says no fit, fits")
        table[key] += 1
        per_kernel.setdefault(r["kernel"], Counter())[key] += 1
    judged = table["agree"] + table["model says fits, oom"] + table["model says no fit, fits"]
    compiles = sum(1 for r in records if r["outcome"] in ("ok", "wrong_result", "run_error", "oom", "compile_error"))
    return {"judged": judged, "agreement": table["agree"] / judged if judged else None, "counts": dict(table),
            "per_kernel": {k: dict(v) for k, v in per_kernel.items()},
            "oom_share_of_compiles": sum(r["outcome"] == "oom" for r in records) / compiles if compiles else None,
            "compiles": compiles}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    records = []
    for run in args.runs:
        for log in sorted(run.rglob("trials.jsonl")):
            records += [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    result = analyse(records)
    agreement = result["agreement"]
    shown = "-" if agreement is None else f"{agreement:.1%}"
    print(f"trials judged: {result['judged']}, model/compiler agreement: {shown}")
    print(f"compiles: {result['compiles']}, ending in oom: {result['oom_share_of_compiles']}")
    for key, value in sorted(result["counts"].items()):
        print(f"  {key}: {value}")
    for kernel, counts in sorted(result["per_kernel"].items()):
        print(f"  {kernel}: {dict(counts)}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
