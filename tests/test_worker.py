"""The worker's measurement path with real JAX Pallas kernels in interpret mode."""
from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import pytest

from farm.measure import outcomes, timing, validate
from farm.measure.device import measure
from farm.tasks import TuningTask
from kernels import softmax
from kernels.lowering import Platform

SOFTMAX = TuningTask("softmax", (32, 128), "float32", "interpret")
WRONG = TuningTask("tests.fixtures.wrong_softmax", (32, 128), "float32", "interpret")


def test_ok_measurement_has_timing_and_small_error():
    m = measure(SOFTMAX, {"block_rows": 8}, interpret=True, repetitions=3)
    assert m.outcome == outcomes.OK, m.error
    assert m.median_s > 0 and m.min_s <= m.median_s and m.n_timed == 3
    assert m.numerics_error < 1e-5 and m.compile_s > 0


def test_fast_wrong_kernel_is_wrong_result():
    m = measure(WRONG, {"block_rows": 8, "variant": "copy"}, interpret=True, repetitions=3)
    assert m.outcome == outcomes.WRONG_RESULT
    assert m.median_s is None and "exceeds the float32 tolerance" in m.error


def test_outputs_of_another_dtype_than_the_references_are_wrong_result():
    m = measure(WRONG, {"block_rows": 8, "variant": "half"}, interpret=True, repetitions=3)
    assert m.outcome == outcomes.WRONG_RESULT and m.numerics_error == math.inf
    assert m.error == "output 0 is float16[32, 128], expected float32[32, 128] (the reference's on the same inputs)"


def test_unwritten_rows_are_caught_by_poisoning():
    m = measure(WRONG, {"block_rows": 8, "variant": "partial"}, interpret=True, repetitions=3)
    assert m.outcome == outcomes.WRONG_RESULT and m.numerics_error == math.inf


def test_poisoned_output_starts_as_nan():
    partial = __import__("tests.fixtures.wrong_softmax", fromlist=["build"])
    fn = partial.build({"block_rows": 8, "variant": "partial"}, (32, 128), jnp.float32,
                       Platform("interpret", poison_outputs=True))
    out = fn(*softmax.make_inputs((32, 128), jnp.float32, __import__("jax").random.key(1)))
    assert bool(jnp.all(jnp.isnan(out[16:]))) and not bool(jnp.any(jnp.isnan(out[:16])))


def test_build_failure_is_compile_error():
    task = TuningTask("matmul", (64, 64, 64), "float32", "interpret")
    m = measure(task, {"block_m": 64, "block_n": 64, "block_k": 64, "epi_n": 48}, interpret=True)
    assert m.outcome == outcomes.COMPILE_ERROR and "must divide" in m.error


def test_tpu_interpret_checks_mosaic_layout_rules():
    task = TuningTask("softmax", (32, 128), "float32", "tpu")
    ok = measure(task, {"block_rows": 8}, interpret=True, repetitions=2)
    assert ok.outcome == outcomes.OK, ok.error
    bad = measure(task, {"block_rows": 4}, interpret=True, repetitions=2)
    assert bad.outcome == outcomes.COMPILE_ERROR and "divisible by 8 and 128" in bad.error


# Real messages (requested bytes, available bytes): Triton through XLA and XLA's allocator as seen on
# the H200; Mosaic GPU's from jax/experimental/mosaic/gpu/core.py; XLA:TPU's as TPU users report it.
OOM_MESSAGES = [
    ("JaxRuntimeError: RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 262144, available: 232448",
     262144, 232448),
    ("ValueError: Mosaic GPU kernel exceeds available shared memory: smem_bytes=300000 > max_smem_bytes=232448",
     300000, 232448),
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem. "
     "Used 98.04M of 64.00M vmem. Exceeded vmem capacity by 34.04M.", int(98.04 * 2**20), 64 * 2**20),
    ("EXECUTION FAILED: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 64.02GiB with allocator "
     "GPU_0_bfc on device 0. [tf-allocator-allocation-error='']", int(64.02 * 2**30), None),
    ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 171798691840 bytes.", 171798691840, None),
    ("CUDA_ERROR_OUT_OF_MEMORY: out of memory", None, None),
    # libtpu 0.0.52 compiling attention at 14336 heads for v5e, without a chip (bench/results/cpu/space_fuzz)
    ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO "
     "temporaries (20.56G) exceeds available HBM (15.75G). HLO module: jit_padded.", int(20.56 * 2**30),
     int(15.75 * 2**30)),
    ("ValueError: Ran out of shared memory.", None, None),
]


