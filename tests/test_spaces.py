"""Search space loading: valid spaces expand into tasks; bad input is one clear error, exit 2,
and nothing is written."""
from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from farm import cli
from farm.errors import SpaceError
from farm.search import plan, spaces
from farm.search.constraints import Constraint, ConstraintSyntaxError
from farm.search.searcher import OUTSIDE_STUDY
from farm.search.space_files import shipped_space
from tests.sweeps import run_sweep
from tests.sweeps import space as space_text

VALID = """\
kernel: softmax
dtypes: [float32]
shapes: [[64, 256]]
targets: [interpret]
params:
  block_rows: {pow2: [1, 64]}
constraints:
  - rows % block_rows == 0
trials: 3
"""


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_repo_spaces_load_and_expand(repo):
    loaded = spaces.load_spaces(sorted((repo / "search_spaces").glob("*.yaml")))
    tasks = plan.expand(loaded, ["interpret"])
    keys = [t.task.key for t in tasks]
    assert "softmax/64x256/float32/interpret" in keys
    assert "matmul/128x128x128/float32/interpret" in keys
    assert len(keys) == len(set(keys))


def test_space_fields(tmp_path):
    space = spaces.load_space(write(tmp_path, VALID))
    assert space.params[0].choices == (1, 2, 4, 8, 16, 32, 64)
    assert space.violated({"block_rows": 64}, (64, 256), "float32", "interpret") is None
    assert space.violated({"block_rows": 64}, (96, 256), "float32", "interpret") == "rows % block_rows == 0"
    assert space.trials == 3 and space.sampler.name == "pattern"   # the default


def test_target_restricted_params_and_constraints(tmp_path):
    text = VALID.replace("targets: [interpret]", "targets: {interpret: {}, gpu-triton: {}}") + "sampler: random\n"
    text = text.replace("params:\n", "params:\n  num_warps: {values: [2, 4], targets: [gpu-triton]}\n")
    space = spaces.load_space(write(tmp_path, text))
    assert [p.name for p in space.params_for("interpret")] == ["block_rows"]
    assert [p.name for p in space.params_for("gpu-triton")] == ["num_warps", "block_rows"]
    assert space.size("gpu-triton") == 14
    assert space.sampler.name == "random"


BAD_SPACES = [
    ("unknown kernel", VALID.replace("kernel: softmax", "kernel: nosuchkernel"), "kernel", "known kernel"),
    ("unknown field", VALID + "colour: blue\n", "colour", "one of the fields"),
    ("wrong type for trials", VALID.replace("trials: 3", "trials: three"), "trials", "positive integer"),
    ("empty choices", VALID.replace("{pow2: [1, 64]}", "{values: []}"), "params.block_rows.values", "non-empty list"),
    ("infeasible constraints", VALID.replace("rows % block_rows == 0", "block_rows > 1000"), "constraints",
     "at least one config"),
    ("malformed yaml", "kernel: softmax\nparams: {block_rows: [1, 2\n", "line", "well-formed YAML"),
    ("unknown dtype", VALID.replace("[float32]", "[float8]"), "dtypes[0]", "one of"),
    ("unknown target", VALID.replace("targets: [interpret]", "targets: [cuda]"), "targets.cuda", "a target from"),
    ("bad shape", VALID.replace("[[64, 256]]", "[[64]]"), "shapes[0]", "list of 2 positive integers"),
    ("unknown name in constraint", VALID.replace("rows % block_rows == 0", "rows % block_cols == 0"),
     "constraints[0]", "unknown name 'block_cols'"),
    ("unsafe constraint", VALID.replace("rows % block_rows == 0", "__import__('os').system('true')"),
     "constraints[0]", "arithmetic/boolean expression"),
    ("bad pow2 range", VALID.replace("{pow2: [1, 64]}", "{pow2: [3, 64]}"), "params.block_rows.pow2", "powers of two"),
    ("two kinds for a param", VALID.replace("{pow2: [1, 64]}", "{pow2: [1, 64], values: [1]}"), "params.block_rows",
     "exactly one of"),
    ("unknown sampler", VALID + "sampler: {name: cmaes}\n", "sampler.name", "one of"),
    ("not a mapping", "- just\n- a list\n", "document", "a mapping"),
    ("missing kernel", VALID.replace("kernel: softmax\n", ""), "kernel", "a kernel name"),
    ("unknown base", "extends: nosuchspace\nshapes: [[64, 256]]\n", "extends", "a shipped space"),
    ("missing base file", "extends: ./nope.yaml\n", "extends", "a readable YAML file"),
    ("extends itself", "extends: space.yaml\n", "extends", "no cycle"),
    ("extends another kernel", "kernel: matmul\nextends: softmax\n", "kernel", "the kernel of the space it extends"),
    ("no params, no shipped space", "kernel: tests.fixtures.wrong_softmax\nshapes: [[64, 256]]\ndtypes: [float32]\n"
     "targets: [interpret]\n", "params", "ships no search space"),
]


