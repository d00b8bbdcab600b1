"""Load and validate search spaces (`search_spaces/*.yaml`) before any work starts.

A space says what a user chooses: kernel, shapes, dtypes, targets, preferred knob ranges, a
budget and a sampler; it may build on another one (`farm.search.space_files`: `extends`, and
three-line spaces that take the kernel's shipped space). Every problem raises `SpaceError`
naming the file, the field and what was expected.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import kernels
from farm.errors import FarmError, SpaceError, show
from farm.search.constraints import ConstraintEvalError
from farm.search.space_files import read_yaml, resolve
from farm.search.space_parts import (
    DTYPE_BYTES,
    ConstraintSpec,
    Param,
    SamplerSpec,
    TargetSpec,
    parse_constraints,
    parse_dtypes,
    parse_params,
    parse_sampler,
    parse_shapes,
    parse_targets,
)
from kernels.protocol import task_default

TOP_LEVEL = ("kernel", "description", "extends", "shapes", "dtypes", "targets", "params", "constraints",
             "sampler", "trials")
DEFAULT_TRIALS = 20
# Spaces this large are checked for a feasible config by sampling instead of enumeration.
ENUMERATION_LIMIT = 200_000
KERNEL_REFUSAL = "kernel "  # how `violated` starts the reason of a config the kernel refuses
FEASIBILITY_SAMPLES = 20_000
MAX_TASKS = 4096               # targets x shapes x dtypes
MAX_TRIALS = 1_000_000
MAX_GRID = 10_000_000          # configs of a target when the sampler is grid (Optuna lists them all)
MAX_CONSIDERED = 2_000_000     # configs the feasibility check may consider for the whole space
FEASIBILITY_SECONDS = 120.0    # and for how long
BLAME_SAMPLES = 4096           # configs an infeasible space's constraints are each judged on, alone
# Kernels named by a module path are imported (their module-level code runs) only with this opt-in.
ALLOW_KERNEL_MODULES_ENV = "FARM_ALLOW_KERNEL_MODULES"


class UnfitTask(NamedTuple):
    """A task whose shape leaves no config within the space's constraints."""

    target: str
    task: str    # "target T, shape AxB, dtype D"
    reason: str  # how many configs, and the constraint that turned most of them away
    default_runs: bool = False   # the kernel takes its default config there (measured, outside the space)

    def __str__(self) -> str:
        return f"{self.task}: {self.reason}"

    @property
    def outcome(self) -> str:
        """What a sweep does with the task."""
        return ("only the kernel's default config is measured" if self.default_runs
                else "that task is answered invalid, not tuned")


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
    # Tasks whose shape leaves no config within the constraints (answered `invalid`, not tuned).
    unfit: tuple[UnfitTask, ...] = dataclasses.field(default=(), compare=False)

    def params_for(self, target: str) -> tuple[Param, ...]:
        """The knobs that exist for `target`."""
        return tuple(p for p in self.params if p.applies_to(target))

    def env(self, config: Mapping[str, Any], shape: Sequence[int], dtype: str) -> dict[str, Any]:
        """The variables a constraint sees: config knobs, named shape dims, dtype_bytes."""
        return {**dict(zip(self.shape_names, shape)), "dtype_bytes": DTYPE_BYTES[dtype], **config}

    def prefix_checks(self, shape: Sequence[int], dtype: str, target: str) -> list[Callable[[Mapping[str, Any]], bool]]:
        """For enumerating `params_for(target)` in order: check d holds once knobs 0..d are set
        (the target's constraints that read no later knob and none it lacks, evaluated as
        `violated` would; one that cannot be evaluated fails). A config that fails a check
        fails `violated`, so an enumeration may skip every config under that prefix."""
        params = self.params_for(target)
        depth = {p.name: d for d, p in enumerate(params)}
        staged: list[list[Any]] = [[] for _ in params]
        for constraint in self._evaluable(target):
            knobs = [depth[n] for n in constraint.names if n in depth]
            if knobs:
                staged[max(knobs)].append(constraint)
        fixed = self.env({}, shape, dtype)

        def check(constraints: list[Any]) -> Callable[[Mapping[str, Any]], bool]:
            def holds(config: Mapping[str, Any]) -> bool:
                env = {**fixed, **config}
                try:
                    return all(c(env) for c in constraints)
                except ConstraintEvalError:
                    return False
            return holds

        return [check(c) for c in staged]

    def leaf_check(self, shape: Sequence[int], dtype: str, target: str) -> Callable[[Mapping[str, Any]], bool]:
        """For enumerating with `prefix_checks`: whether a config whose every prefix check held is
        in the task's space, which is `violated(...) is None` for such a config without evaluating
        again the constraints its prefixes passed: what is left are the constraints that read no
        knob (evaluated once, here) and the kernel's own refusal (`check_config`)."""
        knobs = {p.name for p in self.params_for(target)}
        fixed = self.env({}, shape, dtype)
        try:
            feasible = all(c(fixed) for c in self._evaluable(target) if not c.names & knobs)
        except ConstraintEvalError:
            feasible = False
        return lambda config: feasible and self.kernel_refusal(config, shape, dtype, target) is None

    def _evaluable(self, target: str) -> list[Any]:
        """The target's constraints that a config of its knobs can evaluate (those reading a knob
        the target lacks are skipped, as `violated` skips them)."""
        known = set(self.shape_names) | {"dtype_bytes"} | {p.name for p in self.params_for(target)}
        return [spec.constraint for spec in self.constraints
                if (spec.targets is None or target in spec.targets) and spec.constraint.names <= known]

    def kernel_refusal(self, config: Mapping[str, Any], shape: Sequence[int], dtype: str, target: str) -> str | None:
        """The kernel's reason to refuse `config` (`check_config`), or None; a check that raises refuses."""
        try:
            return kernels.load(self.kernel).check_config(dict(config), tuple(shape), dtype, target)
        except Exception as err:  # noqa: BLE001 - a kernel's check that fails refuses the config
            return f"{type(err).__name__}: {err}"

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
        reason = self.kernel_refusal(config, shape, dtype, target)
        return None if reason is None else f"{KERNEL_REFUSAL}{self.kernel}: {reason}"

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


