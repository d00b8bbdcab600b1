"""No wasted draws: a task's valid configs, enumerated once, and a sampler that proposes only them.

A space's product holds many configs that break its constraints or that the kernel refuses
(`SearchSpace.violated`). Drawing from the product and answering those draws as `invalid` wastes
most asks (63% on a real user space), and samplers also redraw configs already measured (18%).
When a task's valid configs can be enumerated within bounded work (ENUMERATION_LIMIT configs
checked, PREFIX_CHECK_LIMIT partial configs), the searcher enumerates them once and
`ValidSetSampler` proposes only those still open: not measured, not in flight, not already
answered `pruned` (a config that cannot fit is drawn at most once, and its record says why it
was never compiled).

The wrapped sampler keeps its model: its proposal (TPE's, multivariate, over the knobs as
ordered integers; a uniform draw for `random`) is moved to the nearest open valid config, with
ordered knobs compared by their position in their choices and categorical knobs by equality.
`grid` walks the open configs in enumeration order. `pattern` searches around the best configs
measured so far (`farm.search.pattern`) and draws a random open config when nothing near them is
open; `hybrid` takes TPE's proposal there instead, and for every other proposal.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna

from farm.search import pattern, studies
from farm.search.space_parts import Param
from farm.tasks import config_json

# Enumerating checks each knob's constraints as soon as the knobs they read are set, skipping
# whole subtrees of the product (`SearchSpace.prefix_checks`), and a whole config then only for
# what no prefix checked (`SearchSpace.leaf_check`: mostly the kernel's own check), so its work
# is what survives the checks, not the product: the Mosaic GPU matmul task at 8192³, a product of
# 1.66 million configs, is 6,720 valid configs, 2.5-3.2 s on a 2-core CPU (most of it the kernel
# refusing each tail_split > 1 there; 0.7 s without that knob). A walk
# that would check more than ENUMERATION_LIMIT whole configs, or (a product over
# ENUMERATION_LIMIT) PREFIX_CHECK_LIMIT partial ones, stops, and its task is sampled with
# rejection instead (the searcher's fallback). The largest shipped task, matmul + layer norm's
# on Mosaic GPU (a product of 26 million), is 53,760 valid configs, about 5-6 s; layer norm's
# Triton task (176,400 configs) 0.6 s. Once per task, when its sweep
# starts.
ENUMERATION_LIMIT = 200_000
PREFIX_CHECK_LIMIT = 500_000


class _TooMuchWork(Exception):
    """The enumeration's walk went over its bounds."""


class ValidSet:
    """The valid configs of one task and which of them are still open to propose."""

    def __init__(self, configs: Sequence[dict[str, Any]], params: tuple[Param, ...]) -> None:
        self.configs = list(configs)
        self.params = params
        self.keys = [config_json(c) for c in self.configs]
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.open = np.ones(len(self.configs), dtype=bool)
        # Each knob as a coordinate in [0, 1]: its position among its choices.
        self._ordered = np.array([p.kind != "values" or all(isinstance(c, (int, float)) and not isinstance(c, bool)
                                                          for c in p.choices) for p in params], dtype=bool)
        self._coords = np.array([[_position(p, c[p.name]) for p in params] for c in self.configs],
                                dtype=np.float64).reshape(len(self.configs), len(params))
        self._choice = np.array([_choices(params, c) for c in self.configs],
                                dtype=np.int64).reshape(len(self.configs), len(params))

    @classmethod
    def enumerate(cls, params: tuple[Param, ...], valid: Callable[[dict[str, Any]], bool],
                  prefix_checks: Sequence[Callable[[dict[str, Any]], bool]] | None = None) -> ValidSet | None:
        """Every config of `params` that `valid` accepts, in grid order (the last knob fastest);
        None when that takes more than ENUMERATION_LIMIT configs checked or (a product over
        ENUMERATION_LIMIT) more than PREFIX_CHECK_LIMIT partial configs. `prefix_checks[d]`, when
        given, must hold for knobs 0..d set, or no config with that prefix is valid
        (`SearchSpace.prefix_checks`): whole subtrees of the product are skipped, and only what
        survives them counts."""
        configs: list[dict[str, Any]] = []
        config: dict[str, Any] = {}
        checked = [0, 0]  # whole configs, partial configs
        product = math.prod(len(p.choices) for p in params)
        # A product within ENUMERATION_LIMIT is always enumerated, however little the checks prune.
        limits = (ENUMERATION_LIMIT, math.inf if product <= ENUMERATION_LIMIT else PREFIX_CHECK_LIMIT)

        def count(kind: int) -> None:
            checked[kind] += 1
            if checked[kind] > limits[kind]:
                raise _TooMuchWork

        def walk(d: int) -> None:
            if d == len(params):
                count(0)
                if valid(config):
                    configs.append(dict(config))
                return
            for choice in params[d].choices:
                config[params[d].name] = choice
                if prefix_checks is None:
                    walk(d + 1)
                else:
                    count(1)
                    if prefix_checks[d](config):
                        walk(d + 1)
            del config[params[d].name]

        try:
            walk(0)
        except _TooMuchWork:
            return None
        return cls(configs, params)

    def __len__(self) -> int:
        return len(self.configs)

    @property
    def remaining(self) -> int:
        """How many configs are still open."""
        return int(self.open.sum())

    def close(self, key: str) -> None:
        """Take a config out (measured, in flight, or known not to fit)."""
        i = self.index.get(key)
        if i is not None:
            self.open[i] = False

    def nearest(self, proposal: dict[str, Any]) -> dict[str, Any] | None:
        """The open config nearest to `proposal` (a point of the product), or None when none is open."""
        candidates = np.flatnonzero(self.open)
        if not len(candidates):
            return None
        target = np.array([_position(p, proposal[p.name]) if p.name in proposal else np.nan for p in self.params])
        coords = self._coords[candidates]
        gap = np.abs(coords - target)
        gap = np.where(self._ordered, gap, (gap > 0).astype(np.float64))
        gap = np.nan_to_num(gap, nan=0.0)
        return self.configs[candidates[int(np.argmin(gap.sum(axis=1)))]]

    def steps(self, rows: np.ndarray, config: dict[str, Any]) -> np.ndarray:
        """How far each config of `rows` (indices) is from `config`: an ordered knob's steps among
        its choices plus one per changed categorical knob."""
        gap = np.abs(self._choice[rows] - np.array(_choices(self.params, config)))
        return np.where(self._ordered, gap, gap > 0).sum(axis=1)

    def beyond(self, start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any] | None:
        """The config one stride past `end` on the way from `start`: each ordered knob moved on by
        its steps from `start` to `end` (within its choices), the others as in `end`; None unless
        that config is open."""
        a, b = np.array(_choices(self.params, start)), np.array(_choices(self.params, end))
        last = np.array([len(p.choices) - 1 for p in self.params])
        ahead = np.clip(np.where(self._ordered, 2 * b - a, b), 0, last)
        i = self.index.get(config_json({p.name: p.choices[int(k)] for p, k in zip(self.params, ahead)}))
        return self.configs[i] if i is not None and self.open[i] else None

    def pick(self, rng: random.Random) -> dict[str, Any] | None:
        """A uniformly random open config, or None."""
        candidates = np.flatnonzero(self.open)
        return self.configs[candidates[rng.randrange(len(candidates))]] if len(candidates) else None

    def first(self) -> dict[str, Any] | None:
        """The first open config in enumeration order, or None."""
        candidates = np.flatnonzero(self.open)
        return self.configs[candidates[0]] if len(candidates) else None


