"""Nightly retuning: retune only the tasks whose software fingerprint changed, warm-started.

`retune` runs these steps:

1. Read the previous bundle, verified (a run, bundle or `farm pull` deployment folder, or an archive).
2. Probe: one worker per pool reports its software and device kind (a sweep of no trials, in
   RUN_DIR/probe/). With each kernel's source this is every planned task's current fingerprint
   (`farm.bundle.fingerprint`).
3. A planned task is *stale* when the previous bundle has no `ok` row for it on this device kind
   (it is `new`) or when that row's fingerprint differs from the current one (or is missing).
   Every other row of the previous bundle is carried over unchanged.
4. Stale tasks are swept. Each study is warm-started (`SweepSettings.warm_start`): trial 0 is
   the previous winner (the *baseline*: the old config under the new software), then the next
   best configs of the previous winner's run, then the kernel's default; the sampler explores
   the rest of the budget (default: a quarter of the space's budget, at least the warm start + 2;
   `new` tasks get the space's budget). *Escalation*: where the previous winner now fails or is
   slower than its previous time beyond noise, the landscape moved, and a second pass resumes
   the sweep up to the space's full budget for those tasks (nothing is measured twice).
5. A decision per task (the promotion rule):
   - `new`: no usable previous winner (no row, no valid config, or the winner is outside the
     current search space); the sweep's winner is taken.
   - `repaired`: the previous winner now fails (compile error, wrong result, OOM, pruned, ...);
     the new winner replaces it and the task is flagged.
   - `failed`: the previous winner fails and no config works (row `no_valid_config`; flagged).
   - `improved`: a config is faster than the baseline beyond noise; it replaces the old winner.
   - `regressed`: nothing beat the baseline beyond noise, and the baseline is slower than the
     previous bundle's time beyond noise; the old config is kept, with its new time.
   - `kept`: nothing beat the baseline beyond noise and it is not slower than before; the old
     config is kept, with its new time.
   - `carried`: not stale; the previous row is copied unchanged (not measured).
6. The new signed bundle (RUN_DIR/bundle) and a report (RUN_DIR/retune.json, RUN_DIR/retune.md).

Noise. A is *faster than B beyond noise* when A's median, raised by the relative noise floor
(`--noise`, default 2%), is still below B's fastest sample: median_A * (1 + noise) < min_B (B's
median * (1 - noise) when it has no minimum). Timing noise only ever adds time, so B's fastest
sample is the best B can do, and the median is what A does typically; both are order statistics
that a slow outlier cannot move, unlike the spread (IQR / median), which with few samples one
outlier sets (with 5 samples, the slowest sample is half of the upper quartile), so spreads are
reported but not used.

Gate. A task *blocks the rollout* when it is `failed`, or when its new time over the previous
bundle's time exceeds 1 + max_regression *and* the new time is slower beyond noise (whatever
the decision: an `improved` or `repaired` task that is still slower than before blocks too).
`farm retune` exits with EXIT_BLOCKED (3) when any task blocks.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from farm.bundle import artifacts, fingerprint, select, signing
from farm.bundle.locate import open_bundle
from farm.bundle.trust import Trust
from farm.errors import BundleError, FarmError
from farm.measure import outcomes
from farm.run import driver
from farm.run.progress import format_seconds
from farm.search import studies
from farm.search.plan import PlannedTask
from farm.tasks import config_json

NEW, REPAIRED, FAILED, IMPROVED, REGRESSED, KEPT, CARRIED = (
    "new", "repaired", "failed", "improved", "regressed", "kept", "carried")
DECISIONS = (NEW, REPAIRED, FAILED, IMPROVED, REGRESSED, KEPT, CARRIED)
EXIT_BLOCKED = 3
PROBE_DIR = "probe"
BUNDLE_DIR = "bundle"
REPORT_JSON = "retune.json"
REPORT_MD = "retune.md"
# Default budget of a stale task: this share of the space's budget, at least the warm start + EXPLORE.
BUDGET_SHARE = 0.25
EXPLORE = 2


@dataclasses.dataclass(frozen=True)
class RetuneSettings:
    """What `farm retune` does beyond a sweep's settings."""

    top: int = 3                      # previous configs queued per stale task: the winner and the next best
    trials: int | None = None         # budget per stale task (default: see `budget`)
    escalate: bool = True             # a second pass, up to the space's budget, where the landscape moved
    noise: float = 0.02               # noise floor, relative
    max_regression: float = 0.05      # the gate: new / old time above 1 + this (beyond noise) blocks