def load_kernel(name: str, where: str, allow_kernel_modules: bool | None = None) -> ModuleType:
    """The kernel module a user's input names (a space, --kernel, a tasks file, a run's records):
    a registered kernel, or a module path only where `kernel_modules_allowed` (importing it runs
    its code); else a FarmError naming `where` (e.g. "FILE: kernel")."""
    if "." in name and name not in kernels.REGISTRY and not kernel_modules_allowed(allow_kernel_modules):
        raise FarmError(f"{where}: expected a registered kernel ({', '.join(sorted(kernels.REGISTRY))}), got "
                        f"{name!r}; a module path is imported, running its code, only with "
                        f"{ALLOW_KERNEL_MODULES_ENV}=1 or --allow-kernel-module")
    try:
        return kernels.load(name)
    except kernels.UnknownKernel as err:
        raise FarmError(f"{where}: expected a known kernel ({err})") from None


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

    default_shapes = parse_shapes(data.get("shapes"), path, "shapes", len(shape_names), required=False)
    default_dtypes = parse_dtypes(data.get("dtypes"), path, "dtypes", required=False)
    targets = parse_targets(data.get("targets"), path, module, default_shapes, default_dtypes)
    target_names = tuple(t.name for t in targets)
    params = parse_params(data.get("params"), path, shape_names, target_names)
    constraints = parse_constraints(data.get("constraints"), path, params, shape_names, target_names)
    sampler = parse_sampler(data.get("sampler"), path)
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
    _check_knobs(space, module)
    if kernel_name not in kernels.REGISTRY:   # a user's own module: its contract checked before any sweep
        from farm.search.contract import check_kernel_contract

        check_kernel_contract(space, module)
    return dataclasses.replace(space, unfit=_check_feasible(space))


def _check_knobs(space: SearchSpace, module: Any) -> None:
    """Every knob of `params` is one the kernel takes on each target it applies to: a misspelled
    knob (block_row) would have the kernel refuse every config, and the sweep measure only the
    default. Asked of the kernel itself (`check_config` of its default with the knob set)."""
    for target in space.targets:
        if not target.shapes or not target.dtypes:
            continue
        shape, dtype = tuple(target.shapes[0]), target.dtypes[0]
        try:
            default = task_default(module, shape, target.name, dtype)
        except Exception:  # noqa: BLE001 - no default here: `_check_feasible` judges the task
            continue
        for param in space.params_for(target.name):
            try:
                reason = module.check_config({**default, param.name: param.choices[0]}, shape, dtype, target.name)
            except Exception:  # noqa: BLE001 - a check that fails says nothing of the knob's name
                continue
            if reason and "unknown knob" in reason and repr(param.name) in reason:
                raise SpaceError(space.path, f"params.{param.name}", f"a knob {space.kernel} takes on {target.name} "
                                 f"(the kernel says: {reason})", param.name)