@pytest.mark.parametrize("message,requested,available", OOM_MESSAGES)
def test_oom_messages_are_classified_with_their_byte_counts(message, requested, available):
    assert outcomes.classify_error(message, outcomes.COMPILE_ERROR) == outcomes.OOM
    failed = outcomes.Measurement(outcomes.COMPILE_ERROR).fail("x" * 5000 + message, outcomes.COMPILE_ERROR)
    assert failed.outcome == outcomes.OOM
    assert (failed.requested_bytes, failed.available_bytes) == (requested, available)
    assert len(failed.error) == outcomes.ERROR_CHARS   # stored text is cut; the numbers come from all of it


def test_a_failure_that_is_not_oom_carries_no_byte_counts():
    failed = outcomes.Measurement(outcomes.OK).fail("requested 5 things, available: 3", outcomes.COMPILE_ERROR)
    assert failed.outcome == outcomes.COMPILE_ERROR and failed.requested_bytes is None


def test_other_errors_keep_their_default():
    assert outcomes.classify_error("Triton: block shape must be a power of 2", outcomes.COMPILE_ERROR) == \
        outcomes.COMPILE_ERROR


# The end of the real message (JAX 0.10.2): a TPU interpret-mode kernel whose grid allocated more than
# 32767 semaphores (a run_scoped DMA semaphore pair in each of 16500 grid steps).
TPU_INTERPRETER_OVERFLOW = ("jax.errors.JaxRuntimeError: INTERNAL: CpuCallback error calling callback: "
                            "Traceback (most recent call last):\n") + """\
  File "/site-packages/jax/_src/callback.py", line 71, in __call__
  File "/site-packages/jax/_src/pallas/mosaic/interpret/interpret_pallas_call.py", line 107, in wrapper
  File "/site-packages/jax/_src/pallas/mosaic/interpret/interpret_pallas_call.py", line 538, in _allocate_semaphores
OverflowError: Python integer 32768 out of bounds for int16
--------------------
jax.io_callback failed
  File "/site-packages/jax/_src/pallas/mosaic/interpret/interpret_pallas_call.py", line 538, in _allocate_semaphores
    return token, np.arange(
OverflowError: Python integer 32768 out of bounds for int16"""


def test_a_failure_whose_message_hides_its_cause_says_the_cause_first():
    failed = outcomes.Measurement(outcomes.OK).fail("x" * 5000 + TPU_INTERPRETER_OVERFLOW, outcomes.RUN_ERROR)
    assert failed.outcome == outcomes.RUN_ERROR and len(failed.error) == outcomes.ERROR_CHARS
    assert failed.error.startswith("known cause: JAX's TPU interpreter numbers the semaphores")
    # the same overflow elsewhere, and other failures, get no cause
    other = outcomes.Measurement(outcomes.OK).fail("OverflowError: Python integer 32768 out of bounds for int16",
                                                   outcomes.RUN_ERROR)
    assert other.error == "OverflowError: Python integer 32768 out of bounds for int16"
    assert outcomes.known_cause("Triton: block shape must be a power of 2") is None


def test_relative_error_treats_nan_and_shape_mismatch_as_inf():
    a = jnp.ones((4, 4))
    assert validate.relative_error(a, a) == 0.0
    assert validate.relative_error(a.at[0, 0].set(jnp.nan), a) == math.inf
    assert validate.relative_error(a[:2], a) == math.inf
    assert validate.tolerance("bfloat16") > validate.tolerance("float32")


def test_large_outputs_are_checked_on_the_device_with_the_same_answer(monkeypatch):
    ref = jax.random.normal(jax.random.key(0), (64, 96))
    out = ref + 1e-3 * jax.random.normal(jax.random.key(1), (64, 96))
    on_host = validate.relative_error(out, ref)
    monkeypatch.setattr(validate, "HOST_CHECK_ELEMENTS", 16)
    assert validate.relative_error(out, ref) == pytest.approx(on_host, rel=1e-4)
    assert validate.relative_error(out.at[0, 0].set(jnp.nan), ref) == math.inf
    assert validate.relative_error(out[:, :95], ref) == math.inf


