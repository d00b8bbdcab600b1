"""Does the footprint model predict what the compiler accepts? Compile random configs and see.

    python bench/oom_probe.py --out DIR [--per-task 8] [--seed 0] [--exclude OLD/oom_probe.json]
    python bench/oom_probe.py --out DIR --small          # CPU dry run (interpret mode, no verdicts)
    python bench/oom_probe.py --out DIR --tpu v5e:1x1 [--case KERNEL:AxB ...]   # TPU, no chip (libtpu)
    python bench/oom_probe.py --out DIR --rejudge OLD/oom_probe.json   # old compiles, today's models

For every space (default: all in search_spaces/), GPU target and seed shape, draws --per-task
configs uniformly among those that satisfy the space's constraints (static pruning is not
applied), compiles each one ahead of time with the farm's own `compile_config` (a thread pool
keeps the compiler busy) and runs it once. The model's verdict is footprint <= capacity
(capacity read from the device, as a worker does); the compiler's is `oom` (did not fit) or any
outcome after a successful run (it fit). Other compile errors give no verdict and are counted
apart. For `oom`, the bytes the compiler asked for are kept beside the model's figure.
`--exclude` leaves out configs an earlier probe measured, so a model calibrated on one probe is
judged on configs it has not seen.

`--tpu TOPOLOGY` judges the TPU target's VMEM model on a machine without a TPU: each config is
compiled by libtpu for that one-chip topology, deviceless, in a farm compile child (as a TPU
worker's children compile), against that chip's VMEM; nothing runs, so the compiler's verdict is
compiled (fits) or its VMEM `oom`. The kernels ask Mosaic for a scoped VMEM limit from their
model (`vmem_limit`: 1.5 x footprint + 4 MiB, within the chip), so a model that undercounts shows
as "model says fits, oom" even where the chip has room. An HBM `oom` (the shape, not the config)
gives no verdict. Shapes: the spaces' TPU shapes, or `--case KERNEL:AxB` (users' shapes). `--near
F` draws only configs whose model puts them within a factor F of the chip's VMEM: the boundary,
where uniform draws seldom land.

Writes DIR/oom_probe.json and DIR/oom_probe.md (and each row to DIR/oom_probe_rows.jsonl as it comes).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import jax  # noqa: E402

import kernels  # noqa: E402
from bench.oom_report import FIT  # noqa: E402
from bench.tpu_deviceless import parse_case  # noqa: E402
from farm.measure import capacity, compile_pool, outcomes  # noqa: E402
from farm.measure.compiler import compile_config  # noqa: E402
from farm.measure.outcomes import Measurement  # noqa: E402
from farm.search import pruning, spaces  # noqa: E402
from farm.tasks import TuningTask  # noqa: E402

GPU_TARGETS = ("gpu-triton", "gpu-mosaic")


def sample(space: spaces.SearchSpace, target: str, shape: tuple[int, ...], dtype: str, count: int,
           rng: random.Random, exclude: set[str], attempts: int = 20_000,
           keep: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
    """Up to `count` distinct configs drawn uniformly among those the constraints allow (by rejection)
    and `keep` keeps."""
    params = space.params_for(target)
    chosen: dict[str, dict[str, Any]] = {}
    for _ in range(attempts):
        if len(chosen) == count:
            break
        config = {p.name: rng.choice(p.choices) for p in params}
        key = _key(space.kernel, target, shape, config)
        if key not in chosen and key not in exclude and space.violated(config, shape, dtype, target) is None \
                and (keep is None or keep(config)):
            chosen[key] = config
    return list(chosen.values())


def tpu_keep(kernel: str, shape: tuple[int, ...], dtype: str, vmem_bytes: int,
             near: float | None) -> Callable[[dict[str, Any]], bool]:
    """Configs the kernel admits on TPU and, with `near`, whose modelled footprint is within a
    factor `near` of the VMEM capacity (either side): where the model's verdict decides."""
    module = kernels.load(kernel)

    def keep(config: dict[str, Any]) -> bool:
        if module.check_config(config, shape, dtype, "tpu") is not None:
            return False
        if near is None:
            return True
        try:
            footprint = module.footprint(dict(config), shape, jax.numpy.dtype(dtype), "tpu")
        except Exception:  # noqa: BLE001 - a model failing on a config: not drawn here
            return False
        return vmem_bytes / near <= footprint <= vmem_bytes * near

    return keep


def _key(kernel: str, target: str, shape: tuple[int, ...], config: dict[str, Any]) -> str:
    return f"{kernel}/{'x'.join(map(str, shape))}/{target}/{json.dumps(config, sort_keys=True)}"


