"""One task's searcher: asks Optuna for configs and proposes only those that need measuring.

`ask()` draws from the task's study until a config needs measuring. On the way it answers the
draws that need no device: a config that breaks a constraint is `invalid`, one whose footprint
exceeds the target's memory or that is at least as large as a known `oom` config is `pruned`
(`farm.search.pruning`), one the task already measured is `cached`, and one already in flight
waits for that measurement and is then answered from it. `tell(result)` hands back a measured
result. The searcher owns the study, the cache of measured configs, the dominance pruning and
the budget (measured + cached trials; invalid and pruned draws are capped separately). Over a
task whose valid configs are too many to enumerate, a draw of a config already measured is
followed by a random valid config not yet measured (`REPEAT_STREAK`), so a converged sampler
cannot spend the budget on repeats.

The kernel's default config is what a deployment runs untuned, so every task measures it. Where
the space leaves it out (a knob value the space does not list, a search preference it breaks, a
knob the space does not tune) but the kernel takes it, it is measured once outside the study, as
trial `OUTSIDE_STUDY`: the sampler never hears of it, and it may win. Warm-start configs (a
bundle's winners: what a deployment of it runs) are measured first, in order, the same way: in
the study where the space holds them, else outside it as trials `outside_trial(i)` (-2, -3, ...).

When the task's valid configs can be enumerated (with bounded work: `farm.search.valid_set`),
`open` wraps the sampler in `farm.search.valid_set.ValidSetSampler`: draws are then valid
configs not yet measured or in flight, so the answers above are left to the queued default or
warm-start configs, and the task ends once every valid config is measured.

It knows nothing of Ray or of how results are logged: every answer goes through `on_answer`,
which returns the result to keep (the run layer logs a `TrialRecord` there, before Optuna is
told). Failures are told to Optuna as PRUNED, so TPE counts them as regions to avoid.

    >>> import optuna
    >>> from farm.search import plan, spaces
    >>> planned = plan.expand([spaces.load_space("search_spaces/softmax.yaml")], ["interpret"], 4)[0]
    >>> searcher = Searcher.open(planned, optuna.storages.InMemoryStorage())
    >>> first = searcher.ask()                 # the kernel's default config comes first
    >>> first.config
    {'block_rows': 8, 'strategy': 'one_pass', 'block_cols': 128}
    >>> searcher.tell(Answer(first.trial, first.key, "ok", median_s=1e-4))   # what a worker measured
"""
from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

import kernels
from farm.measure import capacity as capacity_
from farm.measure import outcomes
from farm.search import pruning, studies
from farm.search.plan import PlannedTask
from farm.search.valid_set import ValidSet, ValidSetSampler
from farm.tasks import config_json
from kernels.protocol import task_default

# How many invalid or pruned configs a task may draw per trial of budget before it stops.
SKIPPED_DRAWS_PER_TRIAL = 50
# After this many constraint-breaking draws in a row, a random valid config is queued instead.
INVALID_STREAK = 4
# After this many draws in a row of configs already measured, a random valid config not yet
# measured is queued instead (products too large to enumerate: TPE converges and repeats itself).
REPEAT_STREAK = 1
VALID_DRAWS = 5000
# The trial number of a task's default config measured outside its study (the space leaves it out).
OUTSIDE_STUDY = -1
# How much of a failure's text a trial's Optuna user attributes keep.
ERROR_ATTR_CHARS = 500


def outside_trial(index: int) -> int:
    """The trial number of a task's `index`-th warm-start config measured outside its study."""
    return OUTSIDE_STUDY - 1 - index


@dataclasses.dataclass(frozen=True)
class OutsideConfig:
    """A config the task measures outside its study (the space leaves it out, the kernel takes
    it): the default or a warm start, proposed once `after` trials came from the study."""

    trial: int
    config: dict[str, Any]
    after: int = 0


