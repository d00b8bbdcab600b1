"""The Ray actor that measures configs on the accelerator (or CPU) it was placed on."""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import jax
import ray

import kernels
from farm.measure import capacity, compile_pool, finalists, outcomes, roofline, software
from farm.measure.compiler import (
    Compiled,
    abstract_inputs,
    compile_config,
    full_text,
    timing_inputs,
)
from farm.measure.device import MeasureSettings, time_into, validate_and_time
from farm.measure.finalists import FinalTiming
from farm.measure.outcomes import Measured, Measurement
from farm.run.gate import CompileGate, gil_handoff
from farm.tasks import TuningTask

logger = logging.getLogger(__name__)
FINALS_SEED = 0xF1A1   # the finalists' inputs: one seed for all, not any trial's
QUIET_WAIT_S = 30.0    # a disturbed trial's re-timing waits this long at most for compiles in flight


@ray.remote(max_restarts=0, max_task_retries=0)
class Worker:
    """A Ray actor that measures configs on the accelerator (or CPU) it was placed on.

    Created with `max_concurrency=depth`: up to `depth` trials are inside `run` at once. Each is
    compiled by one of `compile_processes` child processes on this host
    (`farm.measure.compile_pool`; none: a thread of this process), and the device (validation
    and timing) is held by one trial at a time, so the accelerator does not wait for the compiler;
    its holder shortens Python's switch interval (`gil_handoff`). A timing the compiles beside it
    held up all the same (`timing.Timing.disturbed`) is taken again with none running
    (`_retime_quietly`).
    """

    def __init__(self, interpret: bool, emulate: str | None = None, compile_processes: int = 0,
                 retime_disturbed: bool | None = None) -> None:
        _pin_tpu_chip()
        self.interpret = interpret
        # A disturbed timing is taken again with nothing compiling (`_retime_quietly`); by default
        # on accelerators (in interpret mode compiles and runs take turns already).
        self.retime_disturbed = not interpret if retime_disturbed is None else retime_disturbed
        self.emulate = emulate
        self._device = threading.Lock()
        self._gate = CompileGate()             # finalists are re-timed with no compile running
        self._compile_threads = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="compile")
        # The device first (a TPU chip opens in one process): TPU children compile deviceless for
        # its topology and never touch it; a TPU kind without a known topology compiles here.
        device = jax.devices()[0]
        tpu = device.platform == "tpu" and not interpret
        self._topology = compile_pool.tpu_topology(device.device_kind) if tpu else None
        if tpu and self._topology is None and compile_processes:
            logger.warning("no deviceless topology known for %s; compiling in the worker", device.device_kind)
            compile_processes = 0
        self._compile_pool = compile_pool.CompilePool(
            compile_processes, compile_pool.TPU_CHILD_ENV if tpu else None) if compile_processes > 0 else None
        self._in_process: set[str] = set()    # tasks whose executables cannot leave their compiler
        self._peaks: tuple[roofline.Peaks | None] | None = None   # measured once, on first use
        self._busy_s = 0.0
        self._started = time.monotonic()

    def info(self, target: str | None = None) -> dict[str, Any]:
        """Where this worker runs, with what software, and its memory capacity for `target`."""
        device = jax.devices()[0]
        return {"host": socket.gethostname(), "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "device_kind": device.device_kind, "platform": device.platform,
                "compute_capability": getattr(device, "compute_capability", None), "software": software.versions(),
                "interpret": self.interpret, "emulate": self.emulate,
                "compile_processes": self._compile_pool.processes if self._compile_pool else 0,
                "capacity": capacity.for_target(target, interpret=self.interpret, emulate=self.emulate).to_dict()
                if target else None}

    def run(self, task: TuningTask, config: dict[str, Any], trial_seed: int, settings: MeasureSettings) -> Measured:
        """Measure one config: compile (within the settings' time limit), validate and time it."""
        compiled, restart = self._compiled(task, config, trial_seed, settings)
        device_s = 0.0
        if isinstance(compiled, Measurement):
            result = compiled
        else:
            with self._timing():
                started = time.monotonic()
                try:
                    if compiled.inputs is None:    # a set per call of a dispatch (farm.measure.dispatch)
                        compiled.inputs = timing_inputs(compiled.module, task, trial_seed,
                                                        max(settings.input_sets, compiled.calls_per_dispatch))
                    result = validate_and_time(compiled, repetitions=settings.repetitions,
                                               time_budget_s=settings.sample_budget_s, cutoff_s=settings.cutoff_s)
                except Exception as err:  # noqa: BLE001 - e.g. the inputs do not fit: data, not a crash
                    result = Measurement(outcomes.RUN_ERROR).fail(full_text(err), outcomes.RUN_ERROR)
                finally:
                    compiled.inputs = None
                device_s = time.monotonic() - started
                self._busy_s += device_s
            if result.outcome == outcomes.OK and result.disturbed and self.retime_disturbed:
                device_s += self._retime_quietly(compiled, result, settings)
        result.worker = f"{socket.gethostname()}:{os.getpid()}"
        result.device_kind = jax.devices()[0].device_kind
        return Measured(result, device_s, restart)

    @contextlib.contextmanager
    def _timing(self) -> Iterator[None]:
        """Hold the device to validate and time on it, with the GIL handed back promptly
        (`gil_handoff`) to the thread that queues the timed calls."""
        with self._device, gil_handoff():
            yield

    def _retime_quietly(self, compiled: Compiled, result: Measurement, settings: MeasureSettings) -> float:
        """Time a trial whose timing was disturbed again, with no compile running on this host
        (`CompileGate.quiet`: new compiles wait, those in flight end first, given QUIET_WAIT_S at
        most), into `result`; the device seconds it took. On the H200, compiles in threads of this
        process (Mosaic GPU's) held the GIL under a timed trial and made its samples 3-70 times
        too slow (`farm.run.gate`), and a sweep ranked the best config of 52 out of its
        finalists; with nothing compiling the samples agreed."""
        with self._gate.quiet(max_wait_s=QUIET_WAIT_S), self._timing():
            started = time.monotonic()
            try:
                compiled.inputs = timing_inputs(compiled.module, compiled.task, compiled.trial_seed,
                                                max(settings.input_sets, compiled.calls_per_dispatch))
                time_into(result, compiled, repetitions=settings.repetitions, time_budget_s=settings.sample_budget_s,
                          cutoff_s=settings.cutoff_s)
            except Exception as err:  # noqa: BLE001 - e.g. the inputs do not fit: data, not a crash
                result.fail(full_text(err), outcomes.RUN_ERROR)
            finally:
                compiled.inputs = None
            result.disturbed, result.retimed_quiet = True, True
            device_s = time.monotonic() - started
            self._busy_s += device_s
        return device_s

    def _compiled(self, task: TuningTask, config: dict[str, Any], trial_seed: int,
                  settings: MeasureSettings) -> tuple[Compiled | Measurement, bool]:
        """The config compiled (by a compile process when there are any), or why not; and whether
        this worker must be replaced (a compile thread that cannot be stopped). Not while
        finalists are re-timed (`CompileGate`)."""
        with self._gate.compiling():
            return self._compile(task, config, trial_seed, settings)

    def _compile(self, task: TuningTask, config: dict[str, Any], trial_seed: int,
                 settings: MeasureSettings) -> tuple[Compiled | Measurement, bool]:
        if self._compile_pool is not None and task.key not in self._in_process:
            reply = self._compile_pool.compile(task, config, interpret=self.interpret,
                                               timeout_s=settings.compile_timeout_s, topology=self._topology)
            if isinstance(reply, Measurement):
                return reply, False
            if isinstance(reply, compile_pool.Portable):
                try:
                    executable, check = compile_pool.load(reply)
                    return Compiled(kernels.load(task.kernel), task, config, self.interpret, trial_seed, executable,
                                    None, reply.compile_s, check, reply.calls), False
                except Exception as err:  # noqa: BLE001 - e.g. a runtime this process lacks
                    logger.warning("%s: executables compiled in a child process do not load here (%s); this task "
                                   "compiles in the worker from now on", task.key, full_text(err)[:300])
            self._in_process.add(task.key)    # not portable: this task compiles here from now on
        future = self._compile_threads.submit(self._compile_here, task, config, trial_seed)
        try:
            return future.result(timeout=settings.compile_timeout_s), False
        except concurrent.futures.TimeoutError:
            # The compiler thread cannot be stopped; ask the driver for a fresh worker.
            return Measurement(outcomes.TIMEOUT, error=f"compile exceeded {settings.compile_timeout_s:.0f} s"), True

    def _compile_here(self, task: TuningTask, config: dict[str, Any], trial_seed: int) -> Compiled | Measurement:
        """Compile in this process, for the input shapes (the inputs are made when the trial gets the device)."""
        if not self.interpret:
            return compile_config(task, config, interpret=False, trial_seed=trial_seed, with_inputs=False)
        # Pallas interpret mode keeps its simulated device's state in globals, which a compile
        # resets: in interpret mode compiles and runs take turns.
        with self._device:
            return compile_config(task, config, interpret=True, trial_seed=trial_seed, with_inputs=False)

    def retime(self, task: TuningTask, configs: list[str], settings: MeasureSettings,
               budget_s: float, sustain_s: float = 0.0) -> list[FinalTiming]:
        """Re-time a task's finalists (config JSONs) side by side on inputs rotated past the caches,
        against the roofline floor (`farm.measure.finalists`; `sustain_s`: each sample from that
        many seconds of calls back to back); a config that fails to build is returned with its error."""
        with concurrent.futures.ThreadPoolExecutor(len(configs)) as threads:
            built = list(threads.map(lambda c: self._compiled(task, json.loads(c), 0, settings)[0], configs))
        failed = [FinalTiming(task.key, c, None, None, None, 0, 0, None, False, len(configs), 0, False,
                              b.error or b.outcome) for c, b in zip(configs, built) if isinstance(b, Measurement)]
        fns = {c: b.executable for c, b in zip(configs, built) if isinstance(b, Compiled)}
        if not fns:
            return failed
        calls = {b.calls_per_dispatch for b in built if isinstance(b, Compiled)}
        if len(calls) != 1:
            raise RuntimeError(f"{task.key}: finalists compiled with different calls per dispatch {calls}")
        calls_per_dispatch = calls.pop()
        module = kernels.load(task.kernel)
        per_set = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(abstract_inputs(module, task)))
        with self._gate.quiet(), self._timing():
            started = time.monotonic()
            try:
                sets = timing_inputs(module, task, FINALS_SEED,
                                     max(finalists.rotation_sets(per_set), calls_per_dispatch))
                if self._peaks is None:
                    self._peaks = (roofline.peaks_for_device(),)
                floor = roofline.floor_s(module, task.shape, task.dtype, self._peaks[0])
                timings = finalists.retime(task.key, fns, sets, floor_s=floor, budget_s=budget_s,
                                           calls=calls_per_dispatch, sustain_s=sustain_s)
            finally:
                self._busy_s += time.monotonic() - started
        return timings + failed

    def duty(self) -> dict[str, float]:
        """Seconds the device spent validating and timing, and seconds since `reset_duty` (or start)."""
        return {"busy_s": self._busy_s, "alive_s": time.monotonic() - self._started}

    def reset_duty(self) -> None:
        """Start the duty cycle's window now (the sweep does, once warm-up is over)."""
        self._busy_s, self._started = 0.0, time.monotonic()


def _pin_tpu_chip() -> None:
    """One TPU chip per process: Ray sets TPU_VISIBLE_CHIPS; libtpu also needs these bounds."""
    chips = os.environ.get("TPU_VISIBLE_CHIPS")
    if not chips or "," in chips:
        return
    os.environ.setdefault("TPU_CHIPS_PER_PROCESS_BOUNDS", "1,1,1")
    os.environ.setdefault("TPU_PROCESS_BOUNDS", "1,1,1")
    port = 8476 + int(chips)
    os.environ.setdefault("TPU_PROCESS_PORT", str(port))
    os.environ.setdefault("TPU_PROCESS_ADDRESSES", f"localhost:{port}")
    os.environ.setdefault("CLOUD_TPU_TASK_ID", "0")
