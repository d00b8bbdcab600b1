"""Nightly retuning with the real parts: Ray, Optuna, Parquet, interpret mode, signed bundles.

Upgrades are simulated two ways: FARM_FINGERPRINT_OVERRIDE replaces the recorded versions, and a
kernel module copied to a folder on the workers' import path is edited. The fixture kernel
`tests.fixtures.versioned_softmax` behaves as a "software file" says (speeds, broken variants).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from farm import cli
from farm.bundle import artifacts, fingerprint, signing, trust
from farm.bundle.records import TrialRecord
from farm.errors import FarmError
from farm.measure import outcomes
from farm.retune import planning, rules
from farm.retune.report import REPORT_JSON, REPORT_MD, task_report
from farm.search import plan, spaces
from farm.search.plan import PlannedTask
from farm.search.searcher import outside_trial
from farm.tasks import TuningTask, config_json
from tests.fixtures import versioned_softmax

REPO = Path(__file__).resolve().parent.parent
SPACE = """\
kernel: {kernel}
dtypes: [float32]
shapes: {shapes}
targets: [interpret]
params:
  block_rows: {{values: [8]}}
  variant: {{values: [a, b, c]}}
  software: {{values: ["{software}"]}}
sampler: grid
trials: 3
"""
VERSIONED = "tests.fixtures.versioned_softmax"
SOURCE_KERNEL = "retune_src.kernel"
NEW_JAX = {fingerprint.OVERRIDE_ENV: json.dumps({"jax": "0.99.0"})}


def _space(folder: Path, name: str, kernel: str, shapes: list[list[int]], software: Path) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(SPACE.format(kernel=kernel, shapes=json.dumps(shapes), software=software))
    return path


def _key(kernel: str, shape: str) -> str:
    return f"{kernel}/{shape}/float32/interpret"


@pytest.fixture(scope="module")
def farm(tmp_path_factory, worker_modules, ray_local, signing_key):
    """A previous bundle: a cold sweep of the versioned kernel (3 shapes) and a copied kernel (1 shape)."""
    root = tmp_path_factory.mktemp("retune")
    package = worker_modules / SOURCE_KERNEL.split(".")[0]
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copyfile(REPO / "tests" / "fixtures" / "versioned_softmax.py", package / "kernel.py")
    software = root / "software.json"  # absent: the old software
    os.environ[versioned_softmax.SOFTWARE_ENV] = str(software)   # the kernels' default names it too
    spaces = {
        "versioned": _space(root, "versioned", VERSIONED, [[16, 128], [32, 128], [64, 128]], software),
        "source": _space(root, "source", SOURCE_KERNEL, [[16, 128]], software),
        "source2": _space(root, "source2", SOURCE_KERNEL, [[16, 128], [32, 128]], software),
        "versioned64": _space(root, "versioned64", VERSIONED, [[64, 128]], software),
    }
    previous = root / "previous"
    # One worker here and in every retune below: on a 2-core machine a second worker's compiles
    # would land inside the first one's timing samples (the rule compares times across runs).
    assert cli.main(["sweep", str(spaces["versioned"]), str(spaces["source"]), "--out", str(previous),
                     "--key", str(signing_key[0]), "--quiet", "--repetitions", "3", "--workers", "1"]) == 0
    rows = {r["task_key"]: r for r in pq.read_table(previous / "bundle" / "configs.parquet").to_pylist()}
    assert {json.loads(r["config"])["variant"] for r in rows.values()} == {"a"}  # 5 ms beats 15 and 25
    yield {"root": root, "software": software, "spaces": spaces, "previous": previous, "rows": rows,
           "package": package}
    os.environ.pop(versioned_softmax.SOFTWARE_ENV)


def _retune(farm, signing_key, name, *spaces, extra=()):
    out = farm["root"] / name
    code = cli.main(["retune", *map(str, spaces), "--previous", str(farm["previous"]), "--trust", str(signing_key[1]),
                     "--key", str(signing_key[0]), "--out", str(out), "--quiet", "--repetitions", "3", "--workers", "1",
                     *extra])
    report = json.loads((out / REPORT_JSON).read_text())
    assert report["exit_code"] == code
    trust.verify(out / "bundle", trust.load_trust([signing_key[1]]))
    trials = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()] \
        if (out / "trials.jsonl").exists() else []
    rows = {r["task_key"]: r for r in pq.read_table(out / "bundle" / "configs.parquet").to_pylist()}
    return code, report, {t["task_key"]: t for t in report["tasks"]}, trials, rows


def _variant(config: str | None) -> str | None:
    return json.loads(config)["variant"] if config else None


def test_sweep_bundles_record_a_fingerprint(farm):
    row = farm["rows"][_key(VERSIONED, "16x128")]
    recorded = json.loads(row["fingerprint"])
    assert row["fingerprint_sha256"] == fingerprint.digest(recorded)
    assert recorded["jax"] and recorded["pallas_farm"] and recorded["device_kind"] == "cpu"
    assert "python" not in recorded
    assert set(recorded["kernel_source"]) >= {VERSIONED, "kernels.softmax", "kernels.lowering"}


def test_only_tasks_whose_kernel_source_changed_are_retuned(farm, signing_key):
    kernel = farm["package"] / "kernel.py"
    kernel.write_text(kernel.read_text() + "\n# edited: the kernel's source changed\n")
    code, report, tasks, trials, rows = _retune(
        farm, signing_key, "source-changed", farm["spaces"]["versioned"], farm["spaces"]["source2"],
        extra=["--noise", "0.3"])  # same behaviour: only a generous noise floor keeps a busy 2-core box from flaking
    assert code == 0
    src16, src32 = _key(SOURCE_KERNEL, "16x128"), _key(SOURCE_KERNEL, "32x128")
    assert {t["task_key"] for t in trials} == {src16, src32}
    assert tasks[src16]["decision"] == rules.KEPT
    assert tasks[src16]["stale_because"] == [f"kernel source {SOURCE_KERNEL} changed"]
    assert tasks[src32]["decision"] == rules.NEW and tasks[src32]["budget"] == 3
    first = min((t for t in trials if t["task_key"] == src16), key=lambda t: t["trial"])
    assert first["trial"] == 0 and first["config"] == farm["rows"][src16]["config"]
    for shape in ("16x128", "32x128", "64x128"):
        key = _key(VERSIONED, shape)
        assert tasks[key]["decision"] == rules.CARRIED and tasks[key]["trials"] == 0
        assert rows[key] == farm["rows"][key]  # carried over unchanged
    assert rows[src16]["fingerprint"] != farm["rows"][src16]["fingerprint"]
    assert rows[src16]["config"] == farm["rows"][src16]["config"]


def test_upgrade_retunes_warm_started_and_decides(farm, signing_key, monkeypatch):
    monkeypatch.setenv(fingerprint.OVERRIDE_ENV, NEW_JAX[fingerprint.OVERRIDE_ENV])
    farm["software"].write_text(json.dumps({
        "16x128": {"delay_ms": {"a": 5, "b": 2, "c": 25}, "broken": ["a"]},   # the old winner breaks
        "32x128": {"delay_ms": {"a": 15, "b": 2, "c": 25}},                   # another config is now faster
        "64x128": {"delay_ms": {"a": 4, "b": 15, "c": 25}},                   # the old winner is still best
    }))
    try:
        code, report, tasks, trials, rows = _retune(farm, signing_key, "upgrade", farm["spaces"]["versioned"])
    finally:
        farm["software"].unlink()
    assert code == 0, report
    k16, k32, k64 = (_key(VERSIONED, s) for s in ("16x128", "32x128", "64x128"))
    assert {t["task_key"] for t in trials} == {k16, k32, k64}
    for key in (k16, k32, k64):
        old_jax = json.loads(farm["rows"][key]["fingerprint"])["jax"]
        assert tasks[key]["stale_because"] == [f"jax {old_jax} -> 0.99.0"]
        first = next(t for t in trials if t["task_key"] == key and t["trial"] == 0)
        assert first["config"] == farm["rows"][key]["config"]  # the previous winner is measured first
        assert json.loads(rows[key]["fingerprint"])["jax"] == "0.99.0"
    assert tasks[k16]["decision"] == rules.REPAIRED and tasks[k16]["flagged"]
    assert tasks[k16]["baseline_outcome"] == outcomes.COMPILE_ERROR and "not supported" in tasks[k16]["note"]
    assert _variant(rows[k16]["config"]) == "b"
    assert tasks[k32]["decision"] == rules.IMPROVED and _variant(rows[k32]["config"]) == "b"
    assert tasks[k32]["ratio"] < 0.8
    assert tasks[k64]["decision"] == rules.KEPT and rows[k64]["config"] == farm["rows"][k64]["config"]
    assert rows[k64]["median_s"] == tasks[k64]["baseline_median_s"]  # the old config's time under the new software
    assert not report["blocked"] and report["other_rows_carried"] == 1
    assert not any(t["escalated"] for t in tasks.values())  # the budget already covers the space
    src = _key(SOURCE_KERNEL, "16x128")
    assert rows[src] == farm["rows"][src]  # not in the given spaces: carried over unchanged
    markdown = (farm["root"] / "upgrade" / REPORT_MD).read_text()
    assert "| repaired |" in markdown and "## Flagged" in markdown and "gate: " in markdown


def test_a_regression_escalates_then_exits_3(farm, signing_key, monkeypatch, capsys):
    monkeypatch.setenv(fingerprint.OVERRIDE_ENV, NEW_JAX[fingerprint.OVERRIDE_ENV])
    farm["software"].write_text(json.dumps({"*": {"delay_ms": {"a": 25, "b": 35, "c": 45}}}))
    try:  # --trials 1: only the previous winner; it slowed down, so a second pass searches the space's budget
        code, report, tasks, trials, rows = _retune(farm, signing_key, "regressed", farm["spaces"]["versioned64"],
                                                    extra=["--trials", "1"])
    finally:
        farm["software"].unlink()
    key = _key(VERSIONED, "64x128")
    assert code == rules.EXIT_BLOCKED == 3
    assert tasks[key]["decision"] == rules.REGRESSED and tasks[key]["blocks_rollout"]
    assert tasks[key]["escalated"] and tasks[key]["trials"] == 3
    assert [t["trial"] for t in trials] == [0, 1, 2] and trials[0]["config"] == farm["rows"][key]["config"]
    assert tasks[key]["ratio"] > 1.5 and report["blocked"] == [key]
    assert rows[key]["config"] == farm["rows"][key]["config"]  # nothing better: the old config stays
    assert "regressed beyond --max-regression" in capsys.readouterr().err


def test_a_space_narrowed_past_the_previous_winner_keeps_it_as_the_baseline(farm, signing_key, monkeypatch):
    """The user's space no longer lists the deployed winner (variant a), which the kernel still
    runs: the retune measures it first, outside the study, and keeps it where nothing in the
    narrowed space beats it, instead of shipping the narrowed space's best (3x slower) unchecked."""
    monkeypatch.setenv(fingerprint.OVERRIDE_ENV, NEW_JAX[fingerprint.OVERRIDE_ENV])
    narrowed = farm["root"] / "narrowed.yaml"
    narrowed.write_text(farm["spaces"]["versioned64"].read_text().replace("[a, b, c]", "[b, c]"))
    farm["software"].write_text(json.dumps({"*": {"delay_ms": {"a": 5, "b": 15, "c": 25}}}))
    try:
        code, report, tasks, trials, rows = _retune(farm, signing_key, "narrowed", narrowed,
                                                    extra=["--noise", "0.3"])   # a busy 2-core box's timing
    finally:
        farm["software"].unlink()
    key = _key(VERSIONED, "64x128")
    assert code == 0, report
    old = next(t for t in trials if t["config"] == farm["rows"][key]["config"])
    assert old["trial"] == outside_trial(0) and old["outcome"] == outcomes.OK   # the sampler never hears of it
    assert sorted(_variant(t["config"]) for t in trials if t["trial"] >= 0) == ["b", "c"]
    assert tasks[key]["decision"] == rules.KEPT and tasks[key]["baseline_median_s"] == old["median_s"]
    assert rows[key]["config"] == farm["rows"][key]["config"] and not report["blocked"]


