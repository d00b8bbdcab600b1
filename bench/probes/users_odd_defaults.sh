# Every GPU kernel's default config, and one more config the search draws, at users' odd shapes
# (bench/tasks/users_odd_shapes.jsonl: widths such as 4224, 6400, 11008, 50257; rows such as 1000,
# 1001, 3000), on both GPU targets: a farm sweep of 2 trials a task, each trial validated against
# the float32 reference with poisoned outputs. Then bench/sweep_summary.py's table (a task whose
# trials all fail shows as `no ok trial`). Usage: [TRIALS=N] [SWEEP_TIMEOUT=S] bash THIS [TASKS.jsonl]
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
tasks=${1:-bench/tasks/users_odd_shapes.jsonl}
python3 -m farm keygen /tmp/probe_key.pem >/dev/null  # a throwaway key: the bundle is signed
timeout ${SWEEP_TIMEOUT:-480} python3 -m farm sweep --tasks $tasks --trials ${TRIALS:-2} --key /tmp/probe_key.pem --out $OUT/run --quiet 2>&1 | tail -5
python3 bench/sweep_summary.py $OUT/run --json $OUT/summary.json
python3 - "$OUT/run" <<'PY'
import json, pathlib, sys
from farm.bundle.records import TrialRecord
from farm.measure.outcomes import FAILURES
for path in sorted(pathlib.Path(sys.argv[1]).rglob("trials.jsonl")):  # each failed trial and its config
    for t in map(TrialRecord.from_dict, map(json.loads, path.read_text().splitlines())):
        if t.outcome in FAILURES:
            print("FAILED", t.kernel, t.shape, t.target, "trial", t.trial, t.outcome, t.config, str(t.error)[:400])
PY
(cd $OUT && tar czf run.tgz run && rm -rf run)
