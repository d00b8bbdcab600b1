"""The benchmark tools' own logic: the footprint probe's verdicts and the seed table's search stats."""
from __future__ import annotations

import collections
import json
import sys
import types
from pathlib import Path

import jax.numpy as jnp
import pytest

import kernels
from bench import baselines, check_gpu_kernels, oom_probe, seed_table, space_coverage, space_fuzz
from farm.measure import outcomes
from farm.search import spaces


def _row(outcome, model_fits, kernel="matmul", target="gpu-triton", footprint=1000, requested=None):
    row = {"kernel": kernel, "target": target, "shape": [8, 8, 8], "config": {"block_m": 16},
           "outcome": outcome, "model_fits": model_fits, "footprint_bytes": footprint,
           "capacity_bytes": 1500, "requested_bytes": requested, "error": ""}
    row["judgement"] = oom_probe.judge(row)
    return row


def test_probe_judges_the_model_against_the_compiler():
    rows = [_row(outcomes.OK, True), _row(outcomes.WRONG_RESULT, True), _row(outcomes.OOM, False, requested=2000),
            _row(outcomes.OK, False), _row(outcomes.OOM, True, requested=3000), _row(outcomes.COMPILE_ERROR, True)]
    assert [r["judgement"] for r in rows] == ["agree", "agree", "agree", "model says no fit, fits",
                                              "model says fits, oom", "no verdict"]
    summary = oom_probe.summarize(rows)
    assert (summary["judged"], summary["agree"]) == (5, 3) and summary["agreement"] == 3 / 5
    assert len(summary["misses"]) == 2 and len(summary["no_verdict"]) == 1
    assert summary["requested_over_model"] == {"n": 2, "min": 2.0, "max": 3.0}


def test_probe_dry_run_writes_its_report(tmp_path):
    # Interpret mode on CPU: every config compiles and runs, so there are verdicts but no OOMs.
    summary = oom_probe.main(["--out", str(tmp_path), "--small", "--per-task", "2", "--threads", "2",
                              "--spaces", "search_spaces/matmul.yaml"])
    report = json.loads((tmp_path / "oom_probe.json").read_text())
    assert summary["configs"] == len(report["rows"]) == 8     # 2 configs x 2 targets x 2 CPU shapes
    assert {r["target"] for r in report["rows"]} == {"gpu-triton", "gpu-mosaic"}
    assert all(r["capacity_bytes"] == 232448 for r in report["rows"])
    again = oom_probe.main(["--out", str(tmp_path / "again"), "--small", "--per-task", "2", "--threads", "2",
                            "--spaces", "search_spaces/matmul.yaml", "--exclude", str(tmp_path / "oom_probe.json")])
    def keys(rows):
        return {(r["target"], tuple(r["shape"]), json.dumps(r["config"], sort_keys=True)) for r in rows}

    fresh = json.loads((tmp_path / "again" / "oom_probe.json").read_text())["rows"]
    assert again["configs"] == 8 and not keys(report["rows"]) & keys(fresh)


def test_probe_for_tpu_says_what_it_needs_and_what_it_expected(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "libtpu", None)     # as where libtpu is not installed
    with pytest.raises(SystemExit, match="libtpu is missing"):
        oom_probe.main(["--out", str(tmp_path), "--tpu", "v5e:1x1"])
    monkeypatch.setitem(sys.modules, "libtpu", types.ModuleType("libtpu"))
    with pytest.raises(SystemExit, match="expected GENERATION:TOPOLOGY"):
        oom_probe.main(["--out", str(tmp_path), "--tpu", "tpu9:1x1"])
    with pytest.raises(SystemExit, match="take --tpu"):
        oom_probe.main(["--out", str(tmp_path), "--near", "2"])
    assert not any(tmp_path.iterdir())


def test_probe_judges_earlier_compiles_by_todays_models(tmp_path):
    """--rejudge: an earlier probe's libtpu verdicts (v4, committed raw results) against the models
    as they are now; nothing compiles. The GLU rows were judged by a model that counted two float32
    tiles more."""
    old = Path("bench/results/cpu/oom_probe_tpu/model_before/v4_near2/oom_probe.json")
    rows = json.loads(old.read_text())["rows"]
    summary = oom_probe.main(["--out", str(tmp_path), "--rejudge", str(old)])
    assert summary["configs"] == len(rows) and summary["judged"] == len(rows)
    glu = [r for r in rows if r["kernel"] in ("swiglu", "geglu")]
    assert glu and all(kernels.load(r["kernel"]).footprint(r["config"], tuple(r["shape"]), r["dtype"], "tpu")
                       < r["footprint_bytes"] for r in glu)
    again = {json.dumps(m["config"], sort_keys=True) for m in summary["misses"]}
    assert not any(json.dumps(r["config"], sort_keys=True) in again for r in glu)   # no GLU miss is left
    assert (tmp_path / "oom_probe.md").exists()


