"""The user's loop end to end, as bench/user_loop.py runs it: run a model once recording what it
asked for, tune exactly that (`farm sweep --tasks`), pull the signed bundle, run tuned."""
from __future__ import annotations

import json
import os
import subprocess
import sys


def test_record_sweep_pull_and_run_tuned(tmp_path, repo):
    env = {**os.environ, "RAY_ADDRESS": ""}   # the loop's sweep starts its own local Ray
    proc = subprocess.run([sys.executable, str(repo / "bench" / "user_loop.py"), "--out", str(tmp_path / "loop"),
                           "--small", "--time-budget", "10"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recorded = [json.loads(line) for line in (tmp_path / "loop" / "misses.jsonl").read_text().splitlines()]
    assert {(r["kernel"], tuple(r["shape"])) for r in recorded} == {("rms_norm", (32, 384)), ("swiglu", (2, 16, 256)),
                                                                  ("softmax", (16, 300))}
    assert all(r["rule"] == "default" for r in recorded)        # nothing was tuned on the first run
    rows = json.loads((tmp_path / "loop" / "user_loop.json").read_text())["rows"]
    assert len(rows) == 3 and all(r["rule"] == "exact" for r in rows)   # the second run runs tuned configs
    assert all(r["numerics_error"] < 1e-4 for r in rows)
