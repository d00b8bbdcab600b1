"""A new user's tuning path: shapes first (--kernel, --tasks), results where they say, bad input
writes nothing, --resume with changed flags. Real Ray, Optuna and CLI."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from farm import cli
from farm.bundle import signing, trust
from farm.cli import tune
from farm.errors import FarmError
from farm.search import tasks_file

COMMON = ["--target", "interpret", "--trials", "2", "--repetitions", "2", "--quiet"]


def _lines(path: Path, *items: object) -> Path:
    path.write_text("".join((i if isinstance(i, str) else json.dumps(i)) + "\n" for i in items))
    return path


def _task_keys(run: Path) -> list[str]:
    return sorted(r["task_key"] for r in pq.read_table(run / "bundle" / "configs.parquet").to_pylist())


# -- the tasks file --------------------------------------------------------------------------------
def test_tasks_file_reads_recorded_misses_once_each(tmp_path):
    path = _lines(tmp_path / "misses.jsonl",
                  {"kernel": "softmax", "shape": [64, 256], "dtype": "float32", "target": "interpret",
                   "rule": "default", "distance": None},
                  "",
                  {"kernel": "softmax", "shape": "64x256", "dtype": "float32", "target": "interpret",
                   "rule": "nearest", "distance": 1.0},
                  {"kernel": "matmul", "shape": [128, 128, 256], "dtype": "bfloat16", "target": "tpu"})
    tasks = tasks_file.read_tasks(path)
    assert [t.key for t in tasks] == ["softmax/64x256/float32/interpret", "matmul/128x128x256/bfloat16/tpu"]
    spaces = tasks_file.tasks_spaces(tasks, label="--tasks x")
    assert [s.kernel for s in spaces] == ["softmax", "matmul"]
    assert [t.name for t in spaces[1].targets] == ["tpu"] and spaces[1].targets[0].dtypes == ("bfloat16",)


@pytest.mark.parametrize("line,fragment", [
    ("{not json", ":2: expected a JSON object, got invalid JSON"),
    ("[1, 2]", ":2: expected a JSON object with fields kernel, shape, dtype, target"),
    ({"kernel": "softmax", "shape": [64, 256], "dtype": "float32"}, ":2: target: expected a value"),
    ({"kernel": "nope", "shape": [64], "dtype": "float32", "target": "tpu"}, ":2: kernel: expected a known kernel"),
    ({"kernel": "softmax", "shape": [64, 256, 2], "dtype": "float32", "target": "tpu"},
     ":2: shape: expected 2 positive integers (rows, cols)"),
    ({"kernel": "softmax", "shape": [64, 0], "dtype": "float32", "target": "tpu"}, ":2: shape: expected 2"),
    ({"kernel": "softmax", "shape": [64, 256], "dtype": "int8", "target": "tpu"}, ":2: dtype: expected one of"),
    ({"kernel": "softmax", "shape": [64, 256], "dtype": "float32", "target": "cuda"}, ":2: target: expected a "
     "target of softmax"),
    ({"kernel": "softmax", "shape": [8, 10 ** 12], "dtype": "float32", "target": "interpret"},
     ":2: shape: expected dimensions of at most 2147483647"),
    ('{"kernel": "softmax", "shape": [' + "9" * 5000 + ', 256]}', ":2: expected a JSON object of small values"),
    ("[" * 100_000, ":2: expected a JSON object, got JSON nested too deep"),
])
def test_a_bad_tasks_line_is_one_error_naming_file_and_line(tmp_path, capsys, line, fragment):
    good = {"kernel": "softmax", "shape": [64, 256], "dtype": "float32", "target": "interpret"}
    path = _lines(tmp_path / "tasks.jsonl", good, line)
    out = tmp_path / "run"
    assert cli.main(["sweep", "--tasks", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:2: ") and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_tasks_file_is_bounded(tmp_path, monkeypatch):
    good = json.dumps({"kernel": "softmax", "shape": [64, 256], "dtype": "float32", "target": "interpret"})
    path = tmp_path / "tasks.jsonl"
    path.write_text((good + "\n") * 5)
    monkeypatch.setattr(tasks_file, "MAX_LINES", 4)
    with pytest.raises(FarmError, match="expected at most 4 lines"):
        tasks_file.read_tasks(path)
    monkeypatch.setattr(tasks_file, "MAX_BYTES", 100)
    with pytest.raises(FarmError, match=f"--tasks {path}: expected at most 100 bytes"):
        tasks_file.read_tasks(path)
    with pytest.raises(FarmError, match="expected a readable JSON-lines file"):
        tasks_file.read_tasks(tmp_path / "missing.jsonl")
    path.write_text("\n\n")
    with pytest.raises(FarmError, match="expected at least one task line"):
        tasks_file.read_tasks(path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)   # would block a plain open() forever; /dev/zero would never end
    for special in (fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises(FarmError, match="a regular file, not a folder, device or FIFO|Is a directory"):
            tasks_file.read_tasks(special)


@pytest.mark.parametrize("argv,fragment", [
    (["--shape", "64x256"], "--shape: expected --kernel too"),
    (["--kernel", "softmax", "--shape", "64x256x3"], "--shape 64x256x3: expected 2 dimensions for softmax"),
    (["--kernel", "nosuch"], "--kernel nosuch: expected a known kernel"),
    ([], "expected SPACE files, --kernel KERNEL --shape AxB, or --tasks FILE"),
])
def test_shape_first_bad_input(tmp_path, capsys, argv, fragment):
    out = tmp_path / "run"
    assert cli.main(["sweep", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_bad_shape_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["sweep", "--kernel", "softmax", "--shape", "64by256"])
    assert exit_.value.code == 2 and "--shape" in capsys.readouterr().err


def test_shape_first_space_keeps_the_shipped_knobs():
    space = tasks_file.minimal_space("softmax", [(4096, 50257)], ["bfloat16"], label="--kernel softmax")
    assert {(t.shapes, t.dtypes) for t in space.targets} == {(((4096, 50257),), ("bfloat16",))}
    assert {t.name for t in space.targets} == {"tpu", "gpu-triton", "gpu-mosaic", "interpret"}
    shipped = tasks_file.minimal_space("softmax", [], label="--kernel softmax")
    assert shipped.targets[-1].dtypes == ("float32",)  # the shipped space's per-target dtypes


# -- real sweeps -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shape_first_run(ray_local, signing_key, tmp_path_factory):
    """`farm sweep --kernel softmax --shape 32x128 --shape 16x256 --dtype float32 --target interpret`."""
    out = tmp_path_factory.mktemp("shape_first") / "run"
    assert cli.main(["sweep", "--kernel", "softmax", "--shape", "32x128", "--shape", "16x256", "--dtype", "float32",
                     "--out", str(out), "--key", str(signing_key[0]), *COMMON]) == 0
    return out


def test_sweep_by_kernel_and_shape(shape_first_run, signing_key):
    trust.verify(shape_first_run / "bundle", trust.load_trust([signing_key[1]]))
    assert _task_keys(shape_first_run) == ["softmax/16x256/float32/interpret", "softmax/32x128/float32/interpret"]
    saved = json.loads((shape_first_run / "sweep.json").read_text())
    assert list(saved["spaces"].values()) == ["--kernel softmax"]
    run = json.loads((shape_first_run / "run.json").read_text())
    assert run["summary"]["warm_up"] and len(run["summary"]["warm_up"]) == run["summary"]["workers"]


def test_resume_refuses_changed_flags_and_applies_safe_ones(shape_first_run, signing_key, capsys):
    before = (shape_first_run / "trials.jsonl").read_text()
    code = cli.main(["sweep", "--resume", str(shape_first_run), "--interpret", "--sampler", "random",
                     "--key", str(signing_key[0]), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--interpret (saved False, given True)" in err and "--sampler (saved None, given 'random')" in err
    code = cli.main(["sweep", "--resume", str(shape_first_run), "--trials", "5", "--key", str(signing_key[0])])
    assert code == 2 and "expected no --trials" in capsys.readouterr().err
    # safe flags apply; the saved spaces (made by --kernel) load again; nothing is measured twice
    assert cli.main(["sweep", "--resume", str(shape_first_run), "--workers", "1", "--repetitions", "2",
                     "--key", str(signing_key[0]), "--quiet"]) == 0
    assert (shape_first_run / "trials.jsonl").read_text() == before
    assert json.loads((shape_first_run / "run.json").read_text())["settings"]["workers"] == 1


def test_sweep_of_a_tasks_file_tunes_exactly_its_tasks_into_a_url(ray_local, signing_key, tmp_path, monkeypatch):
    path = _lines(tmp_path / "misses.jsonl",
                  {"kernel": "softmax", "shape": [32, 128], "dtype": "float32", "target": "interpret",
                   "rule": "default", "distance": None},
                  {"kernel": "softmax", "shape": [16, 256], "dtype": "float32", "target": "tpu"},
                  {"kernel": "matmul", "shape": [50, 72, 40], "dtype": "float32", "target": "interpret"},
                  {"kernel": "softmax", "shape": [32, 128], "dtype": "float32", "target": "interpret"})
    url = f"file://{tmp_path}/published/run-1"
    monkeypatch.chdir(tmp_path)           # the run is staged in ./artifacts
    monkeypatch.setenv(cli.KEY_ENV, signing_key[0].read_text())   # the PEM itself, as a Ray job may get it
    assert cli.main(["sweep", "--tasks", str(path), "--out", url, *COMMON]) == 0
    published = tmp_path / "published" / "run-1"
    trust.verify(published / "bundle", trust.load_trust([signing_key[1]]))
    # --target interpret drops the tpu line; the cross product (softmax 16x256 interpret) is not tuned
    assert _task_keys(published) == ["matmul/50x72x40/float32/interpret", "softmax/32x128/float32/interpret"]
    # a user's shape no tile divides is tuned like any other (its edge tiles padded)
    rows = pq.read_table(published / "bundle" / "configs.parquet").to_pylist()
    assert {r["task_key"]: r["status"] for r in rows}["matmul/50x72x40/float32/interpret"] == "ok"
    staged = list((tmp_path / "artifacts").iterdir())
    assert len(staged) == 1 and (staged[0] / "trials.jsonl").read_text() == (published / "trials.jsonl").read_text()
    # the URL is taken now: a second sweep to it is refused before anything runs
    assert cli.main(["sweep", "--tasks", str(path), "--out", url, *COMMON]) == 2
    assert len(list((tmp_path / "artifacts").iterdir())) == 1


def test_a_target_the_cluster_cannot_run_writes_nothing(ray_local, signing_key, tmp_path, capsys):
    out = tmp_path / "run"
    code = cli.main(["sweep", "--kernel", "softmax", "--shape", "64x256", "--target", "tpu", "--out", str(out),
                     "--key", str(signing_key[0]), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --target tpu: the Ray cluster has no TPU resources"), err
    assert not out.exists()
    out.mkdir()   # an empty folder given as --out stays empty
    assert cli.main(["sweep", "--kernel", "softmax", "--shape", "64x256", "--target", "tpu", "--out", str(out),
                     "--key", str(signing_key[0]), "--quiet"]) == 2
    assert list(out.iterdir()) == []


def test_with_no_target_the_sweep_tunes_what_the_cluster_runs_and_notes_the_rest(ray_local, signing_key,
                                                                                   tmp_path, capsys):
    # This CPU cluster has no TPU or GPU: the shipped softmax space's tpu, gpu-triton and
    # gpu-mosaic tasks are left out with a note each, its interpret tasks tuned. --target names a
    # target to be told as an error instead (above).
    out = tmp_path / "run"
    code = cli.main(["sweep", "search_spaces/softmax.yaml", "--trials", "2", "--repetitions", "2", "--out", str(out),
                     "--key", str(signing_key[0]), "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for target, resource in (("gpu-mosaic", "GPU"), ("gpu-triton", "GPU"), ("tpu", "TPU")):
        assert f"note: left out the {target} tasks: the Ray cluster has no {resource} resources" in captured.err
    keys = _task_keys(out)
    assert keys and all(key.endswith("/interpret") for key in keys)
    saved = json.loads((out / "run.json").read_text())
    assert set(saved["summary"]["left_out"]) == {"gpu-mosaic", "gpu-triton", "tpu"}
    assert saved["tasks"] and all(key.endswith("/interpret") for key in saved["tasks"])


def test_signing_key_from_the_environment(tmp_path, monkeypatch):
    private, _, kid = signing.generate_keypair(tmp_path / "env.pem")
    args = cli.build_parser().parse_args(["sweep", "x.yaml"])
    monkeypatch.setenv(cli.KEY_ENV, str(private))
    assert signing.key_id(tune.signing_key(args).public_key()) == kid
    monkeypatch.setenv(cli.KEY_ENV, private.read_text())
    assert signing.key_id(tune.signing_key(args).public_key()) == kid
    monkeypatch.setenv(cli.KEY_ENV, "-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----")
    with pytest.raises(FarmError, match=r"\$FARM_SIGNING_KEY: expected a PEM Ed25519 private key"):
        tune.signing_key(args)


def test_a_shape_or_dtype_given_twice_is_one_task():
    from farm.cli.options import build_parser

    args = build_parser().parse_args(["sweep", "--kernel", "softmax", "--shape", "3x1000", "--shape", "3x1000",
                                      "--dtype", "float32", "--dtype", "float32", "--target", "interpret"])
    tasks = [p.task.key for p in tune._sweep_spaces(args)]
    assert tasks == ["softmax/3x1000/float32/interpret"]


def test_a_misses_file_of_more_shapes_than_a_space_lists_is_tuned_whole(tmp_path):
    """A deployment records every shape it missed: 300 of one kernel (a space lists at most 256)."""
    from farm.search import plan

    path = _lines(tmp_path / "misses.jsonl", *({"kernel": "softmax", "shape": [rows, 1000], "dtype": "float32",
                                                 "target": "interpret"} for rows in range(1, 301)))
    tasks = tasks_file.read_tasks(path)
    spaces = tasks_file.tasks_spaces(tasks, label="--tasks m")
    keys = tasks_file.task_key_set(tasks)
    assert [s.path for s in spaces] == ["--tasks m (kernel softmax, shapes 1-256 of 300)",
                                        "--tasks m (kernel softmax, shapes 257-300 of 300)"]
    assert sorted(p.task.key for p in plan.expand(spaces) if p.task.key in keys) == sorted(keys)
