"""Compile one config ahead of time: build the timed kernel and its poisoned-output check.

Plain Python with no Ray: the device process (`farm.run.actor`) calls it off the device lock,
so the accelerator does not wait for the compiler.
"""
from __future__ import annotations

import dataclasses
import time
import traceback
import zlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

import kernels
from farm.measure import dispatch, outcomes
from farm.measure.outcomes import Measurement
from farm.tasks import TuningTask
from kernels.lowering import Platform


def full_text(err: BaseException) -> str:
    """The exception's type and message, as a worker reports it."""
    return "".join(traceback.format_exception_only(type(err), err)).strip()


def input_key(task: TuningTask, purpose: str, trial_seed: int) -> jax.Array:
    """A PRNG key for one task's inputs, stable across runs for the same purpose and seed."""
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
    inputs: list[tuple[Any, ...]] | None   # None: made on the device when the trial gets it
    compile_s: float
    check_executable: Any          # the poisoned-output build, compiled too (validation runs it)
    calls_per_dispatch: int = 1    # kernel calls the timed executable makes (`farm.measure.dispatch`)


def timing_inputs(module: Any, task: TuningTask, trial_seed: int, input_sets: int) -> list[tuple[Any, ...]]:
    """The input sets a trial is timed on (they rotate, so that repeated calls are not all cache hits)."""
    dtype = jnp.dtype(task.dtype)
    return [module.make_inputs(task.shape, dtype, input_key(task, f"time{i}", trial_seed))
            for i in range(max(1, input_sets))]


def abstract_inputs(module: Any, task: TuningTask) -> tuple[jax.ShapeDtypeStruct, ...]:
    """The shapes and dtypes of a task's inputs, without making them (what a compile needs)."""
    dtype = jnp.dtype(task.dtype)
    return jax.eval_shape(lambda: module.make_inputs(task.shape, dtype, input_key(task, "shape", 0)))


def build_executables(module: Any, task: TuningTask, config: dict[str, Any], interpret: bool,
                      args: Sequence[Any], calls: int = 1) -> tuple[Any, Any]:
    """The timed kernel and its poisoned-output build (validation runs it), both compiled for `args`
    (arrays or `jax.ShapeDtypeStruct`s); the timed one makes `calls` calls per dispatch, on `calls`
    sets of arguments (`farm.measure.dispatch`). Raises what building, lowering or compiling raises."""
    dtype = jnp.dtype(task.dtype)
    fn = module.build(config, task.shape, dtype, Platform(task.target, interpret=interpret))
    executable = jax.jit(dispatch.repeated(fn, calls, len(args))).lower(*(list(args) * calls)).compile(
        dispatch.compile_options(calls))
    check_fn = module.build(config, task.shape, dtype, Platform(task.target, interpret=interpret,
                                                                poison_outputs=True))
    check_executable = jax.jit(check_fn).lower(*args).compile()
    if task.target == "tpu" and interpret:
        # Interpret mode ignores Mosaic's layout rules; lowering the native kernel checks them.
        native = module.build(config, task.shape, dtype, Platform("tpu"))
        jax.jit(native).trace(*args).lower(lowering_platforms=("tpu",))
    return executable, check_executable


def compile_config(task: TuningTask, config: dict[str, Any], *, interpret: bool, trial_seed: int = 0,
                   input_sets: int = 1, with_inputs: bool = True,
                   calls: int | None = None) -> Compiled | Measurement:
    """Build and compile the timed kernel ahead of time; a failure comes back as a Measurement.
    `with_inputs=False`: compile for the input shapes only (the inputs are made later, on the device).
    `calls`: kernel calls per timed dispatch (None: `dispatch.calls_per_dispatch`'s rule)."""
    module = kernels.load(task.kernel)
    calls = calls or dispatch.calls_per_dispatch(module, task, interpret)
    started = time.perf_counter()
    try:
        inputs = timing_inputs(module, task, trial_seed, max(input_sets, calls)) if with_inputs else None
        args = inputs[0] if inputs else abstract_inputs(module, task)
        executable, check_executable = build_executables(module, task, config, interpret, args, calls)
    except Exception as err:  # noqa: BLE001 - every failure is data
        return Measurement(outcomes.COMPILE_ERROR, compile_s=time.perf_counter() - started).fail(
            full_text(err), outcomes.COMPILE_ERROR)
    return Compiled(module, task, config, interpret, trial_seed, executable, inputs,
                    time.perf_counter() - started, check_executable, calls)
