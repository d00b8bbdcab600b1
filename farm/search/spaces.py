"""Load and validate search spaces (`search_spaces/*.yaml`) before any work starts.

A space says what a user chooses: kernel, shapes, dtypes, targets, preferred knob ranges, a
budget and a sampler; it may build on another one (`farm.search.space_files`: `extends`, and
three-line spaces that take the kernel's shipped space). Every problem raises `SpaceError`
naming the file, the field and what was expected.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import kernels
from farm.errors import SpaceError, show
from farm.search.constraints import Constraint, ConstraintEvalError, ConstraintSyntaxError
from farm.search.space_files import read_yaml, resolve
from kernels.lowering import TARGETS

DTYPES = ("float32", "bfloat16", "float16")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SAMPLERS = ("tpe", "random", "grid")
TOP_LEVEL = ("kernel", "description", "extends", "shapes", "dtypes", "targets", "params", "constraints",
             "sampler", "trials")
PARAM_KINDS = ("values", "range", "pow2")
DEFAULT_TRIALS = 20
# Spaces this large are checked for a feasible config by sampling instead of enumeration.
ENUMERATION_LIMIT = 200_000
FEASIBILITY_SAMPLES = 20_000
# Bounds on what one space may ask for, so that validating it takes bounded time and memory
# (each breach is a one-line SpaceError naming the field and the bound).
MAX_LIST = 256                 # shapes per list, values per knob
MAX_CHOICES = 4096             # choices of one knob (a range's size is checked before it is built)
MAX_PARAMS = 64                # knobs
MAX_CONSTRAINTS = 256
MAX_INT = 2 ** 62              # magnitude of any integer knob value or range end
MAX_STRING = 200               # characters of a string knob value
MAX_DIM = 2 ** 31 - 1          # one shape dimension
MAX_ELEMENTS = 2 ** 48         # product of a shape's dimensions
MAX_TASKS = 4096               # targets x shapes x dtypes
MAX_TRIALS = 1_000_000
MAX_GRID = 10_000_000          # configs of a target when the sampler is grid (Optuna lists them all)
MAX_CONSIDERED = 2_000_000     # configs the feasibility check may consider for the whole space
FEASIBILITY_SECONDS = 120.0    # and for how long
# Kernels named by a module path are imported (their module-level code runs) only with this opt-in.
ALLOW_KERNEL_MODULES_ENV = "FARM_ALLOW_KERNEL_MODULES"


@dataclasses.dataclass(frozen=True)
class Param:
    """One tunable knob: its name, its finite choices and the targets it applies to."""

    name: str
    choices: tuple[Any, ...]
    kind: str  # "values" | "range" | "pow2"
    targets: tuple[str, ...] | None = None  # None: every target

    def applies_to(self, target: str) -> bool:
        """Whether the knob exists for `target`."""
        return self.targets is None or target in self.targets


@dataclasses.dataclass(frozen=True)
class ConstraintSpec:
    """A constraint and the targets it applies to."""

    constraint: Constraint
    targets: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """The shapes and dtypes tuned on one target."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
    """Which Optuna sampler drives the studies of a space, and its seed."""

    name: str = "tpe"
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """A validated search space."""

    path: str
    kernel: str
    shape_names: tuple[str, ...]
    targets: tuple[TargetSpec, ...]
    params: tuple[Param, ...]
    constraints: tuple[ConstraintSpec, ...]
    sampler: SamplerSpec
    trials: int
    # The document after its `extends` chain is merged in: what a run folder saves for --resume.
    document: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def params_for(self, target: str) -> tuple[Param, ...]:
        """The knobs that exist for `target`."""
        return tuple(p for p in self.params if p.applies_to(target))

    def env(self, config: Mapping[str, Any], shape: Sequence[int], dtype: str) -> dict[str, Any]:
        """The variables a constraint sees: config knobs, named shape dims, dtype_bytes."""
        return {**dict(zip(self.shape_names, shape)), "dtype_bytes": DTYPE_BYTES[dtype], **config}

    def violated(self, config: Mapping[str, Any], shape: Sequence[int], dtype: str,
                 target: str, *, strict: bool = False) -> str | None:
        """Why `config` is out of this task's space, or None: the source of the first constraint
        it breaks, else the kernel's own refusal (`check_config`: the config is illegal).

        A constraint that cannot be evaluated for this config (a value over the evaluator's
        bounds, a division by zero) makes the config invalid, with the reason; with `strict`
        it raises ConstraintEvalError instead (loading a space refuses such a constraint)."""
        env = self.env(config, shape, dtype)
        for spec in self.constraints:
            if spec.targets is not None and target not in spec.targets:
                continue
            if not spec.constraint.names <= env.keys():
                continue  # it reads a knob this target lacks
            try:
                holds = spec.constraint(env)
            except ConstraintEvalError as err:
                if strict:
                    raise ConstraintEvalError(f"{spec.constraint.source!r}: {err}") from None
                return f"{spec.constraint.source} (cannot be evaluated: {err})"
            if not holds:
                return spec.constraint.source
        try:
            reason = kernels.load(self.kernel).check_config(dict(config), tuple(shape), dtype, target)
        except Exception as err:  # noqa: BLE001 - a kernel's check that fails refuses the config
            reason = f"{type(err).__name__}: {err}"
        return None if reason is None else f"kernel {self.kernel}: {reason}"

    def configs(self, target: str) -> Iterator[dict[str, Any]]:
        """Every config of the target's knobs, in grid order (constraints not applied)."""
        params = self.params_for(target)
        for values in itertools.product(*(p.choices for p in params)):
            yield dict(zip((p.name for p in params), values))

    def size(self, target: str) -> int:
        """How many configs the target's knobs span."""
        return math.prod(len(p.choices) for p in self.params_for(target))


