"""Trace TPU kernels on a host without a TPU: an abstract TPU device in the mesh context.

Mosaic TPU reads device facts while tracing: `pltpu.emit_pipeline` asks for the chip's
tiling and `pltpu.get_tpu_info` for its VMEM size. On a CPU host (TPU interpret mode, or
lowering for TPU with `lowering_platforms=("tpu",)`) there is no TPU to ask, so kernels
wrap their function with `traced_for_tpu`, which traces it under
`jax.sharding.use_abstract_mesh` with an `AbstractDevice` of a TPU kind. JAX refuses to
*run* a computation under an abstract mesh, so the context is entered inside `jax.jit`,
while tracing only; callers need nothing special. The mesh's one axis is of the Auto type, so
that it stays out of the traced arrays' types: with an Explicit axis a kernel's outputs came back
sharded over a one-CPU mesh of that axis, which the next TPU kernel called outside `jax.jit` (the
second phase of matmul and layer norm) refused as not its context's mesh. On a TPU host, or under
a mesh the caller set up, the wrapper changes nothing.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import AbstractDevice, AbstractMesh, AxisType

MIB = 1 << 20
# The TPU assumed when none is attached: v6e ("TPU v6 lite"), one TensorCore per device.
TPU_DEVICE = AbstractDevice(device_kind="TPU v6 lite", num_cores=1, platform="tpu")


def abstract_tpu_mesh(device: AbstractDevice = TPU_DEVICE) -> AbstractMesh:
    """A one-device abstract mesh whose device is `device`."""
    return AbstractMesh((1,), ("tpu",), (AxisType.Auto,), abstract_device=device)


def needs_abstract_tpu() -> bool:
    """Whether tracing for TPU here needs an abstract TPU (no TPU backend, no device in context)."""
    if jax.sharding.get_abstract_mesh().abstract_device is not None:
        return False
    return jax.default_backend() != "tpu"


def traced_for_tpu(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` under `jax.jit`, traced with an abstract TPU in context when no TPU is attached."""

    @functools.wraps(fn)
    def traced(*args: Any) -> Any:
        if not needs_abstract_tpu():
            return fn(*args)
        with jax.sharding.use_abstract_mesh(abstract_tpu_mesh()):
            return fn(*args)

    return jax.jit(traced)


def tpu_info() -> Any:
    """Pallas's `TpuInfo` of the TPU being traced for (the abstract one off-TPU)."""
    from jax.experimental.pallas import tpu as pltpu

    if needs_abstract_tpu():
        with jax.sharding.use_abstract_mesh(abstract_tpu_mesh()):
            return pltpu.get_tpu_info()
    return pltpu.get_tpu_info()


def vmem_capacity_bytes() -> int:
    """VMEM bytes of one TensorCore of the TPU being traced for (the abstract one off-TPU)."""
    return int(tpu_info().vmem_capacity_bytes)


def tpu_generation() -> int:
    """The generation (4 for v4, 5 for v5e and v5p, ...) of the TPU being traced for."""
    return int(tpu_info().generation)


def vmem_limit(footprint_bytes: int) -> int:
    """The scoped-VMEM limit to ask Mosaic for: the footprint with headroom, within the chip."""
    return min(vmem_capacity_bytes(), max(32 * MIB, int(footprint_bytes * 1.5) + 4 * MIB))