@pytest.mark.parametrize("name,text,field,expected", BAD_SPACES, ids=[c[0] for c in BAD_SPACES])
def test_bad_space_is_one_clear_error_and_writes_nothing(tmp_path, capsys, name, text, field, expected):
    path = write(tmp_path, text)
    out = tmp_path / "run"
    code = cli.main(["sweep", str(path), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"error: {path}: ") and f": {field}" in err and expected in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]


THREE_LINES = """\
kernel: softmax
shapes: [[16, 200]]
dtypes: [float32]
"""


def test_three_line_space_takes_the_kernels_shipped_space(tmp_path):
    space = spaces.load_space(write(tmp_path, THREE_LINES))
    shipped = spaces.load_space(shipped_space("softmax"))
    assert space.params == shipped.params
    assert [(c.constraint.source, c.targets) for c in space.constraints] == \
        [(c.constraint.source, c.targets) for c in shipped.constraints]
    assert [t.name for t in space.targets] == [t.name for t in shipped.targets]
    # the user's shapes and dtypes apply to every target, the shipped per-target ones included
    assert {(t.shapes, t.dtypes) for t in space.targets} == {(((16, 200),), ("float32",))}
    assert space.trials == shipped.trials and space.document["kernel"] == "softmax"


def test_extends_merges_params_by_name_adds_constraints_and_drops_other_targets(tmp_path):
    write(tmp_path, THREE_LINES, "mine.yaml")
    path = write(tmp_path, """\
        extends: mine.yaml
        targets: [interpret]
        params: {block_rows: {values: [1, 2]}}
        constraints: ["block_rows < 2"]
        trials: 5
    """)
    space = spaces.load_space(path)
    shipped = spaces.load_space(shipped_space("softmax"))
    assert [t.name for t in space.targets] == ["interpret"] and space.trials == 5
    assert next(p for p in space.params if p.name == "block_rows").choices == (1, 2)
    # knobs of the shipped space that exist only for other targets are gone
    assert {p.name for p in space.params} == {p.name for p in shipped.params_for("interpret")}
    assert space.constraints[-1].constraint.source == "block_rows < 2"
    assert space.violated({"block_rows": 2, "strategy": "one_pass", "block_cols": 128}, (16, 200), "float32",
                          "interpret") == "block_rows < 2"


def test_extends_by_shipped_name(tmp_path):
    space = spaces.load_space(write(tmp_path, "extends: softmax\ntargets: [interpret]\ntrials: 2\n"))
    assert space.kernel == "softmax" and space.trials == 2 and space.targets[0].shapes == ((64, 256), (128, 512))


def test_three_line_space_sweeps_in_interpret_mode(ray_local, tmp_path, signing_key):
    out, trials = run_sweep(tmp_path, signing_key, THREE_LINES, "--target", "interpret", "--trials", "2")
    measured = [t for t in trials if t["outcome"] == "ok"]
    assert measured and {t["task_key"] for t in trials} == {"softmax/16x200/float32/interpret"}


# A user's odd or small shapes apply to every target of a shipped space, and one target's search
# preferences may admit no config at them (the two-pass softmax's interpret-mode chunks of at most
# 4096 columns, none of which divides 50257; TPU pads the row to whole chunks): that target's task
# measures only the kernel's default (the note names the constraint), and the other targets still
# tune the shape.
def test_a_shape_one_target_cannot_take_leaves_the_others_tuning(ray_local, tmp_path, signing_key, capsys):
    text = "kernel: softmax_two_pass\nshapes: [[8192, 50257]]\ndtypes: [bfloat16]\n"
    space = spaces.load_space(write(tmp_path, text, "user.yaml"))
    interpret = next(t for t in space.targets if t.name == "interpret")
    assert interpret.shapes == ((8192, 50257),)  # loaded, although no interpret config of the space takes it
    assert all(space.violated(c, (8192, 50257), "bfloat16", "interpret") for c in space.configs("interpret"))
    assert [(u.target, u.task) for u in space.unfit] == [
        ("interpret", "target interpret, shape 8192x50257, dtype bfloat16")]
    assert "configs satisfies every constraint" in str(space.unfit[0]) and " break " in str(space.unfit[0])
    assert space.unfit[0].default_runs   # the kernel takes its default there
    # in one sweep: 8 rows break the space's constraint on this target, 32 rows do not
    out, trials = run_sweep(tmp_path, signing_key, space_text("softmax", [[8, 256], [32, 256]], trials=2,
                                                              constraints=["rows >= 16"], block_rows=[2, 8],
                                                              strategy=["one_pass"], block_cols=[128]))
    by_task = {key: [t for t in trials if t["task_key"] == key] for key in {t["task_key"] for t in trials}}
    eight = by_task["softmax/8x256/float32/interpret"]
    assert [(t["trial"], t["outcome"]) for t in eight] == [(OUTSIDE_STUDY, "ok")]   # its default only
    assert json.loads(eight[0]["config"]) == {"block_rows": 8, "strategy": "one_pass", "block_cols": 128}
    assert {t["outcome"] for t in by_task["softmax/32x256/float32/interpret"]} == {"ok"}
    assert ("target interpret, shape 8x256, dtype float32: none of the 2 configs satisfies every constraint "
            "(2 break 'rows >= 16'); only the kernel's default config is measured") in capsys.readouterr().err
    rows = {r["task_key"]: r for r in pq.read_table(out / "bundle" / "configs.parquet").to_pylist()}
    assert rows["softmax/8x256/float32/interpret"]["config"] == eight[0]["config"]


