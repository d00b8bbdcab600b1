"""The worker pool: Ray actors placed on accelerators, trials in flight, faults as events.

One `Worker` actor per slot (`farm.run.placement`), pinned to its node. Each holds up to
`depth` trials (the next compiles while the device times the current one). `wait()` turns what
Ray reports into events the sweep handles: a result, or a crash. A worker that makes no progress
for too long is killed and replaced (`reap_hung`); a dead worker is replaced on its node if the
node is still alive. The pool does not decide what to try next; it knows no Optuna.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError, WorkerCrashedError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from farm.errors import FarmError, shorten
from farm.measure import outcomes
from farm.measure.device import MeasureSettings
from farm.measure.outcomes import Measured, Measurement
from farm.run import placement
from farm.run.actor import Worker
from farm.search.searcher import Proposal
from farm.tasks import TuningTask

logger = logging.getLogger(__name__)
INFO_TIMEOUT_S = 300.0        # a new worker's first answer (it imports JAX, and a TPU worker opens its chips)
MAX_COMPILE_PROCESSES = 16    # per worker: each holds a JAX runtime (about 1 GB of host memory)
# Pools whose workers compile in their own process by default: CPU workers (one per core
# already) and TPU workers (their children compile deviceless for the chip's topology, shown on
# CPU with libtpu, but loading those executables on a chip was never run: `--compile-processes`).
NO_COMPILE_PROCESSES = ("cpu", "tpu")


REACH_TIMEOUT_S = 10.0   # seconds to open a TCP connection to a host:port Ray address


def _check_reachable(address: str) -> None:
    """A FarmError unless a host:port address accepts a TCP connection within REACH_TIMEOUT_S: Ray
    itself retries an address with nothing behind it for minutes (a nightly job hung 10 minutes,
    then ignored SIGTERM). "auto", "local" and ray:// or http(s):// addresses are Ray's to judge."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as err:
        raise FarmError(f"--address {address}: nothing answers there ({err.strerror or err}); expected the "
                        f"host:port of a running Ray cluster's head (`ray start --head`), or auto") from None