def _trial(task, elapsed, median, sweep="A", outcome=outcomes.OK):
    return {"task_key": task, "elapsed_s": elapsed, "median_s": median, "outcome": outcome, "spread": 0.0,
            "run_id": "all", "sweep": sweep, "config": "{}"}


def test_search_stats_follow_the_sweep_that_found_the_winner():
    records = [_trial("t1", 1.0, 10.0), _trial("t1", 2.0, 5.0), _trial("t1", 3.0, 4.95),
               _trial("t1", 4.0, None, outcome=outcomes.PRUNED), _trial("t1", 5.0, 6.0),
               _trial("t2", 1.0, 3.0),
               _trial("t1", 0.5, 9.0, sweep="B"), _trial("t1", 9.0, 4.9, sweep="B")]
    stats = seed_table.search_stats(records)
    t1 = stats["t1"]
    assert t1["sweep"] == "B" and t1["best_s"] == 4.9 and t1["within_2pct_s"] == 9.0
    assert (t1["trials"], t1["ok"], t1["tasks_in_sweep"]) == (2, 2, 1)
    records = records[:6]
    t1 = seed_table.search_stats(records)["t1"]
    # 5.0 is within 2% of the final 4.95: reached at 2 s; the sweep ran 5 s; it shared its GPU with t2.
    assert (t1["within_2pct_s"], t1["tune_s"], t1["pruned"], t1["tasks_in_sweep"]) == (2.0, 5.0, 1, 2)


