"""Accelerator hosts from Ray's autoscaler: asked for before a sweep places its workers, given back after.

A cluster started from cluster.yaml keeps its TPU hosts at `min_workers: 0` so that idle chips are
not billed. `--scale-up CHIPS` asks the autoscaler for that many chips of the sweep's accelerator
(`ray.autoscaler.sdk.request_resources`, one bundle a chip, on nodes with the sweep's
`--node-label`s), waits until they are up or `--scale-up-wait` has passed, and withdraws the
request when the sweep ends, so that the hosts go once idle. The request is the cluster's one
standing `request_resources`: it replaces any other made before and is cleared after.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray

from farm.errors import FarmError
from farm.run import placement

logger = logging.getLogger(__name__)
POLL_S = 2.0          # seconds between looks at the cluster while waiting
REPORT_EVERY_S = 30.0  # seconds between progress lines while waiting
STATUS_LIMIT = 4 << 20  # bytes of the autoscaler's status read for an error message


@dataclasses.dataclass(frozen=True)
class ScaleUp:
    """What was asked of the autoscaler: `chips` of `resource` on nodes with `labels`; `requested`
    is False where enough were up already (nothing asked, nothing to withdraw)."""

    resource: str
    chips: int
    labels: dict[str, str]
    requested: bool
    up: int                  # matching chips up when the wait ended


def resource_of(targets: Sequence[str]) -> str:
    """The one accelerator resource ("TPU" or "GPU") the targets run on natively; FarmError when
    none does (the interpret target) or they need two kinds (say which with --target)."""
    pools = sorted({placement.NATIVE_POOL[t] for t in targets if t in placement.NATIVE_POOL})
    if not pools:
        named = ", ".join(sorted(set(targets)))
        raise FarmError(f"--scale-up: no target of this sweep runs on an accelerator ({named}); expected --target "
                        f"tpu, gpu-triton or gpu-mosaic")
    if len(pools) > 1:
        kinds = " and ".join(placement.RESOURCE[p] for p in pools)
        raise FarmError(f"--scale-up: this sweep's targets run on {kinds}; expected --target naming the one kind "
                        f"of chip to ask the autoscaler for")
    return placement.RESOURCE[pools[0]]


def chips_up(resource: str, labels: Mapping[str, str], nodes: Sequence[Mapping[str, Any]] | None = None) -> int:
    """Chips of `resource` on the alive nodes that carry every label."""
    nodes = ray.nodes() if nodes is None else nodes
    return sum(int((n.get("Resources") or {}).get(resource, 0)) for n in nodes
               if n.get("Alive") and placement.node_matches(n, labels))


def scale_up(resource: str, chips: int, labels: Mapping[str, str], wait_s: float, *,
             clock: Callable[[], float] = time.monotonic) -> ScaleUp:
    """Ask the autoscaler for `chips` of `resource` (where fewer are up) and wait for them.

    Returns once that many matching chips are up, or after `wait_s` with at least one up (a warning
    says how many). FarmError, with the request withdrawn, when none came up in `wait_s`."""
    from ray.autoscaler.sdk import request_resources

    labels = dict(labels)
    up = chips_up(resource, labels)
    if up >= chips:
        logger.info("scale-up: %d %s chips up already (asked for %d); nothing asked of the autoscaler",
                    up, resource, chips)
        return ScaleUp(resource, chips, labels, requested=False, up=up)
    where = f" on nodes labelled {labels}" if labels else ""
    try:
        request_resources(bundles=[{resource: 1}] * chips, bundle_label_selectors=[labels] * chips if labels else None)
        logger.info("scale-up: asked the autoscaler for %d %s chips%s (%d up); waiting up to %.0f s",
                    chips, resource, where, up, wait_s)
        started = last_report = clock()
        while up < chips and clock() - started < wait_s:
            time.sleep(POLL_S)
            up = chips_up(resource, labels)
            if clock() - last_report >= REPORT_EVERY_S:
                last_report = clock()
                logger.info("scale-up: %d of %d %s chips up after %.0f s%s", up, chips, resource,
                            last_report - started, _pending())
    except BaseException:   # interrupted while waiting: no request left standing
        withdraw()
        logger.info("scale-up: stopped while waiting; withdrew the autoscaler request for %d %s chips",
                    chips, resource)
        raise
    if up == 0:
        withdraw()
        raise FarmError(f"--scale-up {chips}: no {resource} chips{where} came up within {wait_s:g} s "
                        f"(--scale-up-wait){_pending()}; expected a cluster whose autoscaler can start "
                        f"{resource} hosts (cluster.yaml's node types, your quota: see `ray status`)")
    if up < chips:   # the sweep places its workers now: ask for no more hosts than it will use
        request_resources(bundles=[{resource: 1}] * up, bundle_label_selectors=[labels] * up if labels else None)
        logger.warning("scale-up: %d of the %d %s chips asked for came up within %.0f s; sweeping on those (the "
                       "request is cut to them)", up, chips, resource, wait_s)
    return ScaleUp(resource, chips, labels, requested=True, up=up)


def ask(targets: Sequence[str], chips: int, labels: Mapping[str, str], wait_s: float,
        address: str | None) -> tuple[ScaleUp, Any]:
    """--scale-up for a command: refuse where no autoscaler can answer (an embedded local Ray) or the
    targets need no or two kinds of chip, join the cluster, have SIGTERM exit through `finally`, ask
    and wait (`scale_up`). Returns what was asked and SIGTERM's handler before; `give_back` undoes both."""
    from farm.run.pool import connect

    resource = resource_of(targets)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address in (None, "local"):
        raise FarmError(f"--scale-up {chips}: an embedded local Ray has no autoscaler to ask for {resource} "
                        f"hosts; expected --address of a cluster started by `ray up`")
    connect(address)
    previous = exit_on_sigterm()
    try:
        return scale_up(resource, chips, labels, wait_s), previous
    except BaseException:
        _restore(previous)
        raise


