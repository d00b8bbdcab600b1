"""Fault tolerance with the real Ray: hangs, crashes, killed workers, a killed driver."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from farm.measure import outcomes
from farm.search.searcher import OUTSIDE_STUDY
from tests.sweeps import run_sweep, space

FAULTS = space("tests.fixtures.faulty_softmax", [[16, 128]], trials=4, block_rows=[8],
               fault=["none", "hang_compile", "hang_device", "crash"])


def test_hangs_and_crashes_are_recorded_and_the_sweep_finishes(ray_local, tmp_path, signing_key):
    out, trials = run_sweep(tmp_path, signing_key, FAULTS, "--compile-timeout", "4", "--timing-timeout", "4",
                         "--workers", "2")
    by_fault = {json.loads(t["config"])["fault"]: t for t in trials}
    assert by_fault["none"]["outcome"] == outcomes.OK
    assert by_fault["hang_compile"]["outcome"] == outcomes.TIMEOUT
    assert "compile exceeded 4 s" in by_fault["hang_compile"]["error"]
    assert by_fault["hang_device"]["outcome"] == outcomes.TIMEOUT
    assert "worker killed and replaced" in by_fault["hang_device"]["error"]
    crash = by_fault["crash"]
    assert crash["outcome"] == outcomes.WORKER_LOST and crash["attempt"] == 2
    assert "quarantined after killing 2 workers" in crash["error"]
    row = pq.read_table(out / "bundle" / "configs.parquet").to_pylist()[0]
    assert row["status"] == "ok" and json.loads(row["config"])["fault"] == "none"


def test_a_trial_whose_worker_died_once_is_requeued(ray_local, tmp_path, signing_key):
    marker = tmp_path / "crashed-once"
    _, trials = run_sweep(tmp_path, signing_key, space("tests.fixtures.faulty_softmax", [[16, 128]], trials=2,
                                                       sampler=None, block_rows=[8], fault=["crash_once"],
                                                       marker=[str(marker)]))
    assert marker.exists()
    drawn = [t for t in trials if t["trial"] != OUTSIDE_STUDY]   # beside the kernel's default (fault "none")
    assert [(t["outcome"], t["attempt"]) for t in drawn] == [(outcomes.OK, 2)]


def test_a_task_whose_reference_fails_stops_and_the_others_go_on(ray_local, tmp_path, signing_key, capsys):
    """A reference that cannot be computed (the host out of memory) fails every config of its task
    alike: after two such trials the task is asked for no more and ends no_valid_config, saying why;
    the sweep's other task spends its whole budget."""
    from farm.run.sweep import REFERENCE_FAILURES_TO_STOP
    from tests.fixtures.faulty_softmax import REFERENCE_OOM_ROWS

    out, trials = run_sweep(tmp_path, signing_key, space(
        "tests.fixtures.faulty_softmax", [[REFERENCE_OOM_ROWS, 128], [16, 128]], trials=6,
        block_rows=[8, 16, 32, 64, 128, 256], fault=["none"]), "--workers", "1")
    doomed = [t for t in trials if f"/{REFERENCE_OOM_ROWS}x128/" in t["task_key"]]
    assert {t["outcome"] for t in doomed} == {outcomes.RUN_ERROR}
    assert all(t["error"].startswith(outcomes.REFERENCE_FAILED) and "host out of memory" in t["error"]
               for t in doomed)
    assert REFERENCE_FAILURES_TO_STOP <= len(doomed) < 6, "the task went on after its reference failed"
    others = [t for t in trials if "/16x128/" in t["task_key"]]
    assert len([t for t in others if t["outcome"] == outcomes.OK]) >= 6
    rows = {r["task_key"].split("/")[1]: r for r in pq.read_table(out / "bundle" / "configs.parquet").to_pylist()}
    assert rows[f"{REFERENCE_OOM_ROWS}x128"]["status"] == "no_valid_config" and rows["16x128"]["status"] == "ok"
    stopped = json.loads((out / "run.json").read_text())["summary"]["stopped_tasks"]
    assert list(stopped) == [doomed[0]["task_key"]] and "host out of memory" in stopped[doomed[0]["task_key"]]
    # The sweep's output and the report say why the task has no config (not only trials.jsonl).
    assert f"note: {doomed[0]['task_key']}: no config ran correctly; {len(doomed)} of its {len(doomed)} failed " \
           f"configs: run_error: {outcomes.REFERENCE_FAILED}MemoryError" in capsys.readouterr().err
    from farm import cli

    assert cli.main(["report", str(out), "--allow-kernel-module"]) == 0
    text = (out / "report.md").read_text()
    assert "## Tasks with no valid config" in text and "MemoryError: host out of memory" in text


