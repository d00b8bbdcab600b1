"""Measure one config: build, compile ahead of time, validate, time. Every outcome is a value.

`measure` is plain Python (usable without Ray); `Worker` is the Ray actor that runs it on one
accelerator (or one CPU in interpret mode).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import socket
import threading
import time
import traceback
import zlib
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ray  # noqa: E402

import kernels  # noqa: E402
from farm import capacity, outcomes, software, timing, validate  # noqa: E402
from farm.outcomes import Measurement  # noqa: E402
from farm.plan import TuningTask  # noqa: E402
from kernels.lowering import Platform  # noqa: E402


def _full_text(err: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(err), err)).strip()


def _seed(task: TuningTask, purpose: str, trial_seed: int) -> jax.Array:
    return jax.random.key(zlib.crc32(f"{task.key}/{purpose}/{trial_seed}".encode()))


@dataclasses.dataclass
class Compiled:
    """A config built and compiled, waiting for the device."""

    module: Any
    task: TuningTask
    config: dict[str, Any]
    interpret: bool
    trial_seed: int
    executable: Any
    inputs: list[tuple[Any, ...]]
    compile_s: float
    check_executable: Any          # the poisoned-output build, compiled too (validation runs it)


def compile_config(task: TuningTask, config: dict[str, Any], *, interpret: bool, trial_seed: int = 0,
                   input_sets: int = 1) -> Compiled | Measurement:
    """Build and compile the timed kernel ahead of time; a failure comes back as a Measurement."""
    module = kernels.load(task.kernel)
    dtype = jnp.dtype(task.dtype)
    started = time.perf_counter()
    try:
        fn = module.build(config, task.shape, dtype, Platform(task.target, interpret=interpret))
        inputs = [module.make_inputs(task.shape, dtype, _seed(task, f"time{i}", trial_seed))
                  for i in range(max(1, input_sets))]
        executable = jax.jit(fn).lower(*inputs[0]).compile()
        # Compiled here, off the device lock: validation then only runs it.
        check_fn = module.build(config, task.shape, dtype, Platform(task.target, interpret=interpret,
                                                                    poison_outputs=True))
        check_executable = jax.jit(check_fn).lower(*inputs[0]).compile()
        if task.target == "tpu" and interpret:
            # Interpret mode ignores Mosaic's layout rules; lowering the native kernel checks them.
            native = module.build(config, task.shape, dtype, Platform("tpu"))
            jax.jit(native).trace(*inputs[0]).lower(lowering_platforms=("tpu",))
    except Exception as err:  # noqa: BLE001 - every failure is data
        return Measurement(outcomes.COMPILE_ERROR, compile_s=time.perf_counter() - started).fail(
            _full_text(err), outcomes.COMPILE_ERROR)
    return Compiled(module, task, config, interpret, trial_seed, executable, inputs,
                    time.perf_counter() - started, check_executable)


class ReferenceCache:
    """Validation inputs and the reference's outputs for the tasks a worker has seen lately.

    Computing the float32 reference can cost more than the kernel (attention at S = 8k), so a
    worker draws its validation inputs once per task (from its own key, independent of the
    timing inputs) and checks every config of that task against the same reference. A worker
    serving several tasks in turn keeps each one's entry (up to `size` entries and `max_bytes`
    of device memory, least recently used out first), so that it is not recomputed per trial.
    """

    def __init__(self, size: int = 8, max_bytes: int = 16 << 30) -> None:
        self.size, self.max_bytes = size, max_bytes
        self._entries: collections.OrderedDict[str, tuple[Any, Any]] = collections.OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _bytes(entry: tuple[Any, Any]) -> int:
        return sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree.leaves(entry))

    def get(self, module: Any, task: TuningTask) -> tuple[Any, Any]:
        """(inputs, reference outputs) for `task`; raises if the reference itself fails."""
        with self._lock:
            if task.key in self._entries:
                self._entries.move_to_end(task.key)
                return self._entries[task.key]
            dtype = jnp.dtype(task.dtype)
            inputs = module.make_inputs(task.shape, dtype, _seed(task, "check", os.getpid()))
            ref = jax.block_until_ready(module.reference(*validate.upcast(inputs)))
            entry = self._entries[task.key] = (inputs, ref)
            while len(self._entries) > 1 and (len(self._entries) > self.size or sum(
                    map(self._bytes, self._entries.values())) > self.max_bytes):
                self._entries.popitem(last=False)
            return entry


_REFERENCES = ReferenceCache()


def validate_and_time(c: Compiled, *, repetitions: int = 10, warmup: int = 2,
                      time_budget_s: float | None = None, references: ReferenceCache | None = None) -> Measurement:
    """On the device: validate a poisoned-output build against the reference, then time."""
    task = c.task
    result = Measurement(outcomes.OK, compile_s=c.compile_s)
    try:
        inputs, ref = (references or _REFERENCES).get(c.module, task)
    except Exception as err:  # noqa: BLE001 - the reference failing is no verdict on the config
        result.outcome = outcomes.RUN_ERROR
        result.error = ("the reference could not be computed (not this config's fault): "
                        + _full_text(err)[:outcomes.ERROR_CHARS])
        return result
    try:
        out = jax.block_until_ready(c.check_executable(*inputs))
        result.numerics_error = validate.relative_error(out, ref)
        del out
    except Exception as err:  # noqa: BLE001
        return result.fail(_full_text(err), outcomes.RUN_ERROR)
    bound = validate.tolerance(task.dtype, c.module)
    if not result.numerics_error <= bound:
        result.outcome = outcomes.WRONG_RESULT
        result.error = (f"relative error {result.numerics_error:.3g} exceeds the {task.dtype} "
                        f"tolerance {bound:.3g} (NaN/inf or unwritten outputs count as inf)")
        return result
    try:
        t = timing.time_calls(c.executable, c.inputs, warmup=warmup, repetitions=repetitions,
                              budget_s=time_budget_s)
    except Exception as err:  # noqa: BLE001
        return result.fail(_full_text(err), outcomes.RUN_ERROR)
    result.median_s, result.min_s, result.spread = t.median_s, t.min_s, t.spread
    result.n_timed, result.calls_per_sample = len(t.samples), t.calls_per_sample
    return result


def measure(task: TuningTask, config: dict[str, Any], *, interpret: bool, trial_seed: int = 0,
            repetitions: int = 10, warmup: int = 2, input_sets: int = 1,
            time_budget_s: float | None = None) -> Measurement:
    """Build, compile, validate and time `config` for `task`; never raises for kernel failures."""
    compiled = compile_config(task, config, interpret=interpret, trial_seed=trial_seed, input_sets=input_sets)
    result = compiled if isinstance(compiled, Measurement) else validate_and_time(
        compiled, repetitions=repetitions, warmup=warmup, time_budget_s=time_budget_s)
    result.worker = f"{socket.gethostname()}:{os.getpid()}"
    result.device_kind = software.device_kind()
    return result


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

    def run(self, task: TuningTask, config: dict[str, Any], trial_seed: int,
            settings: dict[str, Any]) -> dict[str, Any]:
        """Measure one config; returns a `Measurement` as a dict (plus `device_s`, `restart`)."""
        settings = dict(settings)
        compile_timeout = settings.pop("compile_timeout_s", None)
        input_sets = settings.pop("input_sets", 1)
        future = self._compile_pool.submit(self._compile, task, config, trial_seed, input_sets)
        restart = False
        try:
            compiled = future.result(timeout=compile_timeout)
        except concurrent.futures.TimeoutError:
            # The compiler thread cannot be stopped; ask the driver for a fresh worker.
            compiled = Measurement(outcomes.TIMEOUT, error=f"compile exceeded {compile_timeout:.0f} s")
            restart = True
        device_s = 0.0
        if isinstance(compiled, Measurement):
            result = compiled
        else:
            with self._device:
                started = time.monotonic()
                result = validate_and_time(compiled, **settings)
                device_s = time.monotonic() - started
                self._busy_s += device_s
        result.worker = f"{socket.gethostname()}:{os.getpid()}"
        result.device_kind = jax.devices()[0].device_kind
        return {**result.to_dict(), "device_s": device_s, "restart": restart}

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
