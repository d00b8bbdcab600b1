"""How disturbed a sweep's timings were: per run folder, trials timed, how many have a spread
(p75 - p25 over the median) above 0.3, how many a worker timed again with nothing compiling
(`retimed_quiet`), and the fastest five medians (ms) with their configs.
Usage: python3 bench/probes/trial_noise.py RUN_DIR..."""
import json
import sys
from pathlib import Path

for folder in sys.argv[1:]:
    for path in sorted(Path(folder).rglob("trials.jsonl")):
        rows = [json.loads(line) for line in path.open()]
        timed = [r for r in rows if r.get("median_s")]
        noisy = [r for r in timed if (r.get("spread") or 0) > 0.3]
        retimed = [r for r in timed if r.get("retimed_quiet")]
        best = sorted(timed, key=lambda r: r["median_s"])[:5]
        print(f"{path}: {len(timed)} timed, {len(noisy)} with spread > 0.3, {len(retimed)} timed again quietly "
              f"(disturbed); fastest: "
              + ", ".join(f"{r['median_s'] * 1e3:.3f} {r['config']}" for r in best))
