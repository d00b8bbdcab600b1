"""Where a config's compile time goes when a child process compiles and the device process runs.

    python bench/compile_split.py [--out OUT.json]

For a few tasks (Triton and Mosaic GPU on a GPU; the interpret target on CPU), a compile process
of `farm.measure.compile_pool` compiles the default config; this process then loads the
serialized executables and runs them. Printed per task: the compile in the child, the
serialized size, the load, the first call (a kernel binary still to be finished on the device
side would show here) and a steady call. This is the evidence for how executables reach the
device process (see farm/measure/compile_pool.py).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

import kernels  # noqa: E402
from farm.measure import compile_pool  # noqa: E402
from farm.measure.compiler import timing_inputs  # noqa: E402
from farm.tasks import TuningTask  # noqa: E402
from kernels.protocol import task_default  # noqa: E402

GPU_TASKS = [TuningTask("softmax", (8192, 50257), "bfloat16", "gpu-triton"),
             TuningTask("rms_norm", (8192, 4096), "bfloat16", "gpu-triton"),
             TuningTask("matmul", (4096, 4096, 4096), "bfloat16", "gpu-triton"),
             TuningTask("matmul", (4096, 4096, 4096), "bfloat16", "gpu-mosaic"),
             TuningTask("flash_attention", (4, 32, 4096, 128), "bfloat16", "gpu-mosaic")]
CPU_TASKS = [TuningTask("softmax", (128, 512), "float32", "interpret")]


def _timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - started, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    gpu = jax.devices()[0].platform == "gpu"
    tasks = GPU_TASKS if gpu else CPU_TASKS
    pool = compile_pool.CompilePool(1)
    rows = []
    for task in tasks:
        module = kernels.load(task.kernel)
        config = task_default(module, task.shape, task.target, task.dtype)
        started = time.perf_counter()
        reply = pool.compile(task, config, interpret=not gpu, timeout_s=600)
        wall = time.perf_counter() - started
        row = {"task": task.key, "reply": type(reply).__name__, "child_wall_s": wall}
        if isinstance(reply, compile_pool.Portable):
            row["compile_s"] = reply.compile_s
            row["bytes"] = len(reply.executable[0]) + len(reply.check_executable[0])
            try:
                load_s, (executable, _) = _timed(functools.partial(compile_pool.load, reply))
            except Exception as err:  # noqa: BLE001 - not portable: the worker compiles such tasks itself
                row["load_error"] = str(err).splitlines()[0][:300]
            else:
                inputs = timing_inputs(module, task, 0, 1)[0]
                row["load_s"] = load_s
                row["first_call_s"], _ = _timed(functools.partial(executable, *inputs))
                row["second_call_s"], _ = _timed(functools.partial(executable, *inputs))
        else:
            row["error"] = str(reply)[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
    dispatch = dispatch_check(pool, tasks[1] if gpu else tasks[0], gpu)
    finals = finals_check(pool, tasks[1] if gpu else tasks[0], gpu)
    pool.close()
    if args.out:
        args.out.write_text(json.dumps({"device": jax.devices()[0].device_kind, "jax": jax.__version__,
                                        "rows": rows, "dispatch": dispatch,
                                        "finals": finals}, indent=1))


def finals_check(pool: compile_pool.CompilePool, task: TuningTask, gpu: bool) -> list[dict]:
    """`farm.measure.finalists.retime` of a few configs, next to `time_calls` of each alone."""
    from farm.measure import finalists, roofline, timing

    module = kernels.load(task.kernel)
    default = task_default(module, task.shape, task.target, task.dtype)
    configs = [default] + [{**default, "num_warps": w} for w in (2, 4, 16) if w != default.get("num_warps")]
    fns = {}
    for config in configs:
        reply = pool.compile(task, config, interpret=not gpu, timeout_s=600)
        if isinstance(reply, compile_pool.Portable):
            fns[json.dumps(config, sort_keys=True)] = compile_pool.load(reply)[0]
    sets = timing_inputs(module, task, 7, 2)
    floor = roofline.floor_s(module, task.shape, task.dtype, roofline.peaks_for_device())
    rows = [{"how": "retime", "config": t.config, "median_us": t.median_s * 1e6, "spread": t.spread,
             "rounds": t.rounds} for t in finalists.retime(task.key, fns, sets, floor_s=floor)]
    for name, fn in fns.items():
        alone = timing.time_calls(fn, sets, repetitions=10)
        rows.append({"how": "alone", "config": name, "median_us": alone.median_s * 1e6, "spread": alone.spread})
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def dispatch_check(pool: compile_pool.CompilePool, task: TuningTask, gpu: bool) -> list[dict]:
    """Host cost per call and timed per-call figures of one config three ways: `jax.jit`, an AOT
    `Compiled` made here, and the executable a child compiled (deserialized here)."""
    from farm.measure import timing
    from farm.measure.compiler import build_executables

    module = kernels.load(task.kernel)
    config = task_default(module, task.shape, task.target, task.dtype)
    sets = timing_inputs(module, task, 0, 2)
    here, _ = build_executables(module, task, config, not gpu, sets[0])
    from kernels.lowering import Platform
    jitted = jax.jit(module.build(config, task.shape, jax.numpy.dtype(task.dtype), Platform(task.target,
                                                                                            interpret=not gpu)))
    reply = pool.compile(task, config, interpret=not gpu, timeout_s=600)
    child_k, _ = compile_pool.load(reply)
    # The child's executable makes reply.calls kernel calls per dispatch (farm.measure.dispatch);
    # here each of them gets the same arguments, and the row's figures are per dispatch.
    child = (lambda *a: child_k(*(list(a) * reply.calls))) if reply.calls > 1 else child_k
    rows = []
    for name, fn in (("jax.jit", jitted), ("aot_here", here), (f"aot_child ({reply.calls} calls)", child)):
        jax.block_until_ready(fn(*sets[0]))
        started = time.perf_counter()
        outs = [fn(*sets[i % 2]) for i in range(200)]
        enqueue = (time.perf_counter() - started) / 200
        jax.block_until_ready(outs)
        del outs
        one = timing.time_calls(fn, sets[:1], repetitions=10)
        two = timing.time_calls(fn, sets, repetitions=10)
        rows.append({"how": name, "enqueue_us": enqueue * 1e6, "one_set_us": one.median_s * 1e6,
                     "two_sets_us": two.median_s * 1e6, "calls_per_sample": two.calls_per_sample})
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