def test_an_unfit_tasks_note_says_whether_its_default_is_measured(tmp_path):
    # 5 rows break the user's constraint on every target. Mosaic GPU's rms norm also refuses its own
    # default there (3000 bf16 columns are not whole 128-byte units): nothing of that task runs.
    text = 'kernel: rms_norm\nshapes: [[5, 3000], [32, 3072]]\ndtypes: [bfloat16]\nconstraints: ["rows >= 16"]\n'
    space = spaces.load_space(write(tmp_path, text, "user.yaml"))
    outcomes = {u.target: u.outcome for u in space.unfit if "5x3000" in u.task}
    measured = "only the kernel's default config is measured"
    assert outcomes == {"gpu-mosaic": "that task is answered invalid, not tuned",
                        **{target: measured for target in ("gpu-triton", "tpu", "interpret")}}
    assert not any("32x3072" in u.task for u in space.unfit)


def test_every_shipped_space_has_configs_for_every_task_of_its_own(repo):
    for path in sorted((repo / "search_spaces").glob("*.yaml")):
        assert spaces.load_space(path).unfit == (), path


def test_a_space_no_task_of_which_admits_a_config_is_refused_naming_the_constraint(tmp_path):
    path = write(tmp_path, VALID.replace("rows % block_rows == 0", "block_rows > 1000"))
    with pytest.raises(SpaceError, match=r"none of the 7 configs satisfies every constraint "
                                         r"\(7 break 'block_rows > 1000'\)"):
        spaces.load_space(path)


