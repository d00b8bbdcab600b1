"""The registry: which config to run a kernel with, from a verified bundle.

`Registry.load` takes a bundle folder, a run folder, a bundle archive (.tar.gz) or a deployment
folder made by `farm pull` (its `current` version), and opens it with
`farm.bundle.locate.open_bundle`, which verifies it before a row is read. The lookup rules, the
miss warnings and the software policies are documented in `farm.deploy.runtime`, the public
face of this package.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import math
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

import kernels
import kernels.protocol
from farm.bundle.locate import OpenedBundle, open_bundle
from farm.bundle.trust import TrustLike
from farm.deploy import recording
from farm.deploy.misses import Miss
from farm.errors import BundleError, FarmError
from farm.tasks import json_object
from kernels.protocol import task_default
from kernels.targets import DTYPES

if TYPE_CHECKING:
    from farm.deploy.tuned import TunedKernel

POLICIES = ("warn", "refuse", "accept")
CACHE_LIMIT = 100_000  # cached lookups per registry
FINGERPRINT_KEYS = ("jax", "jaxlib", "pallas_farm", "libtpu", "jax-cuda12-plugin", "jax-cuda13-plugin", "triton")
EXACT, NEAREST, DEFAULT = "exact", "nearest", "default"
# A "nearest" farther than this (sum of |log2| ratios: 1.0 is one dimension twice or half the
# tuned one) warns, as a "default" always does: the config was tuned for a rather different task.
NEAREST_WARN_DISTANCE = 1.0
# Farther than this (one dimension 8 times the tuned one, or two 2.8 times), no tuned config is
# used: the kernel's default, chosen for the asked shape, runs. A row-block size tuned for 3 rows
# ran 2048 rows 8x slower than the default in interpret mode (block_rows 1 against 8).
NEAREST_MAX_DISTANCE = 3.0
WARN_LIMIT = 20   # miss warnings per registry; then one saying so (`misses()` lists them all)
HISTORY_LIMIT = 100_000  # distinct lookups remembered (and warned about, and recorded) per registry
GPU_TARGETS = ("gpu-triton", "gpu-mosaic")  # in order of preference when the bundle has neither
# The targets whose configs must fit on-chip memory, and which memory (`farm.measure.capacity`).
_ONCHIP_MEMORY = {"gpu-triton": "shared memory", "gpu-mosaic": "shared memory", "tpu": "vmem"}
ONCHIP_TARGETS = tuple(_ONCHIP_MEMORY)
_COLUMNS = ("task_key", "kernel", "shape", "dtype", "target", "device_kind", "status", "config", "software",
            "median_s", "created")
class SoftwareMismatch(BundleError):
    """The bundle was tuned with other software versions and the policy is "refuse"."""


class SoftwareMismatchWarning(UserWarning):
    """The bundle was tuned with other software versions (policy "warn")."""


class TuningMissWarning(UserWarning):
    """A task ran with the default config, or a nearest one tuned for a distant shape."""


class NoBackwardKernel(FarmError):
    """A tuned kernel was differentiated, but its kernel declares no backward kernel (BACKWARD)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """A looked-up config and how it was chosen (rule: exact, nearest or default)."""

    config: Mapping[str, Any]
    rule: str
    task_key: str | None = None
    tuned_shape: tuple[int, ...] | None = None
    device_kind: str | None = None
    distance: float = 0.0
    median_s: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Lookup:
    """One distinct task a registry was asked for, and how its config was chosen.

    distance: the log2 distance to the tuned shape (0.0 for "exact"), None for "default".
    """

    kernel: str
    shape: tuple[int, ...]
    dtype: str
    target: str
    rule: str
    distance: float | None
    device_kind: str | None = None
    tuned_shape: tuple[int, ...] | None = None

    @classmethod
    def of(cls, kernel: str, shape: Sequence[int], dtype: str, target: str, device_kind: str | None,
           choice: Choice) -> Lookup:
        """The lookup of a task that `choice` answered."""
        return cls(kernel, tuple(int(d) for d in shape), dtype, target, choice.rule,
                   None if choice.rule == DEFAULT else choice.distance, device_kind, choice.tuned_shape)

    @property
    def miss(self) -> Miss:
        """This lookup as a line of the misses file."""
        return Miss(self.kernel, self.shape, self.dtype, self.target, self.rule, self.distance)