def _worker_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"ray::Worker" in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_killing_worker_processes_loses_no_trial(ray_local, tmp_path, signing_key):
    killed: list[int] = []

    def kill_workers_mid_sweep():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            log = tmp_path / "run" / "trials.jsonl"
            if log.exists() and log.read_text().count("\n") >= 2:
                for pid in _worker_pids():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_workers_mid_sweep)
    killer.start()
    _, trials = run_sweep(tmp_path, signing_key, space("matmul", [[64, 64, 64]], trials=12, block_m=[8, 16, 32, 64],
                                                       block_n=[16, 32, 64], block_k=[64]))
    killer.join()
    assert killed, "no worker process was found to kill"
    measured = [t for t in trials if t["outcome"] in outcomes.MEASURED]
    assert Counter(t["outcome"] for t in measured) == {outcomes.OK: 12}
    assert len({t["config"] for t in measured}) == 12


RESUME_SPACE = space("tests.fixtures.faulty_softmax", [[16, 128]], trials=9, block_rows=[8, 16],
                     fault=["slow"], delay_ms=[0, 10, 20, 40])


def _farm(args, repo, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "farm", "sweep", *args], cwd=repo, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)


def _measured(run: Path) -> dict[str, list[str]]:
    records = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    found: dict[str, list[str]] = {}
    for r in records:
        if r["outcome"] in outcomes.MEASURED:
            found.setdefault(r["task_key"], []).append(r["config"])
    return found


def test_killed_driver_resumes_without_measuring_anything_twice(tmp_path, signing_key, repo):
    space = tmp_path / "space.yaml"
    space.write_text(RESUME_SPACE)
    common = ["--key", str(signing_key[0]), "--quiet", "--repetitions", "2", "--workers", "1"]

    killed = tmp_path / "killed"
    proc = _farm([str(space), "--out", str(killed), *common], repo)
    log = killed / "trials.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (log.exists() and log.read_text().count("\n") >= 3):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the embedded Ray it started
    proc.wait(timeout=60)
    before = _measured(killed)
    assert 3 <= sum(map(len, before.values())) < 9

    proc = _farm(["--resume", str(killed), *common], repo)
    assert proc.wait(timeout=600) == 0, proc.stderr.read()[-2000:]
    after = _measured(killed)
    for task, configs in after.items():
        assert len(configs) == len(set(configs)), f"{task}: a config was measured twice"
        assert configs[:len(before.get(task, []))] == before.get(task, [])
    # The budget (9 trials a task) is the kernel's default (fault "none", outside this space) and
    # the whole grid: every config measured once, as in a run that was never killed.
    grid = {(rows, delay) for rows in (8, 16) for delay in (0, 10, 20, 40)}
    assert len(after) == 1
    for task, configs in after.items():
        loaded = [json.loads(c) for c in configs]
        assert [c for c in loaded if c["fault"] == "none"] == [{"block_rows": 8, "fault": "none"}], task
        assert {(c["block_rows"], c["delay_ms"]) for c in loaded if c["fault"] == "slow"} == grid, task

    # Each delay step adds 10 ms per call, far beyond timing noise, so the winners have no delay
    # (block_rows, a close race, may legitimately go either way; so may the default, which never sleeps).
    rows = pq.read_table(killed / "bundle" / "configs.parquet").to_pylist()
    assert {r["task_key"]: json.loads(r["config"]).get("delay_ms", 0) for r in rows} == {k: 0 for k in after}
