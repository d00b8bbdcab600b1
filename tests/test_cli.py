"""The `farm` command's own options: --version and --log-level."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest

import farm
from farm import cli


def test_version_prints_the_package_version(repo):
    out = subprocess.run([sys.executable, "-m", "farm", "--version"], cwd=repo, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"farm (pallas-farm) {farm.__version__}"


def test_log_level_sets_the_root_logger(tmp_path, monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    assert cli.main(["--log-level", "info", "keygen", str(tmp_path / "k.pem")]) == 0
    assert logging.getLogger().level == logging.INFO


def test_unknown_log_level_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--log-level", "chatty", "keygen"])
    assert exit_.value.code == 2 and "--log-level" in capsys.readouterr().err


@pytest.mark.parametrize("argv, fragment", [
    (["sweep", "--kernel", "softmax", "--shape", "4x"], "farm sweep: argument --shape: expected positive integers"),
    (["sweep", "x.yaml", "--trials", "-3"], "--trials: expected a positive integer"),
    (["sweep", "x.yaml", "--dtype", "float64"], "--dtype: invalid choice"),
    (["sweep", "x.yaml", "--trials", "2000000"], "--trials: expected a positive integer of at most 1000000"),
    (["sweep", "x.yaml", "--compile-timeout", "inf"], "--compile-timeout: expected a positive number, got inf"),
    (["nosuch"], "farm: argument command: invalid choice"),
])
def test_usage_errors_are_one_line(capsys, argv, fragment):
    from farm.cli import options
    from farm.search import spaces

    assert options.MAX_TRIALS == spaces.MAX_TRIALS
    """As every other error of the CLI: one line naming the flag and what was expected (the usage
    block is one --help away)."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and fragment in err and "--help" in err


def test_race_and_sample_budget_reach_the_sweep_settings(tmp_path, capsys):
    from farm.cli.options import build_parser
    from farm.cli.tune import _sweep_settings

    def settings(*flags: str):
        args = build_parser().parse_args(["sweep", "--kernel", "softmax", *flags])
        return _sweep_settings(args, tmp_path)

    default = settings()
    assert (default.race, default.sample_budget_s) == (1.5, 0.5)
    given = settings("--race", "2", "--sample-budget", "1.25")
    assert (given.race, given.sample_budget_s) == (2.0, 1.25)
    off = settings("--race", "0", "--sample-budget", "0")
    assert (off.race, off.sample_budget_s) == (None, None)
    with pytest.raises(SystemExit) as exit_:
        settings("--race", "0.5")
    assert exit_.value.code == 2 and "--race: expected 0 (off) or a factor above 1" in capsys.readouterr().err
    assert default.finalist_sustain_s == 0.0 and settings("--finalist-sustain", "0.5").finalist_sustain_s == 0.5
    with pytest.raises(SystemExit):
        settings("--finalist-sustain", "-1")


