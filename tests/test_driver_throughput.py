"""The driver benchmark's stand-in path end to end: the real run_sweep with stand-in workers.

No timing thresholds: what is checked is behaviour (every trial measured once, logged, told).
"""
from __future__ import annotations

import json
from collections import Counter

import optuna
from optuna.trial import TrialState

from bench import driver_throughput as bench
from farm.measure import outcomes
from farm.run import runlog
from farm.search import studies

SPACES = ["search_spaces/matmul.yaml", "search_spaces/softmax.yaml"]


def test_stand_in_answers_are_deterministic(repo):
    planned = bench.planned_tasks(4, files=[str(repo / s) for s in SPACES])[0]
    config = {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 3, "group_m": 8}
    first, again = bench.synthetic(planned.task, config), bench.synthetic(planned.task, config)
    assert first == again and first.outcome in outcomes.MEASURED


def test_stand_in_sweep_measures_every_trial_once_and_logs_it(ray_local, tmp_path, repo, monkeypatch):
    monkeypatch.chdir(repo)
    planned = bench.planned_tasks(6, files=[str(repo / s) for s in SPACES])
    run_dir = tmp_path / "run"
    stats = tmp_path / "stats"
    stats.mkdir()
    worker_class = bench.stand_in(fail_share=0.2, device_s=0.001, stats_dir=stats)
    row = bench.run_once(planned, run_dir, workers=2, depth=3, worker_class=worker_class, interpret=True,
                         stats_dir=stats)
    result = row["result"]
    records = result.records
    assert [r.to_dict() for r in runlog.replay(run_dir)] == [r.to_dict() for r in records]   # all logged
    assert row["measured"] == sum(1 for r in records if r.outcome in outcomes.MEASURED) > 0
    assert row["asks"] == row["tells"] == row["measured"]
    assert "worker_class" not in json.loads((run_dir / runlog.SWEEP_FILE).read_text())["settings"]
    assert len(list(stats.glob("*.json"))) == 2 and 0.0 <= row["starved"] <= 1.0   # each stand-in's idle spans
    store = studies.storage(run_dir)
    for p in planned:
        mine = [r for r in records if r.task_key == p.task.key]
        counted = [r for r in mine if r.outcome in (*outcomes.MEASURED, outcomes.CACHED)]
        assert len(counted) == p.trials                                     # the whole budget
        measured = Counter(r.config for r in mine if r.outcome in outcomes.MEASURED)
        assert measured and max(measured.values()) == 1                     # nothing measured twice
        assert len({r.trial for r in mine}) == len(mine)
        trials = optuna.load_study(study_name=p.task.key, storage=store).get_trials(deepcopy=False)
        assert sorted(t.number for t in trials) == sorted(r.trial for r in mine)   # every trial told
        assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert {r["status"] for r in result.rows} == {"ok"}

    # A resume finds the budget spent: nothing is measured again, nothing is added to the log.
    again = bench.run_once(planned, run_dir, workers=2, depth=3, worker_class=worker_class, interpret=True,
                           resume=True)
    assert again["measured"] == 0
    assert len(runlog.replay(run_dir)) == len(records)
