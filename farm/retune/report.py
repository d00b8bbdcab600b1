"""The retune report: per task the old and new time, their ratio, the decision and why it was
retuned; as JSON (RUN_DIR/retune.json) and Markdown (RUN_DIR/retune.md)."""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from farm.bundle.records import TrialRecord
from farm.measure import outcomes
from farm.retune.planning import TaskPlan
from farm.retune.rules import (
    CARRIED,
    DECISIONS,
    FAILED,
    REPAIRED,
    Decision,
    RetuneSettings,
    Timing,
    blocks_rollout,
    faster_beyond_noise,
    first_line,
)
from farm.run.progress import format_seconds

REPORT_JSON = "retune.json"
REPORT_MD = "retune.md"


def task_report(plan: TaskPlan, decision: Decision | None, row: Mapping[str, Any] | None,
                records: Sequence[TrialRecord], settings: RetuneSettings) -> dict[str, Any]:
    """One task's line of the report (`decision` None: carried over, not measured)."""
    old = plan.previous if plan.previous and plan.previous.get("status") == "ok" else None
    new = row if row and row.get("status") == "ok" else None
    old_t, new_t = Timing.of(old), Timing.of(new)
    measured = decision is not None  # a carried row was not measured again
    ratio = new_t.median_s / old_t.median_s if measured and old_t and new_t and old_t.median_s > 0 else None
    slower = measured and faster_beyond_noise(old_t, new_t, settings.noise)
    name = decision.decision if decision else CARRIED
    blocks = blocks_rollout(name, ratio, slower, settings.max_regression)
    baseline = decision.baseline if decision else None
    counts = Counter(r.outcome for r in records)
    return {
        "task_key": plan.key, "kernel": plan.planned.task.kernel, "device_kind": plan.device_kind,
        "decision": name, "stale_because": plan.changes,
        "flagged": name in (REPAIRED, FAILED), "note": decision.note if decision else None,
        "old_config": old and old["config"], "old_median_s": old and old.get("median_s"),
        "old_spread": old and old.get("spread"), "old_run_id": plan.previous and plan.previous.get("run_id"),
        "baseline_outcome": baseline and baseline.outcome, "baseline_median_s": baseline and baseline.median_s,
        "baseline_spread": baseline and baseline.spread,
        "baseline_error": baseline and baseline.error and first_line(baseline.error, 1000),
        "new_config": new and new["config"], "new_median_s": new and new.get("median_s"),
        "new_spread": new and new.get("spread"), "ratio": ratio, "slower_beyond_noise": slower,
        "blocks_rollout": bool(blocks), "warm_start": len(plan.warm), "escalated": plan.escalated,
        "trials": sum(counts[o] for o in (*outcomes.MEASURED, outcomes.CACHED)),
        "budget": plan.planned.trials if plan.stale else 0,
        "fingerprint_sha256": (row or {}).get("fingerprint_sha256"),
    }


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
