"""`farm lookup`: the config a deployment runs for each task, as the runtime chooses it, from
a real signed bundle (Parquet, Ed25519)."""
from __future__ import annotations

import json
import warnings

import pytest

from farm import cli
from farm.bundle.trust import load_trust
from farm.deploy.registry import Registry, TuningMissWarning
from tests import bundles as B


@pytest.fixture()
def bundle(tmp_path):
    """A signed bundle of softmax at (64, 256) and (128, 512), float32, interpret (on device kind
    "cpu"), and a matmul row on gpu-triton tuned on an H200; its public key."""
    private, public = B.keypair(tmp_path / "keys", "ci")
    big = {"block_m": 128, "block_n": 256, "block_k": 64, "group_m": 4, "split_k": 1, "num_warps": 4,
           "num_stages": 4}   # 192 KiB of shared memory: an H200's 227 KiB holds it, an A100's 163 KiB does not
    rows = [*B.SOFTMAX_ROWS, B.row("matmul", (512, 512, 512), big, dtype="bfloat16", target="gpu-triton",
                                   device_kind="NVIDIA H200")]
    return B.write(tmp_path / "bundle", rows, private), public


def lookups(capsys, *argv: str) -> tuple[int, list[dict]]:
    code = cli.main(["lookup", *argv, "--json"])
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_lookup_gives_the_runtimes_choice_and_rule_for_each_task(bundle, capsys):
    folder, public = bundle
    code, found = lookups(capsys, str(folder), "--trust", str(public), "--kernel", "softmax", "--shape", "64x256",
                          "--shape", "100x512", "--shape", "4096x50257", "--dtype", "float32", "--target", "interpret")
    assert code == 0
    assert [(f["shape"], f["rule"], f["tuned_shape"]) for f in found] == [
        ([64, 256], "exact", [64, 256]), ([100, 512], "nearest", [128, 512]), ([4096, 50257], "default", None)]
    assert found[0]["config"] == {"block_rows": 16} and found[0]["device_kind"] == "cpu"
    registry = Registry.load(folder, load_trust([public]))   # the runtime agrees, config by config
    warnings.simplefilter("ignore", TuningMissWarning)
    for f in found:
        choice = registry.lookup("softmax", tuple(f["shape"]), "float32", "interpret")
        assert (choice.rule, dict(choice.config)) == (f["rule"], f["config"])


def test_require_exact_exits_3_naming_an_untuned_task(bundle, capsys, tmp_path):
    folder, public = bundle
    tasks = tmp_path / "misses.jsonl"
    tasks.write_text(json.dumps({"kernel": "softmax", "shape": [64, 256], "dtype": "float32", "target": "interpret"})
                     + "\n" + json.dumps({"kernel": "softmax", "shape": "64x257", "dtype": "float32",
                                          "target": "interpret", "rule": "default"}) + "\n")
    assert cli.main(["lookup", str(folder), "--trust", str(public), "--tasks", str(tasks), "--require-exact"]) == 3
    captured = capsys.readouterr()
    assert "1 of 2 task(s) have no exact tuned config" in captured.err and "softmax/64x257/float32/interpret" in \
        captured.err
    assert "exact" in captured.out and "nearest" in captured.out   # the table, one row a task
    code, found = lookups(capsys, str(folder), "--trust", str(public), "--kernel", "softmax", "--shape", "64x256",
                          "--dtype", "float32", "--target", "interpret", "--require-exact")
    assert code == 0 and [f["rule"] for f in found] == ["exact"]


def test_device_kind_and_shared_memory_as_the_device_would_judge_them(bundle, capsys):
    folder, public = bundle
    args = [str(folder), "--trust", str(public), "--kernel", "matmul", "--shape", "512x512x512", "--target",
            "gpu-triton"]
    assert [f["rule"] for f in lookups(capsys, *args)[1]] == ["exact"]
    assert [f["rule"] for f in lookups(capsys, *args, "--device-kind", "NVIDIA H200")[1]] == ["exact"]
    assert [f["rule"] for f in lookups(capsys, *args, "--device-kind", "NVIDIA H100")[1]] == ["default"]
    assert [f["rule"] for f in lookups(capsys, *args, "--emulate", "h200")[1]] == ["exact"]
    on_a100 = lookups(capsys, *args, "--emulate", "a100")[1]   # the tuned tiles do not fit: the default runs
    assert on_a100[0]["rule"] == "default" and on_a100[0]["config"]["block_n"] != 256