# -- the promotion rule and the gate, on synthetic records -----------------------------------------
def _plan(row):
    planned = PlannedTask(TuningTask("k", (8,), "float32", "interpret"), space=None, trials=3)
    return planning.TaskPlan(planned, device_kind="cpu", fingerprint={}, previous=row, changes=["x"], warm=[{"v": 1}])


def _rec(v, outcome=outcomes.OK, median=None, spread=0.01, error=None):
    return TrialRecord.for_task(TuningTask("k", (8,), "float32", "interpret"), v, json.dumps({"v": v}, separators=(",", ":")),
                                outcome, median_s=median, spread=spread, min_s=median and median * 0.99, error=error)


OLD_ROW = {"status": "ok", "config": '{"v":1}', "median_s": 1.0, "spread": 0.01, "min_s": 0.99}


@pytest.mark.parametrize("records, decision, chosen", [
    ([_rec(1, median=1.0), _rec(2, median=0.5)], rules.IMPROVED, 2),
    ([_rec(1, median=1.0), _rec(2, median=0.975)], rules.KEPT, 1),         # 0.975 * 1.02 > 0.99: within noise
    ([_rec(1, median=2.0), _rec(2, median=1.95)], rules.REGRESSED, 1),
    ([_rec(1, median=2.0, spread=5.0), _rec(2, median=1.95)], rules.REGRESSED, 1),
    ([_rec(1, outcomes.WRONG_RESULT, error="relative error 1"), _rec(2, median=1.0)], rules.REPAIRED, 2),
    ([_rec(1, outcomes.OOM, error="RESOURCE_EXHAUSTED"), _rec(2, outcomes.COMPILE_ERROR)], rules.FAILED, None),
])
def test_promotion_rule(records, decision, chosen):
    """One slow outlier (a huge spread) does not hide a change: the rule reads medians."""
    made = rules.decide(_plan(OLD_ROW), records, noise=0.02)
    assert made.decision == decision
    assert (json.loads(made.chosen.config)["v"] if made.chosen else None) == chosen