def load_space(path: str | Path, *, allow_kernel_modules: bool | None = None) -> SearchSpace:
    """Load and fully validate one search space file (and the spaces it extends).

    `allow_kernel_modules`: accept a `kernel:` given as a module path (importing it runs its code);
    None reads the FARM_ALLOW_KERNEL_MODULES environment variable (`1` allows)."""
    path = str(path)
    return parse_space(read_yaml(path), path, allow_kernel_modules=allow_kernel_modules)


def load_spaces(paths: Sequence[str | Path], *, allow_kernel_modules: bool | None = None) -> list[SearchSpace]:
    """Load and validate every file; the first invalid one raises before any work starts."""
    if not paths:
        raise SpaceError("<command line>", "SPACE", "at least one search space file")
    return [load_space(p, allow_kernel_modules=allow_kernel_modules) for p in paths]


def kernel_modules_allowed(allow: bool | None = None) -> bool:
    """Whether a space may name its kernel by module path: `allow`, else FARM_ALLOW_KERNEL_MODULES=1."""
    return allow if allow is not None else os.environ.get(ALLOW_KERNEL_MODULES_ENV, "") in ("1", "true", "yes")


def parse_space(data: Any, path: str, *, allow_kernel_modules: bool | None = None) -> SearchSpace:
    """Validate the parsed YAML document of a search space (its `extends` chain merged in first)."""
    data = resolve(data, path)
    if not isinstance(data, dict):
        raise SpaceError(path, "document", "a mapping with fields " + ", ".join(TOP_LEVEL),
                         type(data).__name__)
    unknown = sorted(set(data) - set(TOP_LEVEL))
    if unknown:
        raise SpaceError(path, unknown[0], "one of the fields " + ", ".join(TOP_LEVEL) + " (unknown field)")

    kernel_name = data.get("kernel")
    if not isinstance(kernel_name, str) or not kernel_name:
        raise SpaceError(path, "kernel", "a kernel name", kernel_name)
    if "." in kernel_name and kernel_name not in kernels.REGISTRY \
            and not kernel_modules_allowed(allow_kernel_modules):
        raise SpaceError(path, "kernel", f"a registered kernel ({', '.join(sorted(kernels.REGISTRY))}); a module "
                         f"path is imported, running its code, only with {ALLOW_KERNEL_MODULES_ENV}=1 or "
                         f"--allow-kernel-module", kernel_name)
    try:
        module = kernels.load(kernel_name)
    except kernels.UnknownKernel as err:
        raise SpaceError(path, "kernel", f"a known kernel ({err})") from None
    shape_names = tuple(module.SHAPE_NAMES)

    default_shapes = _shapes(data.get("shapes"), path, "shapes", len(shape_names), required=False)
    default_dtypes = _dtypes(data.get("dtypes"), path, "dtypes", required=False)
    targets = _targets(data.get("targets"), path, module, default_shapes, default_dtypes)
    target_names = tuple(t.name for t in targets)
    params = _params(data.get("params"), path, shape_names, target_names)
    constraints = _constraints(data.get("constraints"), path, params, shape_names, target_names)
    sampler = _sampler(data.get("sampler"), path)
    trials = data.get("trials", DEFAULT_TRIALS)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise SpaceError(path, "trials", "a positive integer", trials)
    if trials > MAX_TRIALS:
        raise SpaceError(path, "trials", f"at most {MAX_TRIALS} trials per task", trials)

    space = SearchSpace(path, kernel_name, shape_names, targets, params, constraints, sampler, trials, data)
    tasks = sum(len(t.shapes) * len(t.dtypes) for t in targets)
    if tasks > MAX_TASKS:
        raise SpaceError(path, "shapes", f"at most {MAX_TASKS} tasks (targets x shapes x dtypes), not {tasks}")
    if sampler.name == "grid":
        for target in targets:
            if space.size(target.name) > MAX_GRID:
                raise SpaceError(path, "sampler", f"a grid of at most {MAX_GRID} configs (target {target.name} "
                                 f"has {space.size(target.name)}); use tpe or random")
    _check_feasible(space)
    return space


