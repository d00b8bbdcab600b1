"""Compile on the whole host: child processes compile configs, the device process only runs them.

Building a Pallas kernel is mostly Python under the GIL (tracing, then Triton's or Mosaic's
MLIR passes), so compile threads of the device process take turns. `CompilePool` keeps
`processes` child Python processes (`python -m farm.measure.compile_child`) on the same host,
each with the same devices visible. A child builds, lowers and compiles a config for the task's
input shapes (`jax.ShapeDtypeStruct`s: no device memory), and sends back both executables (the
timed kernel and its poisoned-output build) serialized with `jax.experimental.serialize_executable`.
The device process deserializes them (milliseconds) and makes the inputs only when the trial
gets the device.

Why serialized executables, not JAX's persistent compilation cache: the cache is keyed by the
lowered module, so the device process would still trace and lower every config (most of a
Pallas compile) before it could hit the cache. A serialized executable carries the compiled
XLA program and the kernels in it (Triton's binary, compiled in the child at lowering time).

One request per child at a time, so faults are the config's own: a child that outruns the
compile limit is killed and replaced (`timeout`, the worker itself stays), a child that dies
(a compiler crash) is replaced (`compile_error`). Children die with their parent
(`PR_SET_PDEATHSIG`), so a killed worker leaves no compiler behind. An executable that cannot
be serialized (host callbacks, as in TPU interpret mode) comes back `NotPortable`: the device
process compiles that task itself. Mosaic GPU's executables load once its runtime is imported
(`kernel_runtimes`).

TPU: a chip opens in one process only, so a TPU worker's children run with
`JAX_PLATFORMS=cpu` (`TPU_CHILD_ENV`) and compile deviceless, for the chip's one-chip topology
(`jax.experimental.topologies`, libtpu's compiler, Mosaic included). Shown on CPU with libtpu
for v5e, v6e and v5p (tests/test_tpu_deviceless.py); loading such executables on a real chip was
never run (no TPU here), so TPU workers start no compile processes unless asked
(`--compile-processes N`).
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import queue
import selectors
import struct
import subprocess
import sys
import threading
import time
import warnings
from typing import IO, Any

from farm.measure import outcomes
from farm.measure.outcomes import Measurement
from farm.tasks import TuningTask

_HEADER = struct.Struct("<Q")
MAX_REPLY_BYTES = 2 << 30     # an executable larger than this is refused (a runaway child)


@dataclasses.dataclass(frozen=True)
class Request:
    """What a child compiles; `topology` (e.g. "v5e:1x1"): compile for TPU without a chip."""

    task: TuningTask
    config: dict[str, Any]
    interpret: bool
    topology: str | None = None


# A TPU worker's compile children: no device (the chip opens in one process), and libtpu loaded
# beside the worker's, which holds libtpu's lockfile (/tmp/libtpu_lockfile): without the second
# variable every deviceless compile in a child fails with "Internal error when accessing libtpu
# multi-process lockfile" while the worker (or any process that initialised JAX) lives.
TPU_CHILD_ENV = {"JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}

# TPU device kinds whose deviceless compiles were run (on CPU, with libtpu installed): the
# topology a compile child targets for a worker's chip. Other kinds compile in the worker.
# ("TPU v5" is v5p's kind, one megacore chip. v4's one-chip topology describes two devices, its
# TensorCores, not the megacore device a v4 worker opens: v4 workers compile in the worker.)
TPU_TOPOLOGIES = {"TPU v5 lite": "v5e:1x1", "TPU v6 lite": "v6e:1x1", "TPU v5": "v5p:1x1x1"}


def tpu_topology(device_kind: str) -> str | None:
    """The one-chip topology to compile for a TPU of `device_kind` without opening it (None: unknown)."""
    return TPU_TOPOLOGIES.get(device_kind)


@dataclasses.dataclass(frozen=True)
class Portable:
    """A config's executables, serialized (`serialize_executable.serialize` triples)."""

    executable: tuple[bytes, Any, Any]
    check_executable: tuple[bytes, Any, Any]
    compile_s: float
    calls: int = 1        # kernel calls the timed executable makes per dispatch (`farm.measure.dispatch`)


@dataclasses.dataclass(frozen=True)
class NotPortable:
    """The config compiled, but its executable cannot leave the process that compiled it."""

    reason: str


Reply = Portable | NotPortable | Measurement


