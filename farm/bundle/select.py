"""Pick each task's winner: the fastest `ok` trial (ties broken by the smaller spread)."""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import kernels
from farm.bundle import fingerprint
from farm.bundle.records import TrialRecord
from farm.measure import outcomes
from farm.measure.finalists import FinalTiming
from farm.measure.finalists import winner as finalist_winner
from farm.tasks import TuningTask, config_json
from kernels.protocol import task_default


def best_record(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The measured `ok` record with the smallest median (then spread), or None."""
    ok = [r for r in records if r.outcome == outcomes.OK and r.median_s is not None]
    return min(ok, key=lambda r: (r.median_s, r.spread or 0.0)) if ok else None


# Sweep figures of one config moved by 5-10% between measurements minutes apart on the H200
# (BENCHMARKS.md, issue 18): configs this close to the sweep's best are re-timed side by side too.
NEAR_TIE = 0.05


def finalists(records: Sequence[TrialRecord], count: int, default: str | None = None,
              near: float = NEAR_TIE) -> list[str]:
    """The configs to re-time side by side: the `count` fastest `ok` ones, then any others within
    `near` of the fastest (up to 2 * count in all: near ties in the sweep are noise, which only a
    side-by-side timing settles), and the default when it ran `ok` (so that `vs default` is
    measured side by side too)."""
    ok = sorted((r for r in records if r.outcome == outcomes.OK and r.median_s is not None),
                key=lambda r: (r.median_s, r.spread or 0.0))
    fastest = list(dict.fromkeys(r.config for r in ok))  # each config at its fastest record
    close = len({r.config for r in ok if r.median_s <= ok[0].median_s * (1 + near)})  # a prefix of fastest
    chosen = fastest[:max(count, min(close, 2 * count))]
    if default is not None and default not in chosen and any(r.config == default for r in ok):
        chosen.append(default)
    return chosen


def time_to_within(records: Sequence[TrialRecord], fraction: float = 0.02) -> float | None:
    """Seconds from the sweep's start (`elapsed_s`) until its best-so-far `ok` time came within
    `fraction` of the final best; None without an `ok` record."""
    ok = sorted((r for r in records if r.outcome == outcomes.OK and r.median_s is not None),
                key=lambda r: r.elapsed_s)
    if not ok:
        return None
    final = min(r.median_s for r in ok)
    return next(r.elapsed_s for r in ok if r.median_s <= final * (1 + fraction))


def winner_rows(tasks: Sequence[TuningTask], records: Sequence[TrialRecord], *, run_id: str,
                created: str, environment: dict[str, dict[str, Any]],
                finals: dict[str, Sequence[FinalTiming]] | None = None) -> list[dict[str, Any]]:
    """One configs.parquet row per task: the winner, the default's time, outcome counts.

    A task with re-timed finalists (`finals`, `farm.measure.finalists`) is won by the fastest of
    them that is not below the roofline floor, with their side-by-side times (the default's too,
    when it was among them); otherwise by the sweep's fastest `ok` trial.

    `environment` maps a task key to the `Worker.info()` of the workers that measured it; with the
    kernel's source it makes the task's software fingerprint (`farm.bundle.fingerprint`).
    """
    by_task: dict[str, list[TrialRecord]] = {}
    for record in records:
        by_task.setdefault(record.task_key, []).append(record)
    sources: dict[str, dict[str, str]] = {}
    rows = []
    for task in tasks:
        task_records = by_task.get(task.key, [])
        best = best_record(task_records)
        default = config_json(task_default(kernels.load(task.kernel), task.shape, task.target, task.dtype))
        default_ok = best_record([r for r in task_records if r.config == default])
        timings = list((finals or {}).get(task.key, ()))
        final = finalist_winner(timings)
        if final is not None:
            best = best_record([r for r in task_records if r.config == final.config]) or best
        timed = final if final is not None else best
        default_final = next((t for t in timings if t.config == default and t.median_s is not None), None)
        counts = Counter(r.outcome for r in task_records)
        env = environment.get(task.key, {})
        if task.kernel not in sources:
            sources[task.kernel] = fingerprint.kernel_sources(task.kernel)
        fp = fingerprint.for_task(task.kernel, env, sources[task.kernel])
        rows.append({
            "task_key": task.key, "kernel": task.kernel, "shape": list(task.shape), "dtype": task.dtype,
            "target": task.target, "device_kind": (best and best.device_kind) or env.get("device_kind"),
            "interpret": env.get("interpret"), "software": json.dumps(env.get("software"), sort_keys=True),
            "fingerprint": fingerprint.to_json(fp), "fingerprint_sha256": fingerprint.digest(fp),
            "status": "ok" if best else "no_valid_config",
            "config": best.config if best else None,
            "median_s": timed and timed.median_s, "spread": timed and timed.spread,
            "min_s": timed and timed.min_s, "n_timed": timed and timed.n_timed,
            "numerics_error": best and best.numerics_error,
            "default_config": default,
            "default_median_s": default_final.median_s if default_final else default_ok and default_ok.median_s,
            "sweep_median_s": best and best.median_s,
            "finalists": len([t for t in timings if t.median_s is not None]) if final else 0,
            "floor_s": timings[0].floor_s if timings else None,
            "settled": final.settled if final else None,
            "clock": timed and timed.clock,
            "trials": sum(counts[o] for o in (*outcomes.MEASURED, outcomes.CACHED)),
            "pruned": counts[outcomes.PRUNED], "oom": counts[outcomes.OOM],
            "outcome_counts": json.dumps(dict(sorted(counts.items()))),
            "run_id": run_id, "created": created,
        })
    return rows