@dataclasses.dataclass(frozen=True)
class Previous:
    """The previous bundle, verified and read."""

    path: str
    manifest: dict[str, Any]
    rows: list[dict[str, Any]]
    trials: list[dict[str, Any]]


@dataclasses.dataclass
class TaskPlan:
    """A planned task, its current fingerprint, its previous row and why (whether) it is retuned."""

    planned: PlannedTask
    device_kind: str | None
    fingerprint: dict[str, Any]
    previous: dict[str, Any] | None
    changes: list[str]
    warm: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    winner_in_space: bool = True
    escalated: bool = False

    @property
    def key(self) -> str:
        """The task key."""
        return self.planned.task.key

    @property
    def stale(self) -> bool:
        """Whether the task is retuned."""
        return bool(self.changes)


@dataclasses.dataclass(frozen=True)
class Timing:
    """A measurement's median, relative spread and fastest sample, for comparisons beyond noise."""

    median_s: float
    spread: float = 0.0
    min_s: float | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any] | None) -> Timing | None:
        """The timing of a configs row or trial record (None when it has no median)."""
        if not row or row.get("median_s") is None:
            return None
        return cls(float(row["median_s"]), float(row.get("spread") or 0.0),
                   None if row.get("min_s") is None else float(row["min_s"]))

    def upper(self, noise: float) -> float:
        """The slow end of the measurement: its median raised by the noise floor."""
        return self.median_s * (1 + noise)

    def lower(self, noise: float) -> float:
        """The fast end of the measurement: its fastest sample (else its median lowered by the noise floor)."""
        return self.median_s * (1 - noise) if self.min_s is None else min(self.min_s, self.median_s)


def faster_beyond_noise(a: Timing | None, b: Timing | None, noise: float) -> bool:
    """Whether `a` is faster than `b` beyond noise: A's median * (1 + noise) below B's fastest sample."""
    return a is not None and b is not None and a.upper(noise) < b.lower(noise)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the promotion rule chose for a retuned task: the kept record and the baseline."""

    decision: str
    chosen: dict[str, Any] | None      # the record whose config goes into the bundle (None: no valid config)
    baseline: dict[str, Any] | None    # the previous winner's record under the new software (ok or failed)
    note: str | None = None


def decide(plan: TaskPlan, records: Sequence[dict[str, Any]], noise: float) -> Decision:
    """Apply the promotion rule (module docstring) to a retuned task's trial records."""
    best = select.best_record(records)
    row = plan.previous
    if row is None or row.get("status") != "ok" or not row.get("config"):
        return Decision(NEW, best, None)
    if not plan.winner_in_space:
        return Decision(NEW, best, None, "the previous winner is not in the current search space")
    old_key = config_json(json.loads(row["config"]))
    own = [r for r in records if r["config"] == old_key]
    baseline = select.best_record(own)
    if baseline is None:
        failure = next((r for r in own if r["outcome"] != outcomes.CACHED), own[0] if own else None)
        what = f"{failure['outcome']}: {first_line(failure.get('error'))}" if failure else "not measured"
        return Decision(REPAIRED if best else FAILED, best, failure, f"previous winner now {what}")
    if best is not None and best["config"] != old_key and \
            faster_beyond_noise(Timing.of(best), Timing.of(baseline), noise):
        return Decision(IMPROVED, best, baseline)
    slower = faster_beyond_noise(Timing.of(row), Timing.of(baseline), noise)
    return Decision(REGRESSED if slower else KEPT, baseline, baseline)


def landscape_moved(plan: TaskPlan, decision: Decision, noise: float) -> bool:
    """Whether the previous winner now fails, or is slower than its previous time beyond noise."""
    if decision.decision in (NEW, CARRIED) or decision.baseline is None:
        return False
    if decision.baseline["outcome"] != outcomes.OK:
        return True
    return faster_beyond_noise(Timing.of(plan.previous), Timing.of(decision.baseline), noise)