def _default_runs(space: SearchSpace, shape: Sequence[int], dtype: str, target: str) -> bool:
    """Whether the kernel takes its own default config for this task (a default that raises: no)."""
    try:
        default = task_default(kernels.load(space.kernel), tuple(shape), target, dtype)
    except Exception:  # noqa: BLE001 - a kernel's default_config that fails is one the sweep cannot run
        return False
    return space.kernel_refusal(default, shape, dtype, target) is None


def _check_feasible(space: SearchSpace) -> tuple[UnfitTask, ...]:
    """At least one (target, shape, dtype) must admit a config, or a config within the space's
    constraints that the kernel refuses (then the kernel cannot run that shape on that target:
    its task is answered `invalid`, not the whole space refused). A task whose shape leaves no
    config within the constraints while other tasks have some measures only its kernel's default
    (`farm.search.searcher.OUTSIDE_STUDY`), or where the kernel refuses that too is answered
    `invalid` the same way (the broken constraint named): a user's shapes apply to every target
    of a shipped space, and one target's preferences (TPU tiles of 16 rows; 3 rows given) must
    not stop the others' sweeps. A space where no task admits a config is refused, naming the
    constraint that turned away most configs. Returns the tasks without a config (`SearchSpace.unfit`).

    Bounded: at most MAX_CONSIDERED configs and FEASIBILITY_SECONDS for the whole space (a space
    that needs more to show a feasible config is refused), and each constraint evaluation is
    bounded by `farm.search.constraints`; a constraint that cannot be evaluated is refused.
    """
    considered, deadline = 0, time.monotonic() + FEASIBILITY_SECONDS
    first_unfit: tuple[str, tuple[int, ...], str] | None = None
    unfit: list[UnfitTask] = []
    usable = False
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
                feasible = kernel_refuses = False
                broken: collections.Counter[str] = collections.Counter()
                for config in candidates:
                    considered += 1
                    if considered > MAX_CONSIDERED or (considered % 256 == 0 and time.monotonic() > deadline):
                        raise SpaceError(space.path, "constraints", f"a feasible config for every task within "
                                         f"{MAX_CONSIDERED} configs and {FEASIBILITY_SECONDS:.0f} s in all; still "
                                         f"searching at {task} (fewer shapes, or narrower knobs)")
                    try:
                        reason = space.violated(config, shape, dtype, target.name, strict=True)
                    except ConstraintEvalError as err:
                        raise SpaceError(space.path, "constraints", f"expressions that evaluate for every config "
                                         f"({err}; e.g. {task}, config {show(config)})") from None
                    if reason is None:
                        feasible = True
                        break
                    kernel_refuses = kernel_refuses or reason.startswith(KERNEL_REFUSAL)
                    broken[reason] += 1
                # A config within the space's constraints that the kernel refuses for this shape:
                # the target cannot run the shape at all (softmax's staged rows on Mosaic GPU past
                # shared memory, say). The task stays, answered `invalid` with the kernel's reason
                # and given no trials, while the space's other targets tune the shape.
                if feasible or kernel_refuses:
                    usable = True
                else:
                    most, count = broken.most_common(1)[0] if broken else ("", 0)
                    first_unfit = first_unfit or (target.name, tuple(shape), dtype)
                    unfit.append(UnfitTask(target.name, task, f"none of the {size} configs satisfies every "
                                           f"constraint" + (f" ({count} break {most!r})" if most else ""),
                                           _default_runs(space, shape, dtype, target.name)))
    if unfit and not usable:
        first = unfit[0]
        raise SpaceError(space.path, "constraints", f"at least one config satisfying every constraint for "
                         f"{first.task}; {first.reason}{_blame(space, *first_unfit)}")
    return tuple(unfit)


def _blame(space: SearchSpace, target: str, shape: tuple[int, ...], dtype: str) -> str:
    """Which constraint turns away every config of the task on its own (counted alone, not only
    where it is the first broken one: a user's constraint comes after the shipped space's), over
    up to BLAME_SAMPLES configs; '' when none does."""
    envs = [space.env(c, shape, dtype) for c in itertools.islice(space.configs(target), BLAME_SAMPLES)]
    always = []
    for spec in space.constraints:
        if spec.targets is not None and target not in spec.targets:
            continue
        try:
            held = [spec.constraint(env) for env in envs if spec.constraint.names <= env.keys()]
        except ConstraintEvalError:
            continue
        if held and not any(held):
            always.append(spec.constraint.source)
    return f"; alone, {show(always[-1])} turns away every one of them" if always else ""
