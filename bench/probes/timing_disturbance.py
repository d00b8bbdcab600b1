"""What disturbs the farm's timing? One config timed by the sweep's method
(`farm.measure.timing.time_calls`), alone and beside background processes of several kinds, with
the VM's steal time and the cgroup's CPU throttling over each variant.

    python3 bench/probes/timing_disturbance.py --kernel softmax --shape 8192x151936 \\
        --target gpu-mosaic --config '{"strategy":"smem_row","cluster":6,"block_cols":2048}' \\
        [--processes 14] [--rounds 6] [--out F.json]

Variants, in this order:
  alone           nothing else runs
  burn            N processes spinning at nice 10, as many as a worker's compile processes
  burn-pinned     the same, pinned off CPU 0, with this process pinned to CPU 0
  compile         N processes compiling configs of the kernel in a loop at nice 10 (the sweep's
                  compile processes: JAX, Mosaic GPU or Triton, on this GPU)
  compile-pinned  the same, pinned off CPU 0, with this process pinned to CPU 0
  spin-threads    4 threads of this process running Python loops (they hold the GIL)
  trace-threads   4 threads of this process compiling configs of the kernel (a worker's compile
                  threads: tracing and lowering are Python under the GIL)
  load-threads    4 threads of this process loading a serialized executable of the timed config
                  again and again (a worker loading its compile processes' replies)

On the H200 (bench/results/h200/sweep_noise/) a sweep's trials timed beside its compiles ran
3-70 times too slow; this tells CPU time (burn) from the compiles' other effects, and whether
pinning keeps the timing thread clear. Found on the H200 (2026-12-02; BENCHMARKS.md): only the
threads of the timing process held it up (the GIL), processes of any kind did not.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

BURN = "import os\nos.nice(10)\nwhile True:\n    pass\n"


def _compile_loop(kernel: str, shape: tuple[int, ...], target: str, stop: Any = None) -> None:
    """Compile the kernel's configs (its space's proposals, fresh closures: no cache) forever,
    or until the event `stop` is set."""
    if stop is None:
        os.nice(10)
    import itertools

    import jax
    import jax.numpy as jnp

    import kernels
    from kernels.lowering import Platform

    module = kernels.load(kernel)
    args = jax.eval_shape(lambda: module.make_inputs(shape, jnp.bfloat16, jax.random.key(0)))
    base = module.default_config(shape, target)
    variants = [{**base, "block_cols": c} for c in (1024, 2048, 4096)] if "block_cols" in base else [base]
    for n in itertools.count():
        if stop is not None and stop.is_set():
            return
        config = variants[n % len(variants)]
        fn = module.build(config, shape, jnp.bfloat16, Platform(target))
        jax.jit(lambda *a, fn=fn, n=n: fn(*a)).trace(*args).lower().compile()


def _cpu_counters() -> dict[str, float]:
    """The VM's steal time (jiffies, /proc/stat) and the cgroup's throttling (cpu.stat), now."""
    counters = {}
    with open("/proc/stat") as f:
        fields = f.readline().split()
    counters["steal_jiffies"] = float(fields[8]) if len(fields) > 8 else float("nan")
    for path in ("/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/cpu/cpu.stat"):
        if os.path.exists(path):
            for line in open(path):
                key, value = line.split()
                if key in ("nr_throttled", "throttled_usec", "throttled_time"):
                    counters[key] = float(value)
    return counters


def _threads(kind: str, stop: threading.Event, args: argparse.Namespace, shape: tuple[int, ...],
             compiled: Any) -> list[threading.Thread]:
    """4 threads of this process doing `kind` work until `stop` is set."""
    def spin() -> None:
        while not stop.is_set():
            sum(range(10_000))

    def load() -> None:
        from jax.experimental import serialize_executable
        payload = serialize_executable.serialize(compiled)
        while not stop.is_set():
            serialize_executable.deserialize_and_load(*payload)

    def trace() -> None:
        _compile_loop(args.kernel, shape, args.target, stop)

    work = {"spin": spin, "load": load, "trace": trace}[kind]
    threads = [threading.Thread(target=work, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    return threads


def _background(kind: str, processes: int, pinned: bool, args: argparse.Namespace) -> list[subprocess.Popen]:
    cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)) if c != 0)
    procs = []
    for _ in range(processes):
        if kind == "burn":
            command = [sys.executable, "-c", BURN]
        else:
            command = [sys.executable, __file__, "--compile-loop", "--kernel", args.kernel, "--shape", args.shape,
                       "--target", args.target]
        if pinned:
            command = ["taskset", "-c", cpus, *command]
        procs.append(subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--shape", required=True, help="AxB...")
    parser.add_argument("--target", default="gpu-mosaic")
    parser.add_argument("--config", default="{}", help="JSON knobs over the kernel's default")
    parser.add_argument("--processes", type=int, default=14)
    parser.add_argument("--rounds", type=int, default=6, help="timings per variant (10 pairs each)")
    parser.add_argument("--settle-s", type=float, default=8.0, help="seconds the background runs before timing")
    parser.add_argument("--variants", default="alone,burn,burn-pinned,compile,compile-pinned,spin-threads,"
                        "trace-threads,load-threads", help="comma-separated, from the list above")
    parser.add_argument("--switch-interval", type=float, help="sys.setswitchinterval (s) for the whole run")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compile-loop", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split("x"))
    if args.compile_loop:
        _compile_loop(args.kernel, shape, args.target)
        return

    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    import jax
    import jax.numpy as jnp

    import kernels
    from farm.measure import timing
    from kernels.lowering import Platform

    module = kernels.load(args.kernel)
    config = {**module.default_config(shape, args.target), **json.loads(args.config)}
    inputs = [module.make_inputs(shape, jnp.bfloat16, jax.random.key(i)) for i in range(2)]
    fn = jax.jit(module.build(config, shape, jnp.bfloat16, Platform(args.target))).trace(*inputs[0]).lower().compile()
    jax.block_until_ready(fn(*inputs[0]))
    everything = os.sched_getaffinity(0)
    results = []
    for variant in args.variants.split(","):
        kind, pinned, in_process = variant.split("-")[0], variant.endswith("pinned"), variant.endswith("threads")
        stop = threading.Event()
        procs = [] if kind == "alone" or in_process else _background(kind, args.processes, pinned, args)
        threads = _threads(kind, stop, args, shape, fn) if in_process else []
        try:
            os.sched_setaffinity(0, {0} if pinned else everything)
            time.sleep(0 if kind == "alone" else args.settle_s)
            before, started = _cpu_counters(), time.monotonic()
            rounds = [timing.time_calls(fn, inputs, repetitions=10) for _ in range(args.rounds)]
            after, wall = _cpu_counters(), time.monotonic() - started
        finally:
            stop.set()
            for t in threads:
                t.join()
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
            os.sched_setaffinity(0, everything)
        row = {"variant": variant, "processes": len(procs), "threads": len(threads), "wall_s": wall,
               "medians_ms": [r.median_s * 1e3 for r in rounds], "mins_ms": [r.min_s * 1e3 for r in rounds],
               "spreads": [r.spread for r in rounds], "disturbed_pairs": [r.disturbed_pairs for r in rounds],
               "disturbed": sum(r.disturbed for r in rounds),
               **{f"{k}_delta": after[k] - before.get(k, 0.0) for k in after}}
        results.append(row)
        print(f"{variant:15s} median of medians {statistics.median(row['medians_ms']):9.3f} ms, "
              f"worst {max(row['medians_ms']):9.3f}, disturbed {row['disturbed']}/{len(rounds)}, "
              + ", ".join(f"{k} {v:.0f}" for k, v in row.items() if k.endswith("_delta")), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"kernel": args.kernel, "shape": shape, "config": config,
                                        "target": args.target, "cpus": len(everything), "results": results},
                                       indent=1))


if __name__ == "__main__":
    main()