def test_an_out_or_address_that_cannot_work_is_one_line_and_leaves_nothing(tmp_path, capsys):
    """A run folder under a file, and a Ray address that is none: one line, no run folder left."""
    space = tmp_path / "space.yaml"
    space.write_text("extends: softmax\nshapes: [[8, 128]]\ndtypes: [float32]\n")
    key = tmp_path / "k.pem"
    assert cli.main(["keygen", str(key)]) == 0
    capsys.readouterr()
    common = [str(space), "--target", "interpret", "--key", str(key), "--quiet"]
    assert cli.main(["sweep", *common, "--out", str(space / "sub")]) == 2
    err = capsys.readouterr().err
    assert f"{space} is not a folder" in err and len(err.strip().splitlines()) == 1
    out = tmp_path / "run"
    assert cli.main(["sweep", *common, "--out", str(out), "--address", "junk:::1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--address junk:::1: " in err[-1] and "expected the host:port" in err[-1] and not out.exists()
    import socket

    with socket.socket() as free:   # a port nothing listens on: Ray alone would retry it for minutes
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert cli.main(["sweep", *common, "--out", str(out), "--address", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"--address 127.0.0.1:{port}: nothing answers there" in err[-1] and not out.exists()


def test_scale_up_is_refused_before_ray_where_it_cannot_ask_for_one_kind_of_chip(tmp_path, capsys, monkeypatch):
    """--scale-up asks an autoscaler for one kind of chip: targets of two kinds, targets of none, or an
    embedded local Ray (no autoscaler) are each one line before Ray starts, leaving no run folder
    (tests/test_cluster.py asks a real autoscaler)."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    space = tmp_path / "space.yaml"
    space.write_text("extends: softmax\nshapes: [[8, 128]]\ndtypes: [float32]\n")
    key = tmp_path / "k.pem"
    assert cli.main(["keygen", str(key)]) == 0
    common = [str(space), "--key", str(key), "--quiet", "--scale-up", "4", "--out", str(tmp_path / "run")]
    for flags, fragment in [
        (["--target", "tpu", "--target", "gpu-triton", "--address", "127.0.0.1:1"],
         "--scale-up: this sweep's targets run on GPU and TPU; expected --target naming the one kind of chip"),
        (["--target", "interpret", "--address", "127.0.0.1:1"],
         "--scale-up: no target of this sweep runs on an accelerator (interpret); expected --target tpu"),
        (["--target", "tpu", "--interpret"],
         "--scale-up 4: an embedded local Ray has no autoscaler to ask for TPU hosts; expected --address"),
        (["--target", "tpu", "--interpret", "--address", "local"],
         "--scale-up 4: an embedded local Ray has no autoscaler to ask for TPU hosts; expected --address"),
    ]:
        capsys.readouterr()
        assert cli.main(["sweep", *common, *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err
        assert not (tmp_path / "run").exists() and not ray.is_initialized()
    for flags, fragment in [(["--scale-up", "0"], "--scale-up: expected a positive integer"),
                            (["--scale-up-wait", "-1"], "--scale-up-wait: expected")]:
        with pytest.raises(SystemExit):
            cli.main(["sweep", str(space), *flags])
        assert fragment in capsys.readouterr().err
    from farm.errors import FarmError
    from farm.run.sweep import SweepSettings

    with pytest.raises(FarmError, match=r"--scale-up \(scale_up\): expected an integer from 1 to 4096"):
        SweepSettings(run_dir=tmp_path / "x", scale_up=5000)


def test_dry_run_counts_what_a_sweep_would_search_and_starts_nothing(tmp_path, capsys, monkeypatch):
    """--dry-run: each task's valid configs (as the searcher enumerates them) and those that fit the
    memory pruned against (a few Triton blocks of a 50257-wide bfloat16 row outgrow an H200's shared
    memory), its budget and default; no Ray, no run folder."""
    import jax.numpy as jnp
    import ray

    import kernels
    from farm.measure import capacity
    from tests.shipped_spaces import admitted_configs
    from tests.shipped_spaces import space as shipped_space

    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "--kernel", "softmax", "--shape", "64x50257", "--dtype", "bfloat16", "--target", "gpu-triton",
            "--trials", "3", "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    shape, dtype = (64, 50257), jnp.dtype("bfloat16")
    valid = admitted_configs(shipped_space("softmax"), "gpu-triton", shape, "bfloat16")
    module, cap = kernels.load("softmax"), capacity.profile("h200")
    fits = [c for c in valid if module.footprint(c, shape, dtype, "gpu-triton") <= cap.onchip_bytes]
    assert 0 < len(fits) < len(valid)
    row = next(line for line in out.splitlines() if "softmax/64x50257/bfloat16/gpu-triton" in line)
    # piped (not a terminal): one tab-separated line a task
    assert row.split("\t")[:5] == ["softmax/64x50257/bfloat16/gpu-triton", "pattern", "3", str(len(valid)),
                                   str(len(fits))], row
    assert row.split("\t")[5].startswith("h200: 227 KiB shared memory"), row
    assert "1 tasks, 3 trials budgeted" in out
    # A head dim no Mosaic GPU tile fits: no config, and the default too large as well: nothing would run.
    assert cli.main(["sweep", "--kernel", "flash_attention", "--shape", "1x1x1024x512", "--dtype", "bfloat16",
                     "--target", "gpu-mosaic", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(does not fit: footprint " in out and "1 of them would run nothing" in out
    assert not ray.is_initialized() and not list(tmp_path.iterdir())
    assert cli.main(["sweep", "--resume", str(tmp_path / "x"), "--dry-run"]) == 2
    assert "--dry-run: expected a new sweep" in capsys.readouterr().err
