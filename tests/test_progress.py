"""Progress a person and a log can read, the winners table, and `farm report`: real sweeps."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from farm import cli
from farm.bundle.records import TrialRecord
from farm.measure import outcomes
from farm.run.progress import SweepProgress
from farm.search import tasks_file
from farm.search.plan import PlannedTask
from farm.tasks import TuningTask

SPACE = """\
kernel: softmax
shapes: [[16, 128]]
dtypes: [float32]
targets: [interpret]
trials: 6
"""


def _planned(trials: int = 4) -> list[PlannedTask]:
    space = tasks_file.minimal_space("softmax", [(16, 128)], ["float32"], ["interpret"], label="t")
    return [PlannedTask(TuningTask("softmax", (16, 128), "float32", "interpret"), space, trials)]


def _record(trial: int, outcome: str, median: float | None = None) -> TrialRecord:
    return TrialRecord.for_task(TuningTask("softmax", (16, 128), "float32", "interpret"), trial, f'{{"x":{trial}}}',
                                outcome, median_s=median)


def test_counts_separate_measured_trials_asked_and_skipped():
    progress = SweepProgress(_planned(), Console(file=io.StringIO()))
    for i, (outcome, median) in enumerate([(outcomes.OK, 2e-6), (outcomes.INVALID, None), (outcomes.PRUNED, None),
                                           (outcomes.COMPILE_ERROR, None), (outcomes.CACHED, None),
                                           (outcomes.OK, 1e-6)]):
        progress.update(_record(i, outcome, median))
    s = progress.snapshot()
    assert (s["measured"], s["trials"], s["asked"], s["skipped"], s["failed"]) == (3, 4, 6, 2, 1)
    assert s["best"] == {"softmax/16x128/float32/interpret": 1e-6} and s["eta_s"] == 0.0
    line = progress.line()
    assert "4/4 trials (3 measured, 1 failed, 6 asked, 2 skipped as invalid/pruned)" in line and "1.0 us" in line


def test_the_last_line_says_how_the_sweep_ended_not_an_eta():
    progress = SweepProgress(_planned(8), Console(file=io.StringIO()))
    progress.update(_record(0, outcomes.OK, 3e-6))
    assert "ETA" in progress.line()
    progress.done = True
    assert "ETA" not in progress.line() and "under the budget: the tasks short of it had no valid config" in \
        progress.line()
    timed = SweepProgress(_planned(8), Console(file=io.StringIO()), time_budget_s=0.0)
    timed.done = True
    assert "stopped by the time budget" in timed.line()


def test_terminal_view_shows_elapsed_rate_and_eta_and_ends_its_line():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=150)
    with SweepProgress(_planned(8), console, time_budget_s=60) as progress:
        progress.mark_started()
        progress.update(_record(0, outcomes.OK, 3e-6))
    shown = out.getvalue()
    assert "elapsed" in shown and "measured/s" in shown and "ETA" in shown and "1/8" in shown
    assert shown.endswith("\n\n") or shown.rstrip(" ").endswith("\n")


def test_progress_lines_appear_while_a_sweep_runs_and_the_table_stands_apart(tmp_path, signing_key, repo):
    """`python -m farm sweep` with stderr a pipe (as in a job log): progress lines arrive on stderr
    before the sweep ends; then the winners table, on its own lines, and the report path."""
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "farm", "sweep", str(space), "--out", str(out), "--key",
                             str(signing_key[0]), "--repetitions", "2", "--progress-every", "0.5"], cwd=repo,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stderr is not None
    during = []
    for line in proc.stderr:
        if "INFO farm.run.progress: sweep:" in line and "trials (" in line:
            during.append((line, proc.poll()))
        if "sweep done:" in line:
            break
    rest = proc.stderr.read()
    stdout = proc.stdout.read() if proc.stdout else ""
    assert proc.wait(timeout=600) == 0, rest[-3000:]
    assert during and all(code is None for _, code in during), "no progress line while the sweep ran"
    lines = stdout.splitlines()
    table_end = max(i for i, line in enumerate(lines) if line.startswith("└"))
    assert lines[table_end + 1].strip().startswith("measured:") and lines[table_end + 2].strip() == ""
    assert lines[-1] == f"report: farm report {out}"
    assert "measured" in stdout and "skipped" in stdout and "vs default" in stdout
    run = json.loads((out / "run.json").read_text())
    assert run["summary"]["warm_up"], "no worker was warmed up before trial 0"


@pytest.fixture(scope="module")
def finished_run(ray_local, signing_key, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "run"
    space = out.parent / "space.yaml"
    space.write_text(SPACE)
    assert cli.main(["sweep", str(space), "--out", str(out), "--key", str(signing_key[0]), "--quiet",
                     "--repetitions", "2"]) == 0
    return out


def test_report_without_matplotlib_is_text_and_one_note(finished_run, repo):
    """matplotlib made unimportable in a real subprocess: the text report, and one line saying why
    there are no plots."""
    code = ("import sys; sys.modules['matplotlib'] = None; from farm import cli; "
            f"sys.exit(cli.main(['report', {str(finished_run)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = (finished_run / "report.md").read_text()
    assert "| softmax/16x128/float32/interpret | ok |" in report and "vs default" in report
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note:")]
    assert notes == ["note: no plots: matplotlib is not installed (pip install 'pallas-farm[plot]')"]
    assert f"report: {finished_run / 'report.md'}" in proc.stdout


def test_report_plots_best_so_far(finished_run, capsys):
    pytest.importorskip("matplotlib")
    assert cli.main(["report", str(finished_run)]) == 0
    plots = list((finished_run / "report").glob("*.png"))
    assert len(plots) == 1 and plots[0].read_bytes()[:4] == b"\x89PNG"
    assert f"plot: {plots[0]}" in capsys.readouterr().out


def test_report_of_a_folder_that_is_no_run(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "expected a run folder with trials.jsonl" in capsys.readouterr().err
    assert cli.main(["report", tmp_path.as_uri()]) == 2   # file://: the same folder, not a mangled path
    assert f"{tmp_path}: expected a run folder with trials.jsonl" in capsys.readouterr().err
    assert cli.main(["report", "gs://bucket/run"]) == 2
    assert "expected a local run folder" in capsys.readouterr().err


def test_sweep_logs_farm_info_by_default_only(tmp_path, monkeypatch):
    import logging

    root, farm_logger = logging.getLogger(), logging.getLogger("farm")
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(farm_logger, "level", farm_logger.level)
    assert cli.main(["sweep", "--kernel", "nosuch"]) == 2
    assert root.level == logging.WARNING and farm_logger.level == logging.INFO
    farm_logger.setLevel(logging.NOTSET)
    assert cli.main(["--log-level", "warning", "sweep", "--kernel", "nosuch"]) == 2
    assert farm_logger.level == logging.NOTSET


def test_report_names_the_winner_its_bundle_ships():
    """Finalists re-timed side by side (a sweep), or the promotion rule (a retune), may ship a
    config other than the fastest logged median: the report says what the bundle holds."""
    from farm.run.report import task_reports

    records = [_record(0, outcomes.OK, 2e-3), _record(1, outcomes.OK, 1e-3)]
    fastest, = task_reports(records)
    assert fastest.best.trial == 1 and fastest.best.median_s == 1e-3
    shipped = {records[0].task_key: {"config": records[0].config, "median_s": 1.5e-3}}
    kept, = task_reports(records, shipped)
    assert kept.best.trial == 0 and kept.best.median_s == 1.5e-3
