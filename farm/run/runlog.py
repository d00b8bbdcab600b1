"""The run folder's own records: the trial log, the saved spaces and settings, run.json.

Every finished trial is appended to `trials.jsonl` (and flushed) before Optuna hears of it, so
a killed driver loses nothing it logged; `replay` reads the log back for `--resume` (a torn last
line is skipped). `save_run` copies the spaces and the settings into the run folder, so that
`load_run` repeats the sweep exactly (a space made on the command line, by `--kernel` or
`--tasks`, is saved as its resolved YAML document).
"""
from __future__ import annotations

import copy
import dataclasses
import fcntl
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from farm.bundle.artifacts import now
from farm.bundle.records import TrialRecord
from farm.errors import FarmError, show
from farm.measure.finalists import FinalTiming
from farm.search import plan, spaces
from farm.search.plan import PlannedTask
from farm.search.spaces import MAX_TRIALS

log = logging.getLogger(__name__)

TRIALS_LOG = "trials.jsonl"
LOCK = ".lock"                      # held by the one process that sweeps this run folder
JOURNAL = "optuna.journal"          # farm.search.studies.JOURNAL
# A torn last line longer than this is not repaired (it is not a line a crash left half-written).
TORN_LIMIT = 1 << 20
RUN_INFO = "run.json"
SPACES_DIR = "spaces"
SWEEP_FILE = "sweep.json"


class RunLog:
    """Append-only trial log of a run folder; use as a context manager."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / TRIALS_LOG
        self._file: IO[str] | None = None

    def __enter__(self) -> RunLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def append(self, record: TrialRecord) -> None:
        """Write one record and flush it to the OS before anyone is told."""
        assert self._file is not None, "RunLog used outside `with`"
        self._file.write(json.dumps(record.to_dict()) + "\n")
        self._file.flush()


class RunLock:
    """One process per run folder: an exclusive, non-blocking lock on RUN/.lock for a sweep's
    lifetime (the OS drops it when the process dies, so `kill -9` leaves no stale lock).

    A second `farm sweep --resume` of the same folder gets a one-line error naming the holder.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise FarmError(f"{self.path.parent}: in use by another farm process (pid {holder}); expected one "
                            f"sweep per run folder at a time") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def repair_torn_tail(path: Path) -> int:
    """Cut a last line that a crash (kill -9, a full disk) left without its newline; the bytes cut.

    Appending after such a line would glue the next record to it and break every later read.
    """
    if not path.is_file():
        return 0
    size = path.stat().st_size
    with open(path, "rb+") as f:
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        start = max(0, size - TORN_LIMIT)
        f.seek(start)
        tail = f.read()
        cut = tail.rfind(b"\n")
        if cut < 0 and start > 0:
            raise FarmError(f"{path}: its last line is over {TORN_LIMIT} bytes without a newline; expected a "
                            f"log written by farm")
        keep = start + cut + 1
        f.truncate(keep)
    log.warning("%s: cut a torn last line (%d bytes) that an interrupted run left", path, size - keep)
    return size - keep


def prepare_resume(run_dir: Path) -> None:
    """Make a run folder safe to append to (call while holding its RunLock): repair torn last
    lines of the trial log and the Optuna journal, and drop the journal's lock file, which a
    killed process leaves behind (Optuna would wait out its grace period)."""
    run_dir = Path(run_dir)
    repair_torn_tail(run_dir / TRIALS_LOG)
    repair_torn_tail(run_dir / JOURNAL)
    stale = run_dir / f"{JOURNAL}.lock"
    if stale.exists() or stale.is_symlink():
        stale.unlink()
        log.warning("%s: removed a stale lock that an interrupted run left", stale)


def replay(run_dir: Path) -> list[TrialRecord]:
    """Every record of a run folder's log, in order (none when there is no log yet). A line cut
    mid-JSON (the driver died writing it: that trial was never told) is skipped; a line that is
    not UTF-8, or JSON that is no trial record (an edited file), is a FarmError naming its line."""
    path = Path(run_dir) / TRIALS_LOG
    if not path.exists():
        return []
    records = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode()
            except UnicodeDecodeError:
                raise FarmError(f"{path}:{number}: expected UTF-8 text (a trial record as JSON)") from None
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except RecursionError:
                raise FarmError(f"{path}:{number}: expected a trial record, got JSON nested too deep") from None
            except ValueError:   # the driver died mid-line: that trial was never told
                continue
            try:
                records.append(TrialRecord.checked(data))
            except ValueError as err:
                raise FarmError(f"{path}:{number}: expected a trial record ({err})") from None
    return records