def first_line(text: str | None, limit: int = 200) -> str:
    """The first line of an error text, shortened."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else "-"
    return line if len(line) <= limit else line[:limit - 3] + "..."


# -- reading the previous bundle ------------------------------------------------------------------
def load_previous(path: str | Path, trust: Trust, *, allow_unsigned: bool = False) -> Previous:
    """The previous bundle (run, bundle or `farm pull` deployment folder, or archive), verified."""
    try:
        with open_bundle(path, trust, allow_unsigned=allow_unsigned) as opened:
            return Previous(str(path), opened.manifest, opened.configs().to_pylist(), opened.trials().to_pylist())
    except BundleError as err:  # exit 1: failed verification
        raise BundleError(f"--previous {err}") from None
    except FarmError as err:
        raise FarmError(f"--previous {err}") from None


# -- planning --------------------------------------------------------------------------------------
def probe(planned: Sequence[PlannedTask], settings: driver.SweepSettings) -> dict[str, dict[str, Any]]:
    """Each task's `Worker.info()` (software, device kind) from one worker per pool: a sweep of no trials."""
    quiet = dataclasses.replace(settings, run_dir=Path(settings.run_dir) / PROBE_DIR, workers=1, warm_start={})
    sweep = driver.Sweep([dataclasses.replace(p, trials=0) for p in planned], quiet)
    sweep.run()
    return {key: sweep.pool_info.get(pool, {}) for key, pool in sweep.task_pool.items()}


def previous_row(previous: Previous, task_key: str, device_kind: str | None) -> dict[str, Any] | None:
    """The newest previous row of a task on a device kind."""
    rows = [r for r in previous.rows if r["task_key"] == task_key and r.get("device_kind") == device_kind]
    return max(rows, key=lambda r: str(r.get("created") or "")) if rows else None


def warm_start(plan: TaskPlan, previous: Previous, top: int) -> tuple[list[dict[str, Any]], bool]:
    """The configs to queue first (previous winner, then the next best of its run) valid in the space now.

    Returns them and whether the previous winner itself is valid in the current space.
    """
    row = plan.previous
    if row is None or row.get("status") != "ok" or not row.get("config"):
        return [], True
    task, space = plan.planned.task, plan.planned.space
    params = space.params_for(task.target)

    def valid(config: dict[str, Any]) -> bool:
        return studies.in_space(config, params) and space.violated(config, task.shape, task.dtype,
                                                                   task.target) is None

    winner = json.loads(row["config"])
    ok = [t for t in previous.trials if t["task_key"] == task.key and t.get("outcome") == outcomes.OK
          and t.get("median_s") is not None and t.get("device_kind") in (None, plan.device_kind)]
    same_run = [t for t in ok if t.get("run_id") == row.get("run_id")]
    ranked = sorted(same_run or ok, key=lambda t: (t["median_s"], t.get("spread") or 0.0))
    configs: list[dict[str, Any]] = [winner]
    for trial in ranked:
        if len(configs) >= top:
            break
        config = json.loads(trial["config"])
        if config not in configs:
            configs.append(config)
    return [c for c in configs if valid(c)], valid(winner)


def budget(plan: TaskPlan, settings: RetuneSettings) -> int:
    """Trials for a stale task: --trials, else a share of the space's budget, at least the warm start + EXPLORE.

    The default never exceeds the space's budget, except to measure every warm-start config.
    `new` tasks (no warm start) get the space's budget, as in a cold sweep.
    """
    if not plan.warm:
        return plan.planned.trials
    if settings.trials:
        return settings.trials
    wanted = max(len(plan.warm) + 1 + EXPLORE, math.ceil(BUDGET_SHARE * plan.planned.trials))
    return max(len(plan.warm), min(plan.planned.trials, wanted))


