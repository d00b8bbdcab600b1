"""Tasks a program recorded: a JSON-lines file, one task per line, read into minimal spaces.

    {"kernel": "softmax", "shape": [4096, 50257], "dtype": "bfloat16", "target": "gpu-triton"}
    {"kernel": "softmax", "shape": "4096x50257", "dtype": "bfloat16", "target": "gpu-triton", "rule": "default"}

Each line names `kernel`, `shape` (a list of positive integers or "AxB"), `dtype` and `target`;
other fields (the lookup's `rule`, `distance`, ...) are ignored, so the misses a deployment
records (`farm.deploy.misses`) are read as they are. Repeated tasks count once. The reader is
bounded (`MAX_BYTES`, `MAX_LINES`) and every problem names the file and the line.

`tasks_spaces` turns the tasks into one minimal space per kernel (`minimal_space`: the kernel,
its shapes, dtypes and targets; everything else from its shipped space), and `farm sweep
--tasks FILE` tunes exactly the listed tasks.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from farm.errors import FarmError, shorten, show
from farm.inputs import TooLarge, read_regular
from farm.search.space_parts import DTYPES, MAX_DIM, MAX_ELEMENTS, MAX_LIST
from farm.search.spaces import SearchSpace, load_kernel, parse_space
from farm.tasks import TuningTask
from kernels.targets import TARGETS

MAX_BYTES = 16 << 20     # a tasks file larger than this is refused before it is read
MAX_LINES = 100_000      # so is one with more lines
FIELDS = ("kernel", "shape", "dtype", "target")


def parse_shape(text: str) -> tuple[int, ...]:
    """"4096x50257" (or "4096,50257") as a tuple of positive integers; ValueError otherwise."""
    parts = text.replace(",", "x").lower().split("x")
    dims = tuple(int(p) for p in parts)
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(text)
    return dims


def _shape(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        return parse_shape(value)
    if (isinstance(value, list) and value
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value)):
        return tuple(value)
    raise ValueError(value)


def read_tasks(path: str | Path) -> list[TuningTask]:
    """The distinct tasks of a JSON-lines tasks file, in first-seen order.

    Raises:
        FarmError: the file is missing, too large, or a line is not a task; the message names
            the file, the line and the field.
    """
    path = Path(path)
    try:
        raw = read_regular(path, MAX_BYTES)
    except TooLarge:
        raise FarmError(f"--tasks {path}: expected at most {MAX_BYTES} bytes") from None
    except OSError as err:
        raise FarmError(f"--tasks {path}: expected a readable JSON-lines file "
                        f"({err.strerror or 'a regular file, not a folder, device or FIFO'})") from None
    tasks: dict[str, TuningTask] = {}
    for number, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
        if number > MAX_LINES:
            raise FarmError(f"--tasks {path}: expected at most {MAX_LINES} lines")
        if line.strip():
            task = _task(line, f"{path}:{number}")
            tasks.setdefault(task.key, task)
    if not tasks:
        raise FarmError(f"--tasks {path}: expected at least one task line ({', '.join(FIELDS)})")
    return list(tasks.values())


def _task(line: str, where: str) -> TuningTask:
    """One line as a task, checked against the kernel registry, dtypes and targets."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as err:
        raise FarmError(f"{where}: expected a JSON object, got invalid JSON ({err.msg})") from None
    except RecursionError:
        raise FarmError(f"{where}: expected a JSON object, got JSON nested too deep") from None
    except ValueError as err:  # an integer of over 4300 digits
        raise FarmError(f"{where}: expected a JSON object of small values ({shorten(str(err), 120)})") from None
    if not isinstance(data, dict):
        raise FarmError(f"{where}: expected a JSON object with fields {', '.join(FIELDS)}")
    missing = [f for f in FIELDS if data.get(f) in (None, "")]
    if missing:
        raise FarmError(f"{where}: {missing[0]}: expected a value (fields {', '.join(FIELDS)})")
    kernel, dtype, target = data["kernel"], data["dtype"], data["target"]
    module = load_kernel(str(kernel), f"{where}: kernel")
    rank = len(module.SHAPE_NAMES)
    try:
        shape = _shape(data["shape"])
    except (ValueError, TypeError):
        shape = ()
    if len(shape) != rank:
        raise FarmError(f"{where}: shape: expected {rank} positive integers ({', '.join(module.SHAPE_NAMES)}) as "
                        f"a list or AxB, got {show(data['shape'])}")
    if max(shape) > MAX_DIM or math.prod(shape) > MAX_ELEMENTS:
        raise FarmError(f"{where}: shape: expected dimensions of at most {MAX_DIM} and at most {MAX_ELEMENTS} "
                        f"elements, got {show(data['shape'])}")
    if dtype not in DTYPES:
        raise FarmError(f"{where}: dtype: expected one of {list(DTYPES)}, got {dtype!r}")
    if target not in TARGETS or target not in module.TARGETS:
        raise FarmError(f"{where}: target: expected a target of {kernel} ({', '.join(module.TARGETS)}), "
                        f"got {target!r}")
    return TuningTask(str(kernel), shape, str(dtype), str(target))


def minimal_space(kernel: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[str] | None = None,
                  targets: Sequence[str] | None = None, *, label: str) -> SearchSpace:
    """A space over the kernel's shipped one: these shapes (and dtypes, targets) for every
    target it keeps, every other field from `search_spaces/<kernel>.yaml`.

    Args:
        label: where the space came from, for error messages (e.g. "--kernel softmax").
    """
    document: dict[str, Any] = {"kernel": kernel}
    if shapes:
        document["shapes"] = [list(s) for s in shapes]
    if dtypes:
        document["dtypes"] = list(dtypes)
    if targets:
        document["targets"] = list(targets)
    if not shapes:   # the shipped space's own shapes
        document = {"extends": kernel, **{k: v for k, v in document.items() if k != "kernel"}}
    return parse_space(document, label)


def tasks_spaces(tasks: Iterable[TuningTask], *, label: str) -> list[SearchSpace]:
    """One minimal space per kernel covering its tasks (plan them, then keep only `tasks`)."""
    by_kernel: dict[str, list[TuningTask]] = {}
    for task in tasks:
        by_kernel.setdefault(task.kernel, []).append(task)

    def distinct(values: Iterable[Any]) -> list[Any]:
        return list(dict.fromkeys(values))

    spaces = []
    for kernel, group in by_kernel.items():
        shapes = distinct(t.shape for t in group)
        for start in range(0, len(shapes), MAX_LIST):   # a space lists at most MAX_LIST shapes
            part = shapes[start:start + MAX_LIST]
            chosen = [t for t in group if t.shape in set(part)]
            named = f" (kernel {kernel})" if len(shapes) <= MAX_LIST else \
                f" (kernel {kernel}, shapes {start + 1}-{start + len(part)} of {len(shapes)})"
            spaces.append(minimal_space(kernel, part, distinct(t.dtype for t in chosen),
                                        distinct(t.target for t in chosen), label=label + named))
    return spaces


def task_key_set(tasks: Iterable[TuningTask]) -> set[str]:
    """The keys of tasks, to keep only them after planning their spaces' cross products."""
    return {t.key for t in tasks}


__all__ = ["MAX_BYTES", "MAX_LINES", "minimal_space", "parse_shape", "read_tasks", "task_key_set", "tasks_spaces"]
