"""The Ray driver: one Optuna study per task, trials from all studies spread over all workers.

Asynchronous ask/tell: whenever a worker has room (`depth` trials in flight, so it compiles the
next config while timing the current one), the next task of its pool (round robin) asks its
study for a config. Before anything is compiled, a config that breaks a constraint is
`invalid`, one whose footprint exceeds the target's memory or that is at least as large as a
known `oom` config is `pruned`, and one the task already measured is answered from the cache.

Faults are data: a worker that stops making progress is killed and replaced (its trial
`timeout`), a trial whose worker died is re-queued up to `max_attempts` and then recorded as
`worker_lost` (its config quarantined), and a trial on a node that left the cluster is
re-queued elsewhere. Every finished trial is appended to `trials.jsonl` before it is told to
Optuna, so a killed driver resumes (`farm sweep --resume`) without measuring anything twice.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import ray
from ray.exceptions import RayActorError, RayTaskError, WorkerCrashedError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import kernels
from farm.bundle import artifacts
from farm.measure import capacity, outcomes
from farm.run import placement
from farm.run.actor import Worker
from farm.search import pruning, studies
from farm.search.plan import PlannedTask
from farm.tasks import config_json

TRIALS_LOG = "trials.jsonl"
RUN_INFO = "run.json"
# How many invalid or pruned configs a task may draw per trial of budget before it stops.
SKIPPED_DRAWS_PER_TRIAL = 50
# After this many constraint-breaking draws in a row, a random valid config is queued instead.
INVALID_STREAK = 4
VALID_DRAWS = 5000


@dataclasses.dataclass
class SweepSettings:
    """How a sweep runs (what it tunes comes from the planned tasks)."""

    run_dir: Path
    interpret: bool = False            # run kernels in interpret mode (accelerator targets emulated)
    emulate: str | None = None         # capacity profile for interpret runs (v5e, v6e, v7, h200, ...)
    workers: int | None = None         # workers per pool; default one per chip, GPU or CPU
    depth: int | None = None           # trials in flight per worker; default 2 on accelerators, 1 on CPU
    node_labels: dict[str, str] = dataclasses.field(default_factory=dict)
    sampler: str | None = None         # override the spaces' samplers
    seed: int | None = None            # override the spaces' sampler seeds
    repetitions: int = 10
    input_sets: int = 1                # rotating input sets for timing (beat the cache)
    compile_timeout_s: float = 600.0
    timing_timeout_s: float = 300.0    # validation and timing of one config
    max_attempts: int = 2              # a trial whose worker died is re-queued up to this many runs
    static_pruning: bool = True        # False: compile even what the footprint model says cannot fit
    address: str | None = None         # Ray address; None starts an embedded local Ray
    time_budget_s: float | None = None  # once workers are up, stop asking for trials after this long
    # task key -> configs queued first, in order, in a new study (farm retune: previous winners)
    warm_start: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _TaskState:
    planned: PlannedTask
    study: optuna.Study
    pool: str
    module: Any
    capacity: capacity.Capacity = capacity.NONE
    asked: int = 0
    skipped: int = 0
    invalid_streak: int = 0
    exhausted: bool = False
    measured: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)   # config json -> record
    waiting: dict[str, list[optuna.Trial]] = dataclasses.field(default_factory=dict)
    deaths: Counter = dataclasses.field(default_factory=Counter)                   # config json -> workers killed
    dominance: pruning.Dominance | None = None

    @property
    def wants_trials(self) -> bool:
        return not self.exhausted and self.asked < self.planned.trials


@dataclasses.dataclass
class _Trial:
    state: _TaskState
    trial: optuna.Trial
    config: dict[str, Any]
    key: str
    footprint: int | None = None
    attempt: int = 1          # runs that counted against the trial (its worker died under it)
    requeued: int = 0         # times it was moved to another worker, for whatever reason
    started_at: str | None = None


@dataclasses.dataclass
class _Worker:
    actor: Any
    slot: placement.Slot
    in_flight: dict[Any, _Trial] = dataclasses.field(default_factory=dict)   # ref -> trial, in dispatch order
    progress: float = dataclasses.field(default_factory=time.monotonic)


def connect(address: str | None) -> None:
    """Join the Ray cluster at `address`, or start an embedded local Ray."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        roots = [os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])]
        ray.init(address="local", include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(roots)}})