def test_seed_table_takes_the_winner_the_bundle_would_ship_the_finalists_one(tmp_path):
    # As on the H200 (softmax 8192x151936): a disturbed sweep figure ranked the config the
    # finalists' side-by-side re-timing found fastest out of first place.
    from farm.bundle.records import TrialRecord
    from farm.measure.finalists import FinalTiming
    from farm.run import runlog
    from farm.tasks import TuningTask

    run = tmp_path / "runs" / "tune"
    run.mkdir(parents=True)
    task = TuningTask("softmax", (8, 128), "float32", "interpret")
    other = TuningTask("softmax", (16, 128), "float32", "interpret")
    trials = [TrialRecord.for_task(task, 0, '{"block_rows":1}', outcomes.OK, median_s=5.3e-3, spread=11.0),
              TrialRecord.for_task(task, 1, '{"block_rows":2}', outcomes.OK, median_s=1.50e-3, spread=0.05),
              TrialRecord.for_task(other, 0, '{"block_rows":4}', outcomes.OK, median_s=2.0e-3, spread=0.01)]
    (run / "trials.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in trials))
    runlog.append_finals(run, [
        FinalTiming(task.key, '{"block_rows":2}', 1.52e-3, 0.01, 1.51e-3, 6, 1, 1e-3, False, 2, 6, True),
        FinalTiming(task.key, '{"block_rows":1}', 1.43e-3, 0.01, 1.42e-3, 6, 1, 1e-3, False, 2, 6, True)])
    winners, _ = seed_table.load_winners([tmp_path], None)
    assert winners[task.key]["config"] == {"block_rows": 1} and winners[task.key]["median_s"] == 1.43e-3
    assert winners[task.key]["source"].endswith("finalists.jsonl")
    # A task without finalists keeps its fastest trial.
    assert winners[other.key]["config"] == {"block_rows": 4}


def test_seed_table_tunes_with_the_farm_then_measures_its_winner(tmp_path, ray_local):
    # --tune on CPU (--small: interpret mode): a real farm sweep, whose winner is the farm column.
    report = seed_table.main(["--small", "--tune", "30", "--trials", "3", "--out", str(tmp_path),
                              "--spaces", "search_spaces/rms_norm.yaml", "--columns", "xla", "--no-compile",
                              "--repetitions", "3"])
    (row,) = report["results"]
    farm = row["columns"]["farm:interpret"]
    assert farm["config_source"] == "winner" and farm["status"] == "ok" and "tune" in farm["source"]
    assert row["columns"]["xla"]["status"] == "ok"
    (stats,) = report["searches"].values()
    assert stats["ok"] >= 1 and stats["sweep"].endswith(":tune")
    log = tmp_path / "tune" / "runs" / "tune" / "trials.jsonl"
    trials = [json.loads(line) for line in log.read_text().splitlines()]
    first = next(t for t in trials if t["trial"] == 0)   # the kernel's default config, measured first
    assert json.loads(first["config"]) == kernels.load("rms_norm").default_config((32, 512), "interpret")


def test_seed_table_flags_a_time_below_the_roofline_as_a_measurement_error():
    # rms norm at 8192x8192 in bf16 moves 268 MB a call: under 56 us is faster than the H200's
    # 4.8 TB/s can move it (issue 17: a torch.compile figure at 121% of the copy ceiling).
    module = kernels.load("rms_norm")
    shape, dtype = (8192, 8192), "bfloat16"
    result = {"kernel": "rms_norm", "shape": list(shape), "dtype": dtype, "flops": module.flops(shape),
              "bytes": module.bytes_moved(shape, dtype), "columns": {
                  "farm:gpu-triton": {"kind": "farm", "status": "ok", "median_s": 73.5e-6},
                  "xla": {"kind": "baseline", "status": "ok", "median_s": 72.8e-6},
                  "torch_compile": {"kind": "baseline", "status": "ok", "median_s": 42.6e-6}}}
    peaks = seed_table.roofline.datasheet("NVIDIA H200")
    summary = seed_table.summarize([result], {"copy_bytes_per_s": 4.26e12}, peaks)
    assert result["columns"]["torch_compile"]["status"] == "below_floor"
    assert "measurement error" in result["columns"]["torch_compile"]["error"]
    assert result["best_other"] == "xla" and summary["speedup_vs_column"].keys() == {"xla"}
    assert seed_table.flag_below_floor(result, None) == []      # no known peaks (a CPU): nothing flagged
    assert "below floor" in seed_table._cell(result["columns"]["torch_compile"])


def test_seed_table_compares_host_bound_rows_on_device_time():
    # rms norm at 4096x4096 on the H200 (bench/results/h200/timing_check/): the JAX columns' queued
    # calls ran 39-47 us a call while their kernels took 18.6-19.2 us; torch eager's 24.6 us call
    # was its 23.5 us kernel. The table's figures then favour torch; the device's do not. And a
    # table figure far from the device clock of the check's samples is marked (geglu at
    # 16x16384x4096: 1.445 ms in the table, 1.812 ms on the device clock; torch.compile's here).
    module = kernels.load("rms_norm")
    shape, dtype = (4096, 4096), "bfloat16"
    medians = {"farm:gpu-triton": 39.2e-6, "xla": 41.6e-6, "torch": 24.6e-6, "torch_compile": 30e-6}
    clocks = {"farm:gpu-triton": (48.1e-6, 18.6e-6), "xla": (45.8e-6, 19.2e-6),
              "torch": (25.1e-6, 23.5e-6), "torch_compile": (36e-6, 30e-6)}
    result = {"kernel": "rms_norm", "space": "norms_rms", "shape": list(shape), "dtype": dtype,
              "flops": module.flops(shape), "bytes": module.bytes_moved(shape, dtype),
              "columns": {n: {"status": "ok", "median_s": m} for n, m in medians.items()},
              "timing_check": [{"column": n, "device_s": d, "kernels_s": k} for n, (d, k) in clocks.items()]}
    summary = seed_table.summarize([result], {"copy_bytes_per_s": 4.26e12})
    assert result["best_other"] == "torch" and result["speedup_vs_best_other"] < 1
    assert result["device_best_other"] == "xla"
    assert result["device_speedup_vs_best_other"] == pytest.approx(19.2 / 18.6)
    assert result["dispatch_bound"] == ["farm:gpu-triton", "xla"]
    assert result["table_off"] == ["torch_compile"]      # 30 us against 36 on the device clock
    assert summary["device_speedup_vs_best_other"] == pytest.approx(19.2 / 18.6)
    report = {"device": "H200", "date": "today", "versions": {}, "results": [result], "geomean": summary,
              "method": "m"}
    text = seed_table.markdown(report)
    assert "## On device time" in text and "| 1.03x | farm:gpu-triton, xla | torch_compile |" in text
    assert "| -16.7% |" in text     # torch.compile's table figure against its device clock


def test_seed_table_marks_a_column_whose_result_is_a_strided_view():
    # H200, 2026-12-03: torch.compile's product at 4096x50257x768 is a view of a 4096 x 50264 one
    layout = "a strided view, shape (4096, 50257), strides (50264, 1) (not compacted)"
    result = {"kernel": "matmul", "space": "matmul", "shape": [4096, 50257, 768], "dtype": "bfloat16",
              "best_other": "torch_compile", "speedup_vs_best_other": 0.69,
              "columns": {"farm:gpu-mosaic": {"status": "ok", "median_s": 6.9e-4},
                          "torch_compile": {"status": "ok", "median_s": 4.75e-4, "layout": layout},
                          "xla": {"status": "ok", "median_s": 1.5e-3}}}
    text = seed_table.markdown({"device": "H200", "date": "today", "versions": {}, "results": [result],
                                "geomean": {}, "method": "m"})
    assert "| torch_compile (0.475, strided view) |" in text
    assert f"torch_compile: returns {layout}: its time leaves out the compaction" in text
    assert "xla: returns" not in text
    assert baselines.strided_layout(jnp.zeros((4, 8))) is None      # JAX arrays are dense


def test_seed_table_explains_figures_over_their_measured_ceiling_by_what_bounds_them():
    # H200, 2026-12-03: cross entropy at 8192x151936 reads 2.49 GB and writes 32 KB in 0.539 ms,
    # 108% of a copy's rate (a copy reads and writes) yet under the HBM peak; a compute-bound
    # figure over the sustained matmul ceiling is a burst under the power cap.
    read_heavy = {"bound": "memory", "pct_of_ceiling": 108.0}
    assert "copy reads and writes alike" in seed_table._over_ceiling_note(read_heavy)
    assert "burst" in seed_table._over_ceiling_note({"bound": "compute", "pct_of_ceiling": 100.4})
    assert seed_table._over_ceiling_note({"bound": "memory", "pct_of_ceiling": 89.0}) == ""
    assert seed_table._over_ceiling_note({"bound": "memory"}) == ""


def _nvidia_smi(tmp_path, monkeypatch, script: str) -> None:
    """An `nvidia-smi` on PATH that runs `script` (sh) with nvidia-smi's arguments."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_text("#!/bin/sh\n" + script)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:/usr/bin:/bin")


def test_gpu_clocks_reads_nvidia_smi_and_falls_back_to_the_old_reasons_field(tmp_path, monkeypatch):
    from bench import gpu_clocks

    # A driver that knows only clocks_throttle_reasons (older name): the first query fails, as
    # nvidia-smi does on an unknown field; the sample comes from the second.
    _nvidia_smi(tmp_path, monkeypatch, 'case "$*" in *clocks_event_reasons*) echo "Field not valid" >&2; exit 2;; '
                '*clocks_throttle_reasons*) echo "1755, 3201, 612.40, 71, 0x0000000000000024";; esac\n')
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    found = gpu_clocks.sample()
    assert found == gpu_clocks.ClockSample(1755.0, 3201.0, 612.4, 71.0, ("power cap", "thermal (software)"))
    assert found.brief() == "1755/3201 MHz, 612 W, 71 C, power cap, thermal (software)"
    # No reasons field at all, power not reported: still the clocks.
    _nvidia_smi(tmp_path / "b", monkeypatch,
                'case "$*" in *reasons*) exit 2;; *) echo "1980, 3201, [N/A], 48";; esac\n')
    assert gpu_clocks.sample() == gpu_clocks.ClockSample(1980.0, 3201.0, None, 48.0)
    assert gpu_clocks.reasons("0x0000000000000000") == () and gpu_clocks.reasons("0x200") == ("0x200",)
    assert gpu_clocks.parse("[N/A], 3201, 500, 40", False) is None     # no SM clock: no sample
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu_clocks.sample() is None      # no nvidia-smi (a CPU machine): nothing, no error


def test_gpu_clocks_settle_waits_for_the_power_to_drop_and_not_longer_than_told():
    from bench import gpu_clocks

    def reader(powers):
        readings = iter(powers)
        return lambda: next(readings)

    def samples(*watts):
        return [gpu_clocks.ClockSample(1755.0, 3201.0, w, 50.0) for w in watts]

    hot = samples(680.0, 420.0, 120.0, 90.0)
    waited, last = gpu_clocks.settle(150.0, 5.0, poll_s=0.0, read=reader(hot))
    assert last.power_w == 120.0 and waited < 5.0           # the first reading at or below 150 W
    waited, last = gpu_clocks.settle(150.0, 0.0, poll_s=0.0, read=reader(hot))
    assert last.power_w == 680.0                              # no time allowed: the first reading
    # A GPU that idles above the threshold (or that another process keeps busy): the wait ends
    # once the power stops falling, not after max_s.
    busy = samples(680.0, 420.0, 300.0, 298.0, 297.0)
    waited, last = gpu_clocks.settle(150.0, 60.0, poll_s=0.0, read=reader(busy), plateau_s=0.0)
    assert last.power_w == 298.0 and waited < 60.0
    assert gpu_clocks.settle(150.0, 5.0, read=lambda: None) == (0.0, None)  # no nvidia-smi: no wait
    unpowered = gpu_clocks.ClockSample(1980.0, 3201.0, None, 40.0)
    assert gpu_clocks.settle(150.0, 5.0, read=lambda: unpowered) == (0.0, unpowered)


def test_seed_table_check_shows_the_gpu_clocks_around_each_column():
    result = {"kernel": "rms_norm", "space": "rms_norm", "shape": [8, 8], "dtype": "bfloat16", "columns": {},
              "timing_check": [{"column": "xla", "device_s": 1e-4, "kernels_s": 1e-4, "settled_s": 1.5, "clocks": [
                  {"sm_mhz": 1980.0, "mem_mhz": 3201.0, "power_w": 400.0, "temperature_c": 50.0, "reasons": []},
                  {"sm_mhz": 1755.0, "mem_mhz": 3201.0, "power_w": 690.0, "temperature_c": 71.0,
                   "reasons": ["power cap"]}]},
                  {"column": "torch", "error": "no GPU"}]}
    text = seed_table.markdown({"device": "H200", "date": "today", "versions": {}, "results": [result],
                                "geomean": {}, "method": "m"})
    assert "| idle 1.5 s, then 1980/3201 MHz, 400 W, 50 C; 1755/3201 MHz, 690 W, 71 C, power cap |" in text
    assert "| torch |  |  |  |  | no GPU |  |  |  |" in text     # no check, no clocks


def test_seed_table_warns_when_tuning_spends_the_comparison_budget():
    # --budget-s counts from the start, tuning included: one no longer than --tune would leave
    # torch.compile out of every row, which the table says before it starts.
    assert "torch.compile" in seed_table.budget_note(75, 60, no_compile=False)
    assert seed_table.budget_note(75, 200, no_compile=False) is None
    assert seed_table.budget_note(75, 60, no_compile=True) is None  # left out on purpose
    assert seed_table.budget_note(None, 60, no_compile=False) is None


def test_seed_table_takes_users_shapes(tmp_path):
    paths = seed_table.user_spaces(["softmax:8192x50257", "softmax:4096x128256", "rms_norm:4096x5120:float32"],
                                   tmp_path)
    loaded = {p.name: spaces.load_space(p) for p in paths}
    assert loaded["user_softmax_bfloat16.yaml"].targets[0].shapes == ((8192, 50257), (4096, 128256))
    assert loaded["user_rms_norm_float32.yaml"].targets[0].dtypes == ("float32",)
    with pytest.raises(SystemExit, match="KERNEL:AxB"):
        seed_table.user_spaces(["softmax:8192xwide"], tmp_path)


def test_seed_table_runs_the_timing_check_on_every_timed_column_of_a_check_row(tmp_path):
    # On CPU the CUPTI trace is unavailable: each timed column of the check row still gets its
    # entry (saying why), next to the figure the table reports; rows not checked get none.
    report = seed_table.main(["--small", "--out", str(tmp_path), "--spaces", "search_spaces/rms_norm.yaml",
                              "search_spaces/softmax.yaml", "--columns", "xla", "--no-compile",
                              "--repetitions", "3", "--check", "rms_norm"])
    checked = [r for r in report["results"] if "timing_check" in r]
    assert [r["space"] for r in checked] == ["rms_norm"]
    (row,) = checked
    timed = {n for n, c in row["columns"].items() if c.get("status") == "ok"}
    assert "xla" in timed and {c["column"] for c in row["timing_check"]} == timed
    assert all(c["table_s"] == row["columns"][c["column"]]["median_s"] and "error" in c for c in row["timing_check"])
    # Every row also times XLA's copy of as many bytes as it moves, beside its columns but not as one.
    for r in report["results"]:
        assert r["same_bytes_copy_s"] > 0 and seed_table.SAME_BYTES_COPY not in r["columns"]
        assert r["same_bytes_copy"].endswith("(torch copy_)" if baselines.on_gpu() else "(XLA negation)")
        assert r["best_other"] != seed_table.SAME_BYTES_COPY
        assert r["pct_of_same_bytes_copy"] == pytest.approx(100 * r["same_bytes_copy_s"] / r["farm_s"])
    assert "| % of a copy of its bytes |" in (tmp_path / "seed_table.md").read_text()


def test_seed_table_row_goes_on_when_its_same_bytes_copy_fails(tmp_path, monkeypatch):
    # One column failing in the interleaved timing sends the row to timing its columns one by one;
    # a copy that fails there is noted on the row, and the row's own columns are still timed.
    from bench import baselines

    def side_by_side(*args, **kwargs):
        raise RuntimeError("one column failed while interleaved")

    def broken_copy(n_bytes, n_sets=1, gpu=None):
        def fail(v):
            raise MemoryError("no room for the copy")
        return baselines.Prepared(fail, [(None,)] * n_sets)

    monkeypatch.setattr(seed_table.timing, "time_side_by_side", side_by_side)
    monkeypatch.setattr(baselines, "same_bytes_copy", broken_copy)
    report = seed_table.main(["--small", "--out", str(tmp_path), "--spaces", "search_spaces/rms_norm.yaml",
                              "--columns", "xla", "--no-compile", "--repetitions", "3"])
    (row,) = report["results"]
    assert "no room for the copy" in row["same_bytes_copy_error"] and "same_bytes_copy_s" not in row
    assert row["columns"]["xla"]["status"] == "ok" and row.get("farm_s")


def test_same_bytes_copy_is_torch_s_device_copy_on_a_gpu_and_xla_s_elsewhere():
    # On a GPU the copy at a row's size is torch's copy_ (XLA's negation moved 3.32 TB/s on the
    # H200 where torch's moved 4.27); without a CUDA device for torch, XLA's, and it still copies.
    import jax
    import numpy as np

    from bench import baselines

    for gpu in (False, True):  # True here: this machine's torch has no CUDA device, so XLA's
        copy = baselines.same_bytes_copy(4 * 1000, n_sets=2, gpu=gpu)
        assert len(copy.inputs) == 2
        if jax.default_backend() != "gpu":
            assert copy.framework == "jax" and "XLA negation" in copy.note
            assert np.array_equal(np.asarray(copy.output(1)), -np.asarray(copy.inputs[1][0]))
            assert np.asarray(copy.inputs[1][0]).size == 1000


def test_suite_convergence_judges_a_run_against_references_side_by_side(tmp_path, ray_local, signing_key):
    # Two real interpret sweeps of one small task: the run (4 configs) and a reference that
    # measures every config (8); the bench re-times both winners on a real worker and reports
    # the run's winner against the fastest of them.
    from bench import suite_convergence
    from tests.sweeps import run_sweep, space

    text = space("matmul", [[64, 64, 64]], trials=4, block_m=[8, 16, 32, 64], block_n=[16, 32], block_k=[16])
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    run, _ = run_sweep(tmp_path / "a", signing_key, text, "--sampler", "random", "--seed", "1")
    ref, _ = run_sweep(tmp_path / "b", signing_key, text, "--trials", "8")
    report = suite_convergence.main(["--run", str(run), "--reference", str(ref), "--at", "0.001,1000",
                                     "--budget-s", "0.5", "--out", str(tmp_path / "c.json")])
    (row,) = report["rows"]
    roles = row["roles"]
    assert {"run", "ref0", "run@1000s"} <= set(roles) and "run@0.001s" not in roles   # nothing done by 1 ms
    assert roles["run@1000s"] == roles["run"]     # no finalists on CPU: the winner is the fastest trial
    timed = {t["config"]: t["median_s"] for t in row["timings"]}
    assert set(timed) == set(roles.values()) and row["best_s"] == min(timed.values())
    assert row["ratio"] == pytest.approx(timed[roles["run"]] / row["best_s"])
    assert row["within"] == (row["ratio"] <= 1.02) and report["within"] == int(row["within"])
    assert json.loads((tmp_path / "c.json").read_text())["rows"][0]["task"] == row["task"]


def test_ab_summary_puts_two_builds_rounds_side_by_side(tmp_path):
    # bench/probes/ab_trees.sh writes baseN/ and patchedN/ folders of kernel_profile JSONs; the
    # summary pairs each case's configs across the builds and gives patched / base of the medians.
    from bench.probes import ab_summary

    for build, scale in (("base", 1.0), ("patched", 0.9)):
        for r in (1, 2):
            (tmp_path / f"{build}{r}").mkdir()
            rows = [{"config": "xla (jax.jit reference)", "sum_us_per_call": 100.0 + r},
                    {"config": '{"block_cols":2048}', "sum_us_per_call": (50.0 + r) * scale},
                    {"config": "torch_compile", "sum_us_per_call": None}]  # failed or skipped: left out
            (tmp_path / f"{build}{r}" / "1_rms_norm_8x8.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "base10").mkdir()  # rounds sort by number, not name
    text = ab_summary.summary(tmp_path)
    assert '| 1_rms_norm_8x8 | `{"block_cols":2048}` | 51.0, 52.0 | 45.9, 46.8 | 0.900 |' in text
    assert "| 1_rms_norm_8x8 | `xla (jax.jit reference)` | 101.0, 102.0 | 101.0, 102.0 | 1.000 |" in text
    assert "torch_compile" not in text
    assert [p.name for p in ab_summary.rounds(tmp_path, "base")] == ["base1", "base2", "base10"]
    with pytest.raises(SystemExit, match="no old"):
        ab_summary.summary(tmp_path, "old", "new")


def test_ncu_summary_gives_a_line_per_launch_and_its_largest_stalls(tmp_path):
    # bench/probes/ncu_staged.sh writes ncu's `--csv --page details` output (log lines first, then
    # one row per metric and launch); the summary keeps the figures that explain a row kernel's time.
    from bench.probes import ncu_summary

    head = ('"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"')
    rows = [("0", "body_mosaic_gpu_kernel", "GPU Speed Of Light Throughput", "Duration", "ns", "267,040"),
            ("0", "body_mosaic_gpu_kernel", "GPU Speed Of Light Throughput", "DRAM Throughput", "%", "81.68"),
            ("0", "body_mosaic_gpu_kernel", "GPU Speed Of Light Throughput", "Memory Throughput", "%", "81.68"),
            ("0", "body_mosaic_gpu_kernel", "GPU Speed Of Light Throughput", "L2 Cache Throughput", "%", "88.05"),
            # the same name again in another section (bytes a second): the percentage is kept
            ("0", "body_mosaic_gpu_kernel", "Memory Workload Analysis", "Memory Throughput", "byte/s", "3.9e12"),
            ("0", "body_mosaic_gpu_kernel", "Occupancy", "Achieved Occupancy", "%", "18.31"),
            ("0", "body_mosaic_gpu_kernel", "Command line profiler metrics",
             "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "", "3.05"),
            ("0", "body_mosaic_gpu_kernel", "Command line profiler metrics",
             "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "", "0.36"),
            ("0", "body_mosaic_gpu_kernel", "Command line profiler metrics",
             "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", "", "n/a"),  # not a number: left out
            ("1", "triton_red_fused_native_layer_norm", "GPU Speed Of Light Throughput", "Duration", "ns", "255,360")]
    lines = ["==PROF== Connected to process 1", head] + \
        [",".join(f'"{v}"' for v in (i, "1", k, sec, m, u, val)) for i, k, sec, m, u, val in rows]
    path = tmp_path / "ncu.csv"
    path.write_text("\n".join(lines) + "\n")
    out = ncu_summary.summarise(str(path))
    assert out[0] == ("  0 body_mosaic_gpu_kernel             time=267,040ns dram%=81.68% mem%=81.68% "
                      "l2%=88.05% occ%=18.31%")
    assert out[1] == "      stalls: long_scoreboard=3.05 barrier=0.36"
    assert out[2].startswith("  1 triton_red_fused_native_layer_norm"[:37]) and "time=255,360ns" in out[2]
    assert len(out) == 3  # no stall metrics for launch 1: no stall line


def test_gpu_check_takes_shapes_no_tile_divides(tmp_path):
    # In Pallas's interpreter on the CPU: Triton's matmul and attention at shapes cut off the tiles
    out = tmp_path / "ragged.json"
    assert check_gpu_kernels.main(["--interpret", "--ragged", "odd", "--target", "gpu-triton",
                                   "--only", "matmul", "flash_attention", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["kernel"] for r in rows} == {"matmul", "flash_attention"} and all(r["ok"] for r in rows)
    assert {r["shape"] for r in rows} == {"1001x193x65", "1x1x233x32", "41x193x961"}  # the last: a split K


def test_gpu_check_runs_thread_stores_off_the_grid_only():
    config = {"block_m": 128, "block_n": 128, "block_k": 64}
    assert check_gpu_kernels.store_variants("matmul", "gpu-mosaic", config, "odd") == [
        config, {**config, "store": "threads"}]
    assert check_gpu_kernels.store_variants("matmul", "gpu-mosaic", config, "units") == [config]
    assert check_gpu_kernels.store_variants("matmul", "gpu-triton", config, "odd") == [config]
    assert check_gpu_kernels.store_variants("flash_attention", "gpu-mosaic", config, "odd") == [config]


def test_space_coverage_names_empty_spaces_and_defaults_outside_them():
    # the two-pass softmax's interpret-mode chunks stop at 4096 columns, none dividing 50257;
    # Mosaic GPU's norms refuse rows that are not whole 128-byte units (1000 bf16 columns)
    row = space_coverage.coverage("softmax_two_pass", (8192, 50257), "interpret", "bfloat16")
    assert row.configs == 0 and row.default.startswith("breaks (cols % block_cols == 0")
    row = space_coverage.coverage("layer_norm", (1000, 1000), "gpu-mosaic", "bfloat16")
    assert (row.configs, row.default) == (0, "refused by the kernel")
    for kernel, shape in (("softmax", (3, 151936)), ("softmax_two_pass", (8192, 50257))):
        row = space_coverage.coverage(kernel, shape, "tpu", "bfloat16")
        assert row.configs > 0 and row.default == "in the space"


def test_space_fuzz_draws_configs_that_fit_and_judges_them_as_a_worker_would(tmp_path):
    # the tool that found welford's and cross entropy's NaN rows at 127 columns (tests/test_rowwise.py
    # keeps that case): real configs, compiled and validated by the worker's own code
    out = tmp_path / "fuzz.json"
    code = space_fuzz.main(["--case", "welford:3x127", "--case", "softmax:5x77", "--target", "gpu-triton",
                            "--target", "interpret", "--configs", "3", "--seed", "1", "--out", str(out)])
    rows = json.loads(out.read_text())
    assert code == 0 and {r["outcome"] for r in rows} == {"ok"}
    # 3 drawn a task, or all there are: the interpret spaces hold one config at these shapes
    drawn = collections.Counter((r["kernel"], r["target"]) for r in rows)
    assert drawn == {(k, t): min(3, space_coverage.coverage(k, s, t, d).configs)
                     for k, s, d in (("welford", (3, 127), "float32"), ("softmax", (5, 77), "bfloat16"))
                     for t in ("gpu-triton", "interpret")}
    for r in rows:   # every one admitted by the space and the kernel, and distinct within its task
        module = kernels.load(r["kernel"])
        assert module.check_config(r["config"], tuple(r["shape"]), r["dtype"], r["target"]) is None
    assert len({json.dumps([r["kernel"], r["target"], r["config"]], sort_keys=True) for r in rows}) == len(rows)
    bad = space_fuzz.Row("welford", (3, 127), "float32", "gpu-triton", {"block_cols": 64}, "wrong_result",
                         "relative error inf exceeds the float32 tolerance")
    text = space_fuzz.table([space_fuzz.Row(**{**rows[0], "shape": tuple(rows[0]["shape"])}), bad])
    assert "2 configs, 1 failed" in text and 'welford 3x127 float32 gpu-triton wrong_result: {"block_cols": 64}' in text


def test_space_fuzz_lowers_native_builds_at_users_sizes(tmp_path):
    out = tmp_path / "fuzz.json"
    assert space_fuzz.main(["--lower", "--case", "cross_entropy:8192x50257", "--target", "gpu-triton",
                            "--target", "tpu", "--configs", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 4 and {r["outcome"] for r in rows} == {"lowered"}
    assert {r["dtype"] for r in rows} == {"bfloat16"}
