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


def readme_cluster_commands(repo: Path) -> list[str]:
    """The first sh block of README.md's "Running on a cluster", one string per command
    (continuation lines joined, comments dropped)."""
    text = (repo / "README.md").read_text()
    section = text[text.index("## Running on a cluster"):]
    block = section[section.index("```sh\n") + 6:]
    block = block[:block.index("```")]
    commands, current = [], ""
    for line in block.splitlines():
        code = re.sub(r"\s+#.*$", "", line) if "'" not in line else line   # JSON lines hold no comments
        if not code.strip() or code.strip().startswith("#"):
            continue
        current += code.strip()[:-1] + " " if code.rstrip().endswith("\\") else code.strip()
        if not code.rstrip().endswith("\\"):
            commands.append(current)
            current = ""
    return commands


def _shell(command: str, env: dict[str, str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], env=env, cwd=cwd, capture_output=True, text=True, **kwargs)


@pytest.fixture
def ray_head(tmp_path, repo):
    """README's commands up to `ray start --head`, run as printed in a fresh HOME (the start made
    blocking, on free loopback ports), then its job server's address, environment and the rest."""
    commands = readme_cluster_commands(repo)
    start = commands.index("ray start --head")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "FARM_"))}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    prelude = "; ".join(commands[:start])
    shown = _shell(f"set -e; {prelude}; env -0", env, repo, timeout=120)
    assert shown.returncode == 0, shown.stderr
    env = dict(item.split("=", 1) for item in shown.stdout.split("\0") if "=" in item)

    gcs, dashboard, agent, client, runtime_env, metrics = _free_ports(6)
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
    yield address, env, commands[start + 1:]
    os.killpg(head.pid, 9)
    head.wait(timeout=60)


def test_readme_cluster_commands_run_as_printed(ray_head, repo):
    """README's `ray job submit` recipe, as printed (only the job server's port differs): the
    bundle lands at the named absolute --out, signed by the key on the head, with progress lines in
    the job's log; then `farm report` reads it."""
    address, env, rest = ray_head
    submit = next(c for c in rest if c.startswith("ray job submit"))
    assert "--address http://127.0.0.1:8265" in submit and "--key" not in submit and "--quiet" not in submit
    job = _shell(submit.replace("http://127.0.0.1:8265", address), env, repo, timeout=900)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "succeeded" in job.stdout
    assert "INFO farm.run.progress: sweep done: 3/3 trials" in job.stdout, job.stdout[-3000:]
    out = Path(_shell(f"echo {submit.split('--out ')[1].split()[0]}", env, repo).stdout.strip())
    assert out.is_absolute() and out.parent.parent == Path(env["HOME"])
    key = Path(env["FARM_SIGNING_KEY"])
    assert key.parent.parent == Path(env["HOME"]), "the signing key lives on the head, not in the working dir"
    trust.verify(out / "bundle", trust.load_trust([Path(f"{key}.pub")]))
    rows = artifacts.read_configs(out / "bundle").to_pylist()
    assert [r["task_key"] for r in rows] == ["softmax/64x256/float32/interpret"] and rows[0]["status"] == "ok"
    for command in rest[rest.index(submit) + 1:]:
        done = _shell(command, env, repo, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "report.md").is_file()


def test_multinode_one_worker_per_chip_and_a_node_leaving(tmp_path, repo):
    proc = subprocess.run([sys.executable, str(repo / "tests" / "multinode_sweep.py"), str(tmp_path)],
                          cwd=repo, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    # One worker per advertised chip, spread over both TPU nodes.
    assert Counter(result["initial"]) == {n: 2 for n in result["tpu_nodes"]}
    assert result["removed"] and result["removed"][0] not in result["final_workers"]
    records = result["records"]
    measured = [r for r in records if r["outcome"] in outcomes.MEASURED]
    assert Counter(r["outcome"] for r in measured) == {outcomes.OK: len(measured)}
    assert len(measured) == 12 and len({(r["task_key"], r["config"]) for r in measured}) == 12
    assert any(r["requeued"] for r in measured), "no trial was in flight on the node that left"
    assert all(r["attempt"] == 1 for r in measured)  # a node leaving is nobody's fault
    # gpu-mosaic on a GPU node whose worker reports no Hopper compute capability: refused up front.
    assert "--target gpu-mosaic: its kernels need a Hopper GPU" in result["mosaic_refused"]
    assert not result["mosaic_run_left"]
    # with no --target, the same cluster tunes what it can run and says what it left out
    assert list(result["untargeted_left_out"]) == ["gpu-mosaic"]
    assert "need a Hopper GPU" in result["untargeted_left_out"]["gpu-mosaic"]
    assert result["untargeted_tuned"] == [["softmax/64x128/float32/interpret", "ok"]]
    assert result["untargeted_trials"] == ["softmax/64x128/float32/interpret"]