def test_a_fast_wall_clock_sample_hides_no_faster_config():
    """The baseline's fastest wall-clock sample far below its median (a difference of two runs that
    noise moved) does not keep a config 2.7 times slower than the new best; on the device clock a
    fastest sample is a kernel that ran that fast, and the new best is then within noise of it."""
    fast_sample = dataclasses.replace(_rec(1, median=2.7), min_s=0.01)
    made = rules.decide(_plan(OLD_ROW), [fast_sample, _rec(2, median=1.0)], noise=0.02)
    assert (made.decision, json.loads(made.chosen.config)["v"]) == (rules.IMPROVED, 2)
    on_device = dataclasses.replace(fast_sample, clock="device", min_s=1.0)
    made = rules.decide(_plan(OLD_ROW), [on_device, _rec(2, median=1.0)], noise=0.02)
    assert made.decision == rules.KEPT and json.loads(made.chosen.config)["v"] == 1


def test_gate_blocks_only_beyond_the_limit_and_the_noise():
    settings = rules.RetuneSettings(max_regression=0.05, noise=0.02)

    def report(decision, new_median, new_min=None, clock=None):
        row = {"status": "ok", "config": '{"v":2}', "median_s": new_median, "spread": 0.01,
               "min_s": new_median * 0.99 if new_min is None else new_min, "clock": clock}
        return task_report(_plan(OLD_ROW), rules.Decision(decision, None, None), row, [], settings)

    assert report(rules.REGRESSED, 1.5)["blocks_rollout"]
    assert report(rules.IMPROVED, 1.5)["blocks_rollout"]         # better than the old config now, worse than before
    assert not report(rules.KEPT, 1.04)["blocks_rollout"]        # within --max-regression
    assert not report(rules.REGRESSED, 1.5, new_min=1.01, clock="device")["blocks_rollout"]  # a kernel ran as fast
    # On the wall clock a fastest sample is a difference of two runs, which noise moves either way:
    # 2.7 times the old median blocks whatever its fastest sample says (seen: 990 times below a median).
    for clock in ("wall", None):
        assert report(rules.KEPT, 2.7, new_min=0.1, clock=clock)["blocks_rollout"]
    assert task_report(_plan(OLD_ROW), rules.Decision(rules.FAILED, None, None), None, [],
                               settings)["blocks_rollout"]
    loose = rules.RetuneSettings(max_regression=1.0)
    assert not task_report(_plan(OLD_ROW), rules.Decision(rules.REGRESSED, None, None),
                                   {**OLD_ROW, "median_s": 1.5}, [], loose)["blocks_rollout"]


