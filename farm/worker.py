"""Measure one config: build, compile ahead of time, validate, time. Every outcome is a value.

`measure` is plain Python (usable without Ray); `Worker` is the Ray actor that runs it on one
accelerator (or one CPU in interpret mode).
"""
from __future__ import annotations

import os
import socket
import time
import traceback
import zlib
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ray  # noqa: E402

import kernels  # noqa: E402
from farm import outcomes, software, timing, validate  # noqa: E402
from farm.outcomes import Measurement  # noqa: E402
from farm.plan import TuningTask  # noqa: E402
from kernels.lowering import Platform  # noqa: E402

# Keep error texts readable in tables; the head of a compiler error says what went wrong.
ERROR_CHARS = 4000


def _error_text(err: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    return text[:ERROR_CHARS]


def _seed(task: TuningTask, purpose: str, trial_seed: int) -> jax.Array:
    return jax.random.key(zlib.crc32(f"{task.key}/{purpose}/{trial_seed}".encode()))


def measure(task: TuningTask, config: dict[str, Any], *, interpret: bool, trial_seed: int = 0,
            repetitions: int = 10, warmup: int = 2, input_sets: int = 1,
            time_budget_s: float | None = None) -> Measurement:
    """Build, compile, validate and time `config` for `task`; never raises for kernel failures."""
    module = kernels.load(task.kernel)
    dtype = jnp.dtype(task.dtype)
    worker = f"{socket.gethostname()}:{os.getpid()}"
    kind = software.device_kind()
    result = Measurement(outcomes.OK, worker=worker, device_kind=kind)

    # Compile the timed kernel ahead of time.
    started = time.perf_counter()
    try:
        fn = module.build(config, task.shape, dtype, Platform(task.target, interpret=interpret))
        timed_inputs = [module.make_inputs(task.shape, dtype, _seed(task, f"time{i}", trial_seed))
                        for i in range(max(1, input_sets))]
        compiled = jax.jit(fn).lower(*timed_inputs[0]).compile()
        if task.target == "tpu" and interpret:
            # Interpret mode ignores Mosaic's layout rules; lowering the native kernel checks them.
            native = module.build(config, task.shape, dtype, Platform("tpu"))
            jax.jit(native).trace(*timed_inputs[0]).lower(lowering_platforms=("tpu",))
    except Exception as err:  # noqa: BLE001 - every failure is data
        result.outcome = outcomes.classify_error(str(err), outcomes.COMPILE_ERROR)
        result.error = _error_text(err)
        return result
    result.compile_s = time.perf_counter() - started

    # Validate a poisoned-output build on fresh inputs against the reference.
    try:
        check_fn = module.build(config, task.shape, dtype,
                                Platform(task.target, interpret=interpret, poison_outputs=True))
        inputs = module.make_inputs(task.shape, dtype, _seed(task, "check", trial_seed))
        out = jax.block_until_ready(jax.jit(check_fn)(*inputs))
        ref = module.reference(*validate.upcast(inputs))
        result.numerics_error = validate.relative_error(out, ref)
    except Exception as err:  # noqa: BLE001
        result.outcome = outcomes.classify_error(str(err), outcomes.RUN_ERROR)
        result.error = _error_text(err)
        return result
    bound = validate.tolerance(task.dtype, module)
    if not result.numerics_error <= bound:
        result.outcome = outcomes.WRONG_RESULT
        result.error = (f"relative error {result.numerics_error:.3g} exceeds the {task.dtype} "
                        f"tolerance {bound:.3g} (NaN/inf or unwritten outputs count as inf)")
        return result

    try:
        t = timing.time_calls(compiled, timed_inputs, warmup=warmup, repetitions=repetitions,
                              budget_s=time_budget_s)
    except Exception as err:  # noqa: BLE001
        result.outcome = outcomes.classify_error(str(err), outcomes.RUN_ERROR)
        result.error = _error_text(err)
        return result
    result.median_s, result.min_s, result.spread = t.median_s, t.min_s, t.spread
    result.n_timed, result.calls_per_sample = len(t.samples), t.calls_per_sample
    return result


@ray.remote(max_restarts=0, max_task_retries=0)
class Worker:
    """A Ray actor that measures configs on the accelerator (or CPU) it was placed on."""

    def __init__(self, interpret: bool) -> None:
        self.interpret = interpret

    def info(self) -> dict[str, Any]:
        """Where this worker runs and with what software."""
        return {"host": socket.gethostname(), "pid": os.getpid(), "device_kind": software.device_kind(),
                "platform": jax.devices()[0].platform, "software": software.versions(),
                "interpret": self.interpret}

    def run(self, task: TuningTask, config: dict[str, Any], trial_seed: int,
            settings: dict[str, Any]) -> dict[str, Any]:
        """Measure one config; returns a `Measurement` as a dict."""
        return measure(task, config, interpret=self.interpret, trial_seed=trial_seed, **settings).to_dict()
