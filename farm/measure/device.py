"""On the device: validate a compiled config against the reference, then time it.

Every outcome is a value (`Measurement`), never an exception. `measure` compiles and measures
one config in this process (no Ray); `farm.run.actor.Worker` runs the same steps on an
accelerator.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp

from farm.measure import device_clock, dispatch, outcomes, software, timing, validate
from farm.measure.compiler import Compiled, compile_config, full_text, input_key
from farm.measure.outcomes import Measurement
from farm.tasks import TuningTask

REFERENCE_MEMORY_SHARE = 0.4   # of an accelerator's memory, for the cached references of its tasks
REFERENCE_BYTES_ON_HOST = 16 << 30   # where the device reports no memory limit (CPU)


@dataclasses.dataclass(frozen=True)
class _Reference:
    entry: tuple[Any, Any]   # (inputs, reference outputs)
    nbytes: int
    cost_s: float            # seconds it took to make: what evicting it costs the next trial


class ReferenceCache:
    """Validation inputs and the reference's outputs of the tasks a worker serves.

    Computing the float32 reference can cost more than the kernel (attention at S = 8k: about a
    second), so a worker draws its validation inputs once per task (from its own key,
    independent of the timing inputs) and checks every config of that task against the same
    reference. A sweep's worker serves its tasks round robin, and a least-recently-used cache
    smaller than that set misses every time; so over `size` entries or `max_bytes` (default:
    REFERENCE_MEMORY_SHARE of the device's memory) this evicts the entry cheapest to remake per
    byte, never the one just made.
    """

    def __init__(self, size: int = 64, max_bytes: int | None = None) -> None:
        self.size, self.max_bytes = size, max_bytes
        self._entries: dict[str, _Reference] = {}
        self._lock = threading.Lock()

    @staticmethod
    def victim(entries: dict[str, _Reference], newest: str) -> str:
        """The entry to evict: the cheapest to remake per byte, other than `newest`."""
        return min((k for k in entries if k != newest), key=lambda k: entries[k].cost_s / max(1, entries[k].nbytes))

    def _budget(self) -> int:
        if self.max_bytes is None:
            stats = jax.devices()[0].memory_stats() or {}
            limit = stats.get("bytes_limit")
            self.max_bytes = int(REFERENCE_MEMORY_SHARE * limit) if limit else REFERENCE_BYTES_ON_HOST
        return self.max_bytes

    def get(self, module: Any, task: TuningTask) -> tuple[Any, Any]:
        """(inputs, reference outputs) for `task`; raises if the reference itself fails."""
        with self._lock:
            if task.key in self._entries:
                return self._entries[task.key].entry
            started = time.perf_counter()
            dtype = jnp.dtype(task.dtype)
            inputs = module.make_inputs(task.shape, dtype, input_key(task, "check", os.getpid()))
            if not isinstance(inputs, tuple):
                raise TypeError(f"{module.__name__}.make_inputs returned {type(inputs).__name__}; expected a tuple "
                                f"of arrays (the kernel's inputs, in order)")
            ref = jax.block_until_ready(module.reference(*validate.upcast(inputs)))
            entry = (inputs, ref)
            nbytes = sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree.leaves(entry))
            self._entries[task.key] = _Reference(entry, nbytes, time.perf_counter() - started)
            budget = self._budget()
            while len(self._entries) > 1 and (len(self._entries) > self.size or sum(
                    e.nbytes for e in self._entries.values()) > budget):
                del self._entries[self.victim(self._entries, task.key)]
            return entry


_REFERENCES = ReferenceCache()


@dataclasses.dataclass(frozen=True)
class MeasureSettings:
    """How a worker measures each config (the same for every trial of a sweep)."""

    repetitions: int = 10                 # timing sample pairs
    input_sets: int = 1                   # rotating input sets when timing (beat the cache)
    compile_timeout_s: float | None = None  # a compile that takes longer is `timeout` (the worker is replaced)
    sample_budget_s: float | None = None  # seconds of timing samples per config: fewer repetitions (3 at least)
    #                                       for a slow kernel; None: always `repetitions`
    cutoff_s: float | None = None       # per trial: a time that cannot win; a config whose first samples are
    #                                     all slower is cut short (`timing.time_calls`)


def validate_and_time(c: Compiled, *, repetitions: int = 10, warmup: int = 2,
                      time_budget_s: float | None = None, references: ReferenceCache | None = None,
                      cutoff_s: float | None = None) -> Measurement:
    """On the device: validate a poisoned-output build against the reference, then time
    (`time_budget_s` and `cutoff_s` as in `timing.time_calls`)."""
    result = validate_compiled(c, references)
    if result.outcome != outcomes.OK:
        return result
    return time_into(result, c, repetitions=repetitions, warmup=warmup, time_budget_s=time_budget_s,
                     cutoff_s=cutoff_s)


def validate_compiled(c: Compiled, references: ReferenceCache | None = None) -> Measurement:
    """On the device: run the poisoned-output build on the task's validation inputs and judge it
    against the reference: `ok` (not yet timed), `wrong_result` or `run_error`."""
    task = c.task
    result = Measurement(outcomes.OK, compile_s=c.compile_s)
    try:
        inputs, ref = (references or _REFERENCES).get(c.module, task)
    except Exception as err:  # noqa: BLE001 - the reference failing is no verdict on the config
        result.outcome = outcomes.RUN_ERROR
        result.error = outcomes.REFERENCE_FAILED + full_text(err)[:outcomes.ERROR_CHARS]
        return result
    try:
        out = jax.block_until_ready(c.check_executable(*inputs))
        shaped = validate.mismatch(out, jax.eval_shape(c.module.reference, *inputs), task.dtype)
        result.numerics_error = validate.relative_error(out, ref) if shaped is None else float("inf")
        del out
    except Exception as err:  # noqa: BLE001
        return result.fail(full_text(err), outcomes.RUN_ERROR)
    if shaped is not None:
        result.outcome, result.error = outcomes.WRONG_RESULT, shaped
        return result
    bound = validate.tolerance(task.dtype, c.module)
    if not result.numerics_error <= bound:
        result.outcome = outcomes.WRONG_RESULT
        result.error = (f"relative error {result.numerics_error:.3g} exceeds the {task.dtype} "
                        f"tolerance {bound:.3g} (NaN/inf or unwritten outputs count as inf)")
    return result


def time_into(result: Measurement, c: Compiled, *, repetitions: int = 10, warmup: int = 2,
              time_budget_s: float | None = None, cutoff_s: float | None = None) -> Measurement:
    """Time `c` on its inputs into `result`'s timing fields, per kernel call: on the device clock
    where `dispatch.device_clocked` says so and a trace shows the kernels
    (`device_clock.time_on_device`, 2 x `repetitions` dispatches), else on the wall clock
    (`timing.time_calls`). A failure to run makes `result` a run error."""
    calls = c.calls_per_dispatch
    sets = dispatch.grouped_sets(c.inputs, calls)
    try:
        t = None
        if dispatch.device_clocked(calls) and device_clock.available():
            t = device_clock.time_on_device(c.executable, sets, samples=2 * repetitions, warmup=warmup)
        if t is None:
            t = timing.time_calls(c.executable, sets, warmup=warmup, repetitions=repetitions,
                                  budget_s=time_budget_s, cutoff_s=None if cutoff_s is None else cutoff_s * calls)
        t = dispatch.per_call(t, calls)
    except Exception as err:  # noqa: BLE001
        return result.fail(full_text(err), outcomes.RUN_ERROR)
    result.median_s, result.min_s, result.spread = t.median_s, t.min_s, t.spread
    result.n_timed, result.calls_per_sample, result.cut_short = len(t.samples), t.calls_per_sample, t.cut_short
    result.disturbed, result.clock = t.disturbed, t.clock
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


