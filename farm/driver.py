"""The Ray driver: one Optuna study per task, trials from all studies spread over all workers.

Asynchronous ask/tell: whenever a worker is free, the next task (round robin) asks its study
for a config; constraint-breaking configs are told PRUNED without measuring; a config the
task already measured (or is measuring) is answered from the cache. Every outcome is a
record in `trials.jsonl`; a hung trial's worker is killed and replaced; a dead worker is
replaced; nothing stops the sweep.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import ray
from ray.exceptions import GetTimeoutError, RayActorError, WorkerCrashedError

import kernels
from farm import artifacts, outcomes, studies
from farm.errors import FarmError
from farm.plan import PlannedTask
from farm.worker import Worker

TRIALS_LOG = "trials.jsonl"
RUN_INFO = "run.json"
# How many constraint-breaking configs a task may draw per trial of budget before it stops.
INVALID_DRAWS_PER_TRIAL = 50

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclasses.dataclass
class SweepSettings:
    """How a sweep runs (the what comes from the planned tasks)."""

    run_dir: Path
    interpret: bool = False          # emulate accelerator targets in interpret mode on CPU workers
    workers: int | None = None       # workers per pool; default one per accelerator (or CPU)
    sampler: str | None = None       # override the spaces' samplers
    seed: int | None = None          # override the spaces' sampler seeds
    repetitions: int = 10
    trial_timeout_s: float = 600.0   # compile + validate + time, per trial
    address: str | None = None       # Ray address; None starts an embedded local Ray


@dataclasses.dataclass
class _TaskState:
    planned: PlannedTask
    study: optuna.Study
    pool: str
    asked: int = 0
    invalid: int = 0
    exhausted: bool = False
    measured: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # config json -> record
    waiting: dict[str, list[tuple[optuna.Trial, str]]] = dataclasses.field(default_factory=dict)

    @property
    def wants_trials(self) -> bool:
        return not self.exhausted and self.asked < self.planned.trials


@dataclasses.dataclass
class _InFlight:
    state: _TaskState
    trial: optuna.Trial
    config: dict[str, Any]
    config_json: str
    worker: Any
    pool: str
    started: float
    started_at: str


def config_json(config: dict[str, Any]) -> str:
    """Canonical JSON of a config: the cache key and the stored form."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def pool_for(target: str, cluster: dict[str, float], interpret: bool) -> str:
    """Which kind of worker runs `target`: 'tpu', 'gpu' or 'cpu' (interpret mode)."""
    native = {"tpu": "TPU", "gpu-triton": "GPU", "gpu-mosaic": "GPU"}.get(target)
    if native is None or interpret:
        return "cpu"
    if cluster.get(native, 0) >= 1:
        return native.lower()
    raise FarmError(f"--target {target}: the Ray cluster has no {native} resources; "
                    f"expected a cluster with {native}s, or --interpret to emulate {target} on CPU")


def _start_worker(pool: str) -> Any:
    env = {"env_vars": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "JAX_PLATFORMS": ""}}
    if pool == "gpu":
        return Worker.options(num_gpus=1, num_cpus=1, runtime_env=env).remote(interpret=False)
    if pool == "tpu":
        return Worker.options(resources={"TPU": 1}, num_cpus=1, runtime_env=env).remote(interpret=False)
    env["env_vars"]["JAX_PLATFORMS"] = "cpu"
    return Worker.options(num_cpus=1, runtime_env=env).remote(interpret=True)


def _pool_size(pool: str, cluster: dict[str, float], requested: int | None) -> int:
    available = int(cluster.get({"cpu": "CPU", "gpu": "GPU", "tpu": "TPU"}[pool], 1))
    return max(1, min(requested, available) if requested else available)