# -- fingerprints and warm starts --------------------------------------------------------------------
def test_a_previous_winner_outside_the_space_that_the_kernel_takes_is_warm_started_and_a_baseline():
    """A sweep measures the kernel's default, and any warm start, even where the space leaves it
    out (5 rows: block_rows 5 or 6 is no power of two), so it may win; a retune takes it as the
    previous winner all the same. One the kernel no longer takes is no baseline (`new`)."""
    space = spaces.parse_space({"kernel": "softmax", "dtypes": ["float32"], "shapes": [[5, 256]],
                                "targets": ["interpret"], "params": {"block_rows": {"pow2": [1, 8]},
                                                                     "strategy": {"values": ["one_pass"]},
                                                                     "block_cols": {"values": [128]}},
                                "trials": 4}, "inline.yaml")
    planned = plan.expand([space])[0]
    default = {"block_rows": 5, "strategy": "one_pass", "block_cols": 128}
    row = {**OLD_ROW, "config": config_json(default)}
    task_plan = planning.TaskPlan(planned, device_kind="cpu", fingerprint={}, previous=row, changes=["x"])
    warm, winner_valid = planning.warm_start(task_plan, planning.Previous("p", {}, [row], []), top=2)
    assert (warm, winner_valid) == ([default], True)
    narrowed = {**default, "block_rows": 6}    # neither the default nor a point of the space
    task_plan.previous = {**OLD_ROW, "config": config_json(narrowed)}
    assert planning.warm_start(task_plan, planning.Previous("p", {}, [task_plan.previous], []), top=2) == (
        [narrowed], True)
    retired = {**default, "strategy": "retired"}    # a strategy the kernel no longer has
    task_plan.previous = {**OLD_ROW, "config": config_json(retired)}
    assert planning.warm_start(task_plan, planning.Previous("p", {}, [task_plan.previous], []), top=2) == ([], False)


