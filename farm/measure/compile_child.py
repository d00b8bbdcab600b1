"""A compile process of `farm.measure.compile_pool`: read a request, compile, reply; until stdin closes.

Run as `python -m farm.measure.compile_child`. Its stdout carries only replies (whatever else
prints goes to stderr), it runs at a lower CPU priority than the device process, and it dies
with its parent.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import Any

PR_SET_PDEATHSIG = 1
# Compiles yield the CPU to the device process (its host thread queues the timed calls: a stall
# there leaves the device idle mid-sample) and to the driver.
COMPILE_NICENESS = 10


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent exits (a worker killed mid-compile)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass


def handle(request: Any) -> Any:
    """Compile one request's config for its task's input shapes; the reply `compile_pool` expects."""
    import kernels
    from farm.measure import compile_pool, dispatch, outcomes
    from farm.measure.compiler import abstract_inputs, build_executables, full_text
    from farm.measure.outcomes import Measurement

    started = time.perf_counter()
    calls = 1
    try:
        module = kernels.load(request.task.kernel)
        args = abstract_inputs(module, request.task)
        if request.topology is None:
            calls = dispatch.calls_per_dispatch(module, request.task, request.interpret)
            executable, check = build_executables(module, request.task, request.config, request.interpret,
                                                  args, calls)
        else:
            executable, check = _deviceless(module, request, args)
    except Exception as err:  # noqa: BLE001 - every failure is data
        return Measurement(outcomes.COMPILE_ERROR, compile_s=time.perf_counter() - started).fail(
            full_text(err), outcomes.COMPILE_ERROR)
    compile_s = time.perf_counter() - started
    from jax.experimental import serialize_executable

    try:
        return compile_pool.Portable(serialize_executable.serialize(executable),
                                     serialize_executable.serialize(check), compile_s, calls)
    except Exception as err:  # noqa: BLE001 - e.g. host callbacks cannot be serialized
        return compile_pool.NotPortable(full_text(err)[:500])


def _deviceless(module: Any, request: Any, args: Any) -> tuple[Any, Any]:
    """Both builds compiled for `request.topology` (a TPU this process never opens): the inputs
    placed on the topology's first device, under its mesh (so that the kernels trace for its
    chip kind, not an assumed one)."""
    import jax
    from jax.experimental import topologies

    from farm.measure.compiler import build_executables

    topology = topologies.get_topology_desc(topology_name=request.topology, platform="tpu")
    mesh = jax.sharding.Mesh(topology.devices[:1], ("tpu",), axis_types=(jax.sharding.AxisType.Explicit,))
    placed = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=placed) for a in args]
    with jax.set_mesh(mesh):
        return build_executables(module, request.task, request.config, False, args)


def main() -> None:
    """Serve requests on stdin/stdout until stdin closes."""
    _die_with_parent()
    os.nice(COMPILE_NICENESS)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)            # stray prints (compilers, warnings) must not corrupt the replies
    from farm.measure.compile_pool import read_message, write_message

    requests = os.fdopen(os.dup(0), "rb")
    import jax

    jax.devices()            # start the backend now, not on the first request
    while True:
        try:
            request = read_message(requests)
        except EOFError:
            return
        write_message(replies, handle(request))


if __name__ == "__main__":
    main()
