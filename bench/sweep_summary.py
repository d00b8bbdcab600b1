"""Summarise a sweep's run folder: per task, the outcomes, the winner's and the default's times and
their throughput (GB/s of the kernel's `bytes_moved`, TFLOP/s of its `flops`).

    python bench/sweep_summary.py RUN_DIR [--json OUT.json]

Prints a table and, with --json, writes the rows. A first check of a sweep on new hardware or
after a refactor: a task whose trials all fail shows up as `no ok trial`.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow.parquet as pq  # noqa: E402

import kernels  # noqa: E402


def summarize(run_dir: Path) -> list[dict]:
    """One row per task of the run's bundle."""
    configs = pq.read_table(run_dir / "bundle" / "configs.parquet").to_pylist()
    trials = pq.read_table(run_dir / "bundle" / "trials.parquet").to_pylist()
    by_task: dict[str, list[dict]] = {}
    for t in trials:
        by_task.setdefault(t["task_key"], []).append(t)
    rows = []
    for c in configs:
        module = kernels.load(c["kernel"])
        shape, counts = tuple(c["shape"]), Counter(t["outcome"] for t in by_task.get(c["task_key"], []))
        best = c.get("median_s")
        default = c.get("default_median_s")
        errors = sorted({(t.get("error") or "").splitlines()[0][:160] for t in by_task.get(c["task_key"], [])
                         if t["outcome"] not in ("ok", "cached", "invalid", "pruned") and t.get("error")})
        rows.append({
            "task": c["task_key"], "status": c["status"], "outcomes": dict(counts),
            "best_us": best and best * 1e6, "default_us": default and default * 1e6,
            "best_gbps": best and module.bytes_moved(shape, c["dtype"]) / best / 1e9,
            "best_tflops": best and module.flops(shape) / best / 1e12,
            "numerics_error": c.get("numerics_error"), "config": c.get("config"), "errors": errors[:3],
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = summarize(args.run_dir)
    print(f"{'task':58s} {'status':16s} {'best us':>10s} {'default us':>10s} {'GB/s':>8s} {'TFLOP/s':>8s}  outcomes")
    for r in rows:
        fmt = (lambda v, f: format(v, f) if v is not None else "-")
        print(f"{r['task']:58s} {r['status']:16s} {fmt(r['best_us'], '10.1f')} {fmt(r['default_us'], '10.1f')} "
              f"{fmt(r['best_gbps'], '8.0f')} {fmt(r['best_tflops'], '8.1f')}  "
              + ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items())))
        for e in r["errors"]:
            print(f"    ! {e}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
