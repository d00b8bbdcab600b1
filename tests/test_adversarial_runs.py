"""A run folder that a crash, a full disk or a second process leaves behind stays resumable.

Real processes and files: `python -m farm sweep` in subprocesses (each with its own embedded
Ray), torn last lines as a `kill -9` or a full disk leaves them, a stale Optuna journal lock, two
processes on one run folder, and a full disk injected at the trial log's write path (this
machine's tests cannot mount a size-limited file system everywhere).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from farm.run import runlog
from farm.search import studies
from tests.sweeps import space

SPACE = space("softmax", [[16, 128]], trials=3, block_rows=[1, 2, 4, 8], strategy=["one_pass"], block_cols=[128])
COMMON = ["--quiet", "--repetitions", "2", "--workers", "1"]


def _farm(args: list[str], repo: Path, *, prelude: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m farm ARGS` in a fresh process (its own local Ray); `prelude` runs first."""
    code = f"import sys; {prelude}\nfrom farm.cli import main\nsys.exit(main({args!r}))"
    env = {**os.environ, "RAY_ADDRESS": ""}
    return subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def one_finished_run(tmp_path_factory, signing_key, repo) -> Path:
    """A run folder of a small sweep that finished (made once for the module)."""
    folder = tmp_path_factory.mktemp("finished")
    (folder / "space.yaml").write_text(SPACE)
    run = folder / "run"
    proc = _farm(["sweep", str(folder / "space.yaml"), "--out", str(run), "--key", str(signing_key[0]), *COMMON],
                 repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run


@pytest.fixture
def finished_run(one_finished_run, tmp_path) -> Path:
    """A fresh copy of the finished run folder, for one test to damage."""
    return Path(shutil.copytree(one_finished_run, tmp_path / "run", symlinks=True))


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / runlog.TRIALS_LOG).read_text().splitlines()]


def _tear(run: Path, torn: str) -> None:
    """What a `kill -9` mid-write leaves: a half line at the end of the trial log, the journal, or both."""
    if torn in ("trials", "both"):
        with open(run / runlog.TRIALS_LOG, "a") as f:
            f.write('{"task_key": "softmax/16x128/float32/interpret", "trial": 9, "conf')
    if torn in ("journal", "both"):
        with open(run / runlog.JOURNAL, "a") as f:
            f.write('{"op_code": 5, "worker_id": "x", "trial_id": 9')


def _journal_takes_new_entries(run: Path) -> None:
    study = optuna.load_study(study_name="softmax/16x128/float32/interpret", storage=studies.storage(run))
    trial = study.ask()
    study.tell(trial, 1.0)
    assert len(optuna.load_study(study_name=study.study_name, storage=studies.storage(run)).trials) == \
        len(study.trials)


