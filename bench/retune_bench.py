"""Benchmark of nightly retuning: trials spent, and the winner reached, against a cold sweep.

    .venv/bin/python bench/retune_bench.py [--trials 24] [--repetitions 10] [--noise auto] [--keep DIR]

On an embedded local Ray in CPU interpret mode, with a small softmax space (3 shapes), two
scenarios, each:
  1. a cold sweep under the "old" software: the previous bundle;
  2. a simulated upgrade of the whole space: FARM_FINGERPRINT_OVERRIDE changes jax's version,
     so every task is stale;
  3. cold sweeps under the "new" software: with the same settings (the goal's reference, what a
     pipeline without retuning would run) and with another seed (an independent draw);
  4. `farm retune` from the previous bundle (variants: default flags, and one other);
  5. where a retune's winner and a cold sweep's differ, both re-timed side by side (interleaved
     samples, in this process) and compared with the retune's rule (`farm.retune.rules.faster_beyond_noise`).
Scenario `version_bump` changes only the version; `shifted_landscape` also makes the old
winners' strategy (one_pass) 1 ms slower per call, so the retune escalates to a full search.
The noise floor (`--noise auto`) is calibrated from the version bump's three cold sweeps: how far
the same config's measurements in two runs of this machine lie apart (`calibrate`).
Goals (version bump, default flags): the retune costs at most 30% of the cold sweep's trials, and
no retune winner is slower than the same-settings cold sweep's beyond noise. Prints tables and
writes bench/results/retune_bench.json.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm import cli  # noqa: E402
from farm.bundle import (
    fingerprint,  # noqa: E402
    signing,  # noqa: E402
)
from farm.measure import timing  # noqa: E402
from farm.retune import rules  # noqa: E402
from farm.retune.report import REPORT_JSON  # noqa: E402
from farm.tasks import TuningTask  # noqa: E402

GOAL_TRIAL_SHARE = 0.30
REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "retune_bench.json"
SPACE = """\
kernel: {kernel}
dtypes: [float32]
shapes: [[64, 256], [128, 512], [256, 256]]
targets: [interpret]
params:
  block_rows: {{pow2: [1, 128]}}
  strategy: {{values: [one_pass, fori_loop, grid]}}
  block_cols: {{pow2: [128, 512]}}
constraints:
  - rows % block_rows == 0
  - "block_cols == 128 if strategy == 'one_pass' else cols % block_cols == 0 and block_cols < cols"
sampler: {{name: tpe, seed: 0}}
trials: {trials}
"""


def farm(*args: str) -> tuple[int, float]:
    """Run a `farm` command in this process (its output swallowed); its exit code and wall seconds."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(list(args))
    return code, time.perf_counter() - started


def rows(run: Path) -> dict[str, dict]:
    """The configs rows of a run's bundle, by task key."""
    import pyarrow.parquet as pq

    return {r["task_key"]: r for r in pq.read_table(run / "bundle" / "configs.parquet").to_pylist()}


def side_by_side(task_key: str, configs: dict[str, str], repetitions: int) -> dict[str, timing.Timing]:
    """Each named config of a task compiled here and timed with interleaved samples."""
    from farm.measure.compiler import compile_config

    kernel, shape, dtype, target = task_key.split("/")
    task = TuningTask(kernel, tuple(int(d) for d in shape.split("x")), dtype, target)
    compiled = {name: compile_config(task, json.loads(config), interpret=True) for name, config in configs.items()}
    inputs = next(iter(compiled.values())).inputs
    return timing.time_side_by_side({n: c.executable for n, c in compiled.items()}, inputs,
                                    repetitions=repetitions)


