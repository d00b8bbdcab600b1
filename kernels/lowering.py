"""How a kernel's `pl.pallas_call` is lowered: the target, interpret mode, and output poisoning.

Kernels build their Pallas calls through `pallas_call` below, so that every kernel gets the
same treatment of targets (compiler params are always passed explicitly: JAX 0.10 and 0.11
default to different GPU backends) and the same output poisoning for validation.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.targets import TARGETS  # re-exported: kernels read their targets here


@dataclasses.dataclass(frozen=True)
class Platform:
    """Where and how a kernel is lowered.

    target: the code generator ("interpret", "tpu", "gpu-triton", "gpu-mosaic").
    interpret: run the target's kernel in Pallas interpret mode on the CPU (TPU interpret
        mode for "tpu"); always true for the "interpret" target.
    poison_outputs: start every output from a buffer of NaN (or the dtype's max), so that
        elements a kernel never writes are caught by validation.
    """

    target: str
    interpret: bool = False
    poison_outputs: bool = False

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}; expected one of {TARGETS}")
        if self.target == "interpret" and not self.interpret:
            object.__setattr__(self, "interpret", True)


def poison_value(dtype: Any) -> Any:
    """The value unwritten output elements are filled with: NaN, or the integer maximum."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.nan
    if dtype == jnp.bool_:
        return True
    return jnp.iinfo(dtype).max


def _interpret_arg(platform: Platform) -> Any:
    if not platform.interpret:
        return False
    if platform.target == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        return pltpu.InterpretParams()
    return True


def compiler_params(platform: Platform, config: dict[str, Any], **tpu_kwargs: Any) -> Any:
    """Explicit compiler params for the platform's target, from the knobs in `config`.

    Kernels with typed configs (the matmul family, attention) always pass num_warps and
    num_stages; the fallbacks here serve the row kernels' dict configs.
    """
    if platform.target == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        return pltpu.CompilerParams(**tpu_kwargs)
    if platform.target == "gpu-triton":
        from jax.experimental.pallas import triton as pltriton

        return pltriton.CompilerParams(
            num_warps=int(config.get("num_warps", 4)), num_stages=int(config.get("num_stages", 3))
        )
    return None


def round_up(value: int, multiple: int) -> int:
    """value rounded up to a multiple of `multiple`."""
    return pl.cdiv(value, multiple) * multiple


def triton_dot_buffers(num_stages: int, num_warps: int, rows: int) -> int:
    """Shared-memory copies of a Triton dot loop's operand tiles, as Triton 3.6 allocates them on
    Hopper (measured on the H200, bench/oom_probe.py): num_stages when the dot can use wgmma
    (num_warps a multiple of 4 and the dot's rows a multiple of 64), else num_stages - 1 (the
    mma.sync path loads num_stages - 1 steps ahead)."""
    wgmma = num_warps % 4 == 0 and rows % 64 == 0
    return num_stages if wgmma else max(1, num_stages - 1)


def pallas_call(
    body: Callable[..., None],
    *,
    platform: Platform,
    config: dict[str, Any],
    out_shape: Any,
    grid: Sequence[int] = (),
    in_specs: Any = pl.no_block_spec,
    out_specs: Any = pl.no_block_spec,
    scratch_shapes: Sequence[Any] = (),
    tpu_params: dict[str, Any] | None = None,
    name: str | None = None,
) -> Callable[..., Any]:
    """`pl.pallas_call` with the platform's interpret mode, compiler params and poisoning.

    The returned function takes the kernel's inputs. With `platform.poison_outputs`, each
    output aliases a freshly poisoned input buffer that the body never sees.
    """
    params = compiler_params(platform, config, **(tpu_params or {}))
    interpret = _interpret_arg(platform)
    if not platform.poison_outputs:
        return pl.pallas_call(
            body, out_shape=out_shape, grid=tuple(grid), in_specs=in_specs, out_specs=out_specs,
            scratch_shapes=tuple(scratch_shapes), compiler_params=params, interpret=interpret,
            name=name,
        )

    outs, out_tree = jax.tree.flatten(out_shape)
    n_out = len(outs)
    out_spec_list = (
        [out_specs] * n_out if out_specs is pl.no_block_spec or not isinstance(out_specs, (list, tuple))
        else list(out_specs)
    )

    def call(*inputs: jax.Array) -> Any:
        n_in = len(inputs)
        poisons = [jnp.full(o.shape, poison_value(o.dtype), o.dtype) for o in outs]

        def poisoned_body(*refs: Any) -> None:
            # refs: inputs, poison buffers (unused), outputs, scratch.
            body(*refs[:n_in], *refs[n_in + n_out:])

        specs = in_specs
        if in_specs is not pl.no_block_spec:
            specs = [*in_specs, *out_spec_list]
        return pl.pallas_call(
            poisoned_body, out_shape=out_shape, grid=tuple(grid), in_specs=specs,
            out_specs=out_specs, scratch_shapes=tuple(scratch_shapes), compiler_params=params,
            interpret=interpret, name=name,
            input_output_aliases={n_in + i: i for i in range(n_out)},
        )(*inputs, *poisons)

    del out_tree
    return call