def test_kernel_source_hash_follows_the_module_and_the_kernels_it_uses(tmp_path, monkeypatch):
    (tmp_path / "hashpkg").mkdir()
    (tmp_path / "hashpkg" / "__init__.py").write_text("")
    (tmp_path / "hashpkg" / "helper.py").write_text("X = 1\n")
    body = (REPO / "tests" / "fixtures" / "versioned_softmax.py").read_text()
    (tmp_path / "hashpkg" / "k.py").write_text(body + "\nfrom . import helper  # noqa\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = fingerprint.kernel_sources("hashpkg.k")
    assert {"hashpkg.k", "hashpkg.helper", "kernels.softmax", "kernels.rows"} <= set(before)
    (tmp_path / "hashpkg" / "helper.py").write_text("X = 2\n")
    after = fingerprint.kernel_sources("hashpkg.k")
    assert fingerprint.changes({"kernel_source": before}, {"kernel_source": after}) == [
        "kernel source hashpkg.helper changed"]


def test_fingerprint_override(tmp_path, monkeypatch):
    info = {"software": {"python": "3.11.7", "jax": "0.10.2", "jaxlib": "0.10.2"}, "device_kind": "cpu"}
    base = fingerprint.for_task(VERSIONED, info)
    monkeypatch.setenv(fingerprint.OVERRIDE_ENV, '{"jax": "0.99.0", "jaxlib": null, "libtpu": "0.0.9"}')
    changed = fingerprint.for_task(VERSIONED, info)
    assert fingerprint.changes(base, changed) == ["jax 0.10.2 -> 0.99.0", "jaxlib 0.10.2 -> None",
                                                  "libtpu None -> 0.0.9"]
    (tmp_path / "fp.json").write_text('{"device_kind": "TPU v6 lite"}')
    monkeypatch.setenv(fingerprint.OVERRIDE_ENV, f"@{tmp_path / 'fp.json'}")
    assert fingerprint.for_task(VERSIONED, info)["device_kind"] == "TPU v6 lite"
    monkeypatch.setenv(fingerprint.OVERRIDE_ENV, "{jax")
    with pytest.raises(FarmError, match=fingerprint.OVERRIDE_ENV):
        fingerprint.for_task(VERSIONED, info)
    assert fingerprint.changes(None, base) == ["no fingerprint recorded"]


def test_retune_refuses_bad_input_before_any_work(tmp_path, signing_key, capsys):
    space = _space(tmp_path, "s", VERSIONED, [[16, 128]], tmp_path / "none.json")
    base = [str(space), "--key", str(signing_key[0]), "--out", str(tmp_path / "out"), "--quiet"]
    assert cli.main(["retune", *base, "--previous", str(tmp_path / "missing"), "--trust", str(signing_key[1])]) == 2
    assert "--previous" in capsys.readouterr().err
    other, _ = signing.generate_keypair(tmp_path / "other.pem")[:2]
    bundle = artifacts.write_bundle(tmp_path / "b", [], [], signing.load_private_key(other))
    assert cli.main(["retune", *base, "--previous", str(bundle), "--trust", str(signing_key[1])]) == 1
    assert "not trusted" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value, fragment", [("notjson", "not JSON"), ("[1]", "expected a JSON object"),
                                             ("@/dev/zero", "not a regular file")])
