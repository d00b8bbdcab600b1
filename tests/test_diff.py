"""`farm diff OLD NEW`: two real signed bundles compared task by task (farm.bundle.compare)."""
from __future__ import annotations

import json

import pytest

from farm import cli
from farm.bundle import artifacts
from farm.bundle.compare import ADDED, DROPPED, NEW_CONFIG, SAME_CONFIG, compare, counts
from tests import bundles


def _row(shape, config, median_s, **kw):
    return bundles.row("softmax", shape, config, median_s=median_s, **kw)


@pytest.fixture
def pair(tmp_path):
    """OLD and NEW bundles signed by one key, and that key's public file.

    64x256: same config, same time; 128x512: a new config twice as fast; 256x512: tuned in OLD,
    failed in NEW (dropped); 512x512: new in NEW (added); 1024x512 tuned on an H200 in OLD and on
    a CPU in NEW: two tasks, as a deployment looks them up (one dropped, one added)."""
    key, public = bundles.keypair(tmp_path / "keys", "ci")
    old = [_row((64, 256), {"block_rows": 16}, 1e-4), _row((128, 512), {"block_rows": 16}, 2e-4),
           _row((256, 512), {"block_rows": 8}, 3e-4),
           _row((1024, 512), {"block_rows": 64}, 4e-4, device_kind="NVIDIA H200")]
    new = [_row((64, 256), {"block_rows": 16}, 1.01e-4, created="2025-02-01T00:00:00+00:00"),
           _row((128, 512), {"block_rows": 32}, 1e-4, created="2025-02-01T00:00:00+00:00"),
           _row((256, 512), {}, 0, status="no_valid_config"),
           _row((512, 512), {"block_rows": 32}, 5e-4),
           _row((1024, 512), {"block_rows": 32}, 4e-4)]
    return bundles.write(tmp_path / "old", old, key), bundles.write(tmp_path / "new", new, key), public


def test_diff_lists_what_pulling_new_adds_drops_and_changes(pair, capsys):
    old, new, public = pair
    assert cli.main(["diff", str(old), str(new), "--trust", str(public), "--json"]) == 0
    captured = capsys.readouterr()
    assert "UNVERIFIED" not in captured.err
    rows = {r["task"]: r for r in map(json.loads, captured.out.splitlines())}
    key = "softmax/{}/float32/interpret on {}".format
    assert {task: r["change"] for task, r in rows.items()} == {
        key("64x256", "cpu"): SAME_CONFIG, key("128x512", "cpu"): NEW_CONFIG, key("256x512", "cpu"): DROPPED,
        key("512x512", "cpu"): ADDED, key("1024x512", "NVIDIA H200"): DROPPED, key("1024x512", "cpu"): ADDED}
    faster = rows[key("128x512", "cpu")]
    assert faster["old_config"] == {"block_rows": 16} and faster["new_config"] == {"block_rows": 32}
    assert faster["ratio"] == pytest.approx(2.0) and faster["within_noise"] is False
    assert rows[key("64x256", "cpu")]["within_noise"] is True      # 1% apart, spreads of 1% each
    assert rows[key("256x512", "cpu")]["new_config"] is None and rows[key("256x512", "cpu")]["ratio"] is None
    # the table: changed knobs shown old -> new, dropped tasks first, and the one-line summary
    assert cli.main(["diff", str(old), str(new), "--trust", str(public)]) == 0
    out = capsys.readouterr().out
    assert "block_rows=16->32" in out and out.index("dropped") < out.index("added")
    assert "6 task(s) tuned in either bundle: 2 dropped, 1 new config, 2 added, 1 same config" in out
    assert "NEW's ran faster at 1 and slower at 0 beyond their spreads" in out
    assert "64x256" not in out and "the 1 same config(s) are listed with --all" in out
    assert cli.main(["diff", str(old), str(new), "--trust", str(public), "--all"]) == 0
    out = capsys.readouterr().out
    assert "64x256" in out and "same config" in out and "listed with --all" not in out


def test_diff_gates_on_dropped_tasks_and_verifies_both_bundles(pair, tmp_path, capsys):
    old, new, public = pair
    assert cli.main(["diff", str(old), str(new), "--trust", str(public), "--fail-on-dropped"]) == 3
    err = capsys.readouterr().err
    assert "2 task(s) tuned in" in err and f"farm bundle {old} {new}" in err
    assert cli.main(["diff", str(new), str(new), "--trust", str(public), "--fail-on-dropped"]) == 0
    capsys.readouterr()
    assert cli.main(["diff", str(old), str(new)]) == 0      # no --trust: compared, with a warning
    assert "WARNING: UNVERIFIED bundles" in capsys.readouterr().err
    other, other_public = bundles.keypair(tmp_path / "keys", "other")
    assert cli.main(["diff", str(old), str(new), "--trust", str(other_public)]) == 1   # a signer not trusted
    assert "verification failed" in capsys.readouterr().err
    configs = new / artifacts.CONFIGS
    configs.write_bytes(configs.read_bytes() + b"\0")
    assert cli.main(["diff", str(old), str(new)]) == 1       # a tampered file fails even without --trust
    assert "configs.parquet" in capsys.readouterr().err
    assert cli.main(["diff", str(old), str(tmp_path / "nowhere"), "--trust", str(public)]) == 2
    assert f"{tmp_path / 'nowhere'}: not found" in capsys.readouterr().err


def test_medians_are_compared_only_when_taken_the_same_way():
    def row(**kw):
        base = {"task_key": "t", "device_kind": "d", "status": "ok", "config": '{"a": 1}', "median_s": 2e-3,
                "spread": 0.0, "clock": "device", "interpret": False, "fingerprint_sha256": "f1"}
        return {**base, **kw}

    def one(old, new):
        [change] = compare([old], [new])
        return change

    assert one(row(), row(median_s=1e-3)).ratio == pytest.approx(2.0)
    wall = one(row(), row(clock="wall"))
    assert wall.ratio is None and "other clocks (device and wall)" in wall.incomparable
    assert one(row(), row(interpret=True)).incomparable == "one was timed in interpret mode"
    assert one(row(clock=None), row(clock="wall")).ratio == pytest.approx(1.0)   # unrecorded: the host's
    assert one(row(), row(median_s=None)).incomparable == "no median recorded"
    assert one(row(), row(fingerprint_sha256="f2")).software_changed
    assert not one(row(), row(fingerprint_sha256=None)).software_changed
    assert one(row(), row(median_s=1.92e-3, spread=0.05)).within_noise    # 4% apart, a 5% spread
    assert not one(row(), row(median_s=1.92e-3)).within_noise             # 4% apart, no spread: the 2% floor
    # rows that hold no tuned config are no task of either bundle
    assert compare([row(status="failed"), row(task_key="u", config="[1]")], [row(task_key="v", config=None)]) == []
    assert counts(compare([row()], [row(task_key="u")])) == {DROPPED: 1, NEW_CONFIG: 0, ADDED: 1, SAME_CONFIG: 0}
