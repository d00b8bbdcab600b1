"""Deployment-side lookups: which config to run a kernel with, from a verified bundle.

    from farm.deploy import runtime
    registry = runtime.Registry.load("/srv/kernels", ["/etc/farm/trust"])   # verified, or an error
    choice = registry.lookup("matmul", (4096, 4096, 4096), "bfloat16", "tpu", device_kind="TPU v6 lite")
    choice.config, choice.rule                # e.g. {'block_m': 256, ...}, 'nearest'
    matmul = runtime.tuned("matmul", target="tpu", registry=registry)
    c = matmul(a, b)                          # built (and jitted) once per (shape, dtype)

`Registry.load` takes a bundle folder, a run folder, a bundle archive (.tar.gz) or a deployment
folder made by `farm pull` (its `current` version), and opens it with
`farm.bundle.locate.open_bundle`, which verifies it before a row is read.

Lookup rules, in order (`Choice.rule` says which one chose the config):
  1. "exact": a row for this kernel, shape, dtype, target and device kind (with
     device_kind=None, any device kind: the newest such row) whose config is valid.
  2. "nearest": among rows of the same kernel, dtype, target (and device kind when given) and
     rank, the tuned shape with the smallest log-distance sum_i |log2(tuned_i) - log2(asked_i)|
     whose config is valid for the asked shape; ties go to the smaller tuned shape, then the
     newest row.
  3. "default": the kernel's `default_config(shape, target)`.
A config is valid for a task when the kernel's own `check_config` accepts it (the legality of a
config is stated once, with the kernel) and, when search spaces are given (`spaces=`, loaded
`farm.search.spaces.SearchSpace` objects), the kernel's space admits it too.
Rows with status `no_valid_config` are never chosen.

Software fingerprints: each row records the versions it was tuned with (`software`). The
components in FINGERPRINT_KEYS that both the row and this process have are compared (plus a
row with no fingerprint at all); on a difference the policy decides: "warn" (default: load and
warn), "refuse" (raise SoftwareMismatch) or "accept" (load silently).

Lookups are thread-safe: cached answers are read without a lock (a dict read), misses are
resolved and cached under a lock.
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
from typing import Any, NamedTuple

import kernels
from farm.bundle.locate import OpenedBundle, open_bundle
from farm.bundle.trust import TrustLike
from farm.errors import BundleError, FarmError

POLICIES = ("warn", "refuse", "accept")
CACHE_LIMIT = 100_000  # cached lookups per registry
FINGERPRINT_KEYS = ("jax", "jaxlib", "pallas_farm", "libtpu", "jax-cuda12-plugin", "jax-cuda13-plugin", "triton")
EXACT, NEAREST, DEFAULT = "exact", "nearest", "default"
_COLUMNS = ("task_key", "kernel", "shape", "dtype", "target", "device_kind", "status", "config", "software",
            "median_s", "created")
class SoftwareMismatch(BundleError):
    """The bundle was tuned with other software versions and the policy is "refuse"."""


class SoftwareMismatchWarning(UserWarning):
    """The bundle was tuned with other software versions (policy "warn")."""


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
                 signed: bool = False, spaces: Sequence[Any] | None = None) -> None:
        self.source, self.manifest, self.signed = source, dict(manifest or {}), signed
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

    def __len__(self) -> int:
        return self._rows

    def __repr__(self) -> str:
        return f"Registry({self.source!r}, {self._rows} tuned tasks, signed={self.signed})"

    @classmethod
    def load(cls, path: str | Path, trusted_keys: TrustLike, *, allow_unsigned: bool = False,
             software_policy: str = "warn", software: Mapping[str, Any] | None = None,
             spaces: Sequence[Any] | None = None) -> Registry:
        """A registry from a verified bundle, run, deployment folder or archive (farm.bundle.locate)."""
        if software_policy not in POLICIES:
            raise FarmError(f"software_policy: expected one of {POLICIES}, got {software_policy!r}")
        with open_bundle(path, trusted_keys, allow_unsigned=allow_unsigned) as opened:
            return cls._from_opened(opened, software_policy, software, spaces)

    @classmethod
    def _from_opened(cls, opened: OpenedBundle, policy: str, software: Mapping[str, Any] | None,
                     spaces: Sequence[Any] | None) -> Registry:
        table = opened.configs(columns=_COLUMNS)
        columns = [table.column(name).to_pylist() for name in _COLUMNS]
        rows: list[_Row] = []
        fingerprints: dict[str | None, list[str]] = {}
        collecting = gc.isenabled()
        gc.disable()  # tens of thousands of small objects: no collector passes while they are built
        try:
            for (task_key, kernel, shape, dtype, target, device_kind, status, config, fingerprint, median_s,
                 created) in zip(*columns):
                if status != "ok" or not config:
                    continue
                rows.append(_Row(task_key, kernel, tuple(shape), dtype, target, device_kind, config, median_s,
                                 created.isoformat() if isinstance(created, datetime) else created or ""))
                fingerprints.setdefault(fingerprint, []).append(task_key)
            registry = cls(rows, source=opened.where, manifest=opened.manifest, signed=opened.signed, spaces=spaces)
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
               device_kind: str | None = None) -> Choice:
        """The config for a task and the rule that chose it (exact, nearest or default)."""
        key = (kernel, shape if type(shape) is tuple else tuple(shape),
               dtype if type(dtype) is str else _dtype_name(dtype), target, device_kind)
        choice = self._cache.get(key)
        if choice is None:
            with self._lock:
                choice = self._cache.get(key)
                if choice is None:
                    if len(self._cache) >= CACHE_LIMIT:  # many distinct shapes: start over, stay bounded
                        self._cache.clear()
                    choice = self._cache[key] = self._resolve(*key)
        return choice

    def _resolve(self, kernel: str, shape: tuple[int, ...], dtype: str, target: str,
                 device_kind: str | None) -> Choice:
        shape = tuple(int(d) for d in shape)
        row = self._exact.get((kernel, shape, dtype, target, device_kind))
        if row is not None and self._valid(kernel, json.loads(row.config_json), shape, dtype, target):
            return _choice(row, EXACT, 0.0)
        if all(d > 0 for d in shape):
            candidates = [r for r in self._groups.get((kernel, dtype, target), ())
                          if len(r.shape) == len(shape) and (device_kind is None or r.device_kind == device_kind)]
            candidates.sort(key=lambda r: r.created, reverse=True)
            candidates.sort(key=lambda r: (log_distance(r.shape, shape), r.shape))
            for row in candidates:
                config = json.loads(row.config_json)
                if self._valid(kernel, config, shape, dtype, target):
                    return _choice(row, NEAREST, log_distance(row.shape, shape), config)
        module = kernels.load(kernel)
        return Choice(MappingProxyType(dict(module.default_config(shape, target))), DEFAULT)

    def _valid(self, kernel: str, config: Mapping[str, Any], shape: tuple[int, ...], dtype: str,
               target: str) -> bool:
        """Whether the kernel (and its given search space) admits `config` for this task."""
        try:
            if kernels.load(kernel).check_config(dict(config), shape, dtype, target) is not None:
                return False
        except Exception:  # noqa: BLE001 - a config from another kernel version: not valid here
            return False
        space = self._spaces.get(kernel)
        return space is None or space.violated(config, shape, dtype, target) is None

    def tuned(self, kernel: str, *, target: str, device_kind: str | None = None, interpret: bool = False,
              shape_of: Callable[..., tuple[int, ...]] | None = None) -> TunedKernel:
        """A function that runs `kernel` on JAX arrays with the looked-up config."""
        return TunedKernel(self, kernel, target=target, device_kind=device_kind, interpret=interpret,
                           shape_of=shape_of)


def _choice(row: _Row, rule: str, distance: float, config: dict[str, Any] | None = None) -> Choice:
    config = json.loads(row.config_json) if config is None else config
    return Choice(MappingProxyType(config), rule, row.task_key, row.shape, row.device_kind, distance, row.median_s)


class TunedKernel:
    """A kernel bound to a registry: called on JAX arrays, it runs the looked-up config.

    The Pallas call is built and jitted once per (input shapes, dtype) and cached.
    """

    def __init__(self, registry: Registry, kernel: str, *, target: str, device_kind: str | None = None,
                 interpret: bool = False, shape_of: Callable[..., tuple[int, ...]] | None = None) -> None:
        self.registry, self.kernel, self.target, self.device_kind = registry, kernel, target, device_kind
        self.interpret = interpret
        self._module = kernels.load(kernel)
        self._shape_of = shape_of or self._module.shape_of
        self._built: dict[tuple, tuple[Choice, Callable[..., Any]]] = {}
        self._lock = threading.Lock()

    def _entry(self, inputs: Sequence[Any]) -> tuple[Choice, Callable[..., Any]]:
        key = (*(tuple(x.shape) for x in inputs), inputs[0].dtype)
        entry = self._built.get(key)
        if entry is None:
            with self._lock:
                entry = self._built.get(key)
                if entry is None:
                    entry = self._built[key] = self._build(inputs)
        return entry

    def _build(self, inputs: Sequence[Any]) -> tuple[Choice, Callable[..., Any]]:
        import jax

        from kernels.lowering import Platform

        shape = tuple(int(d) for d in self._shape_of(*inputs))
        dtype = _dtype_name(inputs[0].dtype)
        choice = self.registry.lookup(self.kernel, shape, dtype, self.target, self.device_kind)
        platform = Platform(self.target, interpret=self.interpret)
        return choice, jax.jit(self._module.build(dict(choice.config), shape, dtype, platform))

    def choice(self, *inputs: Any) -> Choice:
        """The config (and rule) these inputs run with."""
        return self._entry(inputs)[0]

    def __call__(self, *inputs: Any) -> Any:
        """Run the kernel on `inputs` with its tuned config."""
        return self._entry(inputs)[1](*inputs)


_default: Registry | None = None


def set_default(registry: Registry | None) -> None:
    """Make `registry` the one `tuned()` uses when none is passed."""
    global _default
    _default = registry


def tuned(kernel_name: str, *, target: str, registry: Registry | None = None, device_kind: str | None = None,
          interpret: bool = False, shape_of: Callable[..., tuple[int, ...]] | None = None) -> TunedKernel:
    """A function that calls `kernel_name` on JAX arrays with the config looked up in `registry`."""
    registry = registry if registry is not None else _default
    if registry is None:
        raise FarmError("tuned(): no registry; expected registry=Registry.load(...) or runtime.set_default(...)")
    return registry.tuned(kernel_name, target=target, device_kind=device_kind, interpret=interpret,
                          shape_of=shape_of)