def test_missing_space_file(tmp_path, capsys):
    assert cli.main(["sweep", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml: file: expected a readable YAML file" in err
    assert not (tmp_path / "run").exists()


def test_out_folder_not_empty(tmp_path, capsys, signing_key):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    code = cli.main(["sweep", str(write(tmp_path, VALID)), "--out", str(out), "--key", str(signing_key[0])])
    assert code == 2 and "already exists and is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "precious"


def test_missing_signing_key(tmp_path, capsys):
    out = tmp_path / "run"
    code = cli.main(["sweep", str(write(tmp_path, VALID)), "--out", str(out), "--key", str(tmp_path / "k.pem")])
    assert code == 2 and "signing key not found" in capsys.readouterr().err
    assert not out.exists()


def test_target_filter_matches_no_task(tmp_path, capsys):
    code = cli.main(["sweep", str(write(tmp_path, VALID)), "--target", "tpu", "--out", str(tmp_path / "run")])
    assert code == 2 and "no tuning tasks" in capsys.readouterr().err


@pytest.mark.parametrize("argv,fragment", [
    (["sweep", "x.yaml", "--trials", "0"], "expected a positive integer"),
    (["sweep", "x.yaml", "--target", "cuda"], "invalid choice"),
    (["sweep", "x.yaml", "--sampler", "cmaes"], "invalid choice"),
])
def test_bad_flags_exit_2(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2 and fragment in capsys.readouterr().err


def test_task_defined_twice(tmp_path, capsys):
    a, b = write(tmp_path, VALID, "a.yaml"), write(tmp_path, VALID, "b.yaml")
    assert cli.main(["sweep", str(a), str(b), "--out", str(tmp_path / "run")]) == 2
    assert "is also defined by" in capsys.readouterr().err


def test_cli_subprocess_exit_code_and_no_traceback(tmp_path):
    path = write(tmp_path, VALID.replace("trials: 3", "trials: -1"))
    proc = subprocess.run([sys.executable, "-m", "farm", "sweep", str(path), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {path}: trials: expected a positive integer, got -1"
    assert not (tmp_path / "run").exists()


def test_constraint_evaluator_is_restricted():
    assert Constraint("a % b == 0 and min(a, b) < 10")({"a": 8, "b": 4})
    for source in ("a.__class__", "open('x')", "[x for x in y]", "lambda: 1"):
        with pytest.raises(ConstraintSyntaxError):
            Constraint(source)
    assert Constraint("x * y <= 2 ** 10").names == {"x", "y"}


def test_space_error_message_format():
    err = SpaceError("s.yaml", "params.x", "a list", 3)
    assert str(err) == "s.yaml: params.x: expected a list, got 3"


def test_a_run_folder_keeps_resolved_spaces_so_resume_needs_no_base_file(tmp_path):
    """A space that extends a file by relative path resumes after that file is gone."""
    from farm.run import runlog
    from farm.run.sweep import SweepSettings

    write(tmp_path, THREE_LINES, "mine.yaml")
    path = write(tmp_path, "extends: mine.yaml\ntargets: [interpret]\ntrials: 3\n")
    planned = plan.expand([spaces.load_space(path)])
    run = tmp_path / "run"
    runlog.save_run(run, planned, SweepSettings(run_dir=run, interpret=True))
    (tmp_path / "mine.yaml").unlink()
    again, _ = runlog.load_run(run)
    assert [(p.task, p.trials) for p in again] == [(p.task, p.trials) for p in planned]
    assert [p.space.params for p in again] == [p.space.params for p in planned]


def _not_enumerable(path: Path) -> list[tuple[str, str]]:
    """The targets of one space whose first task's valid configs cannot be enumerated."""
    from farm.search.valid_set import ValidSet

    space = spaces.load_space(path)
    left_out = []
    for target in space.targets:
        shape, dtype = tuple(target.shapes[0]), target.dtypes[0]
        found = ValidSet.enumerate(space.params_for(target.name), space.leaf_check(shape, dtype, target.name),
                                   space.prefix_checks(shape, dtype, target.name))
        if found is None:
            left_out.append((path.stem, target.name))
    return left_out


# Every shipped task's valid configs are enumerated within the searcher's bounds
# (`farm.search.valid_set`), so its sweep never draws a config twice or one that breaks a
# constraint. Adding a knob must keep it so, or its search silently gets worse: two knobs added to
# the row spaces once took the norms past the limit of the time, and their sweeps measured 38-74
# distinct configs of 400-trial budgets on the H200; the matmul family's Mosaic GPU tasks were
# sampled so until the bound counted the walk's work instead of the product (BENCHMARKS.md).
def test_shipped_tasks_stay_enumerable(repo):
    # Pure Python on one core while pytest holds the other idle: two processes walk the spaces.
    paths = sorted((repo / "search_spaces").glob("*.yaml"), key=lambda p: -p.stat().st_size)
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        left_out = [entry for found in pool.map(_not_enumerable, paths) for entry in found]
    assert not left_out


@pytest.mark.parametrize("name,target,shape,dtype", [
    ("layer_norm", "gpu-triton", (16384, 16384), "bfloat16"),   # the largest product
    ("cross_entropy", "gpu-mosaic", (8192, 151936), "bfloat16"),
    ("cross_entropy_long", "tpu", (16384, 131072), "float32"),
])
def test_enumeration_skips_prefixes_without_losing_a_valid_config(repo, name, target, shape, dtype, monkeypatch):
    # Constraints checked as soon as the knobs they read are set prune whole subtrees of the
    # product; the valid configs, and their order, are those of checking every config.
    from farm.search import valid_set
    from farm.search.valid_set import ValidSet

    space = spaces.load_space(repo / "search_spaces" / f"{name}.yaml")
    params = space.params_for(target)
    checked: list[dict] = []

    def valid(config: dict) -> bool:
        checked.append(config)
        return space.violated(config, shape, dtype, target) is None

    with monkeypatch.context() as patch:   # every config checked, however many (layer norm's: 211680)
        patch.setattr(valid_set, "ENUMERATION_LIMIT", 10**6)
        every = ValidSet.enumerate(params, valid)
    product = len(checked)
    checked.clear()
    pruned = ValidSet.enumerate(params, valid, space.prefix_checks(shape, dtype, target))
    assert pruned.configs == every.configs and len(every) > 0
    assert len(checked) < product
    # ... and the searcher's whole-config check, which leaves out what the prefixes checked.
    leaf = ValidSet.enumerate(params, space.leaf_check(shape, dtype, target), space.prefix_checks(shape, dtype, target))
    assert leaf.configs == every.configs

