"""Launch Mosaic GPU kernels (`plgpu.kernel`) with the farm's interpret mode and poisoning.

`kernels.lowering.pallas_call` covers `pl.pallas_call`; Mosaic GPU kernels written against
`plgpu.kernel` (warp specialization, persistent grids) need their own treatment:
  interpret: Pallas's GPU interpreter (`InterpretGPUParams`, a private module of JAX 0.10) runs
      the kernel on the CPU, simulating SMEM, TMA, barriers and warpgroups. It fills
      uninitialised memory, outputs included, with NaN, which is the farm's poison.
  poison_outputs on a GPU: every output is a `jax.new_ref` filled with NaN and passed to the
      kernel as an argument (`pl.kernel` aliases Refs in and out), so elements the kernel never
      writes stay NaN; `plgpu.kernel` cannot take Refs, hence `pl.kernel` with a `plgpu.Mesh`.
Importing this module needs `absl-py` (Mosaic GPU imports it); the GPU is needed only to run.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.lowering import Platform, poison_value, vary_like, with_varying_axes

# SMs of the GPU assumed when none is attached (H200 / H100 SXM).
DEFAULT_NUM_SMS = 132
# Shared memory one block may use on sm_90 (H100/H200): 227 KiB.
SMEM_BYTES = 232448
_DEFAULTS_SMEM: contextvars.ContextVar[int | None] = contextvars.ContextVar("defaults_smem", default=None)


def defaults_shared_memory() -> int:
    """The shared memory a block has on the GPU the GPU targets' defaults are chosen for: what
    `defaults_for_shared_memory` says, else SMEM_BYTES (an H100's or H200's, where they were measured)."""
    return _DEFAULTS_SMEM.get() or SMEM_BYTES


@contextlib.contextmanager
def defaults_for_shared_memory(bytes_per_block: int | None) -> Iterator[None]:
    """Choose the defaults inside for a GPU whose blocks have `bytes_per_block` of shared memory
    (None: SMEM_BYTES): the deployment's registry says so for the GPU it runs on (sm86's and
    sm89's 99 KiB, an A100's 163 KiB)."""
    if bytes_per_block is not None and bytes_per_block <= 0:
        raise ValueError(f"shared memory per block must be positive, got {bytes_per_block}")
    token = _DEFAULTS_SMEM.set(bytes_per_block)
    try:
        yield
    finally:
        _DEFAULTS_SMEM.reset(token)


def num_sms() -> int:
    """Streaming multiprocessors of the GPU being traced for (DEFAULT_NUM_SMS off-GPU)."""
    abstract = jax.sharding.get_abstract_mesh().abstract_device
    if abstract is not None and abstract.platform == "gpu" and abstract.num_cores:
        return int(abstract.num_cores)
    if jax.default_backend() == "gpu":
        return int(getattr(jax.devices()[0], "core_count", DEFAULT_NUM_SMS))
    return DEFAULT_NUM_SMS


def _gpu_interpreter() -> tuple[Any, Callable[[], None]] | None:
    """(InterpretGPUParams, reset_gpu_interpret_mode_state) of Pallas's GPU interpreter, or None.

    The one use of `jax._src` in kernels/: JAX 0.10 and 0.11 have no public API for the Mosaic
    GPU interpreter (unlike TPU's `pltpu.InterpretParams`), and JAX's own tests import it so.
    Replace with `jax.experimental.pallas.mosaic_gpu` names once JAX exports them.
    """
    try:
        from jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call import reset_gpu_interpret_mode_state
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    except ImportError:  # pragma: no cover - depends on the JAX version
        return None
    return InterpretGPUParams, reset_gpu_interpret_mode_state


def interpret_params() -> Any:
    """Parameters of Pallas's GPU interpreter (a private JAX module: may move between versions)."""
    found = _gpu_interpreter()
    if found is None:  # pragma: no cover - depends on the JAX version
        raise NotImplementedError("this JAX has no Mosaic GPU interpreter; gpu-mosaic kernels need a GPU")
    return found[0]()


def reset_interpreter() -> None:
    """Clear the GPU interpreter's global state, which a kernel that raised leaves behind."""
    found = _gpu_interpreter()
    if found is not None:
        found[1]()


def mosaic_kernel(
    body: Callable[..., None],
    *,
    platform: Platform,
    out_shape: Sequence[jax.ShapeDtypeStruct],
    grid: tuple[int, ...],
    grid_names: tuple[str, ...],
    cluster: tuple[int, ...] = (),
    cluster_names: tuple[str, ...] = (),
    num_threads: int | None = None,
    thread_name: str | None = None,
    compiler_params: Any = None,
    name: str | None = None,
) -> Callable[..., tuple[jax.Array, ...]]:
    """A Mosaic GPU kernel of `body(*input_refs, *output_refs)`; returns a tuple of outputs."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if platform.target != "gpu-mosaic":
        raise ValueError(f"mosaic_kernel builds gpu-mosaic kernels, not {platform.target!r}")
    out_shape = tuple(out_shape)
    mesh = dict(grid=grid, grid_names=grid_names, num_threads=num_threads, thread_name=thread_name)
    if cluster:  # only when clustered: Mosaic GPU's interpreter rejects any cluster argument
        mesh.update(cluster=cluster, cluster_names=cluster_names)
    if platform.interpret or not platform.poison_outputs:
        def call(*inputs: jax.Array) -> tuple[jax.Array, ...]:
            if platform.interpret:  # each new trace starts from a clean interpreter
                reset_interpreter()
            kernel = plgpu.kernel(body, out_type=with_varying_axes(out_shape, inputs),
                                  compiler_params=compiler_params,
                                  interpret=interpret_params() if platform.interpret else None, **mesh)
            return tuple(vary_like(tuple(kernel(*inputs)), inputs))

        return call

    def poisoned_call(*inputs: jax.Array) -> tuple[jax.Array, ...]:
        refs = [jax.new_ref(jnp.full(o.shape, poison_value(o.dtype), o.dtype)) for o in out_shape]
        pl.kernel(body, out_type=(), mesh=plgpu.Mesh(**mesh), compiler_params=compiler_params,
                  name=name)(*inputs, *refs)
        return tuple(r[...] for r in refs)

    return poisoned_call
