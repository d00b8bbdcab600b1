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
from farm.tasks import TuningTask, config_json


def best_record(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The measured `ok` record with the smallest median (then spread), or None."""
    ok = [r for r in records if r.outcome == outcomes.OK and r.median_s is not None]
    return min(ok, key=lambda r: (r.median_s, r.spread or 0.0)) if ok else None


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
                created: str, environment: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One configs.parquet row per task: the winner, the default's time, outcome counts.

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
        default = config_json(kernels.load(task.kernel).default_config(task.shape, task.target))
        default_ok = best_record([r for r in task_records if r.config == default])
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
            "median_s": best and best.median_s, "spread": best and best.spread,
            "min_s": best and best.min_s, "n_timed": best and best.n_timed,
            "numerics_error": best and best.numerics_error,
            "default_config": default, "default_median_s": default_ok and default_ok.median_s,
            "trials": sum(counts[o] for o in (*outcomes.MEASURED, outcomes.CACHED)),
            "pruned": counts[outcomes.PRUNED], "oom": counts[outcomes.OOM],
            "outcome_counts": json.dumps(dict(sorted(counts.items()))),
            "run_id": run_id, "created": created,
        })
    return rows
