"""Several kernel calls per dispatch (farm.measure.dispatch): which tasks, and the timed path with
real JAX executables (interpret mode on this CPU; the rule batches GPU tasks only)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from farm.measure import dispatch, finalists, outcomes, timing
from farm.measure.compiler import Compiled, compile_config, timing_inputs
from farm.measure.device import validate_and_time
from farm.tasks import TuningTask
from kernels.lowering import Platform

SOFTMAX = TuningTask("softmax", (32, 128), "float32", "interpret")


@pytest.mark.parametrize("kernel, shape, target, interpret, calls", [
    ("rms_norm", (4096, 4096), "gpu-triton", False, 4),      # 67 MB: a 14 us floor on an H200
    ("rms_norm", (4096, 4096), "gpu-mosaic", False, 4),
    ("rms_norm", (16384, 16384), "gpu-triton", False, 1),    # 1 GB: 224 us, the host keeps up
    ("cross_entropy", (128, 2048), "gpu-triton", False, 16),  # 0.5 MB: as many as allowed
    ("rms_norm", (4096, 4096), "gpu-triton", True, 1),       # interpret mode on a CPU
    ("rms_norm", (4096, 4096), "tpu", False, 1),
])
def test_short_gpu_kernels_are_timed_several_calls_per_dispatch(kernel, shape, target, interpret, calls):
    task = TuningTask(kernel, shape, "bfloat16", target)
    assert dispatch.calls_per_dispatch(kernels.load(kernel), task, interpret) == calls


def test_repeated_calls_take_one_input_set_each_and_return_every_output():
    module = kernels.load("softmax")
    sets = timing_inputs(module, SOFTMAX, 0, 3)
    fn = module.build(module.default_config(SOFTMAX.shape, "interpret"), SOFTMAX.shape, jnp.float32,
                      Platform("interpret"))
    grouped = dispatch.grouped_sets(sets, 2)
    assert len(grouped) == 3 and [len(g) for g in grouped] == [2, 2, 2]
    # Rotating: dispatch i takes sets 2i and 2i + 1 (mod 3), never one set twice.
    assert grouped[1][0] is sets[2][0] and grouped[1][1] is sets[0][0]
    outs = jax.jit(dispatch.repeated(fn, 2, 1))(*grouped[1])
    np.testing.assert_allclose(outs[0], fn(*sets[2]), rtol=1e-6)
    np.testing.assert_allclose(outs[1], fn(*sets[0]), rtol=1e-6)
    with pytest.raises(ValueError, match="3 calls per dispatch need 3 different input sets, got 2"):
        dispatch.grouped_sets(sets[:2], 3)
    assert dispatch.grouped_sets(sets, 1) == [tuple(s) for s in sets]


def test_per_call_divides_a_timing_by_the_calls():
    t = timing.Timing(4e-5, 3e-5, 0.1, (3e-5, 4e-5, 5e-5), 7)
    assert dispatch.per_call(t, 4) == timing.Timing(1e-5, 7.5e-6, 0.1, (7.5e-6, 1e-5, 1.25e-5), 7)
    assert dispatch.per_call(t, 1) is t


def test_a_config_compiled_for_two_calls_per_dispatch_is_validated_and_timed_per_call():
    compiled = compile_config(SOFTMAX, kernels.load("softmax").default_config(SOFTMAX.shape, "interpret"),
                              interpret=True, input_sets=1, calls=2)
    assert isinstance(compiled, Compiled) and compiled.calls_per_dispatch == 2
    assert len(compiled.inputs) == 2       # a set for each call of a dispatch
    outs = compiled.executable(*dispatch.grouped_sets(compiled.inputs, 2)[0])
    assert len(outs) == 2 and outs[0].shape == SOFTMAX.shape
    result = validate_and_time(compiled, repetitions=3)
    assert result.outcome == outcomes.OK and result.numerics_error < 1e-5 and result.n_timed == 3
    assert result.median_s > 0


def test_finalists_of_two_calls_per_dispatch_are_reported_per_call():
    module = kernels.load("softmax")
    built = [compile_config(SOFTMAX, {**module.default_config(SOFTMAX.shape, "interpret"), "block_rows": rows},
                            interpret=True, with_inputs=False, calls=2) for rows in (8, 16)]
    fns = {f"rows{i}": b.executable for i, b in enumerate(built)}
    sets = timing_inputs(module, SOFTMAX, 0, 2)
    timings = finalists.retime(SOFTMAX.key, fns, sets, floor_s=1e-9, min_samples=3, max_samples=3,
                               calls=2)
    assert {t.config for t in timings} == set(fns)
    for t in timings:
        assert t.median_s is not None and t.median_s > 0 and t.n_timed == 3
        assert t.floor_s == 1e-9 and t.input_sets == 2 and not t.below_floor
