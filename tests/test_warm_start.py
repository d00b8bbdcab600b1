"""`farm sweep --warm-start BUNDLE`: each task measured first at the configs the bundle tuned for
it or for its nearest shapes (what a deployment of that bundle runs there), with real Ray,
Optuna, Parquet and JAX (interpret mode)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from farm import cli
from farm.retune.nearest import nearest_seeds
from farm.retune.planning import Previous
from farm.run import report
from farm.search import plan, tasks_file
from farm.search.searcher import outside_trial
from tests import bundles as B

OWN = {"block_rows": 16, "strategy": "fori_loop", "block_cols": 128}     # tuned at 64 x 256
NEAR = {"block_rows": 32, "strategy": "one_pass", "block_cols": 128}     # tuned at 128 x 512
FAR = {"block_rows": 8, "strategy": "one_pass", "block_cols": 128}       # tuned at 4096 x 4096
NEWER = {"block_rows": 16}    # tuned at 64 x 256 later: no point of the space (the kernel fills in the rest)
ROWS = [
    B.row("softmax", (64, 256), OWN), B.row("softmax", (128, 512), NEAR), B.row("softmax", (4096, 4096), FAR),
    B.row("softmax", (64, 256), NEWER, created="2026-01-01T00:00:00+00:00"),
    B.row("softmax", (64, 256), {**FAR, "block_rows": 2}, dtype="bfloat16"),              # another dtype
    B.row("softmax", (64, 257), FAR, status="no_valid_config"),                             # never an ok row
]


def planned(*shapes):
    space = tasks_file.minimal_space("softmax", list(shapes), ["float32"], label="--kernel softmax")
    return plan.expand([space], ["interpret"], 3)


def test_each_task_starts_from_its_own_then_its_nearest_shapes_configs():
    found = nearest_seeds(Previous("b", {}, ROWS, []), planned((64, 256), (96, 512), (100, 512), (600, 4096), (8, 8)))
    seeds = found.configs
    assert seeds == {"softmax/64x256/float32/interpret": [NEWER, OWN, NEAR],   # exact (newest first), then 2
                     "softmax/96x512/float32/interpret": [NEAR, NEWER, OWN],   # 0.42, then 1.58
                     "softmax/100x512/float32/interpret": [NEAR, NEWER, OWN],  # 0.38, then 1.64
                     "softmax/600x4096/float32/interpret": [FAR]}              # 2.8 from 4096 x 4096
    assert "softmax/8x8/float32/interpret" not in seeds                        # nothing within distance 3
    # configs the task's space leaves out, measured outside its study: NEWER sets one knob, and the
    # space wants blocks that divide 100 rows (a deployment runs them all the same)
    assert found.outside == {"softmax/64x256/float32/interpret": 1, "softmax/96x512/float32/interpret": 1,
                             "softmax/100x512/float32/interpret": 3}


def test_a_sweep_measures_the_seeds_first_and_a_resume_keeps_them(tmp_path, signing_key, repo):
    private, public = B.keypair(tmp_path / "keys", "deploy")
    bundle = B.write(tmp_path / "deployed", ROWS, private)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "farm", "sweep", "--kernel", "softmax", "--shape", "64x256", "--shape",
               "96x512", "--dtype", "float32", "--target", "interpret", "--trials", "3", "--repetitions", "3",
               "--warm-start", str(bundle), "--trust", str(public), "--out", str(out), "--key", str(signing_key[0])]
    proc = subprocess.run(command, cwd=repo, env={**os.environ, "RAY_ADDRESS": ""}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 of 2 tasks start from its configs (6 in all)" in proc.stderr
    assert "2 of these config(s), of 2 task(s), lie outside the task's space" in proc.stderr
    log = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    for task, seeds in [("softmax/64x256/float32/interpret", {outside_trial(0): NEWER, 0: OWN, 1: NEAR}),
                        ("softmax/96x512/float32/interpret", {0: NEAR, outside_trial(0): NEWER, 1: OWN})]:
        # --trials 3: the seeds alone, those outside the space as trials -2, -3, ... (the study never sees them)
        assert {r["trial"]: json.loads(r["config"]) for r in log if r["task_key"] == task} == seeds, task
    saved = json.loads((out / "sweep.json").read_text())["settings"]["warm_start"]
    assert saved["softmax/64x256/float32/interpret"] == [NEWER, OWN, NEAR]
    tasks = {t.task_key: t for t in report.write_report(out).tasks}   # the winners against the first seed
    for key, first in [("softmax/64x256/float32/interpret", NEWER), ("softmax/96x512/float32/interpret", NEAR)]:
        task = tasks[key]
        assert json.loads(task.warm_start.config) == first and task.vs_warm_start >= 1.0
        assert task.vs_warm_start == task.warm_start.median_s / task.best.median_s
    assert "| warm start | vs warm start |" in (out / "report.md").read_text()
    assert cli.main(["sweep", "--resume", str(out), "--warm-start", str(bundle)]) == 2   # the run keeps its own


def test_warm_start_bad_input_names_the_flag(tmp_path, capsys):
    assert cli.main(["sweep", "--kernel", "softmax", "--shape", "64x256", "--target", "interpret", "--dry-run",
                     "--warm-start", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith("error: --warm-start ")
    assert cli.main(["sweep", "--kernel", "softmax", "--shape", "64x256", "--target", "interpret", "--dry-run",
                     "--trust", str(tmp_path)]) == 2
    assert "--trust: expected --warm-start BUNDLE too" in capsys.readouterr().err
    private, public = B.keypair(tmp_path / "keys", "a")
    other = B.keypair(tmp_path / "keys", "b")[1]
    bundle = B.write(tmp_path / "b", ROWS, private)
    assert cli.main(["sweep", "--kernel", "softmax", "--shape", "64x256", "--target", "interpret", "--dry-run",
                     "--warm-start", str(bundle), "--trust", str(other)]) == 1   # signed by an untrusted key
    assert "--warm-start" in capsys.readouterr().err
    assert cli.main(["sweep", "--kernel", "softmax", "--shape", "64x256", "--dtype", "float32", "--target",
                     "interpret", "--dry-run", "--warm-start", str(bundle)]) == 0  # unverified: read, with a warning
    out, err = capsys.readouterr()
    assert "UNVERIFIED --warm-start" in err and "1 of 1 tasks start from its configs (3 in all)" in err
    header, row = out.splitlines()[:2]   # piped: the preview's tab-separated lines
    assert header.endswith("\twarm start") and row.endswith("\t3 (1 outside the space)"), out


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_a_retune_starts_a_task_new_to_the_bundle_from_its_nearest_shapes():
    """`farm retune`: a task the previous bundle lacks keeps the space's budget, warm-started like
    `farm sweep --warm-start`; a stale task's warm start stays its previous winner."""
    from farm.retune import planning
    from farm.retune.rules import RetuneSettings

    previous = Previous("b", {}, ROWS, [])
    new, stale = planned((96, 512), (128, 512))
    on_cpu = {p.task.key: {"device_kind": "cpu"} for p in (new, stale)}   # the bundle's rows: tuned on "cpu"
    plans = planning.plan_tasks([new, stale], previous, on_cpu, RetuneSettings(top=3))
    assert plans[0].previous is None and plans[0].warm == [NEAR, NEWER, OWN]
    assert plans[0].planned.trials == new.trials                 # a new task's budget: the space's
    assert plans[1].previous is not None and plans[1].stale and plans[1].warm == [NEAR]