# Compiles overlap; runs take turns on the one device. Interpret mode keeps its simulated
# device's state in globals, which a compile resets: there compiles take turns with runs too.
_DEVICE = threading.Lock()


def verdict(task: TuningTask, config: dict[str, Any], interpret: bool) -> Measurement:
    """Compile (the farm's path) and run once; the outcome says whether it fit."""
    if interpret:
        with _DEVICE:
            compiled = compile_config(task, config, interpret=True, calls=1)
    else:
        compiled = compile_config(task, config, interpret=False, calls=1)   # one call: does it fit
    if isinstance(compiled, Measurement):
        return compiled
    try:
        with _DEVICE:
            jax.block_until_ready(compiled.executable(*compiled.inputs[0]))
    except Exception as err:  # noqa: BLE001 - every failure is data
        return Measurement(outcomes.RUN_ERROR, compile_s=compiled.compile_s).fail(str(err), outcomes.RUN_ERROR)
    return Measurement(outcomes.OK, compile_s=compiled.compile_s)


# libtpu's message when the arrays, not the kernel's VMEM, outgrow the chip (CompileTimeHbmOom).
HBM_OOM = re.compile(r"[Oo]ut of memory on HBM|memory space hbm")


def tpu_verdict(pool: compile_pool.CompilePool, topology: str, timeout_s: float, task: TuningTask,
                config: dict[str, Any]) -> Measurement:
    """Compile for `topology` without a chip (libtpu, in the pool's child): `ok` when it compiled
    (nothing runs), else the farm's outcome; an HBM `oom` is `compile_error` here (no verdict)."""
    reply = pool.compile(task, config, interpret=False, timeout_s=timeout_s, topology=topology)
    if isinstance(reply, compile_pool.Portable):
        return Measurement(outcomes.OK, compile_s=reply.compile_s)
    if isinstance(reply, compile_pool.NotPortable):
        return Measurement(outcomes.COMPILE_ERROR).fail(f"compiled, not portable: {reply.reason}",
                                                        outcomes.COMPILE_ERROR)
    if reply.outcome == outcomes.OOM and HBM_OOM.search(reply.error or ""):
        reply.outcome = outcomes.COMPILE_ERROR
    return reply



def _row(task: TuningTask, config: dict[str, Any], m: Measurement, caps: dict[str, capacity.Capacity]) -> dict:
    cap = caps[task.target]
    footprint, _ = pruning.static_verdict(kernels.load(task.kernel), config, task.shape, task.dtype, task.target, cap)
    row = {"kernel": task.kernel, "target": task.target, "shape": list(task.shape), "dtype": task.dtype,
           "config": config, "footprint_bytes": footprint, "capacity_bytes": cap.onchip_bytes,
           "model_fits": cap.onchip_bytes is None or footprint <= cap.onchip_bytes,
           "outcome": m.outcome, "requested_bytes": m.requested_bytes, "available_bytes": m.available_bytes,
           "compile_s": m.compile_s, "error": (m.error or "")[:600]}
    row["judgement"] = judge(row)
    print(f"{row['judgement']:24s} {task.kernel:26s} {task.target:10s} model {footprint:>8d} "
          f"requested {m.requested_bytes or '-':>8} {m.outcome}", flush=True)
    return row


