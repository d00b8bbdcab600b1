"""Deployment-side lookups: which config to run a kernel with, from a verified bundle.

    from farm.deploy import runtime
    registry = runtime.Registry.load("/srv/kernels", ["/etc/farm/trust"])   # verified, or an error
    choice = registry.lookup("matmul", (4096, 4096, 4096), "bfloat16", "tpu", device_kind="TPU v6 lite")
    choice.config, choice.rule                # e.g. {'block_m': 256, ...}, 'nearest'
    matmul = runtime.tuned("matmul", registry=registry)   # target from jax.devices()[0]
    c = jax.jit(lambda a, b: matmul(a, b))(a, b)           # built once per input shapes and dtypes
    norm = runtime.tuned("rms_norm", registry=registry)
    jax.grad(loss)(x)                         # through the tuned rms_norm_bwd (the kernel's BACKWARD)
    registry.lookups()                        # every task asked for: rule and distance
    with runtime.record("misses.jsonl"):      # or FARM_RECORD_MISSES=misses.jsonl
        model(batch)                          # tasks without an exact row -> `farm sweep --tasks`

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

Misses: each distinct task a registry resolves is kept in `lookups()` (kernel, shape, dtype,
target, rule, distance). A "default", or a "nearest" farther than NEAREST_WARN_DISTANCE, warns
once per task (TuningMissWarning). While `record(path)` is active, or FARM_RECORD_MISSES names a
file, every task without an exact row is appended to that file once (farm.deploy.misses).

Targets: `tuned(kernel)` without a target follows `jax.devices()[0]`: "interpret" (Pallas
interpret mode) on CPU, "tpu" on TPU, and on a GPU, per task, whichever of gpu-triton and
gpu-mosaic has an exact row with the faster median (else gpu-triton).

Gradients: a kernel whose module declares BACKWARD (kernels.protocol.Backward) is wrapped in a
`jax.custom_vjp` that runs its backward kernel, itself looked up and tuned; any other kernel
raises NoBackwardKernel when differentiated.

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
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import kernels
import kernels.protocol
from farm.bundle.locate import OpenedBundle, open_bundle
from farm.bundle.trust import TrustLike
from farm.deploy.misses import Miss, MissFileError, record_miss
from farm.errors import BundleError, FarmError

POLICIES = ("warn", "refuse", "accept")
CACHE_LIMIT = 100_000  # cached lookups per registry
FINGERPRINT_KEYS = ("jax", "jaxlib", "pallas_farm", "libtpu", "jax-cuda12-plugin", "jax-cuda13-plugin", "triton")
EXACT, NEAREST, DEFAULT = "exact", "nearest", "default"
# A "nearest" farther than this (sum of |log2| ratios: 1.0 is one dimension twice or half the
# tuned one) warns, as a "default" always does: the config was tuned for a rather different task.
NEAREST_WARN_DISTANCE = 1.0
HISTORY_LIMIT = 100_000  # distinct lookups remembered (and warned about, and recorded) per registry
RECORD_ENV = "FARM_RECORD_MISSES"  # a path: record misses there (as runtime.record(path) does)
GPU_TARGETS = ("gpu-triton", "gpu-mosaic")  # in order of preference when the bundle has neither
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
        self._history: dict[tuple, Lookup] = {}
        self._warned: set[tuple] = set()
        _registries.add(self)

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
            noticed = None
            with self._lock:
                choice = self._cache.get(key)
                if choice is None:
                    if len(self._cache) >= CACHE_LIMIT:  # many distinct shapes: start over, stay bounded
                        self._cache.clear()
                    choice = self._cache[key] = self._resolve(*key)
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
                new = task not in self._warned
                self._warned.add(task)
            if new:
                warnings.warn(_miss_message(lookup, self.source), TuningMissWarning, stacklevel=_caller_level())
        path = recording_path()
        if path is not None:
            _record(path, [lookup])

    def gpu_target(self, kernel: str, shape: Sequence[int], dtype: Any, device_kind: str | None = None,
                   targets: Sequence[str] = GPU_TARGETS) -> str:
        """Of `targets`, the one with an exact row for this task and the fastest median; else the first."""
        shape, dtype = tuple(int(d) for d in shape), _dtype_name(dtype)
        timed = [(row.median_s, target) for target in targets
                 if (row := self._exact.get((kernel, shape, dtype, target, device_kind))) is not None
                 and row.median_s is not None]
        return min(timed)[1] if timed else targets[0]

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

    def tuned(self, kernel: str, *, target: str | None = None, device_kind: str | None = None, interpret: bool = False,
              shape_of: Callable[..., tuple[int, ...]] | None = None) -> TunedKernel:
        """A function that runs `kernel` on JAX arrays with the looked-up config."""
        return TunedKernel(self, kernel, target=target, device_kind=device_kind, interpret=interpret,
                           shape_of=shape_of)


def _choice(row: _Row, rule: str, distance: float, config: dict[str, Any] | None = None) -> Choice:
    config = json.loads(row.config_json) if config is None else config
    return Choice(MappingProxyType(config), rule, row.task_key, row.shape, row.device_kind, distance, row.median_s)


_INTERNAL = (str(Path(kernels.__file__).parent) + os.sep, str(Path(__file__).parent) + os.sep)


def _caller_level() -> int:
    """The stacklevel of the first frame outside the farm, the kernels and JAX: the user's call."""
    import inspect

    frame, level = inspect.currentframe().f_back.f_back, 2  # the caller of warnings.warn's caller
    while frame is not None and (frame.f_code.co_filename.startswith(_INTERNAL)
                                 or f"{os.sep}jax{os.sep}" in frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1


def _miss_message(lookup: Lookup, source: str) -> str:
    task = f"{lookup.kernel} {lookup.shape} {lookup.dtype} on {lookup.target}"
    if lookup.rule == DEFAULT:
        why = "rule 'default': no tuned config is valid for it, the kernel's default config runs"
    else:
        why = (f"rule 'nearest' at log2 distance {lookup.distance:.2f} > {NEAREST_WARN_DISTANCE} (the config "
               f"was tuned for {lookup.tuned_shape})")
    return (f"{task}: not tuned in {source}; {why}. Record such tasks with {RECORD_ENV}=misses.jsonl (or "
            "runtime.record(path)) and tune them with `farm sweep --tasks misses.jsonl`")


# Registries alive in this process: record(path) writes the misses they already resolved.
_registries: weakref.WeakSet[Registry] = weakref.WeakSet()
_recording: list[Path] = []  # the paths of active record() calls; the latest wins
_unwritable: set[Path] = set()


def recording_path() -> Path | None:
    """Where misses are recorded now: the latest active `record(path)`, else $FARM_RECORD_MISSES."""
    if _recording:
        return _recording[-1]
    env = os.environ.get(RECORD_ENV)
    return Path(env) if env else None


def _record(path: Path, lookups: Sequence[Lookup]) -> None:
    """Append the misses to `path`; a file that cannot take them warns once, and the program runs on."""
    try:
        for lookup in lookups:
            if lookup.rule != EXACT:
                record_miss(path, lookup.miss)
    except MissFileError as err:
        if path not in _unwritable:
            _unwritable.add(path)
            warnings.warn(f"misses not recorded: {err}", RuntimeWarning, stacklevel=_caller_level())


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
        _record(path, registry.misses())
    return Recording(path)


def _device_target(platform: str) -> tuple[str | None, bool]:
    """(target, interpret) for a JAX platform name; target None: a GPU, chosen per task."""
    if platform == "cpu":
        return "interpret", True
    if platform == "tpu":
        return "tpu", False
    if platform in ("gpu", "cuda", "rocm"):
        return None, False
    raise FarmError(f"tuned(): no kernel target for JAX platform {platform!r}; expected cpu, tpu or gpu, "
                    "or pass target=")


class TunedKernel:
    """A kernel bound to a registry: called on JAX arrays (or tracers, under `jax.jit`), it runs
    the looked-up config.

    The Pallas call is built and jitted once per input shapes and dtypes, and cached. With
    target=None the target follows `jax.devices()[0]`: "interpret" on CPU, "tpu" on TPU, and on
    a GPU, per task, the GPU target with the faster tuned median in the registry (else
    "gpu-triton"). Differentiable when the kernel declares a backward kernel (its BACKWARD hook:
    the backward kernel is tuned too); otherwise differentiating raises NoBackwardKernel.
    """

    def __init__(self, registry: Registry, kernel: str, *, target: str | None = None, device_kind: str | None = None,
                 interpret: bool = False, shape_of: Callable[..., tuple[int, ...]] | None = None) -> None:
        self.registry, self.kernel, self.target, self.device_kind = registry, kernel, target, device_kind
        self.interpret = interpret
        self._module = kernels.load(kernel)
        self._shape_of = shape_of or self._module.shape_of
        self._built: dict[tuple, tuple[Choice, Callable[..., Any], Lookup]] = {}
        self._lock = threading.Lock()
        backward = kernels.protocol.hook(self._module, "BACKWARD")
        self._backward = None if backward is None else TunedKernel(
            registry, backward.kernel, target=target, device_kind=device_kind, interpret=interpret)
        import jax

        self._call = jax.jit(self._differentiable(backward))  # jit: eager calls skip the rule's dispatch

    def _entry(self, inputs: Sequence[Any]) -> tuple[Choice, Callable[..., Any], Lookup]:
        key = (*(tuple(x.shape) for x in inputs), *(x.dtype for x in inputs))
        entry = self._built.get(key)
        if entry is None:
            with self._lock:
                entry = self._built.get(key)
                if entry is None:
                    entry = self._built[key] = self._build(inputs)
        return entry

    def _platform(self, shape: tuple[int, ...], dtype: str) -> tuple[str, bool]:
        """(target, interpret) for a task: the given target, or the one of the device."""
        if self.target is not None:
            return self.target, self.interpret
        import jax

        target, interpret = _device_target(jax.devices()[0].platform)
        if target is None:
            gpu = [t for t in GPU_TARGETS if t in self._module.TARGETS]
            target = self.registry.gpu_target(self.kernel, shape, dtype, self.device_kind, gpu or GPU_TARGETS)
        return target, interpret or self.interpret

    def _build(self, inputs: Sequence[Any]) -> tuple[Choice, Callable[..., Any], Lookup]:
        import jax

        from kernels.lowering import Platform

        shape = tuple(int(d) for d in self._shape_of(*inputs))
        dtype = _dtype_name(inputs[0].dtype)
        target, interpret = self._platform(shape, dtype)
        choice = self.registry.lookup(self.kernel, shape, dtype, target, self.device_kind)
        lookup = Lookup.of(self.kernel, shape, dtype, target, self.device_kind, choice)
        built = self._module.build(dict(choice.config), shape, dtype, Platform(target, interpret=interpret))
        return choice, jax.jit(built), lookup

    def _differentiable(self, backward: Any) -> Callable[..., Any]:
        """The kernel call with its derivative rule: the backward kernel's VJP, or a clear refusal."""
        import jax

        def run(*inputs: Any) -> Any:
            return self._entry(inputs)[1](*inputs)

        if backward is None:
            refused = jax.custom_jvp(run)

            @refused.defjvp
            def _refuse(primals: tuple, tangents: tuple) -> Any:
                raise NoBackwardKernel(
                    f"kernel {self.kernel!r} has no backward kernel: runtime.tuned({self.kernel!r}) cannot be "
                    f"differentiated (jax.grad, jax.jvp, ...). Differentiate its reference "
                    f"({self._module.__name__}.reference) instead, or declare a backward kernel in "
                    f"{self._module.__name__} (the BACKWARD hook, kernels.protocol.Backward)")

            return refused

        differentiable = jax.custom_vjp(run)
        sources = backward.sources()
        keep_outputs = any(kind == "output" for kind, _ in sources)

        def forward(*inputs: Any) -> tuple[Any, tuple]:
            out = run(*inputs)
            return out, (inputs, out if keep_outputs else None)

        def vjp(residuals: tuple, cotangent: Any) -> tuple:
            inputs, out = residuals
            values = {"input": inputs, "output": _as_tuple(out), "cotangent": _as_tuple(cotangent)}
            grads = _as_tuple(self._backward(*(values[kind][i] for kind, i in sources)))
            by_input = dict(zip(backward.grads, grads))
            return tuple(by_input[i].astype(x.dtype) if i in by_input else _zeros(x) for i, x in enumerate(inputs))

        differentiable.defvjp(forward, vjp)
        return differentiable

    def choice(self, *inputs: Any) -> Choice:
        """The config (and rule) these inputs run with."""
        return self._entry(inputs)[0]

    def choices(self) -> list[Lookup]:
        """The tasks this kernel was built for, with the rule and distance of each config."""
        return [entry[2] for entry in list(self._built.values())]

    def __call__(self, *inputs: Any) -> Any:
        """Run the kernel on `inputs` with its tuned config."""
        return self._call(*inputs)


def _as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _zeros(x: Any) -> Any:
    """The zero cotangent of an input no backward output covers (float0 for integer inputs)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


_default: Registry | None = None


def set_default(registry: Registry | None) -> None:
    """Make `registry` the one `tuned()` uses when none is passed."""
    global _default
    _default = registry


def tuned(kernel_name: str, *, target: str | None = None, registry: Registry | None = None,
          device_kind: str | None = None, interpret: bool = False,
          shape_of: Callable[..., tuple[int, ...]] | None = None) -> TunedKernel:
    """A function that calls `kernel_name` on JAX arrays with the config looked up in `registry`.

    target=None follows the device (see TunedKernel); the result may be called under `jax.jit`
    and differentiated when the kernel has a backward kernel.
    """
    registry = registry if registry is not None else _default
    if registry is None:
        raise FarmError("tuned(): no registry; expected registry=Registry.load(...) or runtime.set_default(...)")
    return registry.tuned(kernel_name, target=target, device_kind=device_kind, interpret=interpret,
                          shape_of=shape_of)
