"""The parts of a search space (knobs, constraints, targets, sampler), each validated from its
YAML field within bounds: a breach is a one-line SpaceError naming the field and the bound."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from farm.errors import SpaceError
from farm.search.constraints import Constraint, ConstraintSyntaxError
from kernels.targets import DTYPES, TARGETS

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SAMPLERS = ("tpe", "random", "grid", "pattern", "hybrid")
PARAM_KINDS = ("values", "range", "pow2")
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


def in_space(config: Mapping[str, Any], params: tuple[Param, ...]) -> bool:
    """Whether `config` sets exactly the knobs of `params`, each to one of its choices."""
    return set(config) == {p.name for p in params} and all(config[p.name] in p.choices for p in params)


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

    name: str = "pattern"
    seed: int = 0


def parse_shapes(value: Any, path: str, field: str, rank: int, required: bool) -> tuple[tuple[int, ...], ...]:
    """The shapes of a `shapes` field, each of `rank` positive dimensions within bounds."""
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


def parse_dtypes(value: Any, path: str, field: str, required: bool) -> tuple[str, ...]:
    """The dtypes of a `dtypes` field, each one of DTYPES."""
    if value is None and not required:
        return ()
    if not isinstance(value, list) or not value or len(value) > MAX_LIST:
        raise SpaceError(path, field, f"a non-empty list of dtypes from {list(DTYPES)}", value)
    for i, dtype in enumerate(value):
        if dtype not in DTYPES:
            raise SpaceError(path, f"{field}[{i}]", f"one of {list(DTYPES)}", dtype)
    return tuple(value)


def parse_targets(value: Any, path: str, module: Any, shapes: tuple, dtypes: tuple) -> tuple[TargetSpec, ...]:
    """The targets of a `targets` field (a list of names or a mapping with per-target shapes/dtypes)."""
    expected = f"a non-empty list or mapping of targets from {list(module.TARGETS)}"
    if isinstance(value, list):
        value = {name: None for name in value} if all(isinstance(v, str) for v in value) else value
    if value is None:   # a space that names its kernel without `extends:` gives everything itself
        raise SpaceError(path, "targets", f"{expected} (a space without `extends: {module.NAME}` gives its own "
                         f"targets, params and shapes; with it, only what it changes)", value)
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
        target_shapes = parse_shapes(body.get("shapes"), path, f"{field}.shapes", rank, False) or shapes
        target_dtypes = parse_dtypes(body.get("dtypes"), path, f"{field}.dtypes", False) or dtypes
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


def parse_params(value: Any, path: str, shape_names: tuple[str, ...], targets: tuple[str, ...]) -> tuple[Param, ...]:
    """The knobs of a `params` field: values, an integer range or powers of two, per target."""
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


def parse_constraints(value: Any, path: str, params: tuple[Param, ...], shape_names: tuple[str, ...],
                 targets: tuple[str, ...]) -> tuple[ConstraintSpec, ...]:
    """The constraints of a `constraints` field: safe expressions over knobs and shape dims."""
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


def parse_sampler(value: Any, path: str) -> SamplerSpec:
    """The sampler of a `sampler` field: a name or {name, seed}."""
    if value is None:
        return SamplerSpec()
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict) or set(value) - {"name", "seed"}:
        raise SpaceError(path, "sampler", "a sampler name or {name, seed}", value)
    name = value.get("name", "pattern")
    if name not in SAMPLERS:
        raise SpaceError(path, "sampler.name", f"one of {list(SAMPLERS)}", name)
    seed = value.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SpaceError(path, "sampler.seed", "an integer", seed)
    return SamplerSpec(name, seed)