def write_message(stream: IO[bytes], value: Any) -> None:
    """One length-prefixed pickle."""
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_message(stream: IO[bytes]) -> Any:
    """One length-prefixed pickle; EOFError when the other side closed."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("closed")
    (size,) = _HEADER.unpack(header)
    if size > MAX_REPLY_BYTES:
        raise EOFError(f"a message of {size} bytes is over the {MAX_REPLY_BYTES} byte limit")
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("closed mid-message")
    return pickle.loads(data)   # our own child, over a private pipe


class _Child:
    """One compile process and its pipes."""

    def __init__(self, env: dict[str, str]) -> None:
        with warnings.catch_warnings():
            # JAX warns at every fork; this one is followed by exec at once, before any thread runs.
            warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
            self.proc = subprocess.Popen([sys.executable, "-m", "farm.measure.compile_child"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)

    def ask(self, request: Request, timeout_s: float | None) -> Reply:
        """Send one request and wait for its reply; TimeoutError or EOFError on trouble."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            write_message(self.proc.stdin, request)
        except (BrokenPipeError, OSError) as err:
            raise EOFError(f"the compile process is gone ({err})") from err
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            if not selector.select(timeout_s):
                raise TimeoutError
        return read_message(self.proc.stdout)

    def kill(self) -> None:
        """Stop the process (no wait beyond reaping it)."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


class CompilePool:
    """`processes` compile processes; `compile` may be called from many threads at once."""

    def __init__(self, processes: int, env: dict[str, str] | None = None) -> None:
        if processes < 1:
            raise ValueError(f"a compile pool needs at least one process, not {processes}")
        self.processes = processes
        self._env = {**os.environ, **(env or {})}
        self._idle: queue.Queue[_Child] = queue.Queue()
        self._all: list[_Child] = []
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(processes):
            self._idle.put(self._spawn())

    def _spawn(self) -> _Child:
        child = _Child(self._env)
        with self._lock:
            self._all.append(child)
        return child

    def _replace(self, child: _Child) -> None:
        child.kill()
        with self._lock:
            if child in self._all:
                self._all.remove(child)
            closed = self._closed
        if not closed:
            self._idle.put(self._spawn())

    def compile(self, task: TuningTask, config: dict[str, Any], *, interpret: bool,
                timeout_s: float | None = None, topology: str | None = None) -> Reply:
        """Compile one config in a free child (waiting for one); every failure is a value.
        `topology`: compile for that TPU topology without a chip (`tpu_topology`)."""
        child = self._idle.get()
        started = time.perf_counter()
        try:
            reply = child.ask(Request(task, config, interpret, topology), timeout_s)
        except TimeoutError:
            self._replace(child)
            return Measurement(outcomes.TIMEOUT, compile_s=time.perf_counter() - started,
                               error=f"compile exceeded {timeout_s:.0f} s; its compile process was killed")
        except (EOFError, pickle.UnpicklingError) as err:
            code = child.proc.poll()
            self._replace(child)
            return Measurement(outcomes.COMPILE_ERROR, compile_s=time.perf_counter() - started).fail(
                f"the compile process died (exit code {code}): {err}", outcomes.COMPILE_ERROR)
        self._idle.put(child)
        return reply

    def pids(self) -> list[int]:
        """The process ids of the live compile processes (for monitoring)."""
        with self._lock:
            return [child.proc.pid for child in self._all]

    def close(self) -> None:
        """Stop every child."""
        with self._lock:
            self._closed = True
            children = list(self._all)
            self._all.clear()
        for child in children:
            child.kill()


def load(reply: Portable) -> tuple[Any, Any]:
    """The timed and check executables of a reply, loaded onto this process's devices."""
    from jax.experimental import serialize_executable

    kernel_runtimes()
    return (serialize_executable.deserialize_and_load(*reply.executable),
            serialize_executable.deserialize_and_load(*reply.check_executable))


def kernel_runtimes() -> None:
    """Register the kernel compilers' host runtimes with this process's JIT, as a compile does.
    A Mosaic GPU executable calls `mosaic_gpu_launch_kernel`, which exists only once
    `jax.experimental.mosaic.gpu` is imported: without it, loading one compiled elsewhere fails
    ("Failed to lookup host symbol"; on the H200, every gpu-mosaic task then compiled in the
    worker's threads, whose Python held the GIL under the timing thread: `farm.run.gate`)."""
    try:
        import jax.experimental.mosaic.gpu  # noqa: F401 - registers mosaic_gpu_launch_kernel
    except ImportError:    # a JAX without Mosaic GPU: none of its executables to load either
        pass