def test_a_torn_last_line_is_cut_and_the_run_resumes(finished_run, signing_key, repo):
    """Both files torn, then `farm sweep --resume` in a fresh process: every line parses again,
    nothing is measured twice, and the journal takes new entries."""
    run = finished_run
    before = _records(run)
    _tear(run, "both")
    proc = _farm(["sweep", "--resume", str(run), "--key", str(signing_key[0]), *COMMON], repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torn last line" in proc.stderr
    assert _records(run) == before                         # every line parses; nothing measured again
    _journal_takes_new_entries(run)


@pytest.mark.parametrize("torn", ["trials", "journal"])
def test_each_file_torn_alone_is_cut_before_a_resume(finished_run, torn):
    """The repair a resume runs first (`runlog.prepare_resume`), one file torn at a time: the
    other file is left as it was."""
    run = finished_run
    before = {name: (run / name).read_bytes() for name in (runlog.TRIALS_LOG, runlog.JOURNAL)}
    _tear(run, torn)
    with runlog.RunLock(run):
        runlog.prepare_resume(run)
    assert {name: (run / name).read_bytes() for name in before} == before
    _journal_takes_new_entries(run)


def test_a_stale_journal_lock_does_not_stall_a_resume(finished_run, signing_key, repo):
    lock = finished_run / f"{runlog.JOURNAL}.lock"
    lock.write_text("")   # what a process killed inside Optuna's journal lock leaves
    bundle = {p.name: p.read_bytes() for p in (finished_run / "bundle").iterdir()}
    started = time.monotonic()
    proc = _farm(["sweep", "--resume", str(finished_run), "--key", str(signing_key[0]), *COMMON], repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not lock.exists() and "stale lock" in proc.stderr
    # A finished run resumed measures nothing: its signed bundle is kept (not signed anew, which
    # would make the same winners look newer to farm pull), and the summary counts no new trial.
    assert {p.name: p.read_bytes() for p in (finished_run / "bundle").iterdir()} == bundle
    assert "unchanged: nothing was left to measure" in proc.stdout and "\n0 configs measured" in proc.stdout
    assert time.monotonic() - started < 120   # Optuna alone would wait out its grace period per access


def test_a_second_process_on_a_run_folder_is_refused(finished_run, signing_key, repo):
    with runlog.RunLock(finished_run):   # this test process sweeps the folder
        proc = _farm(["sweep", "--resume", str(finished_run), "--key", str(signing_key[0]), *COMMON], repo)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1
    assert "in use by another farm process" in err[0] and f"pid {os.getpid()}" in err[0]


# Both failures take the same path; the resume after one (the same for both) runs once.
@pytest.mark.parametrize("code,text,resume", [("ENOSPC", "No space left on device", True),
                                              ("EROFS", "Read-only file system", False)])
def test_a_full_disk_is_one_line_and_the_run_resumes_when_there_is_room(tmp_path, signing_key, repo, code, text,
                                                                        resume):
    (tmp_path / "space.yaml").write_text(SPACE)
    run = tmp_path / "run"
    # The disk fills (or turns read-only) after two records: the third write fails half-way
    # through its line. (Tests run as root, which ignores file modes: the failure is injected.)
    full_disk = (
        "import errno, farm.run.runlog as r\n"
        "count = [0]\n"
        "append = r.RunLog.append\n"
        "def full(self, record):\n"
        "    count[0] += 1\n"
        "    if count[0] > 2:\n"
        "        self._file.write('{\"torn\": ')\n"
        "        self._file.flush()\n"
        f"        raise OSError(errno.{code}, '{text}', str(self.path))\n"
        "    append(self, record)\n"
        "r.RunLog.append = full")
    proc = _farm(["sweep", str(tmp_path / "space.yaml"), "--out", str(run), "--key", str(signing_key[0]), *COMMON],
                 repo, prelude=full_disk)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert err[-1].startswith("error: ") and text in err[-1] and "--resume" in err[-1]
    assert "Traceback" not in proc.stderr
    logged = [line for line in (run / runlog.TRIALS_LOG).read_text().splitlines()]
    assert len(logged) == 3 and logged[-1] == '{"torn": '
    if not resume:
        return
    proc = _farm(["sweep", "--resume", str(run), "--key", str(signing_key[0]), *COMMON], repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = _records(run)
    measured = [(r["task_key"], r["config"]) for r in records if r["outcome"] == "ok"]
    assert len(measured) == len(set(measured)) == 3      # the budget, nothing measured twice
    assert (run / "bundle" / "manifest.sig").is_file()


def _bundle_bytes(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (run / "bundle").iterdir()}


@pytest.mark.parametrize("edit, fragment", [
    (lambda s: {**s, "tasks": {"other/1x1/float32/interpret": 2}}, "'other/1x1/float32/interpret' is not a task"),
    (lambda s: {**s, "tasks": ["softmax/16x128/float32/interpret"]}, "tasks: expected a non-empty JSON object"),
    (lambda s: {**s, "tasks": {k: "5" for k in s["tasks"]}}, "expected a budget from 1 to"),
    (lambda s: {**s, "settings": {**s["settings"], "workers": "many"}}, "--workers (workers): expected an integer"),
    (lambda s: {**s, "settings": {**s["settings"], "compile_timeout_s": "soon"}}, "--compile-timeout"),
    (lambda s: {**s, "settings": {**s["settings"], "repetitions": -3}}, "--repetitions (repetitions)"),
    (lambda s: {**s, "spaces": {"../../etc/passwd": "x"}}, "spaces: expected file names"),
])
def test_an_edited_sweep_file_is_refused_and_the_bundle_kept(finished_run, signing_key, capsys, edit, fragment):
    """A resume of a run folder whose sweep.json names other tasks would sign a bundle without the
    run's winners; settings out of their bounds would run unbounded: one line, nothing rewritten."""
    from farm import cli

    path = finished_run / runlog.SWEEP_FILE
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    before = _bundle_bytes(finished_run)
    assert cli.main(["sweep", "--resume", str(finished_run), "--key", str(signing_key[0]), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0] and runlog.SWEEP_FILE in err[0], err
    assert _bundle_bytes(finished_run) == before


@pytest.mark.parametrize("line, fragment", [
    (b'{"foo": 1}\n', "task_key: expected str"), (b"[1, 2, 3]\n", "expected a JSON object"),
    (b"\xff\xfe not text\n", "expected UTF-8 text"), (b"[" * 100_000 + b"\n", "nested too deep"),
    (None, "median_s: expected float or null"), (b"", "task_key: expected"),
])
def test_an_edited_trial_log_is_one_line_naming_its_line(finished_run, capsys, line, fragment):
    """`farm report` (and a resume, through the same reader) of a trial log someone edited."""
    from farm import cli

    log = finished_run / runlog.TRIALS_LOG
    lines = log.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[0])
    if line is None:
        line = (json.dumps({**record, "median_s": "x"}) + "\n").encode()
    elif line == b"":  # a kernel name of 1000 characters: a plot file name no file system takes
        line = (json.dumps({**record, "task_key": "k" * 1000}) + "\n").encode()
    log.write_bytes(lines[0] + line + b"".join(lines[1:]))
    assert cli.main(["report", str(finished_run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{log}:2: " in err[0] and fragment in err[0], err


def test_a_report_survives_a_run_file_of_the_wrong_shape(finished_run, capsys):
    from farm import cli

    for text in ("[1, 2]", '{"summary": [1]}', '{"summary": {"wall_s": "x", "trials_per_s": "y"}}'):
        (finished_run / runlog.RUN_INFO).write_text(text)
        assert cli.main(["report", str(finished_run)]) == 0, capsys.readouterr().err
        assert (finished_run / "report.md").is_file()
