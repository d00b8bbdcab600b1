"""Print a sweep's trials (run folder's trials.jsonl) as a table, fastest first: config knobs,
median, min, spread, samples, whether cut short. Usage: python3 bench/probes/trial_table.py RUN_DIR"""
import json
import sys
from pathlib import Path

for path in sorted(Path(sys.argv[1]).rglob("trials.jsonl")):
    rows = [json.loads(line) for line in path.open()]
    print(f"{path}: {len(rows)} trials")
    for r in sorted(rows, key=lambda r: r.get("median_s") or 1e9):
        c = json.loads(r["config"])
        knobs = " ".join(f"{k}={v}" for k, v in sorted(c.items()) if k not in ("block_rows", "piece_cols", "slots"))
        med, low = (r.get("median_s") or 0) * 1e3, (r.get("min_s") or 0) * 1e3
        print(f"  {r['trial']:3d} {r['outcome']:12s} {med:9.3f} {low:9.3f} {r.get('spread') or 0:7.2f} "
              f"{r.get('n_timed') or 0:3d} {'cut' if r.get('cut_short') else '   '} {knobs}")