SHIFTED_KERNEL = '''"""softmax whose one_pass strategy is 1 ms slower once UPGRADED exists: a simulated compiler regression."""
import os
import time

import jax

from kernels import softmax
from kernels.softmax import (NAME, SHAPE_NAMES, TARGETS, MEMORY_PARAMS, reference, make_inputs, flops,  # noqa: F401
                             bytes_moved, footprint, default_config)

UPGRADED = os.path.join(os.path.dirname(__file__), "UPGRADED")


def build(config, shape, dtype, platform):
    """The softmax; one_pass pays a host-side millisecond per call after the "upgrade"."""
    fn = softmax.build(config, shape, dtype, platform)
    if config.get("strategy") != "one_pass" or not os.path.exists(UPGRADED):
        return fn

    def sleep(y):
        time.sleep(1e-3)
        return y

    def slowed(x):
        y = fn(x)
        return jax.pure_callback(sleep, jax.ShapeDtypeStruct(y.shape, y.dtype), y)
    return slowed
'''


COLD = {"same_seed": [], "other_seed": ["--seed", "1"]}  # reference cold sweeps under the new software


def compare(task: str, new: dict[str, dict], cold: dict[str, dict], noise: float) -> dict[str, Any]:
    """A retune's winner against a cold sweep's (re-timed side by side when the configs differ)."""
    same = json.loads(new[task]["config"]) == json.loads(cold[task]["config"])
    if same:  # one executable: nothing to compare
        return {"cold_trials": cold[task]["trials"], "cold_config": cold[task]["config"], "same_config": True,
                "retune_over_cold": 1.0, "retune_slower_beyond_noise": False}
    timed = side_by_side(task, {"retune": new[task]["config"], "cold": cold[task]["config"]}, repetitions=15)
    r, c = (rules.Timing(t.median_s, t.spread, t.min_s) for t in (timed["retune"], timed["cold"]))
    return {"cold_trials": cold[task]["trials"], "cold_config": cold[task]["config"], "same_config": False,
            "retune_side_by_side_s": r.median_s, "cold_side_by_side_s": c.median_s, "retune_spread": r.spread,
            "cold_spread": c.spread, "retune_over_cold": r.median_s / c.median_s,
            "retune_slower_beyond_noise": rules.faster_beyond_noise(c, r, noise)}