def judge(row: dict[str, Any]) -> str:
    """'agree', 'model says fits, oom', 'model says no fit, fits' or 'no verdict'."""
    if row["outcome"] == outcomes.OOM:
        fits = False
    elif row["outcome"] in FIT:
        fits = True
    else:
        return "no verdict"
    if row["model_fits"] == fits:
        return "agree"
    return "model says fits, oom" if row["model_fits"] else "model says no fit, fits"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Agreement overall and per (kernel, target), the misses, and requested/model byte ratios."""
    counts = Counter(r["judgement"] for r in rows)
    judged = sum(v for k, v in counts.items() if k != "no verdict")
    per: dict[str, Counter] = {}
    for r in rows:
        per.setdefault(f"{r['kernel']} / {r['target']}", Counter())[r["judgement"]] += 1
    ratios = [r["requested_bytes"] / r["footprint_bytes"] for r in rows
              if r["outcome"] == outcomes.OOM and r.get("requested_bytes") and r["footprint_bytes"]]
    return {"configs": len(rows), "judged": judged, "agree": counts["agree"],
            "agreement": counts["agree"] / judged if judged else None, "counts": dict(counts),
            "per_task": {k: dict(v) for k, v in sorted(per.items())},
            "model_fits": sum(r["model_fits"] for r in rows), "model_no_fit": sum(not r["model_fits"] for r in rows),
            "requested_over_model": {"n": len(ratios), "min": min(ratios, default=None),
                                     "max": max(ratios, default=None)},
            "misses": [r for r in rows if r["judgement"] not in ("agree", "no verdict")],
            "no_verdict": [{k: r[k] for k in ("kernel", "target", "config", "outcome", "error")}
                           for r in rows if r["judgement"] == "no verdict"]}


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """The report as Markdown."""
    agreement = summary["agreement"]
    lines = [f"# Footprint model vs compiler ({meta['device']}, {meta['date']})", "",
             f"Command: `{meta['command']}`", "",
             f"configs compiled: {summary['configs']}; with a verdict: {summary['judged']}; "
             f"agree: {summary['agree']} (**{'-' if agreement is None else f'{agreement:.1%}'}**); "
             f"model says fits / no fit: {summary['model_fits']} / {summary['model_no_fit']}", "",
             "| kernel / target | agree | model says fits, oom | model says no fit, fits | no verdict |",
             "|---|---|---|---|---|"]
    for key, c in summary["per_task"].items():
        lines.append(f"| {key} | {c.get('agree', 0)} | {c.get('model says fits, oom', 0)} | "
                     f"{c.get('model says no fit, fits', 0)} | {c.get('no verdict', 0)} |")
    lines += ["", "Misses:"] + [f"- {m['kernel']} {m['target']} {m['shape']} `{m['config']}`: model "
                                f"{m['footprint_bytes']} B, capacity {m['capacity_bytes']} B, compiler {m['outcome']}"
                                f" (requested {m.get('requested_bytes')})" for m in summary["misses"]]
    return "\n".join(lines) + "\n"


def rejudge(path: Path) -> dict[str, Any]:
    """An earlier probe's compiles judged by today's models: the summary of its rows with each
    footprint computed again. Sound where the compile did not depend on the model (TPU v4: the
    kernels' scoped VMEM limit is the whole 16 MiB there; GPU: no limit is asked for)."""
    rows = []
    for row in json.loads(path.read_text())["rows"]:
        module = kernels.load(row["kernel"])
        footprint = int(module.footprint(dict(row["config"]), tuple(row["shape"]), jax.numpy.dtype(row["dtype"]),
                                         row["target"]))
        row = {**row, "footprint_bytes": footprint, "model_fits": footprint <= row["capacity_bytes"]}
        rows.append({**row, "judgement": judge(row)})
    return summarize(rows)


def _chip(topology: str) -> str:
    """The capacity profile of a libtpu topology name: v5e:1x1 -> v5e, tpu7x:1x1x1 -> v7x."""
    name = topology.split(":")[0].lower()
    return "v" + name.removeprefix("tpu") if name.startswith("tpu") else name


def _libtpu_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("libtpu")
    except PackageNotFoundError:
        return "(version unknown)"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--spaces", nargs="*", type=Path, help="space files (default: all)")
    parser.add_argument("--per-task", type=int, default=8, help="configs per (space, target, shape)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exclude", type=Path, action="append", default=[], help="an earlier oom_probe.json")
    parser.add_argument("--threads", type=int, default=6, help="compiles in flight")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop submitting compiles after this")
    parser.add_argument("--small", action="store_true", help="interpret mode on the spaces' CPU shapes, "
                        "capacities of the h200 profile (a dry run of this script: no compiler verdicts)")
    parser.add_argument("--tpu", metavar="TOPOLOGY", help="the TPU target, compiled by libtpu for this "
                        "one-chip topology without a chip (v5e:1x1, v6e:1x1, v5p:1x1x1, v4:1x1x1, tpu7x:1x1x1)")
    parser.add_argument("--case", action="append", default=[], metavar="KERNEL:AxB",
                        help="with --tpu: these shapes instead of the spaces' (repeatable)")
    parser.add_argument("--compile-timeout-s", type=float, default=300.0, help="with --tpu: per compile")
    parser.add_argument("--near", type=float, help="with --tpu: only configs whose modelled footprint is "
                        "within this factor of the chip's VMEM, either side (e.g. 2)")
    parser.add_argument("--rejudge", type=Path, metavar="OLD/oom_probe.json", help="compile nothing: judge an "
                        "earlier probe's compiles by today's models (sound where the compile did not depend "
                        "on the model: TPU v4, GPU)")
    args = parser.parse_args(argv)
    if args.rejudge:
        summary = rejudge(args.rejudge)
        meta = {"device": f"{args.rejudge}, judged again", "date": time.strftime("%Y-%m-%d"),
                "command": "python bench/oom_probe.py " + " ".join(argv if argv is not None else sys.argv[1:])}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "oom_probe.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=1, default=str))
        text = markdown(summary, meta)
        (args.out / "oom_probe.md").write_text(text)
        print(text)
        return summary
    if not args.tpu and (args.case or args.near):
        raise SystemExit("--case and --near take --tpu TOPOLOGY (the GPU probe runs the spaces' own shapes)")
    vmem = 0
    if args.tpu:
        try:
            import libtpu  # noqa: F401
        except ImportError:
            raise SystemExit("--tpu: libtpu is missing (pip install libtpu); it compiles for a TPU "
                             "without a chip") from None
        if _chip(args.tpu) not in capacity.profiles():
            raise SystemExit(f"--tpu {args.tpu!r}: expected GENERATION:TOPOLOGY with a generation of "
                             f"{list(capacity.profiles())[:8]} (or tpu7x), e.g. v5e:1x1")
        vmem = capacity.profile(_chip(args.tpu)).onchip_bytes
    cases: dict[str, list[tuple[int, ...]]] = {}
    for kernel, shape in map(parse_case, args.case):
        cases.setdefault(kernel, []).append(shape)
    started = time.monotonic()
    paths = args.spaces or sorted((REPO / "search_spaces").glob("*.yaml"))
    exclude = {_key(r["kernel"], r["target"], tuple(r["shape"]), r["config"])
               for old in args.exclude for r in json.loads(old.read_text())["rows"]}
    rng = random.Random(args.seed)
    jobs = []
    for space in spaces.load_spaces(paths):
        small_shapes = next((t.shapes for t in space.targets if t.name == "interpret"), ())
        for spec in space.targets:
            if spec.name not in (("tpu",) if args.tpu else GPU_TARGETS):
                continue
            shapes = small_shapes if args.small else spec.shapes
            if args.tpu and args.case:
                shapes = tuple(cases.get(space.kernel, ()))
            for shape in shapes:
                dtype = spec.dtypes[0]
                keep = tpu_keep(space.kernel, shape, dtype, vmem, args.near) if args.tpu else None
                for config in sample(space, spec.name, shape, dtype, args.per_task, rng, exclude, keep=keep):
                    jobs.append((TuningTask(space.kernel, shape, dtype, spec.name), config))
    print(f"{len(jobs)} configs to compile", flush=True)
    if args.tpu:
        caps = {"tpu": capacity.profile(_chip(args.tpu))}
    else:
        caps = {t: (capacity.profile("h200") if args.small else capacity.for_target(t, interpret=False))
                for t in {task.target for task, _ in jobs}}
    pool = compile_pool.CompilePool(args.threads, compile_pool.TPU_CHILD_ENV) if args.tpu else None

    def judged(task: TuningTask, config: dict[str, Any]) -> Measurement:
        if pool is not None:
            return tpu_verdict(pool, args.tpu, args.compile_timeout_s, task, config)
        return verdict(task, config, args.small)
    rows: list[dict[str, Any]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / "oom_probe_rows.jsonl", "a")   # kept even if a config takes the process down
    pending: dict[concurrent.futures.Future, tuple[TuningTask, dict[str, Any]]] = {}
    queue = iter(jobs)
    try:
        with concurrent.futures.ThreadPoolExecutor(args.threads) as threads:
            while True:
                while len(pending) < 2 * args.threads and time.monotonic() - started < args.budget_s:
                    job = next(queue, None)
                    if job is None:
                        break
                    pending[threads.submit(judged, *job)] = job
                if not pending:
                    break
                done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    rows.append(_row(*pending.pop(future), future.result(), caps))
                    log.write(json.dumps(rows[-1], default=str) + "\n")
                    log.flush()
    finally:
        log.close()
        if pool is not None:
            pool.close()
    summary = summarize(rows)
    device = f"libtpu {_libtpu_version()}, deviceless {args.tpu}" if args.tpu else jax.devices()[0].device_kind
    meta = {"device": device, "date": time.strftime("%Y-%m-%d"), "jax": jax.__version__,
            "command": "python bench/oom_probe.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "seconds": time.monotonic() - started, "capacities": {t: c.to_dict() for t, c in caps.items()}}
    (args.out / "oom_probe.json").write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows},
                                                        indent=1, default=str))
    text = markdown(summary, meta)
    (args.out / "oom_probe.md").write_text(text)
    print(text)
    return summary


if __name__ == "__main__":
    main()