def _choices(params: tuple[Param, ...], config: dict[str, Any]) -> list[int]:
    """A config's knobs as indices into their choices."""
    return [p.choices.index(config[p.name]) for p in params]


def _position(p: Param, value: Any) -> float:
    """A knob value's position among its choices, in [0, 1]."""
    try:
        i = p.choices.index(value)
    except ValueError:
        return float("nan")
    return i / (len(p.choices) - 1) if len(p.choices) > 1 else 0.0


class ValidSetSampler(optuna.samplers.BaseSampler):
    """Proposes only open configs of a `ValidSet`, steered by a wrapped sampler (see the module docstring).

    Every parameter is sampled jointly (Optuna's relative sampling); configs queued with
    `enqueue_trial` (the default, warm starts) pass through unchanged.
    """

    def __init__(self, base: optuna.samplers.BaseSampler, valid: ValidSet, *, mode: str, seed: int) -> None:
        self.base, self.valid, self.mode = base, valid, mode
        self._rng = random.Random(seed)
        self._space = {studies.optuna_name(p): studies.distribution(p) for p in valid.params}

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial
                                    ) -> dict[str, optuna.distributions.BaseDistribution]:
        """Every knob: the sampler proposes whole configs."""
        return dict(self._space)

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict[str, optuna.distributions.BaseDistribution]) -> dict[str, Any]:
        """An open valid config, in Optuna's parameter values ({} when none is open)."""
        if self.mode == "grid":
            chosen = self.valid.first()
        elif self.mode in ("pattern", "hybrid"):
            # hybrid: every other proposal after the start-up is TPE's, and TPE's where pattern has none
            turn = self.mode == "hybrid" and trial.number > pattern.STARTUP and trial.number % 2 == 0
            chosen = None if turn else pattern.propose(study, trial, self.valid, self._rng)
            if chosen is None:   # TPE's turn, or nothing near the best configs is open: explore
                chosen = self._tpe(study, trial) if self.mode == "hybrid" else self.valid.pick(self._rng)
        elif self.mode == "tpe":
            chosen = self._tpe(study, trial)
        else:
            chosen = self.valid.pick(self._rng)
        if chosen is None:
            return {}
        self.valid.close(config_json(chosen))   # in flight: never proposed twice
        return studies.to_optuna(chosen, self.valid.params)

    def _tpe(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict[str, Any] | None:
        """The open config nearest to the wrapped sampler's proposal (uniform during its start-up)."""
        proposal = self.base.sample_relative(study, trial, self.base.infer_relative_search_space(study, trial))
        if len(proposal) == len(self._space):
            return self.valid.nearest(studies.from_optuna(proposal, self.valid.params))
        return self.valid.pick(self._rng)   # the model's start-up trials: uniform over what is open

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, param_name: str,
                           param_distribution: optuna.distributions.BaseDistribution) -> Any:
        """Only when nothing is open: the wrapped sampler's draw (the searcher answers it)."""
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """The wrapped sampler's hook."""
        self.base.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                    state: optuna.trial.TrialState, values: Sequence[float] | None) -> None:
        """The wrapped sampler's hook (the grid's stop is the searcher's budget, not the sampler's)."""
        if not isinstance(self.base, optuna.samplers.GridSampler):
            self.base.after_trial(study, trial, state, values)