class Result(Protocol):
    """What the searcher reads of a finished trial (`farm.bundle.records.TrialRecord` is one)."""

    @property
    def trial(self) -> int:
        """The Optuna trial number (`OUTSIDE_STUDY`: the default, measured outside the study)."""

    @property
    def config(self) -> str:
        """The config's canonical JSON."""

    @property
    def outcome(self) -> str:
        """One of `farm.measure.outcomes.ALL`."""

    @property
    def median_s(self) -> float | None:
        """The measured time, if any."""

    @property
    def error(self) -> str | None:
        """Why it failed (or where a cached answer came from), if it says."""

    @property
    def compile_s(self) -> float | None:
        """Seconds the compile took, if it was compiled."""

    @property
    def numerics_error(self) -> float | None:
        """Relative error against the reference, if it was validated."""


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A config that needs measuring: its Optuna trial number, the config and its canonical JSON."""

    trial: int
    config: dict[str, Any]
    key: str
    footprint_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class Answer:
    """A trial the searcher answered without a worker: `invalid`, `pruned` or `cached` (or the
    failure of the measurement it repeats); `source` is the result a cached answer repeats."""

    trial: int
    config: str
    outcome: str
    error: str | None = None
    footprint_bytes: int | None = None
    capacity_bytes: int | None = None
    source: Result | None = None
    median_s: float | None = None
    compile_s: float | None = None
    numerics_error: float | None = None


class Searcher:
    """Proposes one task's configs (Optuna ask/tell), answering what needs no measurement."""

    def __init__(self, planned: PlannedTask, study: optuna.Study, module: Any, *,
                 capacity: capacity_.Capacity = capacity_.NONE, static_pruning: bool = True,
                 on_answer: Callable[[Answer], Result] | None = None, valid_set: ValidSet | None = None) -> None:
        self.planned = planned
        self.study = study
        self.module = module
        self.capacity = capacity
        self.static_pruning = static_pruning
        self.on_answer: Callable[[Answer], Result] = on_answer or (lambda answer: answer)
        self.params = planned.space.params_for(planned.task.target)
        self.dominance = pruning.Dominance(module)
        self.valid_set = valid_set                    # the task's valid configs, when enumerable
        self.measured: dict[str, Result] = {}        # config json -> its measured result
        self.ok_times: list[float] = []               # the `ok` medians, in the order they were told
        self.asked = 0                                # trials counted against the budget
        self.skipped = 0                              # invalid and pruned draws
        self.exhausted = False
        self._invalid_streak = 0
        self._repeat_streak = 0
        self._running: dict[int, optuna.Trial | None] = {}   # proposals not yet told (None: outside the study)
        self.outside: list[OutsideConfig] = []        # configs still to measure outside the study, in order
        self._from_study = 0                          # trials this searcher drew from the study
        self._waiting: dict[str, list[optuna.Trial]] = {}   # config json -> duplicates of a proposal in flight

    @classmethod
    def open(cls, planned: PlannedTask, storage: optuna.storages.BaseStorage, *, sampler: str | None = None,
             seed: int | None = None, warm_start: Sequence[dict[str, Any]] = (), **options: Any) -> Searcher:
        """The task's searcher over its study in `storage` (created, or loaded when it exists).

        A new study measures `warm_start` first, in order, then the kernel's default config: each
        in the study, or outside it where the space leaves it out and the kernel takes it (a
        warm start the kernel refuses is dropped). A resumed study measures those not yet logged
        (`replay`). `options` go to the constructor (capacity, static_pruning, on_answer).
        """
        module = kernels.load(planned.task.kernel)
        task, space = planned.task, planned.space
        params = space.params_for(task.target)
        candidates = ValidSet.enumerate(params, space.leaf_check(task.shape, task.dtype, task.target),
                                        space.prefix_checks(task.shape, task.dtype, task.target))
        name = studies.sampler_name(planned, sampler)
        base = studies.make_sampler(planned, sampler, seed, multivariate=candidates is not None)
        chosen = base if candidates is None else ValidSetSampler(base, candidates, mode=name,
                                                                 seed=studies.task_seed(planned, seed))
        study = studies.open_study(planned, storage, chosen)
        searcher = cls(planned, study, module, valid_set=candidates, **options)
        default = task_default(module, planned.task.shape, planned.task.target, planned.task.dtype)
        fresh = not study.trials
        inside: list[dict[str, Any]] = []
        for config in warm_start:
            if config in inside or any(o.config == config for o in searcher.outside):
                continue
            if planned.admits(config):
                inside.append(config)
                continue
            if not planned.kernel_takes(config):
                continue
            trial = OUTSIDE_STUDY if config == default else \
                outside_trial(sum(o.trial != OUTSIDE_STUDY for o in searcher.outside))
            searcher.outside.append(OutsideConfig(trial, config, len(inside) if fresh else 0))
        default_left_out = searcher._left_out(default) is not None
        if default_left_out and not any(o.trial == OUTSIDE_STUDY for o in searcher.outside):
            searcher.outside.append(OutsideConfig(OUTSIDE_STUDY, default, len(inside) if fresh else 0))
        queued = None if default_left_out else default
        queued_count = studies.enqueue_warm_start(study, searcher.params, inside, queued)
        if not queued_count and queued is not None:
            # a task whose shape leaves no config within the space, and whose kernel refuses its
            # default: the default is still asked, and answered invalid with the kernel's reason
            studies.enqueue_default(study, searcher.params, default,
                                    even_on_grid=candidates is not None and not len(candidates))
        return searcher

    def _left_out(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """`config` if the space leaves it out and the kernel takes it (it is then measured
        outside the study), else None (the study holds it, or the kernel refuses it)."""
        if self.planned.admits(config) or not self.planned.kernel_takes(config):
            return None
        return config

    @property
    def key(self) -> str:
        """The task key (also the study name)."""
        return self.planned.task.key

    def best_median_s(self, after: int = 1) -> float | None:
        """The fastest `ok` time measured so far, once at least `after` configs measured `ok`."""
        return min(self.ok_times) if len(self.ok_times) >= after else None

    def stalled(self, trials: int, gain: float) -> bool:
        """Whether the last `trials` `ok` configs beat the best before them by less than `gain`
        (a fraction), and there was a best before them."""
        if len(self.ok_times) <= trials:
            return False
        return min(self.ok_times[-trials:]) > min(self.ok_times[:-trials]) * (1 - gain)

    @property
    def wants_trials(self) -> bool:
        """Whether the budget has room for another trial."""
        return not self.exhausted and self.asked < self.planned.trials

    def stop(self) -> None:
        """Ask for nothing more (the time budget is spent); proposals in flight may still be told."""
        self.exhausted = True

    # -- asking ----------------------------------------------------------------------------------
    def ask(self) -> Proposal | None:
        """The next config that needs measuring, or None when the budget is spent (or what is left of
        it waits for configs already in flight)."""
        task, space = self.planned.task, self.planned.space
        while self.wants_trials:
            if self.outside and self._from_study >= self.outside[0].after:
                proposal = self._propose_outside(self.outside.pop(0))   # in the warm starts' order
                if proposal is not None:
                    return proposal
                continue
            if self.valid_set is not None and not self.valid_set.remaining and not self._queued():
                self.exhausted = True   # every valid config is measured or in flight
                break
            trial = self.study.ask()
            self._from_study += 1
            config = studies.suggest(trial, self.params)
            key = config_json(config)
            broken = space.violated(config, task.shape, task.dtype, task.target)
            if broken is not None:
                self._skip(trial, key, outcomes.INVALID, f"breaks constraint: {broken}")
                self._invalid_streak += 1
                if self._invalid_streak >= INVALID_STREAK:
                    self._enqueue_valid()
                continue
            self._invalid_streak = 0
            if key in self.measured:
                self.asked += 1
                self._answer_cached(trial, key, self.measured[key])
                self._repeat_streak += 1
                if self.valid_set is None and self._repeat_streak >= REPEAT_STREAK and self.wants_trials:
                    self._enqueue_valid()
                continue
            footprint, verdict = pruning.static_verdict(self.module, config, task.shape, task.dtype, task.target,
                                                        self.capacity)
            if verdict is not None and (self.static_pruning or verdict.invalid):
                self._skip(trial, key, outcomes.INVALID if verdict.invalid else outcomes.PRUNED, verdict.reason,
                           footprint_bytes=verdict.footprint_bytes, capacity_bytes=verdict.capacity_bytes)
                continue
            dominating = self.dominance.dominating(config)
            if dominating is not None:
                self._skip(trial, key, outcomes.PRUNED,
                           f"at least as large as trial {dominating}, which ran out of memory",
                           footprint_bytes=footprint, capacity_bytes=self.capacity.onchip_bytes)
                continue
            self.asked += 1
            if key in self._waiting:
                self._waiting[key].append(trial)
                continue
            self._waiting[key] = []
            self._repeat_streak = 0
            self._running[trial.number] = trial
            if self.valid_set is not None:   # a queued config (the default, a warm start) bypassed the sampler
                self.valid_set.close(key)
            return Proposal(trial.number, config, key, footprint)
        return None

    def _propose_outside(self, outside: OutsideConfig) -> Proposal | None:
        """A config the space leaves out, once (None if it is measured or in flight, or cannot fit:
        pruned)."""
        task, config, number = self.planned.task, outside.config, outside.trial
        key = config_json(config)
        if key in self.measured or key in self._waiting:
            return None
        footprint, verdict = pruning.static_verdict(self.module, config, task.shape, task.dtype, task.target,
                                                    self.capacity)
        if verdict is not None and (self.static_pruning or verdict.invalid):
            self.skipped += 1
            self.on_answer(Answer(number, key, outcomes.INVALID if verdict.invalid else outcomes.PRUNED,
                                  verdict.reason, footprint_bytes=verdict.footprint_bytes,
                                  capacity_bytes=verdict.capacity_bytes))
            return None
        self.asked += 1
        self._waiting[key] = []
        self._running[number] = None
        return Proposal(number, config, key, footprint)

    def _skip(self, trial: optuna.Trial, key: str, outcome: str, error: str, **extra: Any) -> None:
        self.skipped += 1
        if self.valid_set is not None:   # a pruned config is answered once, then never drawn again
            self.valid_set.close(key)
        self._tell(trial, self.on_answer(Answer(trial.number, key, outcome, error, **extra)))
        if self.skipped >= SKIPPED_DRAWS_PER_TRIAL * self.planned.trials:
            self.exhausted = True

    def _answer_cached(self, trial: optuna.Trial, key: str, source: Result) -> None:
        outcome = outcomes.CACHED if source.outcome == outcomes.OK else source.outcome
        error = getattr(source, "error", None)
        text = f"cached from trial {source.trial}" + (f": {error}" if error else "")
        self._tell(trial, self.on_answer(Answer(trial.number, key, outcome, text, source=source,
                                                median_s=source.median_s)))

    def _enqueue_valid(self) -> None:
        """After a run of constraint-breaking draws, or of configs already measured, queue a random
        config that satisfies the constraints and is neither measured nor in flight.

        The sampler still hears about every invalid draw (told PRUNED) and every repeat (told its
        cached result), but a space whose constraints reject most of its product no longer stalls
        the sweep, and a sampler that keeps proposing what it measured no longer spends its
        budget on repeats: driven on CPU with synthetic timings, the shipped matmul space's
        Mosaic GPU task, then sampled with rejection, measured 85 distinct configs in 400 trials
        before, 223 after (it is enumerated now: 400 of 400, `bench/searcher_draws.py`). With a
        valid set the sampler draws only open configs, and repeats come only from the queued
        default or warm-start configs.
        """
        space, task = self.planned.space, self.planned.task
        rng = random.Random(f"{task.key}/{self.skipped}/{self.asked}")
        for _ in range(VALID_DRAWS):
            config = {p.name: rng.choice(p.choices) for p in self.params}
            key = config_json(config)
            if key not in self.measured and key not in self._waiting \
                    and space.violated(config, task.shape, task.dtype, task.target) is None:
                self.study.enqueue_trial(studies.to_optuna(config, self.params))
                self._invalid_streak = self._repeat_streak = 0
                return

    # -- telling ---------------------------------------------------------------------------------
    def tell(self, result: Result) -> None:
        """The measured result of a proposal; duplicates that waited for it are answered from it."""
        trial = self._running.pop(result.trial)
        if trial is not None:   # outside the study: the sampler never hears of the configs it left out
            self._tell(trial, result)
        self._remember(result)
        for waiting in self._waiting.pop(result.config, []):
            self._answer_cached(waiting, result.config, result)

    def _remember(self, result: Result) -> None:
        self.measured[result.config] = result
        if result.outcome == outcomes.OK and result.median_s is not None:
            self.ok_times.append(result.median_s)
        if self.valid_set is not None:
            self.valid_set.close(result.config)
        if result.outcome == outcomes.OOM:
            self.dominance.add(result.trial, json.loads(result.config))

    def _queued(self) -> bool:
        """Whether the study holds trials queued with `enqueue_trial` (warm starts, the default)."""
        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def _tell(self, trial: optuna.Trial | int, result: Result) -> None:
        if isinstance(trial, optuna.Trial):
            # What Optuna's own tools (optuna-dashboard) show of a trial: why it failed, how long
            # it compiled, how far its numerics were from the reference.
            for name, value in (("outcome", result.outcome), ("error", (result.error or "")[:ERROR_ATTR_CHARS]),
                                ("compile_s", result.compile_s), ("numerics_error", result.numerics_error),
                                ("median_s", result.median_s)):
                if value not in (None, ""):
                    trial.set_user_attr(name, value)
        if result.median_s is not None and result.outcome in (outcomes.OK, outcomes.CACHED):
            self.study.tell(trial, result.median_s)
        else:
            # Failures are told PRUNED (not FAIL) so that TPE counts them as regions to avoid.
            self.study.tell(trial, state=TrialState.PRUNED)

    # -- resuming --------------------------------------------------------------------------------
    def replay(self, results: Iterable[Result]) -> None:
        """Resume from the task's logged results: rebuild the budget and the cache, then settle the
        trials a killed driver left RUNNING in the study.

        A running trial that was logged is told its logged result. One that was not is failed
        (`study.tell(number, state=FAIL)`) and its parameters are queued again (`enqueue_trial`),
        so the config is proposed again through `ask()` and nothing logged is measured twice.
        Knobs the killed driver had not drawn yet are drawn now by the study's sampler, for that
        trial (`sample_independent`: a grid sampler gives its grid point). Public Optuna API only.
        """
        logged: dict[int, Result] = {}
        for result in results:
            logged[result.trial] = result
            if result.trial <= OUTSIDE_STUDY:   # measured (or pruned) outside the study before the driver died
                self.outside = [o for o in self.outside if o.trial != result.trial]
            if result.outcome in outcomes.SKIPPED:
                self.skipped += 1
                continue
            self.asked += 1
            if result.outcome in outcomes.MEASURED:
                self._remember(result)
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if frozen.number in logged:
                self._tell(frozen.number, logged[frozen.number])
                continue
            params = self._drawn(frozen)
            self.study.tell(frozen.number, state=TrialState.FAIL)
            if params is not None:
                self.study.enqueue_trial(params)

    def _drawn(self, frozen: optuna.trial.FrozenTrial) -> dict[str, Any] | None:
        """A running trial's parameters, the missing ones drawn by the sampler (None if it cannot)."""
        params = dict(frozen.params)
        for p in self.params:
            name = studies.optuna_name(p)
            if name not in params:
                try:
                    params[name] = self.study.sampler.sample_independent(self.study, frozen, name,
                                                                         studies.distribution(p))
                except ValueError:   # e.g. a grid trial killed before its grid point was assigned
                    return None
        return params
