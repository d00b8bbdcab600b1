"""The misses file: tasks a program asked for that its bundle lacks, one JSON line per task.

    {"kernel": "softmax", "shape": [96, 300], "dtype": "float32", "target": "interpret",
     "rule": "nearest", "distance": 0.585}

A serving process appends (`record_miss`, from `runtime.record(path)` or FARM_RECORD_MISSES);
`farm sweep --tasks FILE` reads (`read_misses`) and tunes exactly those tasks. The promises:
- one line per task (kernel, shape, dtype, target): a task already in the file is never
  written again, also across processes (the file is locked while it is read and appended);
- each line is appended whole and flushed, so a crash loses at most the line being written (a
  torn last line is skipped by the reader and cut off by the next writer);
- bounded: a file over MAX_BYTES is refused, by the writer and by the reader.
"distance" is the log2 distance to the tuned shape used ("nearest"), or null ("default").
This module imports neither JAX nor anything of the tuning install.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
from pathlib import Path
from typing import Any

from farm.errors import FarmError

MAX_BYTES = 10 * 1024 * 1024
TORN_LIMIT = 64 * 1024  # longest unterminated last line the writer cuts off (a miss line is ~150 bytes)
RULES = ("exact", "nearest", "default")
_FIELDS = ("kernel", "shape", "dtype", "target", "rule", "distance")


class MissFileError(FarmError):
    """A misses file is too large, unreadable, or a line of it is not a miss."""


@dataclasses.dataclass(frozen=True, slots=True)
class Miss:
    """One task a program ran without an exact tuned config, and how its config was chosen."""

    kernel: str
    shape: tuple[int, ...]
    dtype: str
    target: str
    rule: str
    distance: float | None = None

    @property
    def task(self) -> tuple[str, tuple[int, ...], str, str]:
        """(kernel, shape, dtype, target): what makes two misses the same task."""
        return self.kernel, self.shape, self.dtype, self.target

    def to_json(self) -> str:
        """The file's line for this miss (without the newline)."""
        return json.dumps({"kernel": self.kernel, "shape": list(self.shape), "dtype": self.dtype,
                           "target": self.target, "rule": self.rule, "distance": self.distance})


def _parse(line: str, where: str) -> Miss:
    try:
        data = json.loads(line)
    except ValueError as err:
        raise MissFileError(f"{where}: expected one JSON object per line ({err})") from None
    if not isinstance(data, dict):
        raise MissFileError(f"{where}: expected a JSON object with {list(_FIELDS)}, got {type(data).__name__}")
    missing = [f for f in _FIELDS if f not in data]
    if missing:
        raise MissFileError(f"{where}: {missing[0]}: expected a field of {list(_FIELDS)}")
    for field in ("kernel", "dtype", "target"):
        if not isinstance(data[field], str) or not data[field]:
            raise MissFileError(f"{where}: {field}: expected a non-empty string, got {data[field]!r}")
    shape = data["shape"]
    if (not isinstance(shape, list) or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
        raise MissFileError(f"{where}: shape: expected a list of positive integers, got {shape!r}")
    if data["rule"] not in RULES:
        raise MissFileError(f"{where}: rule: expected one of {list(RULES)}, got {data['rule']!r}")
    distance = data["distance"]
    if distance is not None and (isinstance(distance, bool) or not isinstance(distance, (int, float))
                                 or not math.isfinite(distance) or distance < 0):
        raise MissFileError(f"{where}: distance: expected a non-negative number or null, got {distance!r}")
    return Miss(data["kernel"], tuple(shape), data["dtype"], data["target"], data["rule"],
                None if distance is None else float(distance))


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _check_size(path: Path) -> None:
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise MissFileError(f"{path}: {size} bytes; expected a misses file of at most {MAX_BYTES} bytes")


def read_misses(path: str | Path) -> list[Miss]:
    """The misses in a file, in file order, one per task (a repeated task keeps its first line).

    Raises MissFileError naming the file, line and field for a line that is not a miss, and for a
    file over MAX_BYTES. Blank lines are skipped, and so is a torn last line (no newline, not JSON).
    """
    path = Path(path)
    try:
        _check_size(path)
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissFileError(f"{path}: not found; expected a misses file (JSON lines)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise MissFileError(f"{path}: cannot be read: {err}") from None
    lines = text.splitlines()
    if lines and not text.endswith("\n") and not _is_json(lines[-1]):
        lines.pop()
    found: dict[tuple, Miss] = {}
    for number, line in enumerate(lines, 1):
        if line.strip():
            miss = _parse(line, f"{path}:{number}")
            found.setdefault(miss.task, miss)
    return list(found.values())


_lock = threading.Lock()
_seen: dict[Path, tuple[int, int, set[tuple]]] = {}  # file -> (inode, bytes read, tasks in them)


def _tasks_in(data: bytes, tasks: set[tuple]) -> None:
    """Add the tasks of well-formed lines (a malformed line never blocks a new one)."""
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            tasks.add(_parse(line, "").task)
        except MissFileError:
            continue


def record_miss(path: str | Path, miss: Miss) -> bool:
    """Append `miss` to the file at `path` unless its task is there already; True when written.

    The lines already read are remembered, so a process reads each part of the file once.
    Raises MissFileError when the file would grow over MAX_BYTES or cannot be written.
    """
    path = Path(path).absolute()
    line = (miss.to_json() + "\n").encode("utf-8")
    with _lock:
        try:
            with open(path, "a+b") as file:
                _lock_file(file)
                inode, size = os.fstat(file.fileno()).st_ino, file.seek(0, os.SEEK_END)
                known_inode, offset, tasks = _seen.get(path, (inode, 0, set()))
                if size > MAX_BYTES:
                    raise MissFileError(f"{path}: {size} bytes; a misses file is refused over {MAX_BYTES} bytes")
                if known_inode != inode or size < offset:  # replaced or truncated: read it all again
                    offset, tasks = 0, set()
                file.seek(offset)
                new = file.read()
                complete = new.rfind(b"\n") + 1
                _tasks_in(new[:complete], tasks)
                if complete < len(new):  # a line torn by a writer that crashed (it held the lock): cut it
                    if len(new) - complete > TORN_LIMIT:
                        raise MissFileError(f"{path}: ends in {len(new) - complete} bytes without a newline; "
                                            "expected a misses file (JSON lines)")
                    size = offset + complete
                    file.truncate(size)
                _seen[path] = (inode, size, tasks)
                if miss.task in tasks:
                    return False
                if size + len(line) > MAX_BYTES:
                    raise MissFileError(f"{path}: {size} bytes; a misses file is refused over {MAX_BYTES} bytes")
                file.write(line)
                file.flush()
                tasks.add(miss.task)
                _seen[path] = (inode, size + len(line), tasks)
                return True
        except OSError as err:
            raise MissFileError(f"{path}: cannot record a miss: {err}") from None


def _lock_file(file: Any) -> None:
    """An exclusive lock on an open file, released when it closes (POSIX; elsewhere a no-op)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return
    fcntl.flock(file.fileno(), fcntl.LOCK_EX)
