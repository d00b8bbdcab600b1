"""Running as users do: cluster.yaml, `ray job submit` to a real head, and a multi-node cluster."""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Callable
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


AUTOSCALED_SPACE = """\
kernel: softmax
dtypes: [float32]
shapes: [[64, 128]]
targets: [tpu]
params:
  block_rows: {values: [8, 16, 32]}
sampler: grid
trials: 3
"""


@pytest.fixture
def autoscaling_head(tmp_path):
    """A Ray head whose autoscaler starts nodes of one type, "tpu_host" ({"CPU": 2, "TPU": 2},
    labelled pallas-farm/tpu=v5e, none at first), as local processes: Ray's own fake multi-node
    provider, the autoscaler itself real, v2 as `ray up` starts it since Ray 2.50 (v1 ignores
    label selectors). Yields the GCS address and the environment to run in."""
    import ray._private.services
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

    gcs, client, runtime_env, metrics, agent = _free_ports(5)
    address = f"{ray._private.services.get_node_ip_address()}:{gcs}"
    config = {
        "cluster_name": "farm-autoscaling-test", "max_workers": 1, "upscaling_speed": 1.0,
        "idle_timeout_minutes": 0.1, "head_node_type": "ray.head.default",
        "provider": {"type": "external",
                     "module": "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider",
                     "gcs_address": address, "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "launch_multiple": True,
                     "head_node_id": FAKE_HEAD_NODE_ID},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
            "tpu_host": {"resources": {"CPU": 2, "TPU": 2}, "labels": {"pallas-farm/tpu": "v5e"},
                         "node_config": {}, "min_workers": 0, "max_workers": 1}},
        "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": []}
    (tmp_path / "autoscaling.yaml").write_text(yaml.safe_dump(config))
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")   # Ray's socket paths must stay under 108 bytes
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "FARM_"))},
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    head_env = {**env, "RAY_FAKE_CLUSTER": "1", "RAY_enable_autoscaler_v2": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
                "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID}
    ray_cli = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", f"--port={gcs}", f"--ray-client-server-port={client}",
         f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
         f"--dashboard-agent-listen-port={agent}", "--include-dashboard=false", "--num-cpus=1",
         "--object-store-memory=200000000", f"--autoscaling-config={tmp_path / 'autoscaling.yaml'}",
         f"--temp-dir={ray_dir}"],
        env=head_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert head.poll() is None, head.stdout.read()
            try:
                socket.create_connection(("127.0.0.1", gcs), timeout=1).close()
                break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("the autoscaling Ray head did not come up")
        watched = Path(ray_dir) / "tpu_chips"
        watcher = subprocess.Popen([sys.executable, "-c", WATCH_TPUS, address, str(watched)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while _tpu_chips(watched) < 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        yield address, env, watched
        watcher.kill()
        watcher.wait(timeout=60)
    finally:
        if head.poll() is None:
            os.killpg(head.pid, 9)
        head.wait(timeout=60)
        subprocess.run(["pkill", "-9", "-f", ray_dir], check=False)   # the nodes the autoscaler started
        shutil.rmtree(ray_dir, ignore_errors=True)


# A driver that stays joined to the cluster and writes its TPU count to a file every half second
# (joining once per look took seconds each).
WATCH_TPUS = """
import os, sys, time
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
while True:
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write(str(int(ray.cluster_resources().get("TPU", 0))))
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
    time.sleep(0.5)
"""


def _tpu_chips(watched: Path) -> int:
    """TPU chips in the cluster as the watching driver last saw them (-1 before its first look)."""
    try:
        return int(watched.read_text())
    except (OSError, ValueError):
        return -1


def test_scale_up_asks_the_autoscaler_for_chips_and_gives_them_back(autoscaling_head, tmp_path, repo):
    """--scale-up with a cluster of no TPU host: the autoscaler starts one (by the label asked for), the
    sweep runs on its chips, and once the request is withdrawn the idle host goes. A label no node
    type has brings none: an error naming the wait, and no run folder."""
    address, env, watched = autoscaling_head
    (tmp_path / "space.yaml").write_text(AUTOSCALED_SPACE)
    key = tmp_path / "k.pem"
    subprocess.run([sys.executable, "-m", "farm", "keygen", str(key)], cwd=repo, check=True, capture_output=True)
    farm = [sys.executable, "-m", "farm", "sweep", str(tmp_path / "space.yaml"), "--target", "tpu", "--interpret",
            "--address", address, "--key", str(key), "--finalists", "0", "--repetitions", "2", "--quiet"]
    assert _tpu_chips(watched) == 0

    none = subprocess.run([*farm, "--scale-up", "2", "--scale-up-wait", "10", "--node-label", "pallas-farm/tpu=v6e",
                           "--out", str(tmp_path / "none")], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300)
    assert none.returncode != 0
    assert "--scale-up 2: no TPU chips on nodes labelled {'pallas-farm/tpu': 'v6e'} came up within 10 s" in none.stderr
    assert none.stderr.strip().splitlines()[-1].startswith("error: --scale-up 2: no TPU chips")
    assert not (tmp_path / "none").exists()

    # Stopped by SIGTERM (`ray job stop`, `timeout`) while it waits for hosts, and once it sweeps on
    # them (where Ray turns a signal handler's SystemExit into SystemExit(1)): 143, the request
    # withdrawn on the way out, and the host goes.
    waiting = _sweep_until(farm + ["--scale-up", "2", "--scale-up-wait", "600", "--node-label", "pallas-farm/tpu=v6e",
                                   "--out", str(tmp_path / "waiting")], repo, env, tmp_path / "waiting.err",
                           lambda: "scale-up: asked the autoscaler" in _text(tmp_path / "waiting.err"))
    waiting.send_signal(signal.SIGTERM)
    assert waiting.wait(timeout=60) == 128 + signal.SIGTERM, _text(tmp_path / "waiting.err")[-3000:]
    assert "withdrew the autoscaler request" in _text(tmp_path / "waiting.err")
    sweeping = _sweep_until(farm + ["--scale-up", "2", "--scale-up-wait", "600", "--out", str(tmp_path / "term")],
                            repo, env, tmp_path / "term.err", lambda: (tmp_path / "term" / "run.json").exists())
    sweeping.send_signal(signal.SIGTERM)
    assert sweeping.wait(timeout=60) == 128 + signal.SIGTERM, _text(tmp_path / "term.err")[-3000:]
    assert _text(tmp_path / "term.err").strip().splitlines()[-1] == "terminated (SIGTERM)"
    _wait_for_no_tpu(watched, "the request of a sweep stopped by SIGTERM stayed")

    # The stopped sweep resumes: it asks again (by label, v5e hosts), and finishes there.
    resumed = [sys.executable, "-m", "farm", "sweep", "--address", address, "--key", str(key), "--quiet"]
    done = subprocess.run([*resumed, "--resume", str(tmp_path / "term"), "--scale-up", "2", "--scale-up-wait", "240",
                           "--node-label", "pallas-farm/tpu=v5e"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "term" / "run.json").read_text())["summary"]
    assert summary["scale_up"] == {"resource": "TPU", "chips": 2, "labels": {"pallas-farm/tpu": "v5e"},
                                   "requested": True, "up": 2}
    assert len(summary["placement"]["initial"]) == 2 and len(set(summary["placement"]["initial"])) == 1
    rows = artifacts.read_configs(tmp_path / "term" / "bundle").to_pylist()
    assert [(r["task_key"], r["status"]) for r in rows] == [("softmax/64x128/float32/tpu", "ok")]
    # The request withdrawn, the host idle: the autoscaler removes it (idle_timeout_minutes 0.1).
    _wait_for_no_tpu(watched, "the TPU host the sweep asked for stayed after the sweep")


def _sweep_until(command: list[str], repo: Path, env: dict[str, str], stderr: Path,
                 started: Callable[[], bool]) -> subprocess.Popen:
    """`command` started with its stderr in a file, once `started()` holds (at most 120 s)."""
    with stderr.open("w") as err:
        process = subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
    deadline = time.monotonic() + 120
    while not started() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None and started(), _text(stderr)[-3000:]
    return process


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _wait_for_no_tpu(watched: Path, message: str) -> None:
    deadline = time.monotonic() + 120
    while _tpu_chips(watched) != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1)   # a look after the last: the count stays at 0
    assert _tpu_chips(watched) == 0, message
