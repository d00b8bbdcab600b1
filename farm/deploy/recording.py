"""Record mode: every task a program runs without an exact tuned config, appended to a file.

`record(path)` (a context manager, or `.stop()` it) or the environment variable
FARM_RECORD_MISSES names a JSON-lines file (`farm.deploy.misses`); `farm sweep --tasks path`
tunes what it holds. The registries of this process report their misses here.
"""
from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import kernels
from farm.deploy.misses import Miss, MissFileError, record_miss

RECORD_ENV = "FARM_RECORD_MISSES"  # a path: record misses there (as record(path) does)


class MissSource(Protocol):
    """What record() reads of a live registry: the misses it already resolved."""

    def recorded_misses(self) -> Sequence[Miss]:
        """The tasks it resolved without an exact row."""


# Registries alive in this process: record(path) writes the misses they already resolved.
_registries: weakref.WeakSet[Any] = weakref.WeakSet()
_recording: list[Path] = []  # the paths of active record() calls; the latest wins
_unwritable: set[Path] = set()


def track(registry: MissSource) -> None:
    """Remember a live registry, so that a later record(path) writes its earlier misses."""
    _registries.add(registry)


_INTERNAL = (str(Path(kernels.__file__).parent) + os.sep, str(Path(__file__).parent) + os.sep)


def caller_level() -> int:
    """The stacklevel of the first frame outside the farm, the kernels and JAX: the user's call."""
    import inspect

    frame, level = inspect.currentframe().f_back.f_back, 2  # the caller of warnings.warn's caller
    while frame is not None and (frame.f_code.co_filename.startswith(_INTERNAL)
                                 or f"{os.sep}jax{os.sep}" in frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1


def recording_path() -> Path | None:
    """Where misses are recorded now: the latest active `record(path)`, else $FARM_RECORD_MISSES."""
    if _recording:
        return _recording[-1]
    env = os.environ.get(RECORD_ENV)
    return Path(env) if env else None


def write(path: Path, misses: Iterable[Miss]) -> None:
    """Append the misses to `path`; a file that cannot take them warns once, and the program runs on."""
    try:
        for miss in misses:
            record_miss(path, miss)
    except MissFileError as err:
        if path not in _unwritable:
            _unwritable.add(path)
            warnings.warn(f"misses not recorded: {err}", RuntimeWarning, stacklevel=caller_level())


class Recording:
    """An active `record(path)`: a context manager, or `stop()` it."""

    def __init__(self, path: Path) -> None:
        self.path, self.active = path, True

    def stop(self) -> None:
        """Stop recording to this path (an outer `record` or $FARM_RECORD_MISSES takes over)."""
        if self.active:
            self.active = False
            del _recording[len(_recording) - 1 - _recording[::-1].index(self.path)]  # its latest entry

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def record(path: str | Path) -> Recording:
    """Record, to the JSON-lines file `path`, every task run without an exact tuned config.

    One line per task (farm.deploy.misses): the misses already looked up by live registries are
    written at once, later ones as they are looked up. `farm sweep --tasks path` tunes them.

        with runtime.record("misses.jsonl"):
            model(batch)
    """
    path = Path(path)
    _recording.append(path)
    for registry in list(_registries):
        write(path, registry.recorded_misses())
    return Recording(path)
