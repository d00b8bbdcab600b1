"""Optuna studies: one per task, in persistent journal storage; samplers and config suggestion.

The journal is Optuna's file format (`optuna.journal`, one JSON operation a line), written by
`RunJournal`: the sweep is its only writer (it holds the run folder's lock), so each operation is
one append flushed to the OS, without Optuna's per-operation lock file and fsync, and is read
back from memory. Open it anywhere with `storage(run_dir)` or with Optuna's own
`JournalFileBackend`.

Knobs map onto Optuna parameters so that the sampler sees their order: an integer `range` is
`suggest_int` with its step; a `pow2` knob is its exponent, `suggest_int("log2_<name>", lo, hi)`
(so TPE models 64 as between 32 and 128); other knobs are categories. Configs outside this
module are always in real values (`suggest`, `to_optuna`).
"""
from __future__ import annotations

import json
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend

from farm.search.plan import PlannedTask
from farm.search.space_parts import Param, in_space

JOURNAL = "optuna.journal"


def storage(run_dir: Path) -> JournalStorage:
    """The run's Optuna storage; open it with `optuna.load_study(storage=...)` to analyse."""
    return JournalStorage(RunJournal(Path(run_dir) / JOURNAL))


class RunJournal(BaseJournalBackend):
    """Optuna's journal file for one writing process (a sweep holds its run folder's `RunLock`).

    The format is `JournalFileBackend`'s. Optuna's backend takes a lock file, appends and fsyncs
    for every operation and reads the file again before every access: a dozen fsyncs a trial
    were over half of the driver's time. Here every operation is appended and flushed to the OS
    before the call returns (a killed driver loses none of them, as with `trials.jsonl`), and
    reads come from memory: what the file held when opened, then what was appended. Not for
    two writers at once (the run folder's lock prevents them); readers may open the file anytime.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._unread: list[dict[str, Any]] = []   # operations from log number `_base` on
        self._base = 0
        self._file: IO[bytes] | None = None
        if self.path.exists():
            with open(self.path, "rb") as f:
                for number, line in enumerate(f):
                    if not line.endswith(b"\n"):
                        raise ValueError(f"{self.path}: line {number + 1} is torn (no newline); expected a "
                                         f"journal repaired by `farm sweep --resume`")
                    self._unread.append(json.loads(line))

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        """The operations from `log_number_from` on (Optuna reads forward only: earlier ones are dropped)."""
        if log_number_from < self._base:
            raise ValueError(f"{self.path}: log {log_number_from} was already read; expected reads forward")
        del self._unread[:log_number_from - self._base]
        self._base = log_number_from
        return iter(list(self._unread))

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        """Append operations and flush them to the OS."""
        if self._file is None or self._file.closed:
            self._file = open(self.path, "ab")  # noqa: SIM115 - kept open across appends; close() closes it
        self._file.write("".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode())
        self._file.flush()
        self._unread.extend(logs)

    def close(self) -> None:
        """Close the file (the next append opens it again)."""
        file = getattr(self, "_file", None)
        if file is not None:
            file.close()

    def __del__(self) -> None:
        self.close()


class AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's GridSampler without `study.stop()` once the grid is covered.

    GridSampler stops the study from `after_trial`, which only works inside `optimize`; with
    ask/tell the driver's trial budget ends the study, and revisits are answered from cache.
    """

    def after_trial(self, study: optuna.Study, trial: Any, state: Any, values: Any) -> None:
        """Nothing to do: the driver decides when a study ends."""


def sampler_name(planned: PlannedTask, name: str | None = None) -> str:
    """The sampler a task's study uses: `name`, else its space's."""
    return name or planned.space.sampler.name


def task_seed(planned: PlannedTask, seed: int | None = None) -> int:
    """The task's sampler seed: the space's (or `seed`) mixed with the task key, so studies differ
    but runs repeat."""
    return ((planned.space.sampler.seed if seed is None else seed) + zlib.crc32(planned.task.key.encode())) % 2**31