def plan_tasks(planned: Sequence[PlannedTask], previous: Previous, environment: Mapping[str, Mapping[str, Any]],
               settings: RetuneSettings) -> list[TaskPlan]:
    """Each planned task's current fingerprint, previous row, staleness, warm start and budget."""
    sources: dict[str, dict[str, str]] = {}
    plans = []
    for p in planned:
        info = environment.get(p.task.key, {})
        if p.task.kernel not in sources:
            sources[p.task.kernel] = fingerprint.kernel_sources(p.task.kernel)
        current = fingerprint.for_task(p.task.kernel, info, sources[p.task.kernel])
        device_kind = info.get("device_kind")
        row = previous_row(previous, p.task.key, device_kind)
        if row is None:
            changes = [f"not in the previous bundle for device kind {device_kind}"]
        else:
            changes = fingerprint.changes(fingerprint.parse(row.get("fingerprint")), current)
        plan = TaskPlan(p, device_kind, current, row, changes)
        if plan.stale:
            plan.warm, plan.winner_in_space = warm_start(plan, previous, settings.top)
            plan.planned = dataclasses.replace(p, trials=budget(plan, settings))
        plans.append(plan)
    return plans


# -- the run ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class RetuneResult:
    """What `retune` wrote and decided."""

    run_dir: Path
    bundle: Path
    report: dict[str, Any]
    exit_code: int
    markdown: str


