"""One sweep path: `run_sweep` measures planned tasks on Ray workers, picks winners, writes the bundle.

Asynchronous ask/tell: whenever a worker has room (`depth` trials in flight), the next task of
its pool (`farm.run.schedule`: round robin, fewer turns to tasks that stopped improving) asks
its searcher (`farm.search.searcher`) for a config; the searcher answers invalid, pruned and
cached configs itself. Faults are data: a worker that stops making progress is killed and
replaced (its trial `timeout`), a trial whose worker died is re-queued up to `max_attempts`
runs and then recorded `worker_lost` (its config quarantined), and a trial on a node that left
the cluster is re-queued elsewhere without penalty. Every finished trial is
appended to `trials.jsonl` (`farm.run.runlog`) before its searcher tells Optuna, so a killed
driver resumes (`resume=True`) without measuring anything twice.

Used by `farm sweep`, `farm retune` (its probe and its sweeps), the benchmarks and the tests.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import kernels
from farm.bundle import artifacts, select, signing
from farm.bundle.records import TrialRecord
from farm.errors import FarmError
from farm.measure import capacity, finalists, outcomes
from farm.measure.device import MeasureSettings
from farm.measure.finalists import FinalTiming
from farm.measure.outcomes import Measurement
from farm.run import placement, runlog, scaling
from farm.run.bounds import check_settings
from farm.run.pool import Crashed, Done, Flight, WorkerPool, connect
from farm.run.schedule import StrideScheduler
from farm.search import studies
from farm.search.plan import PlannedTask
from farm.search.searcher import Answer, Searcher
from farm.tasks import config_json
from kernels.protocol import task_default

logger = logging.getLogger(__name__)
BUNDLE_DIR = "bundle"
FINALISTS = 4               # configs per task re-timed side by side on accelerators (SweepSettings.finalists)
RACE_AFTER = 3   # ok configs a task measures in full before racing cuts any short
REFERENCE_FAILURES_TO_STOP = 2   # a task's trials whose reference failed before it is asked for no more
WARM_UP_COMPILE_S = 120.0   # the least time a worker's untimed first run may take to compile
OnRecord = Callable[[TrialRecord], None]


@dataclasses.dataclass
class SweepSettings:
    """How a sweep runs (what it tunes comes from the planned tasks)."""

    run_dir: Path
    interpret: bool = False            # run kernels in interpret mode (accelerator targets emulated)
    emulate: str | None = None         # capacity profile for interpret runs (v5e, v6e, v7, h200, ...)
    workers: int | None = None         # workers per pool; default one per chip, GPU or CPU
    depth: int | None = None           # trials in flight per worker; default compile processes + 2 (1 on CPU)
    compile_processes: int | None = None  # per worker; default its share of the node's CPUs (0 on CPU workers)
    node_labels: dict[str, str] = dataclasses.field(default_factory=dict)
    sampler: str | None = None         # override the spaces' samplers
    seed: int | None = None            # override the spaces' sampler seeds
    repetitions: int = 10
    sample_budget_s: float | None = 0.5  # seconds of timing samples per config (3 pairs at least); None: all
    #                                    `repetitions` whatever the kernel's time (finalists are re-timed anyway)
    race: float | None = 1.5           # cut a config's timing short once its first samples are this many times
    #                                    the task's best so far (after RACE_AFTER ok configs); None: never
    input_sets: int = 1                # rotating input sets for timing (beat the cache)
    compile_timeout_s: float = 600.0
    timing_timeout_s: float = 300.0    # validation and timing of one config
    max_attempts: int = 2              # a trial whose worker died is re-queued up to this many runs
    finalists: int | None = None       # best configs per task re-timed side by side before the winner (0:
    #                                    none); default 4 on accelerators, 0 on CPU (interpret timings)
    finalist_budget_s: float = 10.0    # device seconds per task for that
    finalist_sustain_s: float = 0.0    # > 0: each finalist sample from this many seconds of its calls back to
    #                                    back (sustained load, as in a training step), not one short pair
    static_pruning: bool = True        # False: compile even what the footprint model says cannot fit
    address: str | None = None         # Ray address; None starts an embedded local Ray
    runnable_only: bool = False        # no --target given: leave out (with a note) the tasks whose target the
    #                                    cluster cannot run (no such accelerator, gpu-mosaic off Hopper), and the
    #                                    interpret target's where an accelerator target runs, rather than refuse
    #                                    the sweep; an error only when no task is left
    time_budget_s: float | None = None  # once workers are up, stop asking for trials after this long
    scale_up: int | None = None        # chips of the targets' accelerator to ask Ray's autoscaler for before
    #                                    placing workers (withdrawn when the sweep ends); None: ask for none
    scale_up_wait_s: float = 1800.0    # how long to wait for them (hosts take minutes to boot and set up)
    # task key -> configs queued first, in order, in a new study (farm retune: previous winners)
    warm_start: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    # The actor class of the workers: farm.run.actor.Worker when None; stand-ins for benchmarks
    # (bench/driver_throughput.py). Not saved with the run.
    worker_class: Any = dataclasses.field(default=None, repr=False, metadata={"saved": False})

    def __post_init__(self) -> None:
        check_settings({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    def measure(self) -> MeasureSettings:
        """What every worker needs to know to measure a config."""
        return MeasureSettings(self.repetitions, self.input_sets, self.compile_timeout_s, self.sample_budget_s)


@dataclasses.dataclass
class RunResult:
    """What a sweep measured, chose and wrote."""

    run_dir: Path
    run_id: str
    records: list[TrialRecord]                   # every trial, resumed ones included
    rows: list[dict[str, Any]]                   # one configs.parquet row per task (the winner)
    bundle: Path | None                          # None when no signing key was given
    summary: dict[str, Any]                      # wall time, trials/s, duty cycle, placement, ...
    environment: dict[str, dict[str, Any]]       # task key -> the Worker.info() of its pool


def run_sweep(planned: Sequence[PlannedTask], settings: SweepSettings, key: Ed25519PrivateKey | None, *,
              resume: bool = False, on_record: OnRecord | None = None,
              on_start: Callable[[list[PlannedTask]], None] | None = None) -> RunResult:
    """Run (or resume) the sweep, select each task's winner and, given a key, write the signed bundle.

    A new run saves its spaces and settings in the run folder (`farm.run.runlog.save_run`) once the
    cluster can run its tasks. Bad input found on the way (no pool for a target, no slots on the
    labelled nodes) raises `FarmError` and leaves no trace of a new run: the folder is removed
    (emptied, when it existed empty) as long as no trial was logged. `on_start` is called with the
    tasks being tuned (fewer than planned where `runnable_only` left some out) when the workers are
    warm and measuring begins (after a resume's replay). Winners are chosen for those tasks.
    """
    run_dir = Path(settings.run_dir)
    existed = run_dir.exists()
    sweep = _Sweep(list(planned), settings, on_record or (lambda record: None), on_start)
    try:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise FarmError(f"--out {run_dir}: cannot create the run folder ({err.strerror}); expected a new folder "
                            f"in a writable place") from None
        with runlog.RunLock(run_dir):   # before Ray starts: a second process is refused at once
            if resume:
                runlog.prepare_resume(run_dir)
            try:
                sweep.place()
                if not resume:
                    runlog.save_run(run_dir, sweep.planned, settings)
                records = sweep.run(resume)
            finally:
                sweep.release()
    except FarmError:
        if not resume and not (run_dir / runlog.TRIALS_LOG).exists():
            _undo(run_dir, existed)
        raise
    environment = {k: sweep.pool_info.get(pool, {}) for k, pool in sweep.task_pool.items()}
    rows = select.winner_rows([p.task for p in sweep.planned], records, run_id=sweep.run_id, created=artifacts.now(),
                              environment=environment, finals=sweep.finals)
    bundle = None
    if key is not None and _unchanged(run_dir / BUNDLE_DIR, key, sweep):
        bundle = run_dir / BUNDLE_DIR   # a resume of a finished run: its signed bundle stays as it was
        sweep.summary["bundle_unchanged"] = True
    elif key is not None:
        bundle = artifacts.write_bundle(run_dir / BUNDLE_DIR, rows, records, key, {"run_ids": [sweep.run_id]})
    return RunResult(run_dir, sweep.run_id, records, rows, bundle, sweep.summary, environment)


def _unchanged(bundle: Path, key: Ed25519PrivateKey, sweep: _Sweep) -> bool:
    """Whether a resume measured nothing new (no trial, no finalists) over a bundle this key signed:
    then it is kept, not signed again with a new id and time (which would make the same winners
    look newer to `farm pull`)."""
    if sweep.replayed != len(sweep.records) or sweep.new_finals or not sweep.replayed:
        return False
    try:
        manifest = json.loads((bundle / artifacts.MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("signer_key_id") == signing.key_id(key.public_key())


def _undo(run_dir: Path, existed: bool) -> None:
    """Remove what a new run wrote before it measured anything (the folder itself if it made it)."""
    if not run_dir.is_dir():
        return
    if not existed:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for child in run_dir.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


class _Sweep:
    """The loop: searchers propose, the pool measures, the log records, the searchers are told."""

    def __init__(self, planned: list[PlannedTask], settings: SweepSettings, on_record: OnRecord,
                 on_start: Callable[[list[PlannedTask]], None] | None = None) -> None:
        self.planned = planned
        self.on_start = on_start
        self.settings = settings
        self.on_record = on_record
        self.run_dir = Path(settings.run_dir)
        self.run_id = self.run_dir.name
        self.records: list[TrialRecord] = []
        self.replayed = 0          # records a resume replayed from the log (measured by an earlier process)
        self.new_finals = 0        # tasks whose finalists this process re-timed
        self.pool_info: dict[str, dict[str, Any]] = {}   # pool -> a worker's info()
        self.task_pool: dict[str, str] = {}              # task key -> pool
        self.summary: dict[str, Any] = {}
        self.searchers: dict[str, Searcher] = {}
        self.deaths: Counter = Counter()                 # (task key, config) -> workers killed under it
        self.stopped_early = False
        self.warmed: dict[str, dict[str, str]] = {}      # worker -> the task whose default warmed it
        self.placed: list[str] = []                      # node of each worker started first
        self.finals: dict[str, list[FinalTiming]] = {}   # task key -> its finalists, re-timed
        self.left_out: dict[str, str] = {}               # target -> why this cluster does not run it
        self.scaled: scaling.ScaleUp | None = None       # what --scale-up asked the autoscaler for
        self._sigterm: Any = None                        # SIGTERM's handler before --scale-up's (restored after)
        self.reference_failures: Counter = Counter()     # task key -> trials whose reference failed
        self.stopped_tasks: dict[str, str] = {}          # task key -> why no more of its trials were asked
        self._t0 = time.monotonic()
        self._log: runlog.RunLog | None = None

    # -- records ---------------------------------------------------------------------------------
    def _keep(self, record: TrialRecord) -> TrialRecord:
        assert self._log is not None
        self._log.append(record)          # logged before anyone is told
        self.records.append(record)
        self.on_record(record)
        return record

    def _stamp(self) -> dict[str, Any]:
        return {"finished": artifacts.now(), "elapsed_s": time.monotonic() - self._t0, "run_id": self.run_id}

    def _answered(self, planned: PlannedTask, answer: Answer) -> TrialRecord:
        """The record of a trial a searcher answered itself (invalid, pruned, cached)."""
        fields: dict[str, Any] = {"error": answer.error, "footprint_bytes": answer.footprint_bytes,
                                  "capacity_bytes": answer.capacity_bytes}
        if answer.source is not None:
            source: TrialRecord = answer.source
            fields.update(median_s=source.median_s, spread=source.spread, min_s=source.min_s,
                          numerics_error=source.numerics_error)
        return self._keep(TrialRecord.for_task(planned.task, answer.trial, answer.config, answer.outcome,
                                               **fields, **self._stamp()))

    def _finish(self, flight: Flight, measurement: Measurement, device_s: float | None = None) -> None:
        searcher = self.searchers[flight.task.key]
        p = flight.proposal
        record = TrialRecord.measured(flight.task, p.trial, p.key, measurement, device_s=device_s,
                                      attempt=flight.attempt, requeued=flight.requeued, started=flight.started_at,
                                      footprint_bytes=p.footprint_bytes,
                                      capacity_bytes=searcher.capacity.onchip_bytes, **self._stamp())
        searcher.tell(self._keep(record))
        error = measurement.error or ""
        if measurement.outcome == outcomes.RUN_ERROR and error.startswith(outcomes.REFERENCE_FAILED):
            self._reference_failed(flight.task.key, error)

    def _reference_failed(self, task_key: str, error: str) -> None:
        """Stop asking for a task's trials once its reference failed REFERENCE_FAILURES_TO_STOP times
        (a host out of memory, a reference that raises): every config would fail the same way, each
        after its compile. The task ends `no_valid_config`; the summary's `stopped_tasks` says why."""
        self.reference_failures[task_key] += 1
        searcher = self.searchers[task_key]
        if self.reference_failures[task_key] >= REFERENCE_FAILURES_TO_STOP and task_key not in self.stopped_tasks:
            searcher.stop()
            self.stopped_tasks[task_key] = error[:500]
            logger.warning("%s: stopped after %d trials whose reference could not be computed (%s)", task_key,
                           self.reference_failures[task_key], error[len(outcomes.REFERENCE_FAILED):][:200])

    # -- faults ----------------------------------------------------------------------------------
    def _requeue(self, flight: Flight, *, penalize: bool, reason: str) -> None:
        """Run a trial again elsewhere, or record it `worker_lost` once its attempts are spent."""
        if penalize:
            key = (flight.task.key, flight.proposal.key)
            self.deaths[key] += 1
            if flight.attempt >= self.settings.max_attempts:
                flight.requeued += 1
                self._finish(flight, Measurement(outcomes.WORKER_LOST, error=f"{reason}; quarantined after killing "
                                                                             f"{self.deaths[key]} workers"))
                return
            flight.attempt += 1
        self.pool.requeue(flight)

    def _handle(self, event: Done | Crashed) -> None:
        if isinstance(event, Crashed):
            reason = "its worker died" if event.node_alive else "its node left the cluster"
            for victim in event.lost:
                # Only the trial that was on the device is blamed for a crash; node loss blames nobody.
                self._requeue(victim, penalize=event.node_alive and victim is event.lost[0],
                              reason=f"{reason}: {event.error}")
            return
        self._finish(event.flight, event.measured.measurement, event.measured.device_s)
        if event.measured.restart:
            for victim in self.pool.restart(event.worker):
                self._requeue(victim, penalize=False, reason="worker restarted")

    def _reap_hung(self) -> None:
        limit = self.settings.compile_timeout_s + self.settings.timing_timeout_s
        for flights in self.pool.hung(limit):
            self._finish(flights[0], Measurement(outcomes.TIMEOUT, error=f"no progress for {limit:.0f} s (compile "
                                                                         f"+ timing limits); worker killed and "
                                                                         f"replaced"))
            for victim in flights[1:]:
                self._requeue(victim, penalize=False, reason="worker killed for a hung trial")

    # -- the loop --------------------------------------------------------------------------------
    def _start(self) -> None:
        """Start the workers, learn each pool's capacity per target, open the searchers."""
        s = self.settings
        nodes = ray.nodes()
        for pool in sorted(set(self.task_pool.values()), key=lambda pool: (pool == "cpu", pool)):
            self.pool.start(pool, nodes, s.node_labels, s.workers)   # the cpu pool last: it takes the CPUs left
        self.placed = [w.slot.node_id for w in self.pool.workers]
        capacities: dict[tuple[str, str], capacity.Capacity] = {}
        infos = {(pool, target): self.pool.info(pool, target)
                 for pool, target in sorted({(self.task_pool[p.task.key], p.task.target) for p in self.planned})}
        if s.runnable_only:
            self._leave_out({target: placement.device_unfit(target, pool, info)
                             for (pool, target), info in infos.items()})
            native = sorted({p.task.target for p in self.planned if p.task.target in placement.NATIVE_POOL})
            emulated = any(p.task.target == "interpret" for p in self.planned)
            if native and emulated and not s.interpret:   # the interpret target: where nothing runs natively
                self._leave_out({"interpret": f"the cluster runs {', '.join(native)} natively (the interpret "
                                              f"target is for machines without them)"})
            for worker in [w for w in self.pool.workers if w.slot.pool not in self.task_pool.values()]:
                self.pool.retire(worker, replace=False)   # a pool whose every target was left out
        for (pool, target), info in infos.items():
            if target in self.left_out:
                continue
            placement.check_device(target, pool, info)
            self.pool_info.setdefault(pool, info)
            capacities[pool, target] = capacity.Capacity(**info["capacity"])
        store = studies.storage(self.run_dir)
        for p in self.planned:
            self.searchers[p.task.key] = Searcher.open(
                p, store, sampler=s.sampler, seed=s.seed, warm_start=s.warm_start.get(p.task.key, ()),
                capacity=capacities[self.task_pool[p.task.key], p.task.target], static_pruning=s.static_pruning,
                on_answer=functools.partial(self._answered, p))

    def _warm_up(self) -> None:
        """Run the default config of one of its pool's tasks once on every worker, untimed, so that
        the default (measured first: `vs default` compares with it) is not measured on a cold worker."""
        by_pool = {}
        for p in self.planned:
            by_pool.setdefault(self.task_pool[p.task.key], p.task)
        # A fresh worker's first compile pays for starting JAX and its compiler: the warm-up gets
        # at least WARM_UP_COMPILE_S for it, whatever --compile-timeout says about trials.
        compile_s = max(self.settings.compile_timeout_s, WARM_UP_COMPILE_S)
        light = dataclasses.replace(self.settings.measure(), repetitions=1, compile_timeout_s=compile_s)
        refs = {}
        for worker in list(self.pool.workers):
            task = by_pool[worker.slot.pool]
            config = task_default(kernels.load(task.kernel), task.shape, task.target, task.dtype)
            refs[worker.actor.run.remote(task, config, 0, light)] = (worker, task.key)
        limit = compile_s + self.settings.timing_timeout_s
        warmed = {}
        try:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=limit) if refs else ([], [])
        except Exception as err:  # noqa: BLE001 - warming up is best effort; the loop handles faults
            logger.warning("warm-up failed: %s", err)
            ready = []
        for ref, (worker, task_key) in refs.items():
            try:
                if ref not in ready:
                    raise TimeoutError(f"no answer in {limit:.0f} s")
                measured = ray.get(ref)
                if measured.restart:
                    raise RuntimeError(measured.measurement.error or "the worker asked to be replaced")
                warmed[worker.name] = {"task": task_key, "outcome": measured.measurement.outcome}
            except Exception as err:  # noqa: BLE001 - a worker that died or hung is replaced, nobody blamed
                logger.warning("warm-up on %s failed (%s); replacing the worker", worker.name, str(err)[:200])
                self.pool.retire(worker, replace=True)
        self.warmed = warmed
        logger.info("warmed up %d of %d workers", len(warmed), len(refs))

    def _resume(self) -> None:
        """Replay the log: every logged record counts, and each searcher settles its study."""
        by_task: dict[str, list[TrialRecord]] = {}
        for record in runlog.replay(self.run_dir):
            if record.task_key in self.searchers:
                self.records.append(record)
                self.on_record(record)
                by_task.setdefault(record.task_key, []).append(record)
        for key, searcher in self.searchers.items():
            searcher.replay(by_task.get(key, []))

    def place(self) -> None:
        """Join Ray and choose each task's pool (FarmError when the cluster cannot run a target)."""
        s = self.settings
        if s.scale_up:
            self.scaled, self._sigterm = scaling.ask([p.task.target for p in self.planned], s.scale_up,
                                                     s.node_labels, s.scale_up_wait_s, s.address)
        connect(s.address)
        cluster = ray.cluster_resources()
        if s.runnable_only:
            self._leave_out({p.task.target: placement.unrunnable(p.task.target, cluster, s.interpret)
                             for p in self.planned})
        self.task_pool = {p.task.key: placement.pool_for(p.task.target, cluster, s.interpret) for p in self.planned}

    def release(self) -> None:
        """Withdraw what --scale-up asked the autoscaler for (the workers are gone by now)."""
        scaling.give_back(self.scaled, self._sigterm)
        self.scaled = self._sigterm = None

    def _leave_out(self, reasons: dict[str, str | None]) -> None:
        """Drop the tasks of each target with a reason (runnable_only), noting why; FarmError when
        none is left."""
        for target, reason in sorted(reasons.items()):
            if reason is not None:
                self.left_out[target] = reason
                logger.warning("left out target %s: %s (no --target was given; name it with --target to tune "
                               "it or be told why not)", target, reason)
        self.planned = [p for p in self.planned if p.task.target not in self.left_out]
        self.task_pool = {k: pool for k, pool in self.task_pool.items() if k in {p.task.key for p in self.planned}}
        if not self.planned:
            why = "; ".join(f"{target}: {reason}" for target, reason in sorted(self.left_out.items()))
            raise FarmError(f"no task's target can run on this cluster ({why}); expected a cluster with those "
                            f"accelerators, or --interpret to emulate them on CPU")

    def run(self, resume: bool) -> list[TrialRecord]:
        """Measure every task's trial budget; returns all trial records."""
        s = self.settings
        if not self.task_pool:
            self.place()
        started = self._t0 = time.monotonic()
        self.pool = WorkerPool(self.task_pool, interpret=s.interpret, emulate=s.emulate, depth=s.depth,
                               measure=s.measure(), compile_processes=s.compile_processes,
                               worker_class=s.worker_class)
        try:
            self._start()
            runlog.write_run_info(self.run_dir, self.planned, s, self.pool_info, self.summary)
            with runlog.RunLog(self.run_dir) as self._log:
                if resume:
                    self._resume()
                    self.replayed = len(self.records)
                if any(searcher.wants_trials for searcher in self.searchers.values()):
                    self._warm_up()
                if self.on_start is not None:
                    self.on_start(self.planned)
                self.pool.reset_duty()
                measuring = time.monotonic()
                self._loop()
                measured_s = time.monotonic() - measuring
                duty = self.pool.duty()
                finals_started = time.monotonic()
                self._retime_finalists()
            self.summary = self._summarize(time.monotonic() - started, measured_s, duty,
                                           time.monotonic() - finals_started)
        finally:
            self.pool.shutdown()
        runlog.write_run_info(self.run_dir, self.planned, s, self.pool_info, self.summary)
        return self.records

    def _loop(self) -> None:
        """Dispatch and collect until no task wants trials and nothing is in flight."""
        measuring_since = time.monotonic()   # the time budget starts once the workers are up
        queues = {pool: StrideScheduler(searcher for k, searcher in self.searchers.items()
                                        if self.task_pool[k] == pool) for pool in self.pool_info}
        budget = self.settings.time_budget_s
        while True:
            if budget is not None and time.monotonic() - measuring_since > budget:
                self._stop_asking()
            self._dispatch(queues)
            if not self.pool.busy:
                if any(self.pool.retry.values()) and not self.pool.workers:
                    raise RuntimeError("every worker is gone; the cluster has no slots left")
                return
            for event in self.pool.wait(timeout=1.0):
                self._handle(event)
            self._reap_hung()

    def _retime_finalists(self) -> None:
        """Re-time each task's best few configs side by side on one of its pool's workers
        (`Worker.retime`); logged to finalists.jsonl, so a resume re-times only what is missing."""
        s = self.settings
        self.finals = {k: v for k, v in runlog.read_finals(self.run_dir).items() if k in self.searchers}
        workers = {pool: [w for w in self.pool.workers if w.slot.pool == pool] for pool in self.pool_info}
        turn: Counter = Counter()
        jobs, most = {}, 0
        for p in self.planned:
            key, pool = p.task.key, self.task_pool[p.task.key]
            configs = self._finalist_configs(p)
            if key in self.finals or not configs or not workers.get(pool):
                continue
            worker = workers[pool][turn[pool] % len(workers[pool])]
            turn[pool] += 1
            most = max(most, len(configs))
            jobs[worker.actor.retime.remote(p.task, configs, s.measure(), s.finalist_budget_s,
                                            s.finalist_sustain_s)] = key
        if not jobs:
            return
        # Each worker re-times its tasks one after another; allow every task its compile and budget
        # (sustained samples: at least MIN_SAMPLES rounds of every finalist's sustain_s, past the budget).
        per_worker = max(-(-n // len(workers[pool])) for pool, n in turn.items())
        sustained = finalists.MIN_SAMPLES * most * s.finalist_sustain_s
        limit = (s.compile_timeout_s + 3 * s.finalist_budget_s + 2 * sustained + s.timing_timeout_s) * per_worker
        ready, _ = ray.wait(list(jobs), num_returns=len(jobs), timeout=limit)
        for ref in ready:
            try:
                timings = ray.get(ref)
            except Exception as err:  # noqa: BLE001 - no finalists: the sweep's own best stands
                logger.warning("re-timing the finalists of %s failed: %s", jobs[ref], str(err)[:300])
                continue
            runlog.append_finals(self.run_dir, timings)
            self.finals[jobs[ref]] = timings
            self.new_finals += 1
        for ref in set(jobs) - set(ready):
            logger.warning("re-timing the finalists of %s took over %.0f s; the sweep's best stands", jobs[ref], limit)

    def _finalist_configs(self, p: PlannedTask) -> list[str]:
        """The task's configs to re-time: its best few and its default (none on CPU by default)."""
        count = self.settings.finalists
        if count is None:
            count = 0 if self.task_pool[p.task.key] == "cpu" else FINALISTS
        if count < 1:
            return []
        default = config_json(task_default(kernels.load(p.task.kernel), p.task.shape, p.task.target, p.task.dtype))
        return select.finalists([r for r in self.records if r.task_key == p.task.key], count, default)

    def _summarize(self, wall: float, measured_s: float, duty: dict[str, float], finals_s: float) -> dict[str, Any]:
        measured = sum(1 for r in self.records[self.replayed:] if r.outcome in outcomes.MEASURED)
        return {"wall_s": wall, "measured_trials": measured, "replayed_trials": self.replayed,
                "trials_per_s": measured / wall if wall else 0,
                "measuring_s": measured_s, "measuring_trials_per_s": measured / measured_s if measured_s else 0,
                "finalists_s": finals_s,
                "retimed_quiet": sum(1 for r in self.records if r.retimed_quiet),   # disturbed timings taken again
                "compile_processes": self.pool_info and
                {pool: info.get("compile_processes") for pool, info in self.pool_info.items()},
                "workers": len(self.pool.workers), "duty_cycle": duty,
                "stopped_by_time_budget": self.stopped_early, "warm_up": self.warmed, "left_out": self.left_out,
                "scale_up": dataclasses.asdict(self.scaled) if self.scaled else None,
                "stopped_tasks": self.stopped_tasks,
                "placement": {"initial": self.placed, "final": [w.slot.node_id for w in self.pool.workers]}}

    def _stop_asking(self) -> None:
        """The time budget is spent: no task asks for another trial (retries and trials in flight finish)."""
        for searcher in self.searchers.values():
            if searcher.wants_trials:
                searcher.stop()
                self.stopped_early = True

    def _dispatch(self, queues: dict[str, StrideScheduler[Searcher]]) -> None:
        """Fill the workers one flight each per round, so that every device starts early (not
        after the workers before it got `depth` flights each), until they are full or their
        pools have nothing more to propose now."""
        hungry = [w for w in self.pool.workers if self.pool.has_room(w)]
        done: set[str] = set()   # pools with nothing to propose now
        while hungry:
            for worker in hungry:
                pool = worker.slot.pool
                if pool in done:
                    continue
                flight = self.pool.next_retry(pool) or self._next_flight(queues[pool])
                if flight is None:
                    done.add(pool)
                    continue
                flight.started_at = flight.started_at or artifacts.now()
                self.pool.submit(worker, flight)
            hungry = [w for w in hungry if w.slot.pool not in done and self.pool.has_room(w)]

    def _cutoff(self, searcher: Searcher) -> float | None:
        """The time past which a new config of this task is cut short: `race` times its best so far."""
        race = self.settings.race
        best = searcher.best_median_s(RACE_AFTER) if race else None
        return race * best if best is not None else None

    def _next_flight(self, scheduler: StrideScheduler[Searcher]) -> Flight | None:
        """The next proposal of the pool's tasks (`farm.run.schedule`: more turns to tasks that improve)."""
        turn = scheduler.next()
        if turn is None:
            return None
        searcher, proposal = turn
        return Flight(searcher.planned.task, proposal, cutoff_s=self._cutoff(searcher))
