"""Nightly retuning: retune only the tasks whose software fingerprint changed, warm-started.

`retune` runs these steps:

1. Read the previous bundle, verified (`farm.retune.planning.load_previous`).
2. Probe: one worker per pool reports its software and device kind (a sweep of no trials, in
   RUN_DIR/probe/). With each kernel's source this is every planned task's current fingerprint
   (`farm.bundle.fingerprint`).
3. Plan (`farm.retune.planning`): stale tasks, their warm starts and budgets; every other row of
   the previous bundle is carried over unchanged.
4. Sweep the stale tasks (`farm.run.sweep.run_sweep`, warm-started: trial 0 is the previous
   winner, the *baseline*). *Escalation*: where the previous winner now fails or is slower than
   its previous time beyond noise, the landscape moved, and the sweep resumes up to the space's
   full budget for those tasks (nothing is measured twice).
5. Decide per task with the promotion rule (`farm.retune.rules`).
6. Write the new signed bundle (RUN_DIR/bundle) and the report (`farm.retune.report`).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from farm.bundle import artifacts, signing
from farm.bundle.records import TrialRecord
from farm.errors import FarmError
from farm.measure import outcomes
from farm.retune.planning import Previous, TaskPlan, plan_tasks
from farm.retune.report import REPORT_JSON, REPORT_MD, task_report, to_markdown
from farm.retune.rules import EXIT_BLOCKED, KEPT, REGRESSED, RetuneSettings, decide, landscape_moved
from farm.run import scaling
from farm.run.sweep import BUNDLE_DIR, RunResult, SweepSettings, run_sweep
from farm.search.plan import PlannedTask

PROBE_DIR = "probe"


@dataclasses.dataclass
class RetuneResult:
    """What `retune` wrote and decided."""

    run_dir: Path
    bundle: Path
    report: dict[str, Any]
    exit_code: int
    markdown: str


def probe(planned: Sequence[PlannedTask], settings: SweepSettings) -> dict[str, dict[str, Any]]:
    """Each task's `Worker.info()` (software, device kind) from one worker per pool: a sweep of no trials."""
    quiet = dataclasses.replace(settings, run_dir=Path(settings.run_dir) / PROBE_DIR, workers=1, warm_start={})
    return run_sweep([dataclasses.replace(p, trials=0) for p in planned], quiet, None).environment


def _sweep(stale: Sequence[TaskPlan], settings: SweepSettings, progress: Callable[[list[PlannedTask]], Any] | None,
           resume: bool) -> RunResult:
    """Run (or resume) the sweep of the stale tasks, without a bundle (retune writes its own)."""
    tasks = [p.planned for p in stale]
    if progress is None:
        return run_sweep(tasks, settings, None, resume=resume)
    with progress(tasks) as shown:
        return run_sweep(tasks, settings, None, resume=resume, on_record=shown.update)


def sweep_stale(stale: Sequence[TaskPlan], sweep_settings: SweepSettings, settings: RetuneSettings,
                progress: Callable[[list[PlannedTask]], Any] | None) -> RunResult:
    """Sweep the stale tasks warm-started; a second pass, up to the space's budget, where the landscape moved."""
    settings_now = dataclasses.replace(sweep_settings, warm_start={p.key: p.warm for p in stale if p.warm})
    result = _sweep(stale, settings_now, progress, resume=False)
    by_task = _by_task(result.records)
    moved = [p for p in stale if settings.escalate and p.planned.trials < p.planned.space.trials
             and landscape_moved(p, decide(p, by_task.get(p.key, []), settings.noise), settings.noise)]
    if not moved:
        return result
    for p in moved:
        p.planned, p.escalated = dataclasses.replace(p.planned, trials=p.planned.space.trials), True
    return _sweep(stale, settings_now, progress, resume=True)


def retune(planned: Sequence[PlannedTask], previous: Previous, sweep_settings: SweepSettings,
           key: Ed25519PrivateKey, settings: RetuneSettings = RetuneSettings(),
           progress: Callable[[list[PlannedTask]], Any] | None = None) -> RetuneResult:
    """Probe, retune the stale tasks warm-started, decide, write the signed bundle and the report.

    `progress(planned)`, when given, returns a context manager with an `update(record)` method
    (e.g. `farm.run.progress.SweepProgress`) that sees the stale tasks' trials.
    """
    if not sweep_settings.scale_up:
        return _retune(planned, previous, sweep_settings, key, settings, progress)
    # --scale-up once for the whole retune (its probe, sweep and escalation each run a sweep): the
    # hosts stay asked for until the retune ends
    scaled, sigterm = scaling.ask([p.task.target for p in planned], sweep_settings.scale_up,
                                  sweep_settings.node_labels, sweep_settings.scale_up_wait_s, sweep_settings.address)
    try:
        return _retune(planned, previous, dataclasses.replace(sweep_settings, scale_up=None), key, settings, progress)
    finally:
        scaling.give_back(scaled, sigterm)