def test_bad_input_is_one_line_naming_the_flag(bundle, capsys, tmp_path):
    folder, public = bundle
    for argv, expected in [
        (["--kernel", "softmax", "--shape", "64x256"], "--kernel softmax: expected --shape (rowsxcols) and --target"),
        (["--kernel", "softmax", "--shape", "64x256x3", "--target", "interpret"], "--shape 64x256x3: expected 2"),
        (["--kernel", "matmul", "--shape", "8x8x8", "--target", "tpu"], None),
        (["--kernel", "nope", "--shape", "8x8", "--target", "interpret"], "--kernel"),
        (["--shape", "64x256"], "expected --kernel with them"),
        ([], "expected tasks"),
        (["--tasks", str(tmp_path / "none.jsonl")], "--tasks"),
    ]:
        code = cli.main(["lookup", str(folder), "--trust", str(public), *argv])
        err = capsys.readouterr().err
        if expected is None:
            assert code == 0, err
            continue
        assert code == 2 and err.startswith("error: ") and expected in err, (argv, err)
    assert cli.main(["lookup", str(tmp_path / "keys"), "--kernel", "softmax", "--shape", "64x256", "--target",
                     "interpret"]) in (1, 2)
    assert cli.main(["lookup", str(folder), "--kernel", "softmax", "--shape", "64x256", "--dtype", "float32",
                     "--target", "interpret"]) == 0   # unverified: looked up, with a warning
    assert "UNVERIFIED" in capsys.readouterr().err


def test_target_gpu_is_the_gpu_target_a_deployment_picks(tmp_path, capsys):
    """On Hopper the faster of the tuned GPU targets at the task (gpu-mosaic at 4096 columns,
    gpu-triton at 2048 here); gpu-triton alone on a GPU of another compute capability."""
    import kernels

    softmax = kernels.load("softmax")
    private, public = B.keypair(tmp_path / "keys", "ci")
    rows = [B.row("softmax", (4096, cols), softmax.default_config((4096, cols), target), dtype="bfloat16",
                  target=target, device_kind="NVIDIA H200", median_s=median)
            for cols, target, median in [(4096, "gpu-triton", 2e-5), (4096, "gpu-mosaic", 1e-5),
                                         (2048, "gpu-triton", 1e-5), (2048, "gpu-mosaic", 2e-5)]]
    folder = B.write(tmp_path / "bundle", rows, private)
    args = [str(folder), "--trust", str(public), "--kernel", "softmax", "--shape", "4096x4096", "--shape",
            "4096x2048", "--target", "gpu"]
    assert [(f["target"], f["rule"]) for f in lookups(capsys, *args)[1]] == [("gpu-mosaic", "exact"),
                                                                           ("gpu-triton", "exact")]
    assert [(f["target"], f["rule"]) for f in lookups(capsys, *args, "--compute-capability", "8.0")[1]] == [
        ("gpu-triton", "exact"), ("gpu-triton", "exact")]


def test_emulate_a_tpu_chip_judges_tpu_configs_by_its_vmem(tmp_path, capsys):
    import kernels

    softmax, shape = kernels.load("softmax"), (4096, 32768)
    wide = {**softmax.default_config(shape, "tpu"), "strategy": "one_pass", "block_rows": 64, "block_cols": 4096}
    private, public = B.keypair(tmp_path / "keys", "ci")
    folder = B.write(tmp_path / "bundle", [B.row("softmax", shape, wide, target="tpu")], private)
    args = [str(folder), "--trust", str(public), "--kernel", "softmax", "--shape", "4096x32768", "--dtype", "float32",
            "--target", "tpu"]   # its blocks need 48 MiB of VMEM
    assert [f["rule"] for f in lookups(capsys, *args, "--emulate", "v7")[1]] == ["exact"]
    assert [f["rule"] for f in lookups(capsys, *args, "--emulate", "v4")[1]] == ["default"]
    assert [f["rule"] for f in lookups(capsys, *args, "--emulate", "a100")[1]] == ["exact"]   # a GPU: not tpu's