def _with_measurement(row: dict[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
    """A configs row whose winner is `record` (the kept previous winner, measured under the new software)."""
    updated = dict(row, status="ok", config=record["config"])
    for name in ("median_s", "spread", "min_s", "n_timed", "numerics_error"):
        updated[name] = record.get(name)
    updated["device_kind"] = record.get("device_kind") or row.get("device_kind")
    return updated


def _task_report(plan: TaskPlan, decision: Decision | None, row: Mapping[str, Any] | None,
                 records: Sequence[dict[str, Any]], settings: RetuneSettings) -> dict[str, Any]:
    old = plan.previous if plan.previous and plan.previous.get("status") == "ok" else None
    new = row if row and row.get("status") == "ok" else None
    old_t, new_t = Timing.of(old), Timing.of(new)
    measured = decision is not None  # a carried row was not measured again
    ratio = new_t.median_s / old_t.median_s if measured and old_t and new_t and old_t.median_s > 0 else None
    slower = measured and faster_beyond_noise(old_t, new_t, settings.noise)
    name = decision.decision if decision else CARRIED
    blocks = name == FAILED or (ratio is not None and ratio > 1 + settings.max_regression and slower)
    baseline = decision.baseline if decision else None
    counts = Counter(r["outcome"] for r in records)
    return {
        "task_key": plan.key, "kernel": plan.planned.task.kernel, "device_kind": plan.device_kind,
        "decision": name, "stale_because": plan.changes,
        "flagged": name in (REPAIRED, FAILED), "note": decision.note if decision else None,
        "old_config": old and old["config"], "old_median_s": old and old.get("median_s"),
        "old_spread": old and old.get("spread"), "old_run_id": plan.previous and plan.previous.get("run_id"),
        "baseline_outcome": baseline and baseline["outcome"], "baseline_median_s": baseline and baseline.get("median_s"),
        "baseline_spread": baseline and baseline.get("spread"),
        "baseline_error": baseline and baseline.get("error") and first_line(baseline.get("error"), 1000),
        "new_config": new and new["config"], "new_median_s": new and new.get("median_s"),
        "new_spread": new and new.get("spread"), "ratio": ratio, "slower_beyond_noise": slower,
        "blocks_rollout": bool(blocks), "warm_start": len(plan.warm), "escalated": plan.escalated,
        "trials": sum(counts[o] for o in (*outcomes.MEASURED, outcomes.CACHED)),
        "budget": plan.planned.trials if plan.stale else 0,
        "fingerprint_sha256": (row or {}).get("fingerprint_sha256"),
    }


def retune(planned: Sequence[PlannedTask], previous: Previous, sweep_settings: driver.SweepSettings,
           key: Ed25519PrivateKey, settings: RetuneSettings = RetuneSettings(),
           progress: Callable[[list[PlannedTask]], Any] | None = None) -> RetuneResult:
    """Probe, retune the stale tasks warm-started, decide, write the signed bundle and the report.

    `progress(planned)`, when given, returns a context manager with an `update(record)` method
    (e.g. `farm.run.progress.SweepProgress`) that sees the stale tasks' trials.
    """
    run_dir = Path(sweep_settings.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    environment = probe(planned, sweep_settings)
    plans = plan_tasks(planned, previous, environment, settings)
    stale = [p for p in plans if p.stale]
    records: list[dict[str, Any]] = []
    run_id = run_dir.name
    sweep_env: dict[str, dict[str, Any]] = {}
    by_task: dict[str, list[dict[str, Any]]] = {}
    if stale:
        settings_now = dataclasses.replace(sweep_settings, warm_start={p.key: p.warm for p in stale if p.warm})
        records, sweep = _sweep(stale, settings_now, progress, resume=False)
        by_task = _by_task(records)
        # Second pass where the previous winner broke or slowed down: the sweep resumes (nothing is
        # measured twice) with the space's full budget for those tasks.
        moved = [p for p in stale if settings.escalate and p.planned.trials < p.planned.space.trials
                 and landscape_moved(p, decide(p, by_task.get(p.key, []), settings.noise), settings.noise)]
        if moved:
            for p in moved:
                p.planned, p.escalated = dataclasses.replace(p.planned, trials=p.planned.space.trials), True
            records, sweep = _sweep(stale, settings_now, progress, resume=True)
            by_task = _by_task(records)
        run_id = sweep.run_id
        sweep_env = {k: sweep.pool_info.get(pool, {}) for k, pool in sweep.task_pool.items()}
    created = artifacts.now()
    fresh_rows = {r["task_key"]: r for r in select.winner_rows([p.planned.task for p in stale], records, run_id=run_id,
                                                               created=created, environment=sweep_env)}

    replaced: set[tuple[str, str | None]] = set()
    dropped_trials: set[tuple[str, str | None]] = set()
    new_rows: list[dict[str, Any]] = []
    tasks_report = []
    for plan in plans:
        if not plan.stale:
            tasks_report.append(_task_report(plan, None, plan.previous, [], settings))
            continue
        decision = decide(plan, by_task.get(plan.key, []), settings.noise)
        row = fresh_rows[plan.key]
        if decision.decision in (KEPT, REGRESSED):
            row = _with_measurement(row, decision.chosen)
        new_rows.append(row)
        if plan.previous is not None:
            replaced.add((plan.key, plan.previous.get("device_kind")))
            dropped_trials.add((plan.key, plan.previous.get("run_id")))
        tasks_report.append(_task_report(plan, decision, row, by_task.get(plan.key, []), settings))

    carried = [r for r in previous.rows if (r["task_key"], r.get("device_kind")) not in replaced]
    rows = sorted(carried + new_rows, key=lambda r: (r["task_key"], str(r.get("device_kind"))))
    trials = [t for t in previous.trials if (t["task_key"], t.get("run_id")) not in dropped_trials] + records
    blocked = [t["task_key"] for t in tasks_report if t["blocks_rollout"]]
    counts = Counter(t["decision"] for t in tasks_report)
    exit_code = EXIT_BLOCKED if blocked else 0
    run_ids = sorted({r["run_id"] for r in rows if r.get("run_id")})
    meta = {"run_ids": run_ids, "retuned_from": previous.manifest.get("bundle_id"),
            "retune": {"decisions": dict(sorted(counts.items())), "blocked": blocked}}
    bundle = artifacts.write_bundle(run_dir / BUNDLE_DIR, rows, trials, key, meta)
    manifest = json.loads((bundle / artifacts.MANIFEST).read_text())
    measured = sum(1 for r in records if r["outcome"] in outcomes.MEASURED)
    report = {
        "created": created, "run_dir": str(run_dir), "run_id": run_id,
        "previous_bundle": {"path": previous.path, "bundle_id": previous.manifest.get("bundle_id"),
                            "created": previous.manifest.get("created")},
        "bundle": {"path": str(bundle), "bundle_id": manifest["bundle_id"],
                   "signer_key_id": signing.key_id(key.public_key())},
        "max_regression": settings.max_regression, "noise": settings.noise, "top": settings.top,
        "exit_code": exit_code, "blocked": blocked, "decisions": dict(sorted(counts.items())),
        "retuned": len(stale), "carried": len(plans) - len(stale),
        "other_rows_carried": len(carried) - (len(plans) - len(stale)),
        "trials": sum(t["trials"] for t in tasks_report), "measured_trials": measured,
        "cold_budget": sum(p.planned.space.trials for p in stale),
        "tasks": tasks_report,
    }
    markdown = to_markdown(report)
    _write_text(run_dir / REPORT_JSON, json.dumps(report, indent=2, default=str))
    _write_text(run_dir / REPORT_MD, markdown)
    return RetuneResult(run_dir, bundle, report, exit_code, markdown)


def _sweep(stale: Sequence[TaskPlan], settings: driver.SweepSettings,
           progress: Callable[[list[PlannedTask]], Any] | None, resume: bool) -> tuple[list[dict[str, Any]], Any]:
    """Run (or resume) the sweep of the stale tasks; every trial record and the Sweep."""
    tasks = [p.planned for p in stale]
    if progress is None:
        sweep = driver.Sweep(tasks, settings)
        return sweep.run(resume=resume), sweep
    with progress(tasks) as shown:
        sweep = driver.Sweep(tasks, settings, on_record=shown.update)
        return sweep.run(resume=resume), sweep


def _by_task(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_task: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_task.setdefault(record["task_key"], []).append(record)
    return by_task


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


# -- the report ------------------------------------------------------------------------------------
def _config_text(text: str | None) -> str:
    if not text:
        return "-"
    return " ".join(f"{k}={v}" for k, v in json.loads(text).items())


def to_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: a summary, the gate, a table of tasks, the flagged tasks."""
    prev, new = report["previous_bundle"], report["bundle"]
    decisions = ", ".join(f"{n} {report['decisions'][n]}" for n in DECISIONS if report["decisions"].get(n))
    lines = [
        "# Retune report", "",
        f"- previous bundle: `{prev['bundle_id']}` ({prev['path']}, created {prev['created']})",
        f"- new bundle: `{new['bundle_id']}` ({new['path']}, signed by key {new['signer_key_id']})",
        f"- tasks: {report['retuned']} retuned, {report['carried']} carried over unchanged"
        + (f", {report['other_rows_carried']} rows of other tasks carried over" if report["other_rows_carried"] else "")
        + f"; decisions: {decisions or '-'}",
        f"- trials: {report['trials']} ({report['measured_trials']} measured); a cold sweep of the retuned tasks "
        f"would take {report['cold_budget']}",
        f"- gate: max regression {report['max_regression']:.0%} beyond noise (floor {report['noise']:.0%}): "
        + (f"**BLOCKED** (exit {report['exit_code']}): {', '.join(report['blocked'])}" if report["blocked"] else "pass"),
        "",
        "| task | decision | old time | new time | new / old | old config now | old config | new config | why retuned |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in report["tasks"]:
        ratio = f"{t['ratio']:.2f}x" if t["ratio"] is not None else "-"
        if t["blocks_rollout"]:
            ratio += " **blocks**"
        baseline = format_seconds(t["baseline_median_s"]) if t["baseline_median_s"] is not None else (
            t["baseline_outcome"] or "-")
        same = t["new_config"] == t["old_config"]
        decision = t["decision"] + (" (escalated)" if t["escalated"] else "")
        lines.append(f"| {t['task_key']} | {decision} | {format_seconds(t['old_median_s'])} | "
                     f"{format_seconds(t['new_median_s'])} | {ratio} | {baseline} | {_config_text(t['old_config'])} | "
                     f"{'same' if same and t['old_config'] else _config_text(t['new_config'])} | "
                     f"{'; '.join(t['stale_because']) or '-'} |")
    flagged = [t for t in report["tasks"] if t["flagged"] or t["note"]]
    if flagged:
        lines += ["", "## Flagged", ""]
        lines += [f"- {t['task_key']} ({t['decision']}): {t['note']}" for t in flagged]
    return "\n".join(lines) + "\n"
