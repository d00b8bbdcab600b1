"""The Ray actor that measures configs on the accelerator (or CPU) it was placed on."""
from __future__ import annotations

import concurrent.futures
import os
import socket
import threading
import time
from typing import Any

import jax
import ray

from farm.measure import capacity, outcomes, software
from farm.measure.compiler import compile_config
from farm.measure.device import MeasureSettings, validate_and_time
from farm.measure.outcomes import Measured, Measurement
from farm.tasks import TuningTask


@ray.remote(max_restarts=0, max_task_retries=0)
class Worker:
    """A Ray actor that measures configs on the accelerator (or CPU) it was placed on.

    Created with `max_concurrency=depth`: up to `depth` trials are inside `run` at once; each
    compiles on its own thread, while the device (validation and timing) is held by one trial at
    a time, so the accelerator rarely waits for the compiler.
    """

    def __init__(self, interpret: bool, emulate: str | None = None) -> None:
        _pin_tpu_chip()
        self.interpret = interpret
        self.emulate = emulate
        self._device = threading.Lock()
        self._compile_pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="compile")
        self._busy_s = 0.0
        self._started = time.monotonic()

    def info(self, target: str | None = None) -> dict[str, Any]:
        """Where this worker runs, with what software, and its memory capacity for `target`."""
        device = jax.devices()[0]
        return {"host": socket.gethostname(), "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "device_kind": device.device_kind, "platform": device.platform, "software": software.versions(),
                "interpret": self.interpret, "emulate": self.emulate,
                "capacity": capacity.for_target(target, interpret=self.interpret, emulate=self.emulate).to_dict()
                if target else None}

    def run(self, task: TuningTask, config: dict[str, Any], trial_seed: int, settings: MeasureSettings) -> Measured:
        """Measure one config: compile (within the settings' time limit), validate and time it."""
        future = self._compile_pool.submit(self._compile, task, config, trial_seed, settings.input_sets)
        restart = False
        try:
            compiled = future.result(timeout=settings.compile_timeout_s)
        except concurrent.futures.TimeoutError:
            # The compiler thread cannot be stopped; ask the driver for a fresh worker.
            compiled = Measurement(outcomes.TIMEOUT, error=f"compile exceeded {settings.compile_timeout_s:.0f} s")
            restart = True
        device_s = 0.0
        if isinstance(compiled, Measurement):
            result = compiled
        else:
            with self._device:
                started = time.monotonic()
                result = validate_and_time(compiled, repetitions=settings.repetitions)
                device_s = time.monotonic() - started
                self._busy_s += device_s
        result.worker = f"{socket.gethostname()}:{os.getpid()}"
        result.device_kind = jax.devices()[0].device_kind
        return Measured(result, device_s, restart)

    def _compile(self, task: TuningTask, config: dict[str, Any], trial_seed: int, input_sets: int) -> Any:
        if not self.interpret:
            return compile_config(task, config, interpret=False, trial_seed=trial_seed, input_sets=input_sets)
        # Pallas interpret mode keeps its simulated device's state in globals, which a compile
        # resets: in interpret mode compiles and runs take turns.
        with self._device:
            return compile_config(task, config, interpret=True, trial_seed=trial_seed, input_sets=input_sets)

    def duty(self) -> dict[str, float]:
        """Seconds the device spent validating and timing, and seconds alive."""
        return {"busy_s": self._busy_s, "alive_s": time.monotonic() - self._started}


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
