"""The device clock (farm.measure.device_clock): reading kernels out of a trace, cutting them into
dispatches, and the wall clock where a device has none (this CPU). Its figures on a GPU are
checked against torch.profiler's CUPTI trace by bench/probes/device_clock_probe.py (BENCHMARKS.md)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import kernels
from farm.measure import device_clock, dispatch, finalists, outcomes, timing
from farm.measure.compiler import compile_config, timing_inputs
from farm.measure.device import validate_and_time
from farm.tasks import TuningTask

# An XSpace as XLA's CUPTI collector writes it on the H200 (bench/results/h200/device_clock/
# xspace_structure.txt): a GPU plane with one line per stream, events named by kernel, each
# with its start (line timestamp + offset) and duration; plus what is not kernel time.
XSPACE = '''
planes {
  id: 1 name: "/device:GPU:0"
  lines {
    id: 14 name: "Stream #14(Compute)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 1600000 stats { metadata_id: 1 int64_value: 35 } }
    events { metadata_id: 2 offset_ps: 2000000 duration_ps: 1400000 }
    events { metadata_id: 3 offset_ps: 4000000 duration_ps: 900000 }
    events { metadata_id: 1 offset_ps: 6000000 duration_ps: 1700000 stats { metadata_id: 2 str_value: "grid:3,1,1" } }
    events { metadata_id: 2 offset_ps: 8000000 duration_ps: 1300000 }
  }
  lines {
    id: 15 name: "Stream #15(Compute)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 6000000 duration_ps: 1700000 }
  }
  lines {
    id: 99 name: "XLA Ops" timestamp_ns: 1000
    events { metadata_id: 4 offset_ps: 0 duration_ps: 9000000 }
  }
  event_metadata { key: 1 value { id: 1 name: "softmax_spans" } }
  event_metadata { key: 2 value { id: 2 name: "softmax" } }
  event_metadata { key: 3 value { id: 3 name: "MemcpyD2D" } }
  event_metadata { key: 4 value { id: 4 name: "fusion.1" } }
  stat_metadata { key: 1 value { id: 1 name: "correlation_id" } }
  stat_metadata { key: 2 value { id: 2 name: "kernel_details" } }
}
planes {
  id: 2 name: "/host:CPU"
  lines {
    id: 1 name: "Host Threads/514" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 20000000 }
  }
  event_metadata { key: 1 value { id: 1 name: "cuLaunchKernel" } }
}
'''


def test_kernel_spans_are_the_gpu_streams_kernels_each_once():
    spans = device_clock.kernel_spans(jax.profiler.ProfileData.from_text_proto(XSPACE))
    # not the copy, not the derived "XLA Ops" line, not the host; the event shown on two streams once
    assert [s.name for s in spans] == ["softmax_spans", "softmax", "softmax_spans", "softmax"]
    assert [s.start_ns for s in spans] == [1000, 3000, 7000, 9000]
    assert spans[0].seconds == pytest.approx(1.6e-6) and spans[2].seconds == pytest.approx(1.7e-6)


def test_dispatches_are_equal_groups_of_kernels_in_start_order():
    spans = device_clock.kernel_spans(jax.profiler.ProfileData.from_text_proto(XSPACE))
    assert device_clock.per_dispatch_seconds(spans, 2) == pytest.approx([3.0e-6, 3.0e-6])
    assert device_clock.per_dispatch_seconds(spans, 1) == pytest.approx([6.0e-6])
    # kernels that do not divide into the dispatches: something else ran, or some are missing
    assert device_clock.per_dispatch_seconds(spans, 3) is None
    assert device_clock.per_dispatch_seconds([], 2) is None


def test_a_cpu_has_no_device_clock_and_a_trace_of_it_shows_no_kernels():
    assert not device_clock.available()
    f = jax.jit(lambda x: x * 2.0)
    x = jnp.ones(16)
    with device_clock.profiles() as found:   # the trace is written, and read back
        device_clock.run_dispatches(f, [(x,)], 2)
    assert len(found) == 1 and "/host:CPU" in [plane.name for plane in found[0].planes]
    with device_clock.traced() as spans:
        device_clock.run_dispatches(f, [(x,)], 3)
    assert spans == []
    assert device_clock.dispatch_seconds(f, [(x,)], 3) is None
    assert device_clock.time_on_device(f, [(x,)], samples=4) is None


def test_without_a_device_clock_short_kernels_are_timed_on_the_wall_clock():
    task = TuningTask("softmax", (32, 128), "float32", "interpret")
    module = kernels.load("softmax")
    assert dispatch.device_clocked(2) and not dispatch.device_clocked(1)
    compiled = compile_config(task, module.default_config(task.shape, "interpret"), interpret=True,
                              input_sets=1, calls=2)
    result = validate_and_time(compiled, repetitions=3)
    assert result.outcome == outcomes.OK and result.clock == timing.WALL and result.median_s > 0
    sets = timing_inputs(module, task, 0, 2)
    timings = finalists.retime(task.key, {"a": compiled.executable}, sets, floor_s=None, min_samples=3,
                               max_samples=3, calls=2)
    assert [t.clock for t in timings] == [timing.WALL] and timings[0].median_s > 0


def test_a_batched_dispatch_is_compiled_without_command_buffers():
    """Its kernels then run in order on one stream, each alone on the device (with a CUDA graph,
    independent calls overlapped on the H200: bench/probes/serialize_probe.py); the options
    compile on any backend."""
    assert dispatch.compile_options(1) is None
    assert dispatch.compile_options(16) == {"xla_gpu_enable_command_buffer": ""}
    task = TuningTask("softmax", (32, 128), "float32", "interpret")
    compiled = compile_config(task, kernels.load("softmax").default_config(task.shape, "interpret"),
                              interpret=True, input_sets=2, calls=2)
    outs = compiled.executable(*dispatch.grouped_sets(compiled.inputs, 2)[0])
    assert len(outs) == 2 and outs[0].shape == task.shape