def _retune(planned: Sequence[PlannedTask], previous: Previous, sweep_settings: SweepSettings,
            key: Ed25519PrivateKey, settings: RetuneSettings,
            progress: Callable[[list[PlannedTask]], Any] | None) -> RetuneResult:
    run_dir = Path(sweep_settings.run_dir)
    existed = run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        environment = probe(planned, sweep_settings)
    except FarmError:   # bad input found on the way (no such cluster, no pool for a target): no trace left
        if not existed:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    if sweep_settings.runnable_only:   # no --target: the targets the cluster cannot run are left out (noted),
        #                                their previous rows carried as they are
        planned = [p for p in planned if p.task.key in environment]
    plans = plan_tasks(planned, previous, environment, settings)
    stale = [p for p in plans if p.stale]
    records: list[TrialRecord] = []
    run_id = run_dir.name
    fresh_rows: dict[str, dict[str, Any]] = {}
    if stale:
        result = sweep_stale(stale, sweep_settings, settings, progress)
        records, run_id = result.records, result.run_id
        fresh_rows = {r["task_key"]: r for r in result.rows}
    by_task = _by_task(records)

    replaced: set[tuple[str, str | None]] = set()
    dropped_trials: set[tuple[str, str | None]] = set()
    new_rows: list[dict[str, Any]] = []
    tasks_report = []
    for plan in plans:
        if not plan.stale:
            tasks_report.append(task_report(plan, None, plan.previous, [], settings))
            continue
        decision = decide(plan, by_task.get(plan.key, []), settings.noise)
        row = fresh_rows[plan.key]
        if decision.decision in (KEPT, REGRESSED):
            row = _with_measurement(row, decision.chosen)
        new_rows.append(row)
        if plan.previous is not None:
            replaced.add((plan.key, plan.previous.get("device_kind")))
            dropped_trials.add((plan.key, plan.previous.get("run_id")))
        tasks_report.append(task_report(plan, decision, row, by_task.get(plan.key, []), settings))

    carried = [r for r in previous.rows if (r["task_key"], r.get("device_kind")) not in replaced]
    rows = sorted(carried + new_rows, key=lambda r: (r["task_key"], str(r.get("device_kind"))))
    trials = [t for t in previous.trials if (t.task_key, t.run_id) not in dropped_trials] + records
    blocked = [t["task_key"] for t in tasks_report if t["blocks_rollout"]]
    counts = Counter(t["decision"] for t in tasks_report)
    exit_code = EXIT_BLOCKED if blocked else 0
    meta = {"run_ids": sorted({r["run_id"] for r in rows if r.get("run_id")}),
            "retuned_from": previous.manifest.get("bundle_id"),
            "retune": {"decisions": dict(sorted(counts.items())), "blocked": blocked}}
    bundle = artifacts.write_bundle(run_dir / BUNDLE_DIR, rows, trials, key, meta)
    manifest = json.loads((bundle / artifacts.MANIFEST).read_text())
    report = {
        "created": artifacts.now(), "run_dir": str(run_dir), "run_id": run_id,
        "previous_bundle": {"path": previous.path, "bundle_id": previous.manifest.get("bundle_id"),
                            "created": previous.manifest.get("created")},
        "bundle": {"path": str(bundle), "bundle_id": manifest["bundle_id"],
                   "signer_key_id": signing.key_id(key.public_key())},
        "max_regression": settings.max_regression, "noise": settings.noise, "top": settings.top,
        "exit_code": exit_code, "blocked": blocked, "decisions": dict(sorted(counts.items())),
        "retuned": len(stale), "carried": len(plans) - len(stale),
        "other_rows_carried": len(carried) - (len(plans) - len(stale)),
        "trials": sum(t["trials"] for t in tasks_report),
        "measured_trials": sum(1 for r in records if r.outcome in outcomes.MEASURED),
        "cold_budget": sum(p.planned.space.trials for p in stale),
        "tasks": tasks_report,
    }
    markdown = to_markdown(report)
    _write_text(run_dir / REPORT_JSON, json.dumps(report, indent=2, default=str))
    _write_text(run_dir / REPORT_MD, markdown)
    return RetuneResult(run_dir, bundle, report, exit_code, markdown)


def _with_measurement(row: dict[str, Any], record: TrialRecord) -> dict[str, Any]:
    """A configs row whose winner is `record` (the kept previous winner, measured under the new software)."""
    updated = dict(row, status="ok", config=record.config)
    for name in ("median_s", "spread", "min_s", "n_timed", "numerics_error"):
        updated[name] = getattr(record, name)
    updated["device_kind"] = record.device_kind or row.get("device_kind")
    return updated


def _by_task(records: Sequence[TrialRecord]) -> Mapping[str, list[TrialRecord]]:
    by_task: dict[str, list[TrialRecord]] = {}
    for record in records:
        by_task.setdefault(record.task_key, []).append(record)
    return by_task


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
