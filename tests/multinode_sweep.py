"""Run by tests/test_cluster.py in its own process: a sweep on a multi-node Ray cluster
(ray.cluster_utils.Cluster) whose nodes advertise TPU chips; one node leaves mid-sweep. Then a
gpu-mosaic sweep on a node that advertises a GPU its worker cannot use that way (this CPU): refused
before any trial, leaving no run folder; and the same with no --target (runnable_only): the
gpu-mosaic tasks are left out, the interpret ones tuned."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from farm.errors import FarmError
from farm.measure import outcomes
from farm.run.sweep import SweepSettings, run_sweep
from farm.search import plan, spaces

SPACE = """\
kernel: softmax
dtypes: [float32]
shapes: [[64, 128], [128, 128], [64, 256]]
targets: [tpu]
params:
  block_rows: {values: [8, 16, 32, 64]}
sampler: grid
trials: 4
"""


def main(out: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = [cluster.add_node(num_cpus=2, resources={"TPU": 2}) for _ in range(2)]
    cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}})
    (out / "space.yaml").write_text(SPACE)
    planned = plan.expand([spaces.load_space(out / "space.yaml")])
    # No finalists re-timed: the emulated TPU workers count as accelerators, and re-timing (tested in
    # test_compile_pool) took 19 of this sweep's 50 s.
    settings = SweepSettings(run_dir=out / "run", interpret=True, repetitions=2, depth=1, finalists=0)
    records: list = []
    removed: list = []

    def remove_a_node_mid_sweep():
        while len(records) < 2:
            time.sleep(0.05)
        cluster.remove_node(nodes[1])
        removed.append(nodes[1].node_id)

    thread = threading.Thread(target=remove_a_node_mid_sweep, daemon=True)
    thread.start()
    result = run_sweep(planned, settings, None, on_record=records.append)
    thread.join(timeout=60)
    placed = result.summary["placement"]
    (out / "mosaic.yaml").write_text(SPACE.replace("targets: [tpu]", "targets: [gpu-mosaic]"))
    mosaic = SweepSettings(run_dir=out / "mosaic_run", interpret=False, repetitions=2, depth=1)
    try:
        run_sweep(plan.expand([spaces.load_space(out / "mosaic.yaml")]), mosaic, None)
        refused = None
    except FarmError as err:
        refused = str(err)
    (out / "both.yaml").write_text(SPACE.replace("targets: [tpu]", "targets: [interpret, gpu-mosaic]")
                                   .replace("[[64, 128], [128, 128], [64, 256]]", "[[64, 128]]"))
    both = SweepSettings(run_dir=out / "both_run", interpret=False, repetitions=2, depth=1, runnable_only=True)
    untargeted = run_sweep(plan.expand([spaces.load_space(out / "both.yaml")]), both, None)
    # A file, not stdout: Ray's raylet prints its own lines to stdout as the removed node's workers die.
    (out / "result.json").write_text(json.dumps({
        "initial": placed["initial"], "tpu_nodes": [n.node_id for n in nodes], "removed": removed,
        "records": [r.to_dict() for r in result.records], "final_workers": placed["final"],
        "outcomes": outcomes.MEASURED, "mosaic_refused": refused, "mosaic_run_left": (out / "mosaic_run").exists(),
        "untargeted_left_out": untargeted.summary["left_out"],
        "untargeted_tuned": sorted({(r["task_key"], r["status"]) for r in untargeted.rows}),
        "untargeted_trials": sorted({r.task_key for r in untargeted.records}),
    }))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