def connect(address: str | None) -> None:
    """Join the Ray cluster at `address`, else at `RAY_ADDRESS` (Ray's own rule, and what a Ray
    job's driver is given), else start an embedded local Ray."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        logger.info("joining the Ray cluster at %s", address)
        _check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False)
        except (ValueError, ConnectionError, RuntimeError, TimeoutError) as err:
            raise FarmError(f"--address {address}: cannot join a Ray cluster there ({type(err).__name__}: "
                            f"{shorten(str(err), 200)}); expected host:port of a running cluster's head, or auto")
    else:
        roots = [os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])]
        ray.init(address="local", include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(roots)}})


@dataclasses.dataclass
class Flight:
    """A proposal on its way through the pool: which task, how often it ran and moved."""

    task: TuningTask
    proposal: Proposal
    attempt: int = 1          # runs that counted against the trial (its worker died under it)
    requeued: int = 0         # times it was moved to another worker, for whatever reason
    started_at: str | None = None
    cutoff_s: float | None = None   # a time that cannot win (`MeasureSettings.cutoff_s`)


@dataclasses.dataclass(eq=False)
class PoolWorker:
    """A live actor, its slot and the flights it holds, in dispatch order (compared by identity)."""

    actor: Any
    slot: placement.Slot
    in_flight: dict[Any, Flight] = dataclasses.field(default_factory=dict)   # ref -> flight
    progress: float = dataclasses.field(default_factory=time.monotonic)
    cpus: float = 1.0         # the CPUs its actor holds on its node

    @property
    def name(self) -> str:
        """pool:node:index, for duty-cycle reports."""
        return f"{self.slot.pool}:{self.slot.node_id[:8]}:{self.slot.index}"


@dataclasses.dataclass(frozen=True)
class Done:
    """A flight's worker reported (`measured`): a measurement or the worker's own error as data."""

    worker: PoolWorker
    flight: Flight
    measured: Measured


@dataclasses.dataclass(frozen=True)
class Crashed:
    """A worker died under its flights (`lost`: the first was on the device); `node_alive` False when
    its node left the cluster."""

    lost: list[Flight]
    node_alive: bool
    error: str


class WorkerPool:
    """The sweep's actors; `submit` a flight to a worker with room, `wait` for events."""

    def __init__(self, task_pool: dict[str, str], *, interpret: bool, emulate: str | None, depth: int | None,
                 measure: MeasureSettings, compile_processes: int | None = None, worker_class: Any = None) -> None:
        self.task_pool = task_pool          # task key -> the pool that runs it
        self.worker_class = worker_class or Worker   # the actor class; stand-ins for benchmarks
        self.interpret = interpret
        self.emulate = emulate
        self._depth = depth
        self._compile_processes = compile_processes
        self.measure = measure
        self.workers: list[PoolWorker] = []
        self.retry: dict[str, deque[Flight]] = {}
        self._refs: dict[Any, PoolWorker] = {}

    def compile_processes(self, slot: placement.Slot) -> int:
        """Compile processes per worker: the setting, else on accelerators one per CPU of the slot's
        share of its node but two (the worker's own, and the driver's and Ray's), at most
        MAX_COMPILE_PROCESSES; none on CPU and TPU workers (NO_COMPILE_PROCESSES)."""
        if self._compile_processes is not None:
            return self._compile_processes
        if slot.pool in NO_COMPILE_PROCESSES:
            return 0
        return max(1, min(MAX_COMPILE_PROCESSES, slot.cpus - 2))

    def depth(self, slot: placement.Slot) -> int:
        """Trials in flight per worker: the setting, else one per compile process plus two (one on
        the device, one loaded and waiting), and 1 on CPU without compile processes."""
        if self._depth:
            return self._depth
        processes = self.compile_processes(slot)
        return processes + 2 if processes else (1 if slot.pool == "cpu" else 2)

    def start(self, pool: str, nodes: Sequence[dict[str, Any]], labels: dict[str, str],
              limit: int | None) -> None:
        """One worker per slot of `pool` on the (labelled) nodes; the cpu pool's slots leave the CPUs
        of the accelerator workers started before them (start the accelerator pools first)."""
        taken: dict[str, float] = {}
        for worker in self.workers:
            taken[worker.slot.node_id] = taken.get(worker.slot.node_id, 0) + worker.cpus
        for slot in placement.slots(pool, nodes, labels, limit, cpus_taken=taken):
            self._start(slot)

    def _start(self, slot: placement.Slot) -> PoolWorker:
        env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        processes = self.compile_processes(slot)
        options: dict[str, Any] = {"num_cpus": min(slot.cpus, 1 + processes) if processes else 1}
        if slot.pool == "gpu":
            options["num_gpus"] = 1
        elif slot.pool == "tpu":
            options["resources"] = {"TPU": 1}
        if self.interpret or slot.pool == "cpu":
            env["JAX_PLATFORMS"] = "cpu"
        actor = self.worker_class.options(
            **options, max_concurrency=self.depth(slot), runtime_env={"env_vars": env},
            scheduling_strategy=NodeAffinitySchedulingStrategy(slot.node_id, soft=False),
        ).remote(interpret=self.interpret or slot.pool == "cpu", emulate=self.emulate, compile_processes=processes)
        worker = PoolWorker(actor, slot, cpus=options["num_cpus"])
        self.workers.append(worker)
        return worker

    def info(self, pool: str, target: str, timeout_s: float = INFO_TIMEOUT_S) -> dict[str, Any]:
        """A worker's `info()` (host, software, device kind, capacity for `target`) for the pool;
        FarmError when none answers in timeout_s (an actor Ray cannot place waits forever)."""
        worker = next(w for w in self.workers if w.slot.pool == pool)
        try:
            return ray.get(worker.actor.info.remote(target), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise FarmError(f"the {pool} pool's worker on node {worker.slot.node_id} did not start in {timeout_s:.0f} "
                            f"s (is its node short of the CPUs, GPUs or TPUs it asks for?); expected a worker "
                            f"that answers") from None

    def has_room(self, worker: PoolWorker) -> bool:
        """Whether a live worker holds fewer than `depth` trials."""
        return worker in self.workers and len(worker.in_flight) < self.depth(worker.slot)

    def submit(self, worker: PoolWorker, flight: Flight) -> None:
        """Send a flight to a worker (it must have room)."""
        if not worker.in_flight:
            worker.progress = time.monotonic()
        p = flight.proposal
        measure = (self.measure if flight.cutoff_s is None
                   else dataclasses.replace(self.measure, cutoff_s=flight.cutoff_s))
        ref = worker.actor.run.remote(flight.task, p.config, p.trial, measure)
        worker.in_flight[ref] = flight
        self._refs[ref] = worker

    @property
    def busy(self) -> bool:
        """Whether any trial is in flight."""
        return bool(self._refs)

    def wait(self, timeout: float = 1.0) -> list[Done | Crashed]:
        """What finished within `timeout` (once one has, every one ready by then): results, and
        crashes (their workers already replaced)."""
        refs = list(self._refs)
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready and len(refs) > 1:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return [event for ref in ready if (event := self._collect(ref)) is not None]

    def _collect(self, ref: Any) -> Done | Crashed | None:
        worker = self._refs.pop(ref, None)
        if worker is None:
            return None
        flight = worker.in_flight.pop(ref)
        try:
            measured: Measured = ray.get(ref)
        except (RayActorError, WorkerCrashedError) as err:
            node_alive = self.node_alive(worker.slot.node_id)
            lost = [flight, *worker.in_flight.values()]
            self.retire(worker, replace=True)
            return Crashed(lost, node_alive, str(err)[:300])
        except RayTaskError as err:  # a bug in the worker itself: data, not a crash
            measured = Measured(Measurement(outcomes.RUN_ERROR, error=str(err)[:outcomes.ERROR_CHARS]))
        worker.progress = time.monotonic()
        return Done(worker, flight, measured)

    def restart(self, worker: PoolWorker) -> list[Flight]:
        """Replace a worker that asked for it; returns the flights it still held."""
        held = list(worker.in_flight.values())
        self.retire(worker, replace=True)
        return held

    def node_alive(self, node_id: str) -> bool:
        """Whether a node is still in the cluster."""
        return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())

    def retire(self, worker: PoolWorker, *, replace: bool) -> None:
        """Kill a worker, forget its in-flight refs, start a replacement on its node if alive."""
        if worker not in self.workers:
            return
        self.workers.remove(worker)
        for ref in worker.in_flight:
            self._refs.pop(ref, None)
        try:
            ray.kill(worker.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass
        if replace and self.node_alive(worker.slot.node_id):
            self._start(worker.slot)

    def hung(self, limit_s: float) -> list[list[Flight]]:
        """Kill and replace every worker without progress for `limit_s` seconds; their flights, the
        one on the device first."""
        now = time.monotonic()
        found = []
        for worker in list(self.workers):
            if worker.in_flight and now - worker.progress >= limit_s:
                found.append(list(worker.in_flight.values()))
                self.retire(worker, replace=True)
        return found

    def requeue(self, flight: Flight) -> None:
        """Run a flight again on the next worker of its pool with room."""
        flight.requeued += 1
        self.retry.setdefault(self.pool_of(flight), deque()).append(flight)

    def pool_of(self, flight: Flight) -> str:
        """The pool a flight's task runs on."""
        return self.task_pool[flight.task.key]

    def next_retry(self, pool: str) -> Flight | None:
        """The oldest requeued flight of a pool, if any."""
        queue = self.retry.get(pool)
        return queue.popleft() if queue else None

    def duty(self) -> dict[str, float]:
        """Share of its lifetime each live worker's device spent validating and timing."""
        duty = {}
        for worker in self.workers:
            try:
                d = ray.get(worker.actor.duty.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a worker lost at the end is not fatal
                continue
            duty[worker.name] = d["busy_s"] / d["alive_s"] if d["alive_s"] else 0.0
        return duty

    def reset_duty(self) -> None:
        """Start every live worker's duty-cycle window now."""
        refs = [worker.actor.reset_duty.remote() for worker in self.workers]
        try:
            ray.get(refs, timeout=30)
        except Exception:  # noqa: BLE001 - a worker lost here is handled by the loop
            pass

    def shutdown(self) -> None:
        """Kill every worker."""
        for worker in list(self.workers):
            self.retire(worker, replace=False)
