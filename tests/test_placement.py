"""Which pool runs a target, and whether a pool's device can run it at all."""
from __future__ import annotations

import pytest

from farm.errors import FarmError
from farm.run import placement

H200 = {"device_kind": "NVIDIA H200", "platform": "gpu", "compute_capability": "9.0"}
A100 = {"device_kind": "NVIDIA A100-SXM4-80GB", "platform": "gpu", "compute_capability": "8.0"}
B200 = {"device_kind": "NVIDIA B200", "platform": "gpu", "compute_capability": "10.0"}


def test_a_target_goes_to_its_accelerator_else_to_cpu_interpret():
    assert placement.pool_for("gpu-mosaic", {"GPU": 2, "CPU": 32}, interpret=False) == "gpu"
    assert placement.pool_for("tpu", {"TPU": 4, "CPU": 8}, interpret=True) == "tpu"
    assert placement.pool_for("tpu", {"CPU": 8}, interpret=True) == "cpu"
    assert placement.pool_for("interpret", {"GPU": 1}, interpret=False) == "cpu"
    with pytest.raises(FarmError, match=r"--target gpu-triton: the Ray cluster has no GPU resources"):
        placement.pool_for("gpu-triton", {"CPU": 8}, interpret=False)


def test_gpu_mosaic_is_refused_up_front_on_a_gpu_that_is_not_hopper():
    placement.check_device("gpu-mosaic", "gpu", H200)
    for info in (A100, B200, {"device_kind": "NVIDIA H200", "platform": "gpu"}):   # no capability: unknown
        with pytest.raises(FarmError, match=r"--target gpu-mosaic: its kernels need a Hopper GPU") as err:
            placement.check_device("gpu-mosaic", "gpu", info)
        assert info["device_kind"] in str(err.value) and "gpu-triton" in str(err.value)
    for info in (H200, A100, B200):
        placement.check_device("gpu-triton", "gpu", info)


def test_interpret_mode_emulates_any_target_whatever_the_host():
    cpu = {"device_kind": "cpu", "platform": "cpu", "compute_capability": None}
    for target in ("gpu-mosaic", "gpu-triton", "tpu", "interpret"):
        placement.check_device(target, "cpu", cpu)
    placement.check_device("gpu-mosaic", "gpu", {**A100, "interpret": True})   # --interpret on a GPU host


def test_cpu_slots_leave_the_cpus_that_accelerator_workers_hold():
    # A GPU node of 16 CPUs whose GPU worker holds 4 of them: 12 CPU workers there, not 16 (a
    # worker Ray could never place would keep the sweep waiting for its first answer).
    nodes = [{"Alive": True, "NodeID": "gpu-node", "Resources": {"CPU": 16, "GPU": 1}},
             {"Alive": True, "NodeID": "cpu-node", "Resources": {"CPU": 2}}]
    assert len(placement.slots("cpu", nodes)) == 18
    taken = placement.slots("cpu", nodes, cpus_taken={"gpu-node": 4})
    assert sum(s.node_id == "gpu-node" for s in taken) == 12 and sum(s.node_id == "cpu-node" for s in taken) == 2
    assert [s.node_id for s in placement.slots("cpu", nodes, cpus_taken={"gpu-node": 16})] == ["cpu-node"] * 2
    assert len(placement.slots("gpu", nodes, cpus_taken={"gpu-node": 16})) == 1   # only the cpu pool gives way
