"""TPU compile children compile without a chip: deviceless, for a TPU topology, with libtpu's own
compiler (Mosaic included). Needs libtpu (`pip install libtpu`); skipped where it is missing (the
CI image), run on the development machine (BENCHMARKS.md says how)."""
from __future__ import annotations

import json
import os

import pytest

import kernels
from farm.measure import compile_pool
from farm.tasks import TuningTask

pytest.importorskip("libtpu")


@pytest.fixture(scope="module")
def pool():
    p = compile_pool.CompilePool(1, compile_pool.TPU_CHILD_ENV)   # as a TPU worker starts them
    yield p
    p.close()


@pytest.mark.parametrize("topology", ["v5e:1x1", "v6e:1x1", "v5p:1x1x1", "tpu7x:1x1x1"])
@pytest.mark.parametrize("kernel,shape", [("softmax", (1024, 2560)), ("matmul", (512, 512, 512)),
                                          ("flash_attention", (1, 2, 512, 128))])
def test_shipped_tpu_configs_compile_deviceless_in_a_child(pool, topology, kernel, shape):
    task = TuningTask(kernel, shape, "bfloat16", "tpu")
    config = kernels.load(kernel).default_config(shape, "tpu")
    reply = pool.compile(task, config, interpret=False, timeout_s=600, topology=topology)
    assert isinstance(reply, compile_pool.Portable), reply
    assert len(reply.executable[0]) > 0 and len(reply.check_executable[0]) > 0


@pytest.mark.parametrize("kernel,shape", [
    ("softmax", (3, 151936)), ("cross_entropy", (7, 151936)), ("rms_norm_bwd", (77, 5120)),
    ("cross_entropy", (1000, 50257)), ("softmax", (1001, 50257)), ("flash_attention", (32, 12, 197, 64)),
    ("flash_attention_causal", (1, 4, 1000, 80)),
], ids=str)
def test_tpu_defaults_compile_deviceless_at_users_shapes(pool, kernel, shape):
    """Users' shapes whose TPU defaults Mosaic once refused (a traced row offset it could not prove
    tile-aligned), ran out of VMEM (1000 rows a block of 50257 columns) or the kernel refused
    (head dims under 128 lanes); bench/tpu_deviceless.py runs more."""
    task = TuningTask(kernel, shape, "bfloat16", "tpu")
    config = kernels.load(kernel).default_config(shape, "tpu")
    reply = pool.compile(task, config, interpret=False, timeout_s=600, topology="v6e:1x1")
    assert isinstance(reply, compile_pool.Portable), reply


@pytest.mark.parametrize("kernel,config,shape", [
    ("welford", {"strategy": "grid", "block_rows": 256, "block_cols": 256, "buffers": 2}, (524288, 512)),
    ("welford", {"strategy": "one_pass", "block_rows": 512, "block_cols": 512, "buffers": 2}, (524288, 512)),
    ("cross_entropy", {"strategy": "grid", "block_rows": 128, "block_cols": 1024, "buffers": 2}, (128, 2048)),
    ("cross_entropy", {"strategy": "one_pass", "block_rows": 128, "block_cols": 2048, "buffers": 1}, (128, 2048)),
], ids=str)
@pytest.mark.parametrize("topology", ["v4:1x1x1", "v5e:1x1"])
def test_lane_dense_per_row_vectors_compile_on_every_generation(pool, topology, kernel, config, shape):
    """Before the engine transposed them on TPUs older than v5, libtpu refused every lane-dense
    config of welford and cross entropy for v4: "Sublane gather not supported by this TPU
    generation" (bench/oom_probe.py --tpu v4:1x1x1)."""
    task = TuningTask(kernel, shape, "bfloat16", "tpu")
    config = {**kernels.load(kernel).default_config(shape, "tpu"), **config, "stats_layout": "lane"}
    reply = pool.compile(task, config, interpret=False, timeout_s=600, topology=topology)
    assert isinstance(reply, compile_pool.Portable), reply


def test_the_footprint_probe_judges_the_tpu_model_against_libtpu(tmp_path):
    """`bench/oom_probe.py --tpu`: configs drawn with no pruning, compiled deviceless for v4 (16 MiB
    of VMEM, where the seed shapes' spaces hold configs over it), each judged against the model."""
    from bench import oom_probe

    summary = oom_probe.main(["--out", str(tmp_path), "--tpu", "v4:1x1x1", "--per-task", "6", "--threads", "1",
                              "--seed", "1", "--spaces", "search_spaces/welford.yaml",
                              "search_spaces/flash_attention.yaml"])
    rows = json.loads((tmp_path / "oom_probe.json").read_text())["rows"]
    assert summary["configs"] == len(rows) == 18 and {r["capacity_bytes"] for r in rows} == {16 * 2**20}
    assert summary["counts"].get("no verdict", 0) == 0, summary["no_verdict"]   # welford's lane configs compile
    assert summary["model_no_fit"] > 0 and summary["agreement"] >= 0.9
    assert {r["outcome"] for r in rows if not r["model_fits"]} <= {"oom", "ok"}


def test_a_child_compiles_while_another_process_holds_libtpus_lockfile(pool):
    """A TPU worker holds libtpu's lockfile for as long as it lives; its compile children load
    libtpu beside it (`TPU_CHILD_ENV`). Without that, every deviceless compile in a child failed
    ("Internal error when accessing libtpu multi-process lockfile") while any process that had
    initialised JAX with libtpu installed was alive: here, a process standing in for the worker."""
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", "import jax, sys; jax.devices(); print('up', flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "JAX_PLATFORMS": ""})
    try:
        assert holder.stdout.readline().strip() == "up"
        task = TuningTask("softmax", (3, 151936), "bfloat16", "tpu")
        config = kernels.load("softmax").default_config(task.shape, "tpu")
        reply = pool.compile(task, config, interpret=False, timeout_s=600, topology="v6e:1x1")
        assert isinstance(reply, compile_pool.Portable), reply
    finally:
        holder.communicate("", timeout=60)


def test_a_config_mosaic_refuses_is_a_compile_error(pool):
    # 8 lanes: Mosaic TPU's blocks must tile (8, 128); the kernel's own check may or may not say so
    task = TuningTask("matmul", (512, 512, 512), "bfloat16", "tpu")
    config = {**kernels.load("matmul").default_config(task.shape, "tpu"), "block_n": 8}
    reply = pool.compile(task, config, interpret=False, timeout_s=600, topology="v6e:1x1")
    assert not isinstance(reply, compile_pool.Portable)
    assert reply.outcome == "compile_error" and reply.error


def test_known_topologies():
    assert compile_pool.tpu_topology("TPU v6 lite") == "v6e:1x1"
    assert compile_pool.tpu_topology("NVIDIA H200") is None


@pytest.mark.parametrize("kind,topology", sorted(compile_pool.TPU_TOPOLOGIES.items()))
def test_each_known_topology_is_one_device_of_its_kind(kind, topology):
    """A worker's children compile for the chip the worker opened: one device, of its kind."""
    import subprocess
    import sys

    code = ("from jax.experimental import topologies; "
            f"d = topologies.get_topology_desc(topology_name={topology!r}, platform='tpu').devices; "
            "print(len(d), d[0].device_kind, sep='|')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **compile_pool.TPU_CHILD_ENV}, check=True).stdout
    assert out.strip().splitlines()[-1] == f"1|{kind}"