def connect(address: str | None) -> None:
    """Join the Ray cluster at `address`, or start an embedded local Ray."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(address="local", include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(_import_roots())}})


def _import_roots() -> list[str]:
    roots = [os.getcwd()]
    if os.environ.get("PYTHONPATH"):
        roots.append(os.environ["PYTHONPATH"])
    return roots


class Sweep:
    """One sweep over planned tasks; `run()` returns every trial record."""

    def __init__(self, planned: list[PlannedTask], settings: SweepSettings,
                 on_record: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.planned = planned
        self.settings = settings
        self.on_record = on_record or (lambda record: None)
        self.run_id = Path(settings.run_dir).name
        self.records: list[dict[str, Any]] = []
        self.pool_info: dict[str, dict[str, Any]] = {}   # pool -> a worker's info()
        self.task_pool: dict[str, str] = {}              # task key -> pool
        self._log = None

    # -- records ---------------------------------------------------------------------------
    def _record(self, state: _TaskState, trial_number: int, config_json_: str, outcome: str,
                measurement: dict[str, Any] | None = None, started: str | None = None) -> dict[str, Any]:
        task = state.planned.task
        record = {
            "task_key": task.key, "kernel": task.kernel, "shape": list(task.shape), "dtype": task.dtype,
            "target": task.target, "trial": trial_number, "config": config_json_, "outcome": outcome,
            "attempt": 1, "started": started, "finished": artifacts.now(), "run_id": self.run_id,
        }
        for key, value in (measurement or {}).items():
            if key != "outcome":
                record.setdefault(key, value)
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
            # Failures are told PRUNED (not FAIL) so that TPE counts them as bad regions to avoid.
            state.study.tell(trial, state=optuna.trial.TrialState.PRUNED)

    # -- asking ----------------------------------------------------------------------------
    def _next_config(self, state: _TaskState) -> tuple[optuna.Trial, dict[str, Any], str] | None:
        """Ask until a config needs measuring; answer invalid and cached ones on the way."""
        space, task = state.planned.space, state.planned.task
        params = space.params_for(task.target)
        while state.wants_trials:
            trial = state.study.ask()
            config = studies.suggest(trial, params)
            key = config_json(config)
            broken = space.violated(config, task.shape, task.dtype, task.target)
            if broken is not None:
                state.invalid += 1
                record = self._record(state, trial.number, key, outcomes.INVALID,
                                      {"error": f"breaks constraint: {broken}"})
                self._tell(state, trial, record)
                if state.invalid >= INVALID_DRAWS_PER_TRIAL * state.planned.trials:
                    state.exhausted = True
                continue
            state.asked += 1
            if key in state.measured:
                self._answer_cached(state, trial, key, state.measured[key])
                continue
            if key in state.waiting:
                state.waiting[key].append((trial, artifacts.now()))
                continue
            state.waiting[key] = []
            return trial, config, key
        return None

    def _answer_cached(self, state: _TaskState, trial: optuna.Trial, key: str, source: dict[str, Any]) -> None:
        outcome = outcomes.CACHED if source["outcome"] == outcomes.OK else source["outcome"]
        measurement = {k: source.get(k) for k in ("median_s", "spread", "min_s", "numerics_error", "error")}
        measurement["error"] = f"cached from trial {source['trial']}" + (
            f": {source['error']}" if source.get("error") else "")
        record = self._record(state, trial.number, key, outcome, measurement)
        self._tell(state, trial, record)

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        """Measure every task's trial budget; returns all trial records."""
        settings = self.settings
        run_dir = Path(settings.run_dir)
        connect(settings.address)
        cluster = ray.cluster_resources()
        task_pools = [pool_for(p.task.target, cluster, settings.interpret) for p in self.planned]
        run_dir.mkdir(parents=True, exist_ok=True)
        store = studies.storage(run_dir)
        states: list[_TaskState] = []
        for planned, pool in zip(self.planned, task_pools):
            sampler = studies.make_sampler(planned, settings.sampler, settings.seed)
            study = studies.open_study(planned, store, sampler)
            module = kernels.load(planned.task.kernel)
            studies.enqueue_default(study, planned.space.params_for(planned.task.target),
                                    module.default_config(planned.task.shape, planned.task.target))
            states.append(_TaskState(planned, study, pool))
        self.task_pool = {s.planned.task.key: s.pool for s in states}

        pools = {s.pool for s in states}
        idle: dict[str, deque] = {p: deque(_start_worker(p) for _ in range(_pool_size(p, cluster, settings.workers)))
                                  for p in pools}
        self.pool_info = {p: ray.get(idle[p][0].info.remote()) for p in pools}
        queues: dict[str, deque[_TaskState]] = {p: deque(s for s in states if s.pool == p) for p in pools}
        in_flight: dict[Any, _InFlight] = {}
        timing_settings = {"repetitions": settings.repetitions}
        (run_dir / RUN_INFO).write_text(json.dumps({
            "run_id": self.run_id, "created": artifacts.now(), "tasks": [p.task.key for p in self.planned],
            "settings": {k: str(v) for k, v in dataclasses.asdict(settings).items()}}, indent=2))

        with open(run_dir / TRIALS_LOG, "a") as self._log:
            while True:
                for pool in pools:
                    self._dispatch(pool, idle[pool], queues[pool], in_flight, timing_settings)
                if not in_flight:
                    break
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
                for ref in ready:
                    flight = in_flight.pop(ref)
                    try:
                        measurement = ray.get(ref)
                    except (RayActorError, WorkerCrashedError) as err:
                        measurement = {"outcome": outcomes.WORKER_LOST, "error": str(err)[:2000]}
                        flight.worker = _start_worker(flight.pool)
                    self._finish(flight, measurement)
                    idle[flight.pool].append(flight.worker)
                self._reap_hung(in_flight, idle)
        for worker_queue in idle.values():
            for worker in worker_queue:
                ray.kill(worker)
        return self.records

    def _dispatch(self, pool: str, idle: deque, queue: deque[_TaskState], in_flight: dict, settings: dict) -> None:
        while idle and any(s.wants_trials for s in queue):
            state = queue[0]
            queue.rotate(-1)
            asked = self._next_config(state)
            if asked is None:
                continue
            trial, config, key = asked
            worker = idle.popleft()
            ref = worker.run.remote(state.planned.task, config, trial.number, settings)
            in_flight[ref] = _InFlight(state, trial, config, key, worker, pool, time.monotonic(), artifacts.now())

    def _finish(self, flight: _InFlight, measurement: dict[str, Any]) -> None:
        state = flight.state
        record = self._record(state, flight.trial.number, flight.config_json, measurement["outcome"],
                              measurement, flight.started_at)
        self._tell(state, flight.trial, record)
        state.measured[flight.config_json] = record
        for trial, _ in state.waiting.pop(flight.config_json, []):
            self._answer_cached(state, trial, flight.config_json, record)

    def _reap_hung(self, in_flight: dict, idle: dict[str, deque]) -> None:
        now = time.monotonic()
        for ref, flight in list(in_flight.items()):
            if now - flight.started < self.settings.trial_timeout_s:
                continue
            in_flight.pop(ref)
            ray.kill(flight.worker, no_restart=True)
            try:
                ray.get(ref, timeout=0)
            except (RayActorError, WorkerCrashedError, GetTimeoutError, Exception):  # noqa: BLE001
                pass
            self._finish(flight, {"outcome": outcomes.TIMEOUT,
                                  "error": f"trial exceeded {self.settings.trial_timeout_s:.0f} s; worker replaced"})
            idle[flight.pool].append(_start_worker(flight.pool))