class Sweep:
    """One sweep over planned tasks; `run()` returns every trial record (resumed ones included)."""

    def __init__(self, planned: list[PlannedTask], settings: SweepSettings,
                 on_record: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.planned = planned
        self.settings = settings
        self.on_record = on_record or (lambda record: None)
        self.run_dir = Path(settings.run_dir)
        self.run_id = self.run_dir.name
        self.records: list[dict[str, Any]] = []
        self.pool_info: dict[str, dict[str, Any]] = {}   # pool -> a worker's info()
        self.task_pool: dict[str, str] = {}              # task key -> pool
        self.summary: dict[str, Any] = {}
        self._log: Any = None
        self._retry: dict[str, deque[_Trial]] = {}
        self._workers: list[_Worker] = []
        self._refs: dict[Any, _Worker] = {}
        self._t0 = time.monotonic()
        self._stopped_early = False

    # -- records and telling ---------------------------------------------------------------
    def _record(self, state: _TaskState, trial_number: int, key: str, outcome: str,
                measurement: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        task = state.planned.task
        record = {"task_key": task.key, "kernel": task.kernel, "shape": list(task.shape), "dtype": task.dtype,
                  "target": task.target, "trial": trial_number, "config": key, "outcome": outcome,
                  "attempt": 1, "finished": artifacts.now(), "elapsed_s": time.monotonic() - self._t0,
                  "run_id": self.run_id, **extra}
        for name, value in (measurement or {}).items():
            if name not in ("outcome", "restart"):
                record.setdefault(name, value)
        self.records.append(record)
        self._log.write(json.dumps(record) + "\n")
        self._log.flush()
        self.on_record(record)
        return record

    def _tell(self, state: _TaskState, trial: optuna.Trial, record: dict[str, Any]) -> None:
        trial.set_user_attr("outcome", record["outcome"])
        if record.get("median_s") is not None and record["outcome"] in (outcomes.OK, outcomes.CACHED):
            state.study.tell(trial, record["median_s"])
        else:
            # Failures are told PRUNED (not FAIL) so that TPE counts them as regions to avoid.
            state.study.tell(trial, state=optuna.trial.TrialState.PRUNED)

    def _answer_cached(self, state: _TaskState, trial: optuna.Trial, key: str, source: dict[str, Any]) -> None:
        outcome = outcomes.CACHED if source["outcome"] == outcomes.OK else source["outcome"]
        measurement = {k: source.get(k) for k in ("median_s", "spread", "min_s", "numerics_error")}
        measurement["error"] = f"cached from trial {source['trial']}" + (
            f": {source['error']}" if source.get("error") else "")
        self._tell(state, trial, self._record(state, trial.number, key, outcome, measurement))

    # -- asking ----------------------------------------------------------------------------
    def _skip(self, state: _TaskState, trial: optuna.Trial, key: str, outcome: str, error: str, **extra: Any) -> None:
        state.skipped += 1
        self._tell(state, trial, self._record(state, trial.number, key, outcome, {"error": error}, **extra))
        if state.skipped >= SKIPPED_DRAWS_PER_TRIAL * state.planned.trials:
            state.exhausted = True

    def _enqueue_valid(self, state: _TaskState) -> None:
        """After a run of constraint-breaking draws, queue a random config that satisfies them.

        The sampler still hears about every invalid draw (told PRUNED), but a space whose
        constraints reject most of its product no longer stalls the driver.
        """
        space, task = state.planned.space, state.planned.task
        params = space.params_for(task.target)
        rng = random.Random(f"{task.key}/{state.skipped}")
        for _ in range(VALID_DRAWS):
            config = {p.name: rng.choice(p.choices) for p in params}
            if space.violated(config, task.shape, task.dtype, task.target) is None \
                    and config_json(config) not in state.measured:
                state.study.enqueue_trial(config)
                state.invalid_streak = 0
                return

    def _next_trial(self, state: _TaskState) -> _Trial | None:
        """Ask until a config needs measuring; answer invalid, pruned and cached ones on the way."""
        space, task = state.planned.space, state.planned.task
        params = space.params_for(task.target)
        while state.wants_trials:
            trial = state.study.ask()
            config = studies.suggest(trial, params)
            key = config_json(config)
            broken = space.violated(config, task.shape, task.dtype, task.target)
            if broken is not None:
                self._skip(state, trial, key, outcomes.INVALID, f"breaks constraint: {broken}")
                state.invalid_streak += 1
                if state.invalid_streak >= INVALID_STREAK:
                    self._enqueue_valid(state)
                continue
            state.invalid_streak = 0
            if key in state.measured:
                state.asked += 1
                self._answer_cached(state, trial, key, state.measured[key])
                continue
            footprint, verdict = pruning.static_verdict(state.module, config, task.shape, task.dtype, task.target,
                                                        state.capacity)
            if verdict is not None and self.settings.static_pruning:
                self._skip(state, trial, key, outcomes.PRUNED, verdict.reason, footprint_bytes=verdict.footprint_bytes,
                           capacity_bytes=verdict.capacity_bytes)
                continue
            dominating = state.dominance.dominating(config)
            if dominating is not None:
                self._skip(state, trial, key, outcomes.PRUNED,
                           f"at least as large as trial {dominating}, which ran out of memory",
                           footprint_bytes=footprint, capacity_bytes=state.capacity.onchip_bytes)
                continue
            state.asked += 1
            if key in state.waiting:
                state.waiting[key].append(trial)
                continue
            state.waiting[key] = []
            return _Trial(state, trial, config, key, footprint)
        return None

    # -- workers ---------------------------------------------------------------------------
    def _depth(self, pool: str) -> int:
        return self.settings.depth or (1 if pool == "cpu" else 2)

    def _start_worker(self, slot: placement.Slot) -> _Worker:
        env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        options: dict[str, Any] = {"num_cpus": 1}
        if slot.pool == "gpu":
            options["num_gpus"] = 1
        elif slot.pool == "tpu":
            options["resources"] = {"TPU": 1}
        if self.settings.interpret or slot.pool == "cpu":
            env["JAX_PLATFORMS"] = "cpu"
        actor = Worker.options(
            **options, max_concurrency=self._depth(slot.pool), runtime_env={"env_vars": env},
            scheduling_strategy=NodeAffinitySchedulingStrategy(slot.node_id, soft=False),
        ).remote(interpret=self.settings.interpret or slot.pool == "cpu", emulate=self.settings.emulate)
        worker = _Worker(actor, slot)
        self._workers.append(worker)
        return worker

    def _node_alive(self, node_id: str) -> bool:
        return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())

    def _retire(self, worker: _Worker, *, replace: bool) -> None:
        """Kill a worker, forget its in-flight refs, start a replacement on its node if alive."""
        self._workers.remove(worker)
        for ref in worker.in_flight:
            self._refs.pop(ref, None)
        try:
            ray.kill(worker.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass
        if replace and self._node_alive(worker.slot.node_id):
            self._start_worker(worker.slot)

    def _requeue(self, flight: _Trial, *, penalize: bool, reason: str) -> None:
        """Run a trial again elsewhere, or record it `worker_lost` once its attempts are spent."""
        state = flight.state
        flight.requeued += 1
        if penalize:
            state.deaths[flight.key] += 1
            if flight.attempt >= self.settings.max_attempts:
                self._finish(flight, {"outcome": outcomes.WORKER_LOST,
                                      "error": f"{reason}; quarantined after killing {state.deaths[flight.key]} "
                                               f"workers"})
                return
            flight.attempt += 1
        self._retry.setdefault(state.pool, deque()).append(flight)

    # -- the loop --------------------------------------------------------------------------
    def _prepare(self) -> list[_TaskState]:
        cluster = ray.cluster_resources()
        pools = {p.task.key: placement.pool_for(p.task.target, cluster, self.settings.interpret)
                 for p in self.planned}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        store = studies.storage(self.run_dir)
        states = []
        for planned in self.planned:
            sampler = studies.make_sampler(planned, self.settings.sampler, self.settings.seed)
            study = studies.open_study(planned, store, sampler)
            module = kernels.load(planned.task.kernel)
            params = planned.space.params_for(planned.task.target)
            default = module.default_config(planned.task.shape, planned.task.target)
            if not studies.enqueue_warm_start(study, params, self.settings.warm_start.get(planned.task.key, []),
                                              default):
                studies.enqueue_default(study, params, default)
            states.append(_TaskState(planned, study, pools[planned.task.key], module,
                                     dominance=pruning.Dominance(module)))
        self.task_pool = {s.planned.task.key: s.pool for s in states}
        return states

    def _resume(self, states: list[_TaskState]) -> None:
        """Rebuild caches from `trials.jsonl`; re-queue trials that were in flight when the driver died."""
        log = self.run_dir / TRIALS_LOG
        logged = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
        by_key = {s.planned.task.key: s for s in states}
        done: dict[str, dict[int, dict[str, Any]]] = {}
        for record in logged:
            state = by_key.get(record["task_key"])
            if state is None:
                continue
            self.records.append(record)
            self.on_record(record)
            done.setdefault(record["task_key"], {})[record["trial"]] = record
            outcome = record["outcome"]
            if outcome in (outcomes.INVALID, outcomes.PRUNED):
                state.skipped += 1
                continue
            state.asked += 1
            if outcome in outcomes.MEASURED:
                state.measured[record["config"]] = record
                if outcome == outcomes.OOM:
                    state.dominance.add(record["trial"], json.loads(record["config"]))
        for state in states:
            for frozen in state.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                trial = optuna.Trial(state.study, frozen._trial_id)
                record = done.get(state.planned.task.key, {}).get(frozen.number)
                if record is not None:  # logged, but the driver died before telling Optuna
                    self._tell(state, trial, record)
                    continue
                # Suggesting again returns the params already drawn and completes any the killed
                # driver had not drawn yet.
                config = studies.suggest(trial, state.planned.space.params_for(state.planned.task.target))
                key = config_json(config)
                broken = state.planned.space.violated(config, state.planned.task.shape, state.planned.task.dtype,
                                                      state.planned.task.target)
                if broken is not None:
                    self._skip(state, trial, key, outcomes.INVALID, f"breaks constraint: {broken}")
                    continue
                state.asked += 1
                if key in state.measured:
                    self._answer_cached(state, trial, key, state.measured[key])
                elif key in state.waiting:
                    state.waiting[key].append(trial)
                else:
                    state.waiting[key] = []
                    self._retry.setdefault(state.pool, deque()).append(_Trial(state, trial, config, key))

    def run(self, resume: bool = False) -> list[dict[str, Any]]:
        """Measure every task's trial budget; returns all trial records."""
        connect(self.settings.address)
        states = self._prepare()
        nodes = ray.nodes()
        started = self._t0 = time.monotonic()
        for pool in sorted(set(self.task_pool.values())):
            for slot in placement.slots(pool, nodes, self.settings.node_labels, self.settings.workers):
                self._start_worker(slot)
        for pool_target in sorted({(s.pool, s.planned.task.target) for s in states}):
            info = ray.get(first_of(self._workers, pool_target[0]).actor.info.remote(pool_target[1]))
            self.pool_info.setdefault(pool_target[0], info)
            for state in states:
                if (state.pool, state.planned.task.target) == pool_target:
                    state.capacity = capacity.Capacity(**info["capacity"])
        self._write_run_info(started=None)
        measuring_since = time.monotonic()   # the time budget starts once the workers are up
        with open(self.run_dir / TRIALS_LOG, "a") as self._log:
            if resume:
                self._resume(states)
            queues = {pool: deque(s for s in states if s.pool == pool) for pool in self.pool_info}
            while True:
                budget = self.settings.time_budget_s
                if budget is not None and time.monotonic() - measuring_since > budget:
                    self._stop_asking(states)
                self._dispatch(queues)
                if not self._refs:
                    if any(self._retry.values()) and not self._workers:
                        raise RuntimeError("every worker is gone; the cluster has no slots left")
                    break
                ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=1.0)
                for ref in ready:
                    self._collect(ref)
                self._reap_hung()
        duty = self._duty()
        wall = time.monotonic() - started
        measured = sum(1 for r in self.records if r["outcome"] in outcomes.MEASURED)
        self.summary = {"wall_s": wall, "measured_trials": measured, "trials_per_s": measured / wall if wall else 0,
                        "workers": len(self._workers), "duty_cycle": duty,
                        "stopped_by_time_budget": self._stopped_early}
        for worker in list(self._workers):
            self._retire(worker, replace=False)
        self._write_run_info(started=started)
        return self.records

    def _stop_asking(self, states: list[_TaskState]) -> None:
        """The time budget is spent: no task asks for another trial (retries and trials in flight finish)."""
        for state in states:
            if state.wants_trials:
                state.exhausted = self._stopped_early = True

    def _dispatch(self, queues: dict[str, deque[_TaskState]]) -> None:
        for worker in list(self._workers):
            pool = worker.slot.pool
            while len(worker.in_flight) < self._depth(pool):
                retry = self._retry.get(pool)
                flight = retry.popleft() if retry else None
                queue = queues[pool]
                for _ in range(len(queue)):
                    if flight is not None:
                        break
                    state = queue[0]
                    queue.rotate(-1)
                    if state.wants_trials:
                        flight = self._next_trial(state)
                if flight is None:
                    break
                if not worker.in_flight:
                    worker.progress = time.monotonic()
                flight.started_at = flight.started_at or artifacts.now()
                settings = {"repetitions": self.settings.repetitions, "input_sets": self.settings.input_sets,
                            "compile_timeout_s": self.settings.compile_timeout_s}
                ref = worker.actor.run.remote(flight.state.planned.task, flight.config, flight.trial.number, settings)
                worker.in_flight[ref] = flight
                self._refs[ref] = worker

    def _collect(self, ref: Any) -> None:
        worker = self._refs.pop(ref, None)
        if worker is None:
            return
        flight = worker.in_flight.pop(ref)
        try:
            measurement = ray.get(ref)
        except (RayActorError, WorkerCrashedError) as err:
            node_alive = self._node_alive(worker.slot.node_id)
            victims = [flight, *worker.in_flight.values()]
            self._retire(worker, replace=True)
            reason = "its worker died" if node_alive else "its node left the cluster"
            for victim in victims:
                # Only the trial that was on the device is blamed for a crash; node loss blames nobody.
                self._requeue(victim, penalize=node_alive and victim is flight, reason=f"{reason}: {str(err)[:300]}")
            return
        except RayTaskError as err:  # a bug in the worker itself: data, not a crash
            measurement = {"outcome": outcomes.RUN_ERROR, "error": str(err)[:4000]}
        worker.progress = time.monotonic()
        self._finish(flight, measurement)
        if measurement.get("restart"):
            victims = list(worker.in_flight.values())
            self._retire(worker, replace=True)
            for victim in victims:
                self._requeue(victim, penalize=False, reason="worker restarted")

    def _finish(self, flight: _Trial, measurement: dict[str, Any]) -> None:
        state = flight.state
        record = self._record(state, flight.trial.number, flight.key, measurement["outcome"], measurement,
                              attempt=flight.attempt, requeued=flight.requeued, started=flight.started_at,
                              footprint_bytes=flight.footprint,
                              capacity_bytes=state.capacity.onchip_bytes)
        self._tell(state, flight.trial, record)
        state.measured[flight.key] = record
        if record["outcome"] == outcomes.OOM:
            state.dominance.add(flight.trial.number, flight.config)
        for trial in state.waiting.pop(flight.key, []):
            self._answer_cached(state, trial, flight.key, record)

    def _reap_hung(self) -> None:
        limit = self.settings.compile_timeout_s + self.settings.timing_timeout_s
        now = time.monotonic()
        for worker in list(self._workers):
            if not worker.in_flight or now - worker.progress < limit:
                continue
            flights = list(worker.in_flight.values())
            self._retire(worker, replace=True)
            self._finish(flights[0], {"outcome": outcomes.TIMEOUT,
                                      "error": f"no progress for {limit:.0f} s (compile + timing limits); "
                                               f"worker killed and replaced"})
            for victim in flights[1:]:
                self._requeue(victim, penalize=False, reason="worker killed for a hung trial")

    def _duty(self) -> dict[str, float]:
        """Seconds each live worker's device spent validating and timing, over its lifetime."""
        duty = {}
        for worker in self._workers:
            try:
                d = ray.get(worker.actor.duty.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a worker lost at the end is not fatal
                continue
            duty[f"{worker.slot.pool}:{worker.slot.node_id[:8]}:{worker.slot.index}"] = \
                d["busy_s"] / d["alive_s"] if d["alive_s"] else 0.0
        return duty

    def _write_run_info(self, started: float | None) -> None:
        info = {"run_id": self.run_id, "updated": artifacts.now(), "tasks": [p.task.key for p in self.planned],
                "spaces": sorted({p.space.path for p in self.planned}),
                "settings": {k: (str(v) if isinstance(v, Path) else v)
                             for k, v in dataclasses.asdict(self.settings).items()},
                "pools": self.pool_info, "summary": self.summary}
        tmp = self.run_dir / (RUN_INFO + ".tmp")
        tmp.write_text(json.dumps(info, indent=2, default=str))
        os.replace(tmp, self.run_dir / RUN_INFO)


def first_of(workers: list[_Worker], pool: str) -> _Worker:
    """The first live worker of a pool."""
    return next(w for w in workers if w.slot.pool == pool)
