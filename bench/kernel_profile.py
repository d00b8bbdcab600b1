"""Where one call's device time goes: every CUDA kernel a config launches, from a CUPTI trace.

    python bench/kernel_profile.py --kernel matmul_layernorm --shape 4096x4096x4096 --target gpu-mosaic \\
        --config '{"ln_strategy": "tile_stats", ...}' [--config ...] [--column torch_compile] [--out F.json]

For each config (completed from the kernel's default, as in bench/configs_side_by_side.py; a
config written TARGET:JSON is built for that target instead of --target; each checked against
the kernel's float32 reference with its outputs poisoned, its relative error printed), for
`jax.jit` of the kernel's reference (XLA) and for each `--column` of bench/baselines.py (torch,
torch.compile, ...; with TORCH_LOGS=output_code torch.compile prints the Triton it generates),
runs 20 queued calls under torch.profiler (CUDA activity) after a warm-up (first waiting, up to
--settle-s, for the GPU to draw at most --settle-w watts or its power to stop falling; the GPU's
clocks read before and after, bench/gpu_clocks.py, into --out's JSON), and prints each kernel's
name (shortened), launches per call, mean duration in microseconds and launch shape (grid,
block, registers per thread, shared memory), and the sum per call. With --copy, a copy of as
many bytes as the kernel moves is profiled too (torch's device copy on a GPU): the copy ceiling
at this size. Kernel durations only: gaps between kernels are not counted, so the sum is a lower
bound of the call's device time.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels  # noqa: E402
from bench import baselines, gpu_clocks  # noqa: E402
from bench.configs_side_by_side import config_arguments  # noqa: E402
from farm.measure import validate  # noqa: E402
from farm.tasks import config_json  # noqa: E402
from kernels.lowering import TARGETS, Platform  # noqa: E402
from kernels.protocol import task_default  # noqa: E402

CALLS = 20


def profile_calls(fn, inputs) -> list[dict]:
    """Per kernel name: launches per call and mean duration (us) over CALLS queued calls.

    `fn(*inputs)` returns anything `jax.block_until_ready` waits for (a baseline's call too)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        jax.block_until_ready(fn(*inputs))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            out = fn(*inputs)
        jax.block_until_ready(out)
    spans = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
            spans[e.name[:80]].append(e.time_range.elapsed_us())
    launches = _launch_shapes(prof)
    return [{"kernel": name, "per_call": len(d) / CALLS, "mean_us": sum(d) / len(d),
             "us_per_call": sum(d) / CALLS, **launches.get(name, {})}
            for name, d in sorted(spans.items(), key=lambda kv: -sum(kv[1]))]


SAME_BYTES_COPY = "copy of the same bytes"
LAUNCH_FIELDS = {"grid": "grid", "block": "block", "registers per thread": "registers",
                 "shared memory": "shared_memory"}


def _launch_shapes(prof) -> dict[str, dict]:
    """Per kernel name: its grid, block, registers per thread and shared memory, from the trace."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return {e["name"][:80]: {field: e["args"][key] for key, field in LAUNCH_FIELDS.items() if key in e["args"]}
            for e in events if e.get("cat") == "kernel" and isinstance(e.get("args"), dict)}


def _target_prefix(text: str, default: str) -> tuple[str, str]:
    """(target, JSON) of a --config value: JSON alone, or TARGET:JSON for another target."""
    head, _, rest = text.partition(":")
    return (head, rest) if head in TARGETS and rest.lstrip().startswith("{") else (default, text)


def _baseline_call(factory, module, shape, dtype, inputs) -> object:
    """One call of a bench/baselines.py column on `inputs`, prepared on first use."""
    key = id(factory)
    if key not in _PREPARED:
        _PREPARED[key] = factory(baselines.Case(module, shape, dtype, [inputs]))
    return _PREPARED[key].call(0)


_PREPARED: dict[int, object] = {}


def main() -> None:
    parser = config_arguments(__doc__.splitlines()[0], target="gpu-mosaic")
    parser.add_argument("--column", action="append", default=[],
                        help="a column of bench/baselines.py to profile too (torch_compile, torch, ...)")
    parser.add_argument("--copy", action="store_true",
                        help=f"profile '{SAME_BYTES_COPY}' too: a copy of as many bytes as the kernel moves "
                             "(torch's on a GPU)")
    parser.add_argument("--settle-w", type=float, default=150.0,
                        help="before each profile, wait until the GPU draws at most this many watts, or its "
                             "power stops falling (default 150)")
    parser.add_argument("--settle-s", type=float, default=10.0, help="the longest such wait (default 10)")
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split("x"))
    module = kernels.load(args.kernel)
    dtype = jnp.dtype(args.dtype)
    inputs = module.make_inputs(shape, dtype, jax.random.key(3))
    fns = {"xla (jax.jit reference)": jax.jit(module.reference)}
    errors: dict[str, float] = {}
    reference = module.reference(*validate.upcast(inputs))
    for text in args.config:
        target, text = _target_prefix(text, args.target)
        config = {**task_default(module, shape, target, dtype), **json.loads(text)}
        name = config_json(config) if target == args.target else f"{target}:{config_json(config)}"
        fns[name] = jax.jit(module.build(config, shape, dtype, Platform(target)))
        # Checked with poisoned outputs (elements the kernel never writes read NaN), timed without.
        poisoned = module.build(config, shape, dtype, Platform(target, poison_outputs=True))
        errors[name] = validate.relative_error(jax.jit(poisoned)(*inputs), reference)
    factories = baselines.columns(args.kernel, opt_in=args.column)
    own_inputs: dict[str, tuple] = {}  # columns called with inputs of their own (none: they hold them)
    for column in args.column:
        fns[column] = functools.partial(_baseline_call, factories[column], module, shape, args.dtype, inputs)
        own_inputs[column] = ()
    if args.copy:
        copy = baselines.same_bytes_copy(module.bytes_moved(shape, dtype))
        fns[SAME_BYTES_COPY], own_inputs[SAME_BYTES_COPY] = (lambda: copy.call(0)), ()
    report = []
    for name, fn in fns.items():
        settled_s, _ = gpu_clocks.settle(args.settle_w, args.settle_s)  # each from the same, cooled state
        before = gpu_clocks.sample()
        try:
            rows = profile_calls(fn, own_inputs.get(name, inputs))
        except Exception as err:  # noqa: BLE001 - report and go on
            report.append({"config": name, "error": str(err).splitlines()[0][:300]})
            print(f"error: {report[-1]['error']}: {name}")
            continue
        report.append({"config": name, "kernels": rows, "sum_us_per_call": sum(r["us_per_call"] for r in rows),
                       "relative_error": errors.get(name),
                       "clocks": [c and dataclasses.asdict(c) for c in (before, gpu_clocks.sample())],
                       "settled_s": settled_s})
        error = f" (relative error {errors[name]:.2g})" if name in errors else ""
        print(f"{report[-1]['sum_us_per_call']:9.1f} us per call in kernels: {name}{error}")
        for r in rows:
            launch = " ".join(f"{k}={r[k]}" for k in LAUNCH_FIELDS.values() if k in r)
            print(f"    {r['us_per_call']:8.1f} us  {r['per_call']:.0f} x {r['mean_us']:7.1f}  {r['kernel']}  {launch}")
    if args.out:
        args.out.write_text(json.dumps({"kernel": args.kernel, "shape": shape, "device": jax.devices()[0].device_kind,
                                        "calls": CALLS, "rows": report}, indent=1))


if __name__ == "__main__":
    main()
