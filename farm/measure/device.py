"""On the device: validate a compiled config against the reference, then time it.

Every outcome is a value (`Measurement`), never an exception. `measure` compiles and measures
one config in this process (no Ray); `farm.run.actor.Worker` runs the same steps on an
accelerator.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import socket
import threading
from typing import Any

import jax
import jax.numpy as jnp

from farm.measure import outcomes, software, timing, validate
from farm.measure.compiler import Compiled, compile_config, full_text, input_key
from farm.measure.outcomes import Measurement
from farm.tasks import TuningTask


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
            inputs = module.make_inputs(task.shape, dtype, input_key(task, "check", os.getpid()))
            ref = jax.block_until_ready(module.reference(*validate.upcast(inputs)))
            entry = self._entries[task.key] = (inputs, ref)
            while len(self._entries) > 1 and (len(self._entries) > self.size or sum(
                    map(self._bytes, self._entries.values())) > self.max_bytes):
                self._entries.popitem(last=False)
            return entry


_REFERENCES = ReferenceCache()


@dataclasses.dataclass(frozen=True)
class MeasureSettings:
    """How a worker measures each config (the same for every trial of a sweep)."""

    repetitions: int = 10                 # timing sample pairs
    input_sets: int = 1                   # rotating input sets when timing (beat the cache)
    compile_timeout_s: float | None = None  # a compile that takes longer is `timeout` (the worker is replaced)


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
                        + full_text(err)[:outcomes.ERROR_CHARS])
        return result
    try:
        out = jax.block_until_ready(c.check_executable(*inputs))
        result.numerics_error = validate.relative_error(out, ref)
        del out
    except Exception as err:  # noqa: BLE001
        return result.fail(full_text(err), outcomes.RUN_ERROR)
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
        return result.fail(full_text(err), outcomes.RUN_ERROR)
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


