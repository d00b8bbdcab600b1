"""How a kernel's `pl.pallas_call` is lowered: the target, interpret mode, and output poisoning.

Kernels build their Pallas calls through `pallas_call` below, so that every kernel gets the
same treatment of targets (compiler params are always passed explicitly: JAX 0.10 and 0.11
default to different GPU backends) and the same output poisoning for validation.
"""
from __future__ import annotations

import dataclasses
import inspect
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


# How jax.ShapeDtypeStruct names an output's varying manual mesh axes (JAX 0.10: manual_axis_type;
# `vma` elsewhere), or None where it has no such argument.
_VARYING_ARG = next((name for name in ("manual_axis_type", "vma")
                     if name in inspect.signature(jax.ShapeDtypeStruct).parameters), None)


def _axis_type(x: Any) -> Any:
    """The manual-axis type of a traced input (its varying mesh axes under shard_map), or None."""
    try:
        aval = jax.typeof(x)
    except TypeError:
        return None
    return getattr(aval, "manual_axis_type", None) or getattr(aval, "vma", None)


def _varying(axis_type: Any) -> frozenset:
    return frozenset(getattr(axis_type, "varying", axis_type) or ())


def varying_axes(x: Any) -> frozenset:
    """The manual mesh axes a traced value varies over (inside shard_map, its checks on); else empty."""
    return _varying(_axis_type(x))


def with_varying_axes(out_shape: Any, inputs: Sequence[Any]) -> Any:
    """`out_shape` typed to vary over the manual mesh axes its inputs vary over.

    Under `jax.shard_map` (its default `check_vma=True`), JAX refuses a pallas_call whose output
    shapes do not say how they vary; a kernel's outputs vary where any input does. Outside
    shard_map, or where nothing varies, `out_shape` is returned as it is."""
    types = [t for t in map(_axis_type, inputs) if t is not None and _varying(t)]
    if _VARYING_ARG is None or not types:
        return out_shape
    union = frozenset().union(*map(_varying, types))
    chosen = next((t for t in types if _varying(t) == union), None)
    if chosen is None:
        chosen = type(types[0])(varying=union) if hasattr(types[0], "varying") else union

    def typed(leaf: Any) -> Any:
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding, **{_VARYING_ARG: chosen})

    return jax.tree.map(typed, out_shape)


def vary_like(outputs: Any, inputs: Sequence[Any]) -> Any:
    """`outputs` marked as varying over every manual mesh axis an input varies over, where a launch
    (Mosaic GPU's `plgpu.kernel`) returned them invariant: a later kernel that takes them
    (`with_varying_axes`) and shard_map's checks then see where they vary. Elsewhere unchanged."""
    union = frozenset().union(*(_varying(t) for t in map(_axis_type, inputs) if t is not None))
    if not union:
        return outputs

    def vary(x: Any) -> Any:
        missing = tuple(sorted(union - _varying(_axis_type(x))))
        if not missing:
            return x
        if hasattr(jax.lax, "pvary"):
            return jax.lax.pvary(x, missing)
        return jax.lax.pcast(x, missing, to="varying")

    return jax.tree.map(vary, outputs)


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
        def plain(*inputs: jax.Array) -> Any:
            return pl.pallas_call(
                body, out_shape=with_varying_axes(out_shape, inputs), grid=tuple(grid), in_specs=in_specs,
                out_specs=out_specs, scratch_shapes=tuple(scratch_shapes), compiler_params=params,
                interpret=interpret, name=name,
            )(*inputs)

        return plain

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
            poisoned_body, out_shape=with_varying_axes(out_shape, inputs), grid=tuple(grid), in_specs=specs,
            out_specs=out_specs, scratch_shapes=tuple(scratch_shapes), compiler_params=params,
            interpret=interpret, name=name,
            input_output_aliases={n_in + i: i for i in range(n_out)},
        )(*inputs, *poisons)

    del out_tree
    return call
