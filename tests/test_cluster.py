"""Running as users do: cluster.yaml, `ray job submit` to a real head, and a multi-node cluster."""
from __future__ import annotations

import copy
import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

import pytest
import yaml

from farm.bundle import artifacts, trust
from farm.measure import outcomes


def test_cluster_yaml_passes_rays_own_validation(repo):
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((repo / "cluster.yaml").read_text())
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    types = prepared["available_node_types"]
    head = types[prepared["head_node_type"]]
    assert "TPU" not in head["resources"] and head["max_workers"] == 0
    tpu_hosts = {name: t for name, t in types.items() if "acceleratorType" in t.get("node_config", {})}
    assert {t["node_config"]["acceleratorType"] for t in tpu_hosts.values()} == {"v5litepod-4", "v6e-4"}
    assert all("farm-env/bin/ray start" in c for c in [*prepared["head_start_ray_commands"][1:],
                                                      *prepared["worker_start_ray_commands"][1:]])
    for host in tpu_hosts.values():
        chips = int(host["node_config"]["acceleratorType"].rsplit("-", 1)[1])
        assert host["resources"]["TPU"] == chips and host["node_config"]["runtimeVersion"]
    setup = " ".join(prepared["setup_commands"])
    assert "pallas-farm[tune]" in setup and "--python 3.11" in setup
    assert all(t["min_workers"] == 0 for t in tpu_hosts.values()), "idle TPU hosts would be billed"
    assert any(t["node_config"].get("schedulingConfig", {}).get("spot") for t in tpu_hosts.values())

    broken = copy.deepcopy(config)
    broken["available_node_types"]["tpu_v6e_host"]["min_workers"] = "one"
    with pytest.raises(Exception):
        validate_config(prepare_config(broken))


def test_cluster_yaml_pins_every_dependency(repo):
    """Every package of the farm's stack (the light install and the tune extra) is pinned with ==."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["tune"]]
    names = {re.split(r"[<>=\[ ]", spec, maxsplit=1)[0].lower() for spec in wanted}
    setup = " ".join(yaml.safe_load((repo / "cluster.yaml").read_text())["setup_commands"])
    pinned = {m.group(1).lower() for m in re.finditer(r'"([A-Za-z0-9_.-]+)(?:\[[a-z,]+\])?==[0-9][^"]*"', setup)}
    assert names <= pinned, f"not pinned in cluster.yaml: {sorted(names - pinned)}"


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture
def ray_head(tmp_path):
    """A real `ray start --head` with the dashboard (the job server) on loopback, then stopped."""
    gcs, dashboard, agent, client, runtime_env, metrics = _free_ports(6)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ray_cli = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", f"--port={gcs}", "--node-ip-address=127.0.0.1",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
         f"--dashboard-agent-listen-port={agent}", f"--ray-client-server-port={client}",
         f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
         "--num-cpus=2", "--object-store-memory=300000000", "--disable-usage-stats"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    address = f"http://127.0.0.1:{dashboard}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        probe = subprocess.run([ray_cli, "job", "list", "--address", address], env=env, capture_output=True,
                               text=True)
        if probe.returncode == 0:
            break
        assert head.poll() is None, head.stdout.read()
        time.sleep(1)
    else:
        pytest.fail("the Ray head's job server did not come up")
    yield address, env, ray_cli
    os.killpg(head.pid, 9)
    head.wait(timeout=60)


def test_ray_job_submit_runs_a_sweep(ray_head, tmp_path, signing_key, repo):
    address, env, ray_cli = ray_head
    out = tmp_path / "run"
    excludes = json.dumps({"excludes": [".venv", ".git", "artifacts", ".keys", ".whl"]})
    job = subprocess.run(
        [ray_cli, "job", "submit", "--address", address, "--working-dir", str(repo), "--runtime-env-json",
         excludes, "--", sys.executable, "-m", "farm", "sweep", "search_spaces/softmax.yaml",
         "--target", "interpret", "--trials", "3", "--repetitions", "2", "--address", "auto",
         "--out", str(out), "--key", str(signing_key[0]), "--quiet"],
        env=env, capture_output=True, text=True, timeout=900)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "succeeded" in job.stdout
    trust.verify(out / "bundle", trust.load_trust([signing_key[1]]))
    rows = artifacts.read_configs(out / "bundle").to_pylist()
    assert sorted(r["task_key"] for r in rows) == ["softmax/128x512/float32/interpret",
                                                   "softmax/64x256/float32/interpret"]
    assert all(r["status"] == "ok" for r in rows)


def test_multinode_one_worker_per_chip_and_a_node_leaving(tmp_path, repo):
    proc = subprocess.run([sys.executable, str(repo / "tests" / "multinode_sweep.py"), str(tmp_path)],
                          cwd=repo, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # One worker per advertised chip, spread over both TPU nodes.
    assert Counter(result["initial"]) == {n: 4 for n in result["tpu_nodes"]}
    assert result["removed"] and result["removed"][0] not in result["final_workers"]
    records = result["records"]
    measured = [r for r in records if r["outcome"] in outcomes.MEASURED]
    assert Counter(r["outcome"] for r in measured) == {outcomes.OK: len(measured)}
    assert len(measured) == 12 and len({(r["task_key"], r["config"]) for r in measured}) == 12
    assert any(r["requeued"] for r in measured), "no trial was in flight on the node that left"
    assert all(r["attempt"] == 1 for r in measured)  # a node leaving is nobody's fault
