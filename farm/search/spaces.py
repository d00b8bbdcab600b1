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
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import kernels
from farm.errors import SpaceError
from farm.search.constraints import Constraint, ConstraintSyntaxError
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
                 target: str) -> str | None:
        """Why `config` is out of this task's space, or None: the source of the first constraint
        it breaks, else the kernel's own refusal (`check_config`: the config is illegal)."""
        env = self.env(config, shape, dtype)
        for spec in self.constraints:
            if spec.targets is not None and target not in spec.targets:
                continue
            if not spec.constraint.names <= env.keys():
                continue  # it reads a knob this target lacks
            if not spec.constraint(env):
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


def load_space(path: str | Path) -> SearchSpace:
    """Load and fully validate one search space file (and the spaces it extends)."""
    path = str(path)
    return parse_space(read_yaml(path), path)


def load_spaces(paths: Sequence[str | Path]) -> list[SearchSpace]:
    """Load and validate every file; the first invalid one raises before any work starts."""
    if not paths:
        raise SpaceError("<command line>", "SPACE", "at least one search space file")
    return [load_space(p) for p in paths]


def parse_space(data: Any, path: str) -> SearchSpace:
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

    space = SearchSpace(path, kernel_name, shape_names, targets, params, constraints, sampler, trials, data)
    _check_feasible(space)
    return space


def _shapes(value: Any, path: str, field: str, rank: int, required: bool) -> tuple[tuple[int, ...], ...]:
    if value is None and not required:
        return ()
    expected = f"a non-empty list of shapes, each a list of {rank} positive integers"
    if not isinstance(value, list) or not value:
        raise SpaceError(path, field, expected, value)
    shapes = []
    for i, shape in enumerate(value):
        if (not isinstance(shape, list) or len(shape) != rank
                or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
            raise SpaceError(path, f"{field}[{i}]", f"a list of {rank} positive integers", shape)
        shapes.append(tuple(shape))
    return tuple(shapes)


def _dtypes(value: Any, path: str, field: str, required: bool) -> tuple[str, ...]:
    if value is None and not required:
        return ()
    if not isinstance(value, list) or not value:
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


def _scalar_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, (int, float, str, bool)) for v in value)


def _int_pair(value: Any) -> bool:
    return (isinstance(value, list) and len(value) in (2, 3)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value))


def _params(value: Any, path: str, shape_names: tuple[str, ...], targets: tuple[str, ...]) -> tuple[Param, ...]:
    if not isinstance(value, dict) or not value:
        raise SpaceError(path, "params", "a non-empty mapping of parameter name to "
                         "{values: [...]} | {range: [lo, hi]} | {pow2: [lo, hi]}", value)
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
            if not _scalar_list(raw) or not raw:
                raise SpaceError(path, f"{field}.values", "a non-empty list of numbers, strings or booleans", raw)
            if len(set(map(repr, raw))) != len(raw):
                raise SpaceError(path, f"{field}.values", "distinct values", raw)
            choices = tuple(raw)
        elif kind == "range":
            if not _int_pair(raw) or raw[0] > raw[1] or (len(raw) == 3 and raw[2] < 1):
                raise SpaceError(path, f"{field}.range", "[lo, hi] or [lo, hi, step] integers with lo <= hi, step >= 1", raw)
            step = raw[2] if len(raw) == 3 else 1
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
    """Every (target, shape, dtype) must admit at least one config."""
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
                try:
                    if any(space.violated(c, shape, dtype, target.name) is None for c in candidates):
                        continue
                except (ArithmeticError, TypeError) as err:
                    raise SpaceError(space.path, "constraints", f"expressions that evaluate ({err})") from None
                shown = "x".join(map(str, shape))
                raise SpaceError(space.path, "constraints",
                                 f"at least one config satisfying every constraint for target {target.name}, "
                                 f"shape {shown}, dtype {dtype}; none of the {size} configs does")