class _Row(NamedTuple):  # a NamedTuple: 10,000 of them build several times faster than frozen dataclasses
    task_key: str
    kernel: str
    shape: tuple[int, ...]
    dtype: str
    target: str
    device_kind: str | None
    config_json: str
    median_s: float | None
    created: str


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    """'float32' for a dtype name, NumPy dtype or JAX scalar type (memoised: `dtype.name` is slow)."""
    if isinstance(dtype, str):
        return dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        import numpy as np

        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return name


def log_distance(tuned: Sequence[int], asked: Sequence[int]) -> float:
    """sum_i |log2(tuned_i) - log2(asked_i)| for shapes of positive dimensions."""
    return sum(abs(math.log2(t) - math.log2(a)) for t, a in zip(tuned, asked))


def fingerprint_diff(recorded: Mapping[str, Any] | None, current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{component: (recorded, current)} for the FINGERPRINT_KEYS that both have and that differ."""
    if not recorded:
        return {"software": (None, "a recorded fingerprint")}
    return {k: (recorded[k], current[k]) for k in FINGERPRINT_KEYS
            if k in recorded and k in current and recorded[k] != current[k]}


class Registry:
    """Tuned configs of a verified bundle, indexed for fast lookups; see the module docstring."""

    def __init__(self, rows: Sequence[_Row] = (), *, source: str = "<empty>", manifest: Mapping[str, Any] | None = None,
                 signed: bool = False, spaces: Sequence[Any] | None = None,
                 onchip_bytes: Mapping[str, int] | None = None) -> None:
        """onchip_bytes: per GPU target, the shared memory a block has on the GPU the configs will
        run on, and for "tpu" the chip's VMEM; a target not named there is read from this
        process's device (`farm.measure.capacity`), and off such a device is unbounded (no config
        is refused for its size)."""
        self.source, self.manifest, self.signed = source, dict(manifest or {}), signed
        for name, size in (onchip_bytes or {}).items():
            if name not in ONCHIP_TARGETS or isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise FarmError(f"onchip_bytes: expected a positive number of bytes per GPU or TPU target "
                                f"({', '.join(ONCHIP_TARGETS)}), got {name!r}: {size!r}")
        self._onchip: dict[str, int | None] = dict(onchip_bytes or {})
        self.software_mismatches: list[tuple[str, dict[str, tuple[Any, Any]]]] = []
        self._spaces = {space.kernel: space for space in spaces or ()}
        self._exact: dict[tuple, _Row] = {}
        self._groups: dict[tuple[str, str, str], list[_Row]] = {}
        for row in rows:
            for key in ((row.kernel, row.shape, row.dtype, row.target, row.device_kind),
                        (row.kernel, row.shape, row.dtype, row.target, None)):
                if key not in self._exact or row.created >= self._exact[key].created:
                    self._exact[key] = row
            self._groups.setdefault((row.kernel, row.dtype, row.target), []).append(row)
        self._rows = len(rows)
        self._cache: dict[tuple, Choice] = {}
        self._lock = threading.Lock()
        self._history: dict[tuple, Lookup] = {}
        self._warned: set[tuple] = set()
        recording.track(self)

    def __len__(self) -> int:
        return self._rows

    def __repr__(self) -> str:
        return f"Registry({self.source!r}, {self._rows} tuned tasks, signed={self.signed})"

    @classmethod
    def load(cls, path: str | Path, trusted_keys: TrustLike, *, allow_unsigned: bool = False,
             software_policy: str = "warn", software: Mapping[str, Any] | None = None,
             spaces: Sequence[Any] | None = None, onchip_bytes: Mapping[str, int] | None = None) -> Registry:
        """A registry from a verified bundle, run, deployment folder or archive (farm.bundle.locate)."""
        if software_policy not in POLICIES:
            raise FarmError(f"software_policy: expected one of {POLICIES}, got {software_policy!r}")
        with open_bundle(path, trusted_keys, allow_unsigned=allow_unsigned) as opened:
            return cls._from_opened(opened, software_policy, software, spaces, onchip_bytes)

    @classmethod
    def _from_opened(cls, opened: OpenedBundle, policy: str, software: Mapping[str, Any] | None,
                     spaces: Sequence[Any] | None, onchip_bytes: Mapping[str, int] | None = None) -> Registry:
        table = opened.configs(columns=_COLUMNS)
        columns = [table.column(name).to_pylist() for name in _COLUMNS]
        rows: list[_Row] = []
        fingerprints: dict[str | None, list[str]] = {}
        collecting = gc.isenabled()
        gc.disable()  # tens of thousands of small objects: no collector passes while they are built
        try:
            for (task_key, kernel, shape, dtype, target, device_kind, status, config, fingerprint, median_s,
                 created) in zip(*columns):
                if status != "ok" or not config or not shape or not kernel or not dtype or not target:
                    continue
                rows.append(_Row(task_key, kernel, tuple(shape), dtype, target, device_kind, config, median_s,
                                 created.isoformat() if isinstance(created, datetime) else created or ""))
                fingerprints.setdefault(fingerprint, []).append(task_key)
            registry = cls(rows, source=opened.where, manifest=opened.manifest, signed=opened.signed, spaces=spaces,
                           onchip_bytes=onchip_bytes)
        finally:
            if collecting:
                gc.enable()
        registry._check_software(fingerprints, policy, software)
        return registry

    def _check_software(self, fingerprints: Mapping[str | None, list[str]], policy: str,
                        software: Mapping[str, Any] | None) -> None:
        if policy == "accept":
            return
        if software is None:
            from farm.measure.software import versions

            software = versions()
        problems = []
        for text, task_keys in fingerprints.items():
            try:
                recorded = json.loads(text) if text else None
            except ValueError:
                recorded = None
            diff = fingerprint_diff(recorded, software)
            if diff:
                self.software_mismatches.append((task_keys[0], diff))
                shown = ", ".join(f"{k} {a} (bundle) vs {b} (here)" for k, (a, b) in diff.items())
                problems.append(f"{len(task_keys)} task(s) such as {task_keys[0]}: {shown}")
        if not problems:
            return
        message = f"{self.source}: tuned with other software: " + "; ".join(problems)
        if policy == "refuse":
            raise SoftwareMismatch(message + "; expected the same versions (software_policy='refuse')")
        warnings.warn(message, SoftwareMismatchWarning, stacklevel=3)

    def lookup(self, kernel: str, shape: Sequence[int], dtype: Any, target: str,
               device_kind: str | None = None, *, note: bool = True) -> Choice:
        """The config for a task and the rule that chose it (exact, nearest or default); a task no
        kernel can run (an unknown kernel or target, a shape of the wrong rank or with a dimension
        below 1, a dtype not in DTYPES) is a FarmError naming the field. note=False leaves the task
        out of `lookups()`, warnings and record mode until it is looked up with note=True (a call
        traced at a shape that may never run: a partitioned call's global shape)."""
        key = (kernel, shape if type(shape) is tuple else _shape_key(shape),
               dtype if type(dtype) is str else _dtype_name(dtype), target, device_kind)
        choice = self._cache.get(key)
        if choice is not None and (not note or key in self._history or len(self._history) >= HISTORY_LIMIT):
            return choice
        noticed = None
        check_task(*key[:4])
        with self._lock:
            choice = self._cache.get(key)
            if choice is None:
                if len(self._cache) >= CACHE_LIMIT:  # many distinct shapes: start over, stay bounded
                    self._cache.clear()
                choice = self._cache[key] = self._resolve(*key)
            if note:
                noticed = self._remember(key, choice)
        if noticed is not None:
            self._report(noticed)
        return choice

    def lookups(self) -> list[Lookup]:
        """Every distinct task looked up so far, in order (the first HISTORY_LIMIT of them)."""
        with self._lock:
            return list(self._history.values())

    def misses(self) -> list[Lookup]:
        """The lookups without an exact tuned config (rule "nearest" or "default")."""
        return [lookup for lookup in self.lookups() if lookup.rule != EXACT]

    def recorded_misses(self) -> list[Miss]:
        """The misses as the record file holds them (farm.deploy.recording)."""
        return [lookup.miss for lookup in self.misses()]

    def _remember(self, key: tuple, choice: Choice) -> Lookup | None:
        """Add a newly resolved task to the history; the Lookup when it is new (call under the lock)."""
        if key in self._history or len(self._history) >= HISTORY_LIMIT:
            return None
        lookup = self._history[key] = Lookup.of(*key, choice)
        return lookup

    def _report(self, lookup: Lookup) -> None:
        """Warn once per task about a default or a distant nearest; record a miss when recording."""
        if lookup.rule == EXACT:
            return
        task = (lookup.kernel, lookup.shape, lookup.dtype, lookup.target)
        if lookup.rule == DEFAULT or lookup.distance > NEAREST_WARN_DISTANCE:
            with self._lock:
                new = task not in self._warned and len(self._warned) <= WARN_LIMIT
                self._warned.add(task)
                last = new and len(self._warned) > WARN_LIMIT
            if last:
                warnings.warn(f"{self.source}: more than {WARN_LIMIT} tasks missed tuning; no more are warned "
                              f"about (registry.misses() lists them all; record them with {recording.RECORD_ENV}="
                              f"misses.jsonl and tune them with `farm sweep --tasks misses.jsonl`)",
                              TuningMissWarning, stacklevel=recording.caller_level())
            elif new:
                warnings.warn(_miss_message(lookup, self.source), TuningMissWarning,
                              stacklevel=recording.caller_level())
        path = recording.recording_path()
        if path is not None:
            recording.write(path, [lookup.miss])

    def gpu_target(self, kernel: str, shape: Sequence[int], dtype: Any, device_kind: str | None = None,
                   targets: Sequence[str] = GPU_TARGETS) -> str:
        """Of `targets` (those that run on the GPU, in the order to try their defaults): the one
        with an exact row for this task and the fastest median; else the fastest at the nearest
        shape (log2 distance at most NEAREST_WARN_DISTANCE) that the bundle timed on several of
        them on one device kind (`device_kind`'s when given); else the first whose default
        config the task accepts (`targets[0]` if none does). Only targets with a config valid for
        this task (a tuned row or the default) are compared: a target faster at a nearby shape may
        take no config at this one (the Mosaic GPU norms at widths of no whole 128-byte units)."""
        shape, dtype = _shape_key(shape), _dtype_name(dtype)
        for target in targets:
            if target not in GPU_TARGETS:
                raise FarmError(f"gpu_target({kernel!r}): targets: expected GPU targets ({', '.join(GPU_TARGETS)}), "
                                f"got {target!r}")
        check_task(kernel, shape, dtype, None)
        targets = [t for t in targets if self._serves(kernel, shape, dtype, t, device_kind)] or list(targets[:1])
        timed = [(row.median_s, target) for target in targets
                 if (row := self._exact.get((kernel, shape, dtype, target, device_kind))) is not None
                 and row.median_s is not None]
        if timed:
            return min(timed)[1]
        if all(d > 0 for d in shape):
            compared = self._timed_side_by_side(kernel, len(shape), dtype, device_kind, targets)
            near = [(log_distance(key[0], shape), key) for key in compared]
            near = [item for item in near if item[0] <= NEAREST_WARN_DISTANCE]
            if near:
                return min((median, target) for target, median in compared[min(near)[1]].items())[1]
        return targets[0]

    def _serves(self, kernel: str, shape: tuple[int, ...], dtype: str, target: str, device_kind: str | None) -> bool:
        """Whether a lookup of the task on `target` finds a valid config: a tuned row (exact or
        nearest, which `_resolve` checks) or a valid default."""
        if target not in kernels.load(kernel).TARGETS:
            return False
        if self._resolve(kernel, shape, dtype, target, device_kind).rule != DEFAULT:
            return True
        return self._default_valid(kernel, shape, dtype, target)

    def _default_valid(self, kernel: str, shape: tuple[int, ...], dtype: str, target: str) -> bool:
        """Whether the kernel's default config for the task, sized for this GPU, is valid there."""
        if target not in kernels.load(kernel).TARGETS:
            return False
        try:
            default = self._default(kernel, shape, dtype, target)
        except Exception:  # noqa: BLE001 - a default the kernel cannot make here: not this target
            return False
        return self._valid(kernel, default, shape, dtype, target)

    def _timed_side_by_side(self, kernel: str, rank: int, dtype: str, device_kind: str | None,
                            targets: Sequence[str]) -> dict[tuple[tuple[int, ...], str], dict[str, float]]:
        """{(shape, device kind): {target: its fastest median}} where several of `targets` were timed."""
        medians: dict[tuple[tuple[int, ...], str], dict[str, float]] = {}
        for target in targets:
            for row in self._groups.get((kernel, dtype, target), ()):
                if (row.median_s is None or len(row.shape) != rank or min(row.shape, default=0) <= 0
                        or device_kind not in (None, row.device_kind)):
                    continue
                by_target = medians.setdefault((row.shape, row.device_kind or ""), {})
                by_target[target] = min(by_target.get(target, math.inf), row.median_s)
        return {key: by_target for key, by_target in medians.items() if len(by_target) > 1}

    def _resolve(self, kernel: str, shape: tuple[int, ...], dtype: str, target: str,
                 device_kind: str | None) -> Choice:
        shape = tuple(int(d) for d in shape)
        row = self._exact.get((kernel, shape, dtype, target, device_kind))
        if row is not None and (config := _config(row)) is not None and self._valid(kernel, config, shape, dtype,
                                                                                      target):
            return _choice(row, EXACT, 0.0, config)
        if all(d > 0 for d in shape):
            candidates = [r for r in self._groups.get((kernel, dtype, target), ())
                          if len(r.shape) == len(shape) and (device_kind is None or r.device_kind == device_kind)
                          and log_distance(r.shape, shape) <= NEAREST_MAX_DISTANCE]
            candidates.sort(key=lambda r: r.created, reverse=True)
            candidates.sort(key=lambda r: (log_distance(r.shape, shape), r.shape))
            for row in candidates:
                config = _config(row)
                if config is not None and self._valid(kernel, config, shape, dtype, target):
                    return _choice(row, NEAREST, log_distance(row.shape, shape), config)
        return Choice(MappingProxyType(self._default(kernel, shape, dtype, target)), DEFAULT)

    def _default(self, kernel: str, shape: tuple[int, ...], dtype: str, target: str) -> dict[str, Any]:
        """The kernel's default config for the task, sized for the GPU the target runs on."""
        from kernels.mgpu_launch import defaults_for_shared_memory  # JAX: imported when first needed

        with defaults_for_shared_memory(self._onchip_bytes(target) if target in GPU_TARGETS else None):
            return dict(task_default(kernels.load(kernel), shape, target, dtype))

    def _onchip_bytes(self, target: str) -> int | None:
        """The on-chip memory a target's configs must fit where they run: shared memory a block
        has on the GPU (GPU targets), VMEM on the TPU chip ("tpu"); None: unknown, or another
        target. Read once per target from this process's device unless given; a device of
        another kind (a TPU target looked up on a GPU host) says nothing."""
        if target not in ONCHIP_TARGETS:
            return None
        if target not in self._onchip:
            from farm.measure import capacity

            found = capacity.detect(target)
            self._onchip[target] = found.onchip_bytes if found.memory == _ONCHIP_MEMORY[target] else None
        return self._onchip[target]

    def _valid(self, kernel: str, config: Mapping[str, Any], shape: tuple[int, ...], dtype: str,
               target: str) -> bool:
        """Whether the kernel (and its given search space) admits `config` for this task."""
        try:
            module = kernels.load(kernel)
            if module.check_config(dict(config), shape, dtype, target) is not None:
                return False
            onchip = self._onchip_bytes(target)  # a config tuned on a device with more on-chip memory
            if onchip is not None and module.footprint(dict(config), shape, dtype, target) > onchip:
                return False
        except Exception:  # noqa: BLE001 - a config from another kernel version: not valid here
            return False
        space = self._spaces.get(kernel)
        return space is None or space.violated(config, shape, dtype, target) is None

    def tuned(self, kernel: str, *, target: str | None = None, device_kind: str | None = None, interpret: bool = False,
              shape_of: Callable[..., tuple[int, ...]] | None = None, partition: bool = False) -> TunedKernel:
        """A function that runs `kernel` on JAX arrays with the looked-up config (partition: see
        `farm.deploy.tuned.tuned`)."""
        from farm.deploy.tuned import TunedKernel  # tuned builds on this module

        return TunedKernel(self, kernel, target=target, device_kind=device_kind, interpret=interpret,
                           shape_of=shape_of, partition=partition)


def _shape_key(shape: Any) -> tuple:
    """A shape as a tuple (its dimensions as given: `check_task` judges them), else a FarmError."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise FarmError(f"shape: expected a sequence of positive integers such as (4096, 50257), got {shape!r}")
    return tuple(shape)


def check_task(kernel: str, shape: tuple, dtype: str, target: str | None) -> None:
    """A FarmError naming the field unless a kernel can run this task: a registered kernel, one of
    its targets (None: not checked), a shape of its rank with integer dimensions >= 1, a dtype of DTYPES."""
    module = kernels.load(kernel)  # an unknown kernel: kernels.UnknownKernel, naming the registered ones
    if target is not None and target not in module.TARGETS:
        raise FarmError(f"{kernel}: target: expected one of {', '.join(module.TARGETS)}, got {target!r}")
    names = tuple(module.SHAPE_NAMES)
    if (len(shape) != len(names) or any(isinstance(d, bool) or not hasattr(type(d), "__index__") for d in shape)
            or any(int(d) < 1 for d in shape)):
        raise FarmError(f"{kernel}: shape: expected ({', '.join(names)}), {len(names)} integers >= 1, got "
                        f"{shape!r}")
    if dtype not in DTYPES:
        raise FarmError(f"{kernel}: dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")


def _config(row: _Row) -> dict[str, Any] | None:
    """A row's config, None where its text is no JSON object (such a row is never chosen)."""
    return json_object(row.config_json)


def _choice(row: _Row, rule: str, distance: float, config: dict[str, Any] | None = None) -> Choice:
    config = json.loads(row.config_json) if config is None else config
    return Choice(MappingProxyType(config), rule, row.task_key, row.shape, row.device_kind, distance, row.median_s)


def _miss_message(lookup: Lookup, source: str) -> str:
    task = f"{lookup.kernel} {lookup.shape} {lookup.dtype} on {lookup.target}"
    if lookup.rule == DEFAULT:
        why = (f"rule 'default': no config tuned for {lookup.kernel} in {lookup.dtype} on {lookup.target} at a "
               f"shape within log2 distance {NEAREST_MAX_DISTANCE} is valid for it; the kernel's default config runs")
    else:
        why = (f"rule 'nearest' at log2 distance {lookup.distance:.2f} > {NEAREST_WARN_DISTANCE} (the config "
               f"was tuned for {lookup.tuned_shape})")
    return (f"{task}: not tuned in {source}; {why}. Record such tasks with {recording.RECORD_ENV}=misses.jsonl (or "
            "runtime.record(path)) and tune them with `farm sweep --tasks misses.jsonl`")