def make_sampler(planned: PlannedTask, name: str | None = None, seed: int | None = None, *,
                 multivariate: bool = False) -> optuna.samplers.BaseSampler:
    """The space's sampler (or `name`), seeded per task. `multivariate`: TPE models the knobs
    jointly (what `farm.search.valid_set.ValidSetSampler` steers by). `pattern` and `hybrid` are
    modes of that sampler; over a space too large to enumerate they are TPE."""
    name, task_seed_ = sampler_name(planned, name), task_seed(planned, seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=task_seed_)
    if name == "grid":
        params = planned.space.params_for(planned.task.target)
        return AskTellGridSampler({optuna_name(p): optuna_choices(p) for p in params}, seed=task_seed_)
    startup = max(3, min(10, planned.trials // 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)   # multivariate is stable in use
        return optuna.samplers.TPESampler(seed=task_seed_, n_startup_trials=startup, constant_liar=True,
                                          multivariate=multivariate)


def open_study(planned: PlannedTask, store: JournalStorage, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """Create the task's study, or load it when it already exists in the storage."""
    return optuna.create_study(storage=store, study_name=planned.task.key, sampler=sampler,
                               direction="minimize", load_if_exists=True)


POW2_PREFIX = "log2_"


def optuna_name(p: Param) -> str:
    """The Optuna parameter of a knob: `log2_<name>` for powers of two, else its name."""
    return POW2_PREFIX + p.name if p.kind == "pow2" else p.name


def optuna_choices(p: Param) -> list[Any]:
    """The knob's choices as Optuna sees them (exponents for powers of two)."""
    return [int(c).bit_length() - 1 for c in p.choices] if p.kind == "pow2" else list(p.choices)


def distribution(p: Param) -> optuna.distributions.BaseDistribution:
    """The knob's Optuna distribution: integers for ranges and exponents of powers of two, else categories."""
    if p.kind == "range":
        step = p.choices[1] - p.choices[0] if len(p.choices) > 1 else 1
        return optuna.distributions.IntDistribution(p.choices[0], p.choices[-1], step=step)
    if p.kind == "pow2":
        exponents = optuna_choices(p)
        return optuna.distributions.IntDistribution(exponents[0], exponents[-1])
    return optuna.distributions.CategoricalDistribution(list(p.choices))


def suggest(trial: optuna.Trial, params: tuple[Param, ...]) -> dict[str, Any]:
    """A config from the trial, in real values: ranges and powers of two as ordered ints, other knobs as categories."""
    config: dict[str, Any] = {}
    for p in params:
        d = distribution(p)
        if isinstance(d, optuna.distributions.IntDistribution):
            value = trial.suggest_int(optuna_name(p), d.low, d.high, step=d.step)
            config[p.name] = 1 << value if p.kind == "pow2" else value
        else:
            config[p.name] = trial.suggest_categorical(p.name, list(p.choices))
    return config


def to_optuna(config: dict[str, Any], params: tuple[Param, ...]) -> dict[str, Any]:
    """The Optuna parameters of a config (for `enqueue_trial`); knobs not in `params` are left out."""
    by_name = {p.name: p for p in params}
    return {optuna_name(by_name[k]): (int(v).bit_length() - 1 if by_name[k].kind == "pow2" else v)
            for k, v in config.items() if k in by_name}


def from_optuna(values: dict[str, Any], params: tuple[Param, ...]) -> dict[str, Any]:
    """A config in real values from Optuna's parameter values (the inverse of `to_optuna`)."""
    config = {}
    for p in params:
        value = values[optuna_name(p)]
        config[p.name] = 1 << int(value) if p.kind == "pow2" else value
    return config


def enqueue_default(study: optuna.Study, params: tuple[Param, ...], default: dict[str, Any], *,
                    even_on_grid: bool = False) -> bool:
    """Queue the kernel's default config as the first trial when the space contains it.

    Not with a grid sampler (unless `even_on_grid`: a task with no valid config, where the
    default's answer says why): the grid visits the default anyway, and Optuna's GridSampler
    does not count enqueued trials as visited grid points.
    """
    if isinstance(study.sampler, optuna.samplers.GridSampler) and not even_on_grid:
        return False
    if study.trials or set(default) != {p.name for p in params}:
        return False
    if not all(default[p.name] in p.choices for p in params):
        return False
    study.enqueue_trial(to_optuna(default, params))
    return True


def enqueue_warm_start(study: optuna.Study, params: tuple[Param, ...], configs: list[dict[str, Any]],
                       default: dict[str, Any] | None) -> int:
    """Queue `configs` first, in order, then the kernel's default (unless None); only in a new study.

    Configs outside the space and repeats are skipped; returns how many were queued. The
    default is left out with a grid sampler (see `enqueue_default`); the warm-start configs are
    not, since they must be measured first whatever the grid's order (a later visit of the same
    grid point is answered from the cache).
    """
    if study.trials:
        return 0
    queued: list[dict[str, Any]] = []
    for config in configs:
        if in_space(config, params) and config not in queued:
            queued.append(config)
    if not queued:
        return 0
    if (default is not None and not isinstance(study.sampler, optuna.samplers.GridSampler)
            and in_space(default, params) and default not in queued):
        queued.append(default)
    for config in queued:
        study.enqueue_trial(to_optuna(config, params))
    return len(queued)