def calibrate(runs: list[Path]) -> dict[str, Any]:
    """This machine's run-to-run noise: the floor that keeps same-config measurements of different runs equal.

    For each config measured `ok` in two runs (A, B) the floor it needs is max(min_B / median_A,
    min_A / median_B) - 1 (see `farm.retune.rules.faster_beyond_noise`); the 90th percentile of those,
    at least 2%, is the calibrated floor.
    """
    measured = []
    for run in runs:
        found = {}
        for line in (run / "trials.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r["outcome"] == "ok" and r.get("min_s"):
                found[(r["task_key"], r["config"])] = r
        measured.append(found)
    needed = sorted(max(b[k]["min_s"] / a[k]["median_s"], a[k]["min_s"] / b[k]["median_s"]) - 1
                    for i, a in enumerate(measured) for b in measured[i + 1:] for k in set(a) & set(b))
    if not needed:
        return {"pairs": 0, "noise": 0.02}
    at = {q: needed[min(len(needed) - 1, int(q * len(needed)))] for q in (0.5, 0.75, 0.9)}
    return {"pairs": len(needed), "needed_p50": at[0.5], "needed_p75": at[0.75], "needed_p90": at[0.9],
            "noise": round(max(0.02, at[0.9]), 3)}


def scenario(tmp: Path, name: str, kernel: str, upgrade: Any, args: argparse.Namespace, key: Path,
             public: Path, retunes: dict[str, list[str]], noise: float | None) -> dict[str, Any]:
    """Cold sweep (old software), upgrade, cold sweeps (new software), retune(s), comparisons.

    `noise` None: calibrated from this scenario's three cold sweeps (valid when the upgrade
    changes no timing).
    """
    folder = tmp / name
    folder.mkdir()
    space = folder / "space.yaml"
    space.write_text(SPACE.format(kernel=kernel, trials=args.trials))
    common = ["--key", str(key), "--quiet", "--repetitions", str(args.repetitions)]
    os.environ.pop(fingerprint.OVERRIDE_ENV, None)
    code, cold_old_s = farm("sweep", str(space), "--out", str(folder / "old"), *common)
    assert code == 0, f"{name}: cold sweep (old software) exited {code}"
    upgrade()
    os.environ[fingerprint.OVERRIDE_ENV] = json.dumps({"jax": "99.0.0-simulated-upgrade"})
    colds, cold_s = {}, {}
    for reference, flags in COLD.items():
        code_cold, cold_s[reference] = farm("sweep", str(space), "--out", str(folder / f"cold-{reference}"),
                                            *flags, *common)
        assert code_cold == 0, f"{name}: cold sweep {reference} (new software) exited {code_cold}"
        colds[reference] = rows(folder / f"cold-{reference}")
    calibration = calibrate([folder / "old", *(folder / f"cold-{r}" for r in COLD)]) if noise is None else None
    noise = calibration["noise"] if calibration else noise
    runs = {}
    for variant, flags in retunes.items():
        out = folder / f"retune-{variant}"
        code, wall = farm("retune", str(space), "--previous", str(folder / "old"), "--trust", str(public),
                          "--out", str(out), "--noise", str(noise), *flags, *common)
        runs[variant] = (code, wall, json.loads((out / REPORT_JSON).read_text()), rows(out))
    os.environ.pop(fingerprint.OVERRIDE_ENV, None)
    old = rows(folder / "old")
    results: dict[str, Any] = {"noise": noise, "calibration": calibration}
    for variant, (code, wall, report, new) in runs.items():
        tasks = [{"task_key": e["task_key"], "decision": e["decision"], "escalated": e["escalated"],
                  "old_median_s": e["old_median_s"], "baseline_median_s": e["baseline_median_s"],
                  "baseline_outcome": e["baseline_outcome"],
                  "retune_trials": new[e["task_key"]]["trials"], "previous_config": old[e["task_key"]]["config"],
                  "retune_config": new[e["task_key"]]["config"],
                  "vs": {ref: compare(e["task_key"], new, cold, noise) for ref, cold in colds.items()}}
                 for e in report["tasks"]]
        retune_trials = sum(t["retune_trials"] for t in tasks)
        cold_trials = sum(t["vs"]["same_seed"]["cold_trials"] for t in tasks)
        results[variant] = {
            "flags": retunes[variant], "retune_exit_code": code, "decisions": report["decisions"],
            "trials": {"cold": cold_trials, "retune": retune_trials, "share": retune_trials / cold_trials},
            "slower_beyond_noise": {ref: [t["task_key"] for t in tasks if t["vs"][ref]["retune_slower_beyond_noise"]]
                                    for ref in colds},
            "wall_s": {"cold_sweep_old": cold_old_s, "retune": wall, **{f"cold_{r}": v for r, v in cold_s.items()}},
            "tasks": tasks}
    return results


def show(name: str, result: dict[str, Any]) -> None:
    """Print a retune's table: trials, decisions, and its winners against both cold sweeps."""
    def versus(v: dict[str, Any]) -> str:
        if v["same_config"]:
            return "same config"
        slower = " SLOWER" if v["retune_slower_beyond_noise"] else ""
        return f"{v['cold_side_by_side_s'] * 1e3:.3f} vs {v['retune_side_by_side_s'] * 1e3:.3f} ms{slower}"

    print(f"\n{name}")
    print(f"{'task':<52} {'decision':<20} {'trials cold':>11} {'retune':>7}  {'vs cold, same seed':<28} "
          f"vs cold, other seed")
    for t in result["tasks"]:
        decision = t["decision"] + (" (escalated)" if t["escalated"] else "")
        print(f"{t['task_key']:<52} {decision:<20} {t['vs']['same_seed']['cold_trials']:>11} "
              f"{t['retune_trials']:>7}  {versus(t['vs']['same_seed']):<28} {versus(t['vs']['other_seed'])}")
    trials, wall = result["trials"], result["wall_s"]
    slower = result["slower_beyond_noise"]
    print(f"trials: retune {trials['retune']} / cold {trials['cold']} = {trials['share']:.0%}; retune winners "
          f"slower beyond noise than the same-seed cold sweep's: {len(slower['same_seed'])}, the other seed's: "
          f"{len(slower['other_seed'])}; wall: cold {wall['cold_same_seed']:.0f} s, retune {wall['retune']:.0f} s "
          f"(probe included)")


def main() -> int:
    """Run both scenarios; 0 when the version bump meets both goals."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24, help="cold sweep budget per task")
    parser.add_argument("--repetitions", type=int, default=10, help="timing samples per trial")
    parser.add_argument("--noise", default="auto", help="noise floor for the retunes and comparisons (default "
                        "auto: calibrated from the version bump's cold sweeps, see `calibrate`)")
    parser.add_argument("--keep", type=Path, help="work in this new folder and keep it (run folders, reports)")
    args = parser.parse_args()
    os.chdir(REPO)
    with tempfile.TemporaryDirectory(prefix="retune-bench-") as scratch:
        tmp = Path(scratch) if args.keep is None else args.keep.resolve()
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "modules" / "benchkern").mkdir(parents=True)
        (tmp / "modules" / "benchkern" / "__init__.py").write_text("")
        (tmp / "modules" / "benchkern" / "shifted_softmax.py").write_text(SHIFTED_KERNEL)
        sys.path.insert(0, str(tmp / "modules"))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp / "modules"), os.environ.get("PYTHONPATH")]))
        key, public, _ = signing.generate_keypair(tmp / "bench.pem")
        noise = None if args.noise == "auto" else float(args.noise)
        bumped = scenario(tmp, "version_bump", "softmax", lambda: None, args, key, public,
                          {"default": [], "noise_2pct": ["--noise", "0.02"]}, noise)
        shifted = scenario(tmp, "shifted_landscape", "benchkern.shifted_softmax",
                           lambda: (tmp / "modules" / "benchkern" / "UPGRADED").write_text(""), args, key, public,
                           {"default": [], "no_escalate": ["--no-escalate"]}, bumped["noise"])
        results = {"version_bump": bumped, "shifted_landscape": shifted}
    bump = results["version_bump"]["default"]
    met = {"trial_share": bump["trials"]["share"] <= GOAL_TRIAL_SHARE,
           "winner_no_slower": not bump["slower_beyond_noise"]["same_seed"]}
    result = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "load_average_1min": os.getloadavg()[0]},
        "space": SPACE.format(kernel="softmax", trials=args.trials), "repetitions": args.repetitions,
        "noise": results["version_bump"]["noise"], "goals": {"trial_share_max": GOAL_TRIAL_SHARE, "retune_slower_beyond_noise": 0,
                                       "scenario": "version_bump", "reference": "cold sweep, same settings and seed"},
        "met": met, "scenarios": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    calibration = results["version_bump"]["calibration"] or {}
    print(f"noise floor: {results['version_bump']['noise']:.0%}" + (
        f" (calibrated: same config in two runs differs by >= p50 {calibration['needed_p50']:.0%}, "
        f"p75 {calibration['needed_p75']:.0%}, p90 {calibration['needed_p90']:.0%} beyond the faster run's "
        f"minimum; {calibration['pairs']} pairs)" if calibration.get("pairs") else ""))
    show("version bump: FARM_FINGERPRINT_OVERRIDE only (every task stale, nothing really changed)", bump)
    show("version bump, retune --noise 0.02 (the default floor, uncalibrated)", results["version_bump"]["noise_2pct"])
    show("shifted landscape: the upgrade also makes one_pass (the old winners' strategy) 1 ms slower",
         results["shifted_landscape"]["default"])
    show("shifted landscape, retune --no-escalate", results["shifted_landscape"]["no_escalate"])
    print(f"\ngoals (version bump): trial share <= {GOAL_TRIAL_SHARE:.0%}: {met['trial_share']}; "
          f"no retune winner slower beyond noise than a cold sweep's (same settings): {met['winner_no_slower']}")
    print(f"wrote {RESULTS}")
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