def _settings_json(settings: Any) -> dict[str, Any]:
    """The settings' saved fields as JSON values (a field with metadata `saved: False`, such as a
    benchmark's stand-in actor class, is left out)."""
    fields = {f.name: copy.deepcopy(getattr(settings, f.name)) for f in dataclasses.fields(settings)
              if f.metadata.get("saved", True)}
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in fields.items()}


def save_run(run_dir: Path, planned: Sequence[PlannedTask], settings: Any) -> None:
    """Copy the spaces and write the tasks, budgets and settings, so `load_run` repeats the sweep."""
    folder = Path(run_dir) / SPACES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    by_path = {p.space.path: p.space for p in planned}
    copies = {}
    for i, (path, space) in enumerate(by_path.items()):
        # The resolved document, not the file: a space may extend others (by relative path, or a
        # shipped space that a later version changes), or come from the command line.
        name = Path(path).name if Path(path).is_file() else f"{space.kernel.replace('/', '_')}.yaml"
        copies[path] = f"{i:02d}-{name}"
        (folder / copies[path]).write_text(yaml.safe_dump(dict(space.document), sort_keys=False))
    saved = {k: v for k, v in _settings_json(settings).items() if k not in ("run_dir", "address")}
    _write_json(Path(run_dir) / SWEEP_FILE, {
        "tasks": {p.task.key: p.trials for p in planned}, "settings": saved,
        "spaces": {copies[path]: path for path in by_path}})


def load_run(run_dir: Path) -> tuple[list[PlannedTask], dict[str, Any]]:
    """The planned tasks (with their budgets) and the settings (a dict) `save_run` wrote."""
    try:
        saved = json.loads((Path(run_dir) / SWEEP_FILE).read_text())
        budgets, settings, copies = saved["tasks"], saved["settings"], saved["spaces"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise FarmError(f"--resume {run_dir}: expected a run folder with {SWEEP_FILE} ({err!r})") from None
    where = f"--resume {run_dir}: {SWEEP_FILE}"
    for field, value, expected in (("tasks", budgets, dict), ("settings", settings, dict), ("spaces", copies, dict)):
        if not isinstance(value, expected) or not value:
            raise FarmError(f"{where}: {field}: expected a non-empty JSON object, got {show(value)}")
    for key, trials in budgets.items():
        if isinstance(trials, bool) or not isinstance(trials, int) or not 1 <= trials <= MAX_TRIALS:
            raise FarmError(f"{where}: tasks.{key}: expected a budget from 1 to {MAX_TRIALS} trials, got "
                            f"{show(trials)}")
    for name in copies:
        if not isinstance(name, str) or Path(name).name != name or not (Path(run_dir) / SPACES_DIR / name).is_file():
            raise FarmError(f"{where}: spaces: expected file names in {SPACES_DIR}/, got {show(name)}")
    loaded = spaces.load_spaces([Path(run_dir) / SPACES_DIR / name for name in copies])
    planned = [dataclasses.replace(p, trials=budgets[p.task.key]) for p in plan.expand(loaded)
               if p.task.key in budgets]
    missing = sorted(set(budgets) - {p.task.key for p in planned})
    if missing:  # resuming would write a bundle without them: the run's winners lost
        raise FarmError(f"{where}: tasks: {show(missing[0])} is not a task of the run's spaces ({len(missing)} such); "
                        f"expected the tasks its {SPACES_DIR}/ define")
    return planned, settings


def write_run_info(run_dir: Path, planned: Iterable[PlannedTask], settings: Any,
                   pools: dict[str, Any], summary: dict[str, Any]) -> None:
    """run.json: the tasks, spaces, settings, each pool's worker info and the summary (atomically)."""
    planned = list(planned)
    _write_json(Path(run_dir) / RUN_INFO, {
        "run_id": Path(run_dir).name, "updated": now(), "tasks": [p.task.key for p in planned],
        "spaces": sorted({p.space.path for p in planned}), "settings": _settings_json(settings),
        "pools": pools, "summary": summary})


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


FINALS_LOG = "finalists.jsonl"      # each task's finalists, re-timed side by side


def append_finals(run_dir: Path, timings: Sequence[FinalTiming]) -> None:
    """Log one task's re-timed finalists (a resume re-times only tasks without them)."""
    with open(Path(run_dir) / FINALS_LOG, "a") as f:
        f.write("".join(json.dumps(t.to_dict()) + "\n" for t in timings))
        f.flush()


def read_finals(run_dir: Path) -> dict[str, list[FinalTiming]]:
    """task key -> its logged finalists (a torn last line is skipped)."""
    path = Path(run_dir) / FINALS_LOG
    finals: dict[str, list[FinalTiming]] = {}
    if not path.is_file():
        return finals
    with open(path) as f:
        for line in f:
            try:
                timing = FinalTiming(**json.loads(line))
            except (ValueError, TypeError):
                continue
            finals.setdefault(timing.task_key, []).append(timing)
    return finals
