"""Where workers go: one per accelerator chip (TPU), per GPU, or per CPU for interpret mode.

Slots are read from the live Ray cluster (`ray.nodes()`), optionally limited to nodes with a
label, and spread round-robin over nodes. Each worker is pinned to its node with a hard node
affinity, so a replacement lands where the dead one was (or nowhere, if that node is gone).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from farm.errors import FarmError
from kernels.targets import gpu_targets_for

# Ray resource names per pool.
RESOURCE = {"tpu": "TPU", "gpu": "GPU", "cpu": "CPU"}
# Targets whose kernels run natively on a pool's accelerator.
NATIVE_POOL = {"tpu": "tpu", "gpu-triton": "gpu", "gpu-mosaic": "gpu"}


@dataclasses.dataclass(frozen=True)
class Slot:
    """One worker's place: its pool, node and index among that node's chips."""

    pool: str
    node_id: str
    index: int
    cpus: int = 1     # the node's CPUs per slot of this pool (what its compile processes may use)


def pool_for(target: str, cluster: Mapping[str, float], interpret: bool) -> str:
    """Which pool runs `target`: its accelerator when the cluster has one, else CPU interpret."""
    native = NATIVE_POOL.get(target)
    if native is None:
        return "cpu"
    if cluster.get(RESOURCE[native], 0) >= 1:
        return native
    if interpret:
        return "cpu"
    raise FarmError(f"--target {target}: {unrunnable(target, cluster, interpret)}; expected a cluster with "
                    f"{RESOURCE[native]}s, or --interpret to emulate {target} on CPU")


def unrunnable(target: str, cluster: Mapping[str, float], interpret: bool) -> str | None:
    """Why the cluster cannot run `target` (its accelerator missing, no --interpret), or None."""
    native = NATIVE_POOL.get(target)
    if native is None or interpret or cluster.get(RESOURCE[native], 0) >= 1:
        return None
    return f"the Ray cluster has no {RESOURCE[native]} resources"


def device_unfit(target: str, pool: str, info: Mapping[str, Any]) -> str | None:
    """Why the pool's device (a worker's `info()`) cannot run `target`'s kernels natively, or None:
    gpu-mosaic's issue Hopper's WGMMA and TMA, so on any other GPU every trial would be a compile
    error. Interpret mode emulates any target anywhere. A pool's workers are taken to share one
    device kind (as its capacity is)."""
    if pool != "gpu" or info.get("interpret"):
        return None
    capability = info.get("compute_capability")
    runs = gpu_targets_for(capability)
    if target in runs:
        return None
    return (f"its kernels need a Hopper GPU (CUDA compute capability 9.x); this cluster's GPU workers run on "
            f"{info.get('device_kind')} (compute capability {capability}), where the GPU targets are "
            f"{', '.join(runs)}")


def check_device(target: str, pool: str, info: Mapping[str, Any]) -> None:
    """Raise FarmError when the pool's device cannot run `target`'s kernels natively (`device_unfit`)."""
    reason = device_unfit(target, pool, info)
    if reason is not None:
        raise FarmError(f"--target {target}: {reason}; drop --target {target}, or give it Hopper nodes "
                        f"(--node-label)")


def node_matches(node: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a `ray.nodes()` entry carries every label (Ray labels, or custom resources named key=value)."""
    node_labels = node.get("Labels") or {}
    resources = node.get("Resources") or {}
    return all(node_labels.get(k) == v or f"{k}={v}" in resources for k, v in labels.items())


def slots(pool: str, nodes: Sequence[Mapping[str, Any]], labels: Mapping[str, str] | None = None,
          limit: int | None = None, cpus_taken: Mapping[str, float] | None = None) -> list[Slot]:
    """One slot per unit of the pool's resource on each alive matching node, spread over nodes.
    cpus_taken: CPUs a node's accelerator workers hold (node id -> CPUs), which the cpu pool's
    slots leave them: a slot whose actor could never be placed would wait forever."""
    per_node: list[list[Slot]] = []
    for node in nodes:
        if not node.get("Alive") or (labels and not node_matches(node, labels)):
            continue
        resources = node.get("Resources", {})
        count = int(resources.get(RESOURCE[pool], 0))
        if pool == "cpu":
            count = max(0, int(resources.get("CPU", 0) - (cpus_taken or {}).get(node["NodeID"], 0)))
        cpus = max(1, int(resources.get("CPU", 1) // max(count, 1)))
        per_node.append([Slot(pool, node["NodeID"], i, cpus) for i in range(count)])
    spread = [s for group in _interleave(per_node) for s in group]
    if not spread:
        where = f" on nodes labelled {dict(labels)}" if labels else ""
        raise FarmError(f"no {RESOURCE[pool]} slots{where} in the Ray cluster; expected at least one")
    return spread[:limit] if limit else spread


def _interleave(groups: list[list[Slot]]) -> list[list[Slot]]:
    longest = max((len(g) for g in groups), default=0)
    return [[g[i] for g in groups if i < len(g)] for i in range(longest)]


def parse_labels(items: Sequence[str] | None) -> dict[str, str]:
    """`key=value` strings from the command line as a dict."""
    labels = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise FarmError(f"--node-label {item!r}: expected key=value")
        labels[key] = value
    return labels