def _shapes(value: Any, path: str, field: str, rank: int, required: bool) -> tuple[tuple[int, ...], ...]:
    if value is None and not required:
        return ()
    expected = f"a non-empty list of shapes, each a list of {rank} positive integers"
    if not isinstance(value, list) or not value:
        raise SpaceError(path, field, expected, value)
    if len(value) > MAX_LIST:
        raise SpaceError(path, field, f"at most {MAX_LIST} shapes, not {len(value)}")
    shapes = []
    for i, shape in enumerate(value):
        if (not isinstance(shape, list) or len(shape) != rank
                or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
            raise SpaceError(path, f"{field}[{i}]", f"a list of {rank} positive integers", shape)
        if max(shape) > MAX_DIM or math.prod(shape) > MAX_ELEMENTS:
            raise SpaceError(path, f"{field}[{i}]", f"dimensions of at most {MAX_DIM} and at most {MAX_ELEMENTS} "
                             f"elements in all", shape)
        shapes.append(tuple(shape))
    return tuple(shapes)


def _dtypes(value: Any, path: str, field: str, required: bool) -> tuple[str, ...]:
    if value is None and not required:
        return ()
    if not isinstance(value, list) or not value or len(value) > MAX_LIST:
        raise SpaceError(path, field, f"a non-empty list of dtypes from {list(DTYPES)}", value)
    for i, dtype in enumerate(value):
        if dtype not in DTYPES:
            raise SpaceError(path, f"{field}[{i}]", f"one of {list(DTYPES)}", dtype)
    return tuple(value)


def _targets(value: Any, path: str, module: Any, shapes: tuple, dtypes: tuple) -> tuple[TargetSpec, ...]:
    expected = f"a non-empty list or mapping of targets from {list(module.TARGETS)}"
    if isinstance(value, list):
        value = {name: None for name in value} if all(isinstance(v, str) for v in value) else value
    if not isinstance(value, dict) or not value:
        raise SpaceError(path, "targets", expected, value)
    rank = len(module.SHAPE_NAMES)
    specs = []
    for name, body in value.items():
        field = f"targets.{name}"
        if name not in TARGETS:
            raise SpaceError(path, field, f"a target from {list(TARGETS)}")
        if name not in module.TARGETS:
            raise SpaceError(path, field, f"a target kernel {module.NAME!r} supports: {list(module.TARGETS)}")
        body = {} if body is None else body
        if not isinstance(body, dict) or set(body) - {"shapes", "dtypes"}:
            raise SpaceError(path, field, "a mapping with optional fields shapes, dtypes", body)
        target_shapes = _shapes(body.get("shapes"), path, f"{field}.shapes", rank, False) or shapes
        target_dtypes = _dtypes(body.get("dtypes"), path, f"{field}.dtypes", False) or dtypes
        if not target_shapes:
            raise SpaceError(path, "shapes", f"a list of shapes (or {field}.shapes)")
        if not target_dtypes:
            raise SpaceError(path, "dtypes", f"a list of dtypes (or {field}.dtypes)")
        specs.append(TargetSpec(name, target_shapes, target_dtypes))
    return tuple(specs)


def _scalar(v: Any) -> bool:
    """A knob value of bounded size: a boolean, an integer within MAX_INT, a finite float, a short string."""
    if isinstance(v, bool):
        return True
    if isinstance(v, int):
        return abs(v) <= MAX_INT
    if isinstance(v, float):
        return math.isfinite(v)
    return isinstance(v, str) and len(v) <= MAX_STRING


def _scalar_list(value: Any) -> bool:
    return isinstance(value, list) and all(map(_scalar, value))


def _int_pair(value: Any) -> bool:
    return (isinstance(value, list) and len(value) in (2, 3)
            and all(isinstance(v, int) and not isinstance(v, bool) and abs(v) <= MAX_INT for v in value))


def _params(value: Any, path: str, shape_names: tuple[str, ...], targets: tuple[str, ...]) -> tuple[Param, ...]:
    if not isinstance(value, dict) or not value:
        raise SpaceError(path, "params", "a non-empty mapping of parameter name to "
                         "{values: [...]} | {range: [lo, hi]} | {pow2: [lo, hi]}", value)
    if len(value) > MAX_PARAMS:
        raise SpaceError(path, "params", f"at most {MAX_PARAMS} knobs, not {len(value)}")
    params = []
    for name, spec in value.items():
        field = f"params.{name}"
        if not isinstance(name, str) or not name.isidentifier() or name in shape_names or name == "dtype_bytes":
            raise SpaceError(path, field, f"an identifier that is not a shape dimension {list(shape_names)}")
        if not isinstance(spec, dict):
            raise SpaceError(path, field, "a mapping with one of " + ", ".join(PARAM_KINDS), spec)
        kinds = [k for k in PARAM_KINDS if k in spec]
        extra = set(spec) - set(PARAM_KINDS) - {"targets"}
        if len(kinds) != 1 or extra:
            raise SpaceError(path, field, "exactly one of " + ", ".join(PARAM_KINDS) + " (and optional targets)",
                             spec)
        kind = kinds[0]
        raw = spec[kind]
        if kind == "values":
            if not _scalar_list(raw) or not raw or len(raw) > MAX_CHOICES:
                raise SpaceError(path, f"{field}.values", f"a non-empty list of at most {MAX_CHOICES} numbers "
                                 f"(integers within 2**62, finite floats), strings (of at most {MAX_STRING} "
                                 f"characters) or booleans", raw)
            if len(set(map(repr, raw))) != len(raw):
                raise SpaceError(path, f"{field}.values", "distinct values", raw)
            choices = tuple(raw)
        elif kind == "range":
            if not _int_pair(raw) or raw[0] > raw[1] or (len(raw) == 3 and raw[2] < 1):
                raise SpaceError(path, f"{field}.range", "[lo, hi] or [lo, hi, step] integers within 2**62 with "
                                 "lo <= hi, step >= 1", raw)
            step = raw[2] if len(raw) == 3 else 1
            count = (raw[1] - raw[0]) // step + 1
            if count > MAX_CHOICES:
                raise SpaceError(path, f"{field}.range", f"at most {MAX_CHOICES} values (a larger step, or pow2), "
                                 f"not {count}", raw)
            choices = tuple(range(raw[0], raw[1] + 1, step))
        else:
            if not _int_pair(raw) or len(raw) != 2 or not all(v > 0 and v & (v - 1) == 0 for v in raw) or raw[0] > raw[1]:
                raise SpaceError(path, f"{field}.pow2", "[lo, hi] powers of two with lo <= hi", raw)
            choices = tuple(2 ** e for e in range(raw[0].bit_length() - 1, raw[1].bit_length()))
        param_targets = spec.get("targets")
        if param_targets is not None:
            if not isinstance(param_targets, list) or not param_targets or not all(t in targets for t in param_targets):
                raise SpaceError(path, f"{field}.targets", f"a non-empty list of this space's targets {list(targets)}",
                                 param_targets)
            param_targets = tuple(param_targets)
        params.append(Param(name, choices, kind, param_targets))
    return tuple(params)


def _constraints(value: Any, path: str, params: tuple[Param, ...], shape_names: tuple[str, ...],
                 targets: tuple[str, ...]) -> tuple[ConstraintSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SpaceError(path, "constraints", "a list of expressions (or {expr, targets} mappings)", value)
    if len(value) > MAX_CONSTRAINTS:
        raise SpaceError(path, "constraints", f"at most {MAX_CONSTRAINTS} constraints, not {len(value)}")
    known = {p.name for p in params} | set(shape_names) | {"dtype_bytes"}
    specs = []
    for i, item in enumerate(value):
        field = f"constraints[{i}]"
        constraint_targets = None
        if isinstance(item, dict):
            if set(item) - {"expr", "targets"} or "expr" not in item:
                raise SpaceError(path, field, "a mapping with fields expr and optional targets", item)
            constraint_targets = item.get("targets")
            if constraint_targets is not None and (
                    not isinstance(constraint_targets, list) or not all(t in targets for t in constraint_targets)):
                raise SpaceError(path, f"{field}.targets", f"a list of this space's targets {list(targets)}",
                                 constraint_targets)
            item = item["expr"]
        if not isinstance(item, str):
            raise SpaceError(path, field, "an expression string", item)
        try:
            constraint = Constraint(item)
        except ConstraintSyntaxError as err:
            raise SpaceError(path, field, f"an arithmetic/boolean expression ({err})", item) from None
        unknown = sorted(constraint.names - known)
        if unknown:
            raise SpaceError(path, field, f"names from the params, shape dims {list(shape_names)} or dtype_bytes; "
                             f"unknown name {unknown[0]!r}", item)
        specs.append(ConstraintSpec(constraint, tuple(constraint_targets) if constraint_targets else None))
    return tuple(specs)


def _sampler(value: Any, path: str) -> SamplerSpec:
    if value is None:
        return SamplerSpec()
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict) or set(value) - {"name", "seed"}:
        raise SpaceError(path, "sampler", "a sampler name or {name, seed}", value)
    name = value.get("name", "tpe")
    if name not in SAMPLERS:
        raise SpaceError(path, "sampler.name", f"one of {list(SAMPLERS)}", name)
    seed = value.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SpaceError(path, "sampler.seed", "an integer", seed)
    return SamplerSpec(name, seed)


def _check_feasible(space: SearchSpace) -> None:
    """Every (target, shape, dtype) must admit at least one config.

    Bounded: at most MAX_CONSIDERED configs and FEASIBILITY_SECONDS for the whole space (a space
    that needs more to show a feasible config is refused), and each constraint evaluation is
    bounded by `farm.search.constraints`; a constraint that cannot be evaluated is refused.
    """
    considered, deadline = 0, time.monotonic() + FEASIBILITY_SECONDS
    for target in space.targets:
        size = space.size(target.name)
        for shape in target.shapes:
            for dtype in target.dtypes:
                if size <= ENUMERATION_LIMIT:
                    candidates = space.configs(target.name)
                else:
                    rng = random.Random(0)
                    params = space.params_for(target.name)
                    candidates = ({p.name: rng.choice(p.choices) for p in params}
                                  for _ in range(FEASIBILITY_SAMPLES))
                shown = "x".join(map(str, shape))
                task = f"target {target.name}, shape {shown}, dtype {dtype}"
                feasible = False
                for config in candidates:
                    considered += 1
                    if considered > MAX_CONSIDERED or (considered % 256 == 0 and time.monotonic() > deadline):
                        raise SpaceError(space.path, "constraints", f"a feasible config for every task within "
                                         f"{MAX_CONSIDERED} configs and {FEASIBILITY_SECONDS:.0f} s in all; still "
                                         f"searching at {task} (fewer shapes, or narrower knobs)")
                    try:
                        feasible = space.violated(config, shape, dtype, target.name, strict=True) is None
                    except ConstraintEvalError as err:
                        raise SpaceError(space.path, "constraints", f"expressions that evaluate for every config "
                                         f"({err}; e.g. {task}, config {show(config)})") from None
                    if feasible:
                        break
                if not feasible:
                    raise SpaceError(space.path, "constraints",
                                     f"at least one config satisfying every constraint for {task}; none of the "
                                     f"{size} configs does")
