"""End to end with the real parts: Ray, Optuna, JAX Pallas (interpret mode), Parquet, Ed25519."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import optuna
import pyarrow.parquet as pq
import pytest

from farm import cli
from farm.bundle import trust
from farm.measure import outcomes, timing
from farm.run.sweep import RACE_AFTER, SweepSettings
from farm.run.sweep import run_sweep as run_planned
from farm.search import plan, spaces, studies
from farm.search.searcher import OUTSIDE_STUDY
from tests.sweeps import run_sweep, space


def _ok_configs(rows):
    return [r for r in rows if r["outcome"] == outcomes.OK]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, signing_key, repo):
    """`python -m farm sweep` over softmax and matmul x two shapes, on its own embedded Ray."""
    out = tmp_path_factory.mktemp("sweep") / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "farm", "sweep", "search_spaces/softmax.yaml", "search_spaces/matmul.yaml",
         "--target", "interpret", "--trials", "6", "--repetitions", "3", "--out", str(out),
         "--key", str(signing_key[0])],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_sweep_writes_a_bundle_that_verifies(demo_run, signing_key):
    out, proc = demo_run
    manifest = trust.verify(out / "bundle", trust.load_trust([signing_key[1]])).manifest
    assert set(manifest["files"]) == {"configs.parquet", "trials.parquet"}
    assert "winners" in proc.stdout and "softmax/64x256/float32/interpret" in proc.stdout


def test_winner_is_the_fastest_ok_trial_of_each_task(demo_run):
    out, _ = demo_run
    configs = pq.read_table(out / "bundle" / "configs.parquet").to_pylist()
    trials = pq.read_table(out / "bundle" / "trials.parquet").to_pylist()
    assert sorted(r["task_key"] for r in configs) == sorted([
        "softmax/64x256/float32/interpret", "softmax/128x512/float32/interpret",
        "matmul/128x128x128/float32/interpret", "matmul/256x128x256/float32/interpret"])
    for row in configs:
        ok = _ok_configs(t for t in trials if t["task_key"] == row["task_key"])
        fastest = min(ok, key=lambda t: t["median_s"])
        assert row["status"] == "ok"
        assert row["config"] == fastest["config"] and row["median_s"] == fastest["median_s"]
        counts = json.loads(row["outcome_counts"])
        assert row["trials"] == 6 == sum(v for k, v in counts.items() if k != outcomes.INVALID)
        assert json.loads(row["software"])["jax"] and row["device_kind"] == "cpu"


def test_trials_table_holds_every_trial(demo_run):
    out, _ = demo_run
    trials = pq.read_table(out / "bundle" / "trials.parquet").to_pylist()
    log = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert len(trials) == len(log)
    store = studies.storage(out)
    for summary in optuna.get_all_study_summaries(store):
        study = optuna.load_study(study_name=summary.study_name, storage=store)
        in_table = {t["trial"] for t in trials if t["task_key"] == summary.study_name}
        assert in_table == {t.number for t in study.trials}
        assert all(t.state.is_finished() for t in study.trials)


def test_no_config_is_measured_twice_per_task(demo_run):
    out, _ = demo_run
    trials = pq.read_table(out / "bundle" / "trials.parquet").to_pylist()
    measured = Counter((t["task_key"], t["config"]) for t in trials if t["outcome"] in outcomes.MEASURED)
    assert measured and max(measured.values()) == 1
    for t in trials:
        if t["outcome"] == outcomes.CACHED:
            assert (t["task_key"], t["config"]) in measured


def test_show_prints_the_winners(demo_run, signing_key, capsys):
    out, _ = demo_run
    assert cli.main(["show", str(out / "bundle"), "--trust", str(signing_key[1])]) == 0
    shown = capsys.readouterr().out
    assert "matmul/256x128x256/float32/interpret" in shown and "block_m=" in shown


WRONG_SPACE = space("tests.fixtures.wrong_softmax", [[32, 128], [64, 128]], trials=6, block_rows=[8, 16],
                    variant=["correct", "copy", "partial"])


def test_wrong_config_is_recorded_and_never_wins(ray_local, tmp_path, signing_key):
    out, trials = run_sweep(tmp_path, signing_key, WRONG_SPACE, "--repetitions", "3")
    by_variant = Counter((json.loads(t["config"])["variant"], t["outcome"]) for t in trials)
    assert by_variant[("copy", outcomes.WRONG_RESULT)] == 4
    assert by_variant[("partial", outcomes.WRONG_RESULT)] == 4
    assert by_variant[("correct", outcomes.OK)] == 4
    for row in pq.read_table(out / "bundle" / "configs.parquet").to_pylist():
        assert json.loads(row["config"])["variant"] == "correct"
        assert json.loads(row["outcome_counts"])[outcomes.WRONG_RESULT] == 4


def test_failures_do_not_stop_the_sweep(ray_local, tmp_path, signing_key):
    _, trials = run_sweep(tmp_path, signing_key, space("matmul", [[64, 64, 64]], trials=3, block_m=[64],
                                                       block_n=[64], block_k=[64], epi_n=[32, 48, 64]))
    # epi_n = 48 does not divide block_n: the kernel's check_config refuses it, so it is never drawn
    # (the task's valid set holds the two legal configs) and never compiled. The kernel's default
    # sets knobs this space does not tune: it is measured too, outside the study (trial -1).
    assert Counter(t["outcome"] for t in trials) == {outcomes.OK: 3}
    drawn = [t for t in trials if t["trial"] != OUTSIDE_STUDY]
    assert sorted(json.loads(t["config"])["epi_n"] for t in drawn) == [32, 64]


def test_a_compile_error_is_data_and_the_sweep_goes_on(ray_local, tmp_path, signing_key):
    _, trials = run_sweep(tmp_path, signing_key, space("tests.fixtures.faulty_softmax", [[16, 128]], trials=2,
                                                       block_rows=[8], fault=["compile_error", "none"]))
    assert Counter(t["outcome"] for t in trials) == {outcomes.OK: 1, outcomes.COMPILE_ERROR: 1}
    failed = next(t for t in trials if t["outcome"] == outcomes.COMPILE_ERROR)
    assert json.loads(failed["config"])["fault"] == "compile_error" and "compiler rejects it" in failed["error"]


def test_a_space_that_rejects_almost_every_config_still_makes_progress(ray_local, tmp_path, signing_key):
    # One config of 64 satisfies the constraint: the task's valid set holds it alone, so it is
    # measured and the task ends: no draw is wasted. Beside it, the kernel's default (which sets
    # knobs this space does not tune), measured outside the study.
    _, trials = run_sweep(tmp_path, signing_key, space(
        "matmul", [[64, 64, 64]], trials=2, sampler=None, constraints=["block_m * block_n * block_k == 64 * 64 * 64"],
        block_m=[8, 16, 32, 64], block_n=[8, 16, 32, 64], block_k=[8, 16, 32, 64]))
    counts = Counter(t["outcome"] for t in trials)
    assert counts == {outcomes.OK: 2}
    drawn = next(t for t in trials if t["trial"] != OUTSIDE_STUDY)
    assert json.loads(drawn["config"]) == {"block_m": 64, "block_n": 64, "block_k": 64}


def test_a_time_budget_stops_asking_and_still_writes_a_bundle(ray_local, tmp_path, signing_key):
    # 64 configs cannot all be compiled and timed in 2 s on CPU; the budget stops the asking, the
    # trials in flight finish and the bundle holds the best of what was measured.
    out, trials = run_sweep(tmp_path, signing_key, space(
        "matmul", [[64, 64, 64]], trials=64, block_m=[8, 16, 32, 64], block_n=[8, 16, 32, 64],
        block_k=[8, 16, 32, 64]), "--time-budget", "2")
    measured = [t for t in trials if t["outcome"] in outcomes.MEASURED]
    assert 0 < len(measured) < 64
    assert json.loads((out / "run.json").read_text())["summary"]["stopped_by_time_budget"] is True
    row = pq.read_table(out / "bundle" / "configs.parquet").to_pylist()[0]
    assert row["status"] == "ok" and row["trials"] == len(measured)


def test_the_default_config_is_measured_first_and_reported(demo_run):
    # Every kernel's default is a point of its spaces (tests/test_default_configs.py), so the
    # driver queues it as trial 0 and the bundle says how much tuning gained over it.
    out, _ = demo_run
    configs = pq.read_table(out / "bundle" / "configs.parquet").to_pylist()
    trials = pq.read_table(out / "bundle" / "trials.parquet").to_pylist()
    for row in configs:
        first = next(t for t in trials if t["task_key"] == row["task_key"] and t["trial"] == 0)
        assert first["config"] == row["default_config"] and first["outcome"] == outcomes.OK
        assert row["default_median_s"] == first["median_s"] and row["median_s"] <= row["default_median_s"]


def test_a_default_the_space_leaves_out_is_measured_and_wins_when_fastest(ray_local, tmp_path, signing_key):
    # The space holds only a config that sleeps 20 ms a call; the kernel's default (fault "none")
    # is no point of it. It is measured anyway, outside the study, and the bundle keeps it: tuning
    # never ships a config slower than the default a deployment would run untuned.
    out, trials = run_sweep(tmp_path, signing_key, space("tests.fixtures.faulty_softmax", [[16, 128]], trials=3,
                                                         block_rows=[8], fault=["slow"], delay_ms=[20]))
    default = next(t for t in trials if t["trial"] == OUTSIDE_STUDY)
    assert json.loads(default["config"]) == {"block_rows": 8, "fault": "none"} and default["outcome"] == outcomes.OK
    assert [json.loads(t["config"])["fault"] for t in trials if t["trial"] != OUTSIDE_STUDY] == ["slow"]
    study = optuna.load_study(study_name=default["task_key"], storage=studies.storage(out))
    assert [t.params for t in study.trials] == [{"block_rows": 8, "fault": "slow", "delay_ms": 20}]
    row = pq.read_table(out / "bundle" / "configs.parquet").to_pylist()[0]
    assert row["config"] == row["default_config"] == default["config"]
    assert row["median_s"] == row["default_median_s"] == default["median_s"]


def test_racing_cuts_short_only_configs_slower_than_the_best_so_far(ray_local, tmp_path):
    # race=1e-9: a config asked once RACE_AFTER configs measured ok is slower than 1e-9 x the best
    # so far, so it is cut after timing.RACE_SAMPLES samples; race=None times every config in full.
    text = space("matmul", [[64, 64, 64]], trials=7, block_m=[8, 16, 32, 64], block_n=[16, 32], block_k=[16])
    (tmp_path / "space.yaml").write_text(text)
    planned = plan.expand([spaces.load_space(tmp_path / "space.yaml")])
    for race in (1e-9, None):
        settings = SweepSettings(run_dir=tmp_path / f"run-{race}", interpret=True, repetitions=5, depth=1,
                                 race=race, sample_budget_s=None)
        ok = [r for r in run_planned(planned, settings, None).records if r.outcome == outcomes.OK]
        assert len(ok) == 7
        ok.sort(key=lambda r: r.trial)   # depth 1: asked in trial order
        cut = [r.cut_short for r in ok]
        if race is None:
            assert not any(cut) and all(r.n_timed == 5 for r in ok)
            continue
        # The ask after the third ok result may leave before that result is told (one flight ahead).
        assert not any(cut[:RACE_AFTER]) and all(cut[RACE_AFTER + 1:]), cut
        assert all(r.n_timed == (timing.RACE_SAMPLES if r.cut_short else 5) for r in ok)