def give_back(scaled: ScaleUp | None, previous: Any) -> None:
    """Withdraw what `ask` requested (if it asked) and restore SIGTERM's handler."""
    if scaled is not None and scaled.requested:
        withdraw()
        logger.info("scale-up: withdrew the autoscaler request for %d %s chips; idle hosts go after the "
                    "cluster's idle timeout", scaled.chips, scaled.resource)
    _restore(previous)


def _restore(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def exit_on_sigterm() -> Any:
    """Have SIGTERM (`ray job stop`, `timeout`, a scheduler) raise SystemExit, so that the sweep's
    `finally` withdraws its request instead of leaving billed hosts up; returns the handler it
    replaced (restore it with `signal.signal`), or None off the main thread (nothing changed)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminated(signum: int, frame: Any) -> None:
        _terminated_by.append(signum)
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, terminated)


_terminated_by: list[int] = []   # the signals `exit_on_sigterm`'s handler turned into SystemExit


def terminated_status() -> int | None:
    """The exit status (128 + the signal) for a SIGTERM that `exit_on_sigterm` handled, else None.

    Ray re-raises a signal handler's SystemExit inside `ray.get`/`ray.wait` as SystemExit(1), so the
    CLI asks here for the status to exit with."""
    return 128 + _terminated_by[-1] if _terminated_by else None


def withdraw() -> None:
    """Clear the cluster's standing request: hosts the sweep asked for go once idle."""
    from ray.autoscaler.sdk import request_resources

    try:
        request_resources(bundles=[])
    except Exception as err:  # noqa: BLE001 - the sweep's result stands; the hosts then go at ray down
        logger.warning("scale-up: could not withdraw the autoscaler request (%s); the hosts it started stay "
                       "until another request_resources() or `ray down`", err)


def _pending() -> str:
    """What the autoscaler last reported about launches (its status in Ray's KV store), as a clause."""
    try:
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get("__autoscaling_status")
        if not raw or len(raw) > STATUS_LIMIT:
            return ""
        report = json.loads(raw).get("autoscaler_report") or {}
    except Exception:  # noqa: BLE001 - a message's detail only
        return ""
    pending = {str(k): v for k, v in (report.get("pending_launches") or {}).items()}
    failed = report.get("failed_nodes") or []
    parts = [f"launching {pending}" if pending else "", f"{len(failed)} failed to start" if failed else ""]
    said = "; ".join(p for p in parts if p)
    return f" (the autoscaler: {said})" if said else " (the autoscaler reports no launch)"