def test_a_bad_fingerprint_override_is_answered_before_anything_runs(tmp_path, monkeypatch, capsys, value, fragment):
    """Not at the end of a sweep that measured everything (then no bundle was written)."""
    space = tmp_path / "space.yaml"
    space.write_text("extends: softmax\nshapes: [[8, 128]]\ndtypes: [float32]\n")
    monkeypatch.setenv(fingerprint.OVERRIDE_ENV, value)
    out = tmp_path / "run"
    for argv in (["sweep", str(space), "--target", "interpret", "--out", str(out)],
                 ["retune", str(space), "--previous", str(tmp_path), "--out", str(out)]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert fingerprint.OVERRIDE_ENV in err and fragment in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()


def test_the_nightly_script_signs_with_the_environment_key_and_refuses_early(farm, signing_key, tmp_path):
    """scripts/nightly_retune.sh as cron or a Ray job runs it: the key from $FARM_SIGNING_KEY (a Ray
    job's env_vars; its upload leaves the git-ignored .keys/ out), a published archive that
    verifies; a Python not on PATH and a publish folder it cannot write answered before any work."""
    import subprocess
    import sys

    script = REPO / "scripts" / "nightly_retune.sh"
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(REPO), "PYTHON": sys.executable,
           "FARM_PREVIOUS": str(farm["previous"]), "FARM_SPACES": str(farm["spaces"]["versioned"]),
           "FARM_TARGET": "interpret", "FARM_ADDRESS": "", "FARM_TRUST": str(signing_key[1]),
           "FARM_SIGNING_KEY": Path(signing_key[0]).read_text(), "FARM_OUT_ROOT": str(tmp_path / "out"),
           "FARM_EXTRA": "--repetitions 3 --workers 1", fingerprint.OVERRIDE_ENV: NEW_JAX[fingerprint.OVERRIDE_ENV],
           # The script's flow is under test, not the gate (test_gate.py): interpret timings on a shared
           # CPU move more than 5%, and a blocked gate publishes nothing.
           "FARM_MAX_REGRESSION": "1000"}
    env.pop("FARM_KEY", None)
    for changed, fragment in (({"PYTHON": "/nonexistent/python"}, "PYTHON: expected a Python"),
                              ({"FARM_PUBLISH": str(script / "sub")}, "FARM_PUBLISH")):
        proc = subprocess.run(["bash", str(script)], env={**env, **changed}, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and fragment in proc.stderr, proc.stderr[-2000:]
        assert not list((tmp_path / "out").glob("retune-*"))
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    published = list((tmp_path / "out" / "published").glob("kernels-*.tar.gz"))
    assert len(published) == 1 and "nightly_retune: published" in proc.stdout
    assert cli.main(["verify", str(published[0]), "--trust", str(signing_key[1])]) == 0
    # What deployments pull is the bundle the night's report names, not a copy signed again.
    from farm.bundle.locate import open_bundle

    (run,) = (tmp_path / "out").glob("retune-*")
    with open_bundle(published[0], trust.load_trust([Path(signing_key[1])])) as opened:
        assert opened.bundle_id == json.loads((run / REPORT_JSON).read_text())["bundle"]["bundle_id"]
    # The next night, nothing changed: nothing stale, nothing published (the same configs again
    # would only look newer to farm pull).
    proc = subprocess.run(["bash", str(script)], env={**env, "FARM_PREVIOUS": str(published[0])},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "nothing stale; nothing published" in proc.stdout, proc.stderr[-3000:]
    assert list((tmp_path / "out" / "published").glob("kernels-*.tar.gz")) == published


def test_a_retune_takes_the_targets_the_cluster_runs_and_leaves_no_folder_when_none(farm, signing_key, tmp_path,
                                                                                     capsys):
    """As farm sweep: without --target the tpu tasks are left out (noted) and the rest retuned; with
    --target tpu on a cluster of CPUs, one line and no run folder left behind."""
    space = tmp_path / "softmax.yaml"
    space.write_text("extends: softmax\nshapes: [[8, 128]]\ndtypes: [float32]\ntargets: [interpret, tpu]\n")
    common = [str(space), "--previous", str(farm["previous"]), "--trust", str(signing_key[1]), "--key",
              str(signing_key[0]), "--quiet", "--trials", "2", "--repetitions", "2", "--workers", "1"]
    assert cli.main(["retune", *common, "--out", str(tmp_path / "none"), "--target", "tpu"]) == 2
    assert "--target tpu" in capsys.readouterr().err and not (tmp_path / "none").exists()
    assert cli.main(["retune", *common, "--out", str(tmp_path / "runs")]) == 0
    report = json.loads((tmp_path / "runs" / REPORT_JSON).read_text())
    decided = {t["task_key"]: t["decision"] for t in report["tasks"]}
    assert decided["softmax/8x128/float32/interpret"] == rules.NEW
    assert not [key for key in decided if key.endswith("/tpu")]