def test_reference_cache_keeps_several_tasks_and_evicts_the_cheapest_to_remake():
    from farm.measure.device import ReferenceCache, _Reference

    tasks = [TuningTask("softmax", (8, 128 * (i + 1)), "float32", "interpret") for i in range(3)]
    cache = ReferenceCache(size=2)
    first = cache.get(softmax, tasks[0])
    assert cache.get(softmax, tasks[1]) is not first
    assert cache.get(softmax, tasks[0]) is first          # kept while another task was served
    newest = cache.get(softmax, tasks[2])                   # over the count: one of the others goes
    assert cache.get(softmax, tasks[2]) is newest and len(cache._entries) == 2
    tiny = ReferenceCache(size=8, max_bytes=1)              # over the byte budget: only the newest stays
    kept = tiny.get(softmax, tasks[0])
    tiny.get(softmax, tasks[1])
    assert tiny.get(softmax, tasks[0]) is not kept
    # Round robin over more tasks than fit: keep what is dear to remake (attention's reference),
    # remake what is cheap (a norm's), whatever was used last.
    entries = {"attention": _Reference((), 4 << 30, 0.9), "norm": _Reference((), 1 << 30, 0.01),
               "new": _Reference((), 1 << 30, 0.0)}
    assert ReferenceCache.victim(entries, "new") == "norm"
    assert ReferenceCache.victim(entries, "norm") == "new"


def test_a_cutoff_stops_timing_after_the_race_samples():
    # Measured in full, then with a cutoff below any time (cut after timing.RACE_SAMPLES samples)
    # and above every time (not cut).
    full = measure(SOFTMAX, {"block_rows": 8}, interpret=True, repetitions=5)
    fn = jax.jit(lambda x: x * 2)
    x = jnp.ones((64, 64))
    cut = timing.time_calls(fn, [(x,)], repetitions=5, cutoff_s=1e-12)
    kept = timing.time_calls(fn, [(x,)], repetitions=5, cutoff_s=10.0)
    assert full.n_timed == 5 and not full.cut_short
    assert cut.cut_short and len(cut.samples) == timing.RACE_SAMPLES
    assert not kept.cut_short and len(kept.samples) == 5


def test_a_pair_whose_samples_disagree_marks_the_timing_disturbed():
    # An undisturbed pair takes twice the calls in about twice the time, less the once-per-sample
    # costs; a host stall in either sample moves the ratio out of range.
    assert timing.consistent_pair(5e-3, 9.5e-3) and timing.consistent_pair(5e-3, 10e-3)
    assert not timing.consistent_pair(105e-3, 10e-3)      # the stall in the short sample
    assert not timing.consistent_pair(5e-3, 110e-3)       # ... in the long one
    calls = [0]

    def stalls(x):
        # 2 ms a call: a sample of one call (calibration: 3 calls), pairs of 1 + 2 calls; the
        # 10th and 13th calls fall in the third and fourth pairs.
        calls[0] += 1
        time.sleep(0.3 if calls[0] in stalled else 0.002)
        return x + 1

    x = jnp.ones((8, 8))
    stalled = {10}
    once = timing.time_calls(stalls, [(x,)], repetitions=5)
    assert once.disturbed_pairs >= 1      # (one pair in five alone would leave its median standing)
    calls[0], stalled = 0, {10, 13}
    twice = timing.time_calls(stalls, [(x,)], repetitions=5)
    assert twice.disturbed_pairs >= 2 and twice.disturbed


def test_a_worker_times_a_disturbed_trial_again_with_nothing_compiling(ray_local, tmp_path):
    # The kernel's host stalls twice, inside the first timing: the worker takes the timing again
    # behind its compile gate, and the record says so; the figures are the second timing's.
    import ray

    from farm.measure.device import MeasureSettings
    from farm.run.actor import Worker

    worker = Worker.options(max_concurrency=2).remote(interpret=True, retime_disturbed=True)
    task = TuningTask("tests.fixtures.faulty_softmax", (8, 128), "float32", "interpret")
    # 5 ms a call: samples of one call; the 10th call is past validation, warm-up and calibration,
    # and it and the 13th stall (two pairs of five).
    config = {"block_rows": 8, "fault": "stall_twice", "marker": str(tmp_path / "stalled"), "stall_at": 10,
              "stall_ms": 300, "delay_ms": 5}
    measured = ray.get(worker.run.remote(task, config, 0, MeasureSettings(repetitions=5)))
    m = measured.measurement
    assert (tmp_path / "stalled").exists()                    # the stall happened
    assert m.outcome == outcomes.OK and m.disturbed and m.retimed_quiet
    assert m.n_timed == 5 and not m.cut_short
    ray.kill(worker)
