"""Tuned calls that XLA partitions: under `jax.jit` with sharded inputs, a call split over its
kernel's parallel dimensions, each device running the kernel on its own shard.

A kernel says which task dimensions split into independent tasks of the same kernel
(`PARALLEL_DIMS`, `kernels.protocol.OptionalHooks`): rows for the row kernels, m, n and k for a
matmul (k's pieces summed), batch and heads for attention. `PartitionRule.of` reads which dimension of the task each
input and output dimension is (from the kernel's own `make_inputs` and `reference` at a shape of
distinct primes), and `partitioned` wraps a call in JAX's `custom_partitioning` with that rule:
the partitioner keeps a parallel dimension split as the inputs are and gathers the others; each
device then runs the kernel built for its shard's shape (looked up at that shape). An output
that lacks a split dimension (a matmul's product over k; rms_norm_bwd's weight gradient, a sum
over rows) is summed over the devices that split it. A dimension the mesh does not divide
evenly is gathered, not padded.

On one device, and inside `jax.shard_map` (every axis manual), JAX runs the wrapped call as it is.
Under `jax.vmap`, the batch is one more parallel dimension, merged on each device into one the
kernel has (a row kernel's rows), else run an element at a time (`batched`).
JAX traces the global call before XLA partitions it, so its task is looked up unnoted, and noted
(`Registry.lookup`: warned about, recorded) only where that call is lowered whole
(`when_run_whole`); the shards' tasks are noted as the partitioner builds their calls.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import kernels.protocol
from farm.errors import FarmError

_BATCH = "vmap."   # a vmapped call's batch dimensions: vmap.0, vmap.1, ... (no task dimension's name)
_PRIMES = (3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


@dataclasses.dataclass(frozen=True)
class PartitionRule:
    """Which task dimension each dimension of a kernel's inputs and outputs is, and which of them
    may be split (`parallel`)."""

    kernel: str
    operands: tuple[tuple[str, ...], ...]
    results: tuple[tuple[str, ...], ...]
    parallel: tuple[str, ...]

    @classmethod
    def of(cls, kernel: str, module: Any) -> PartitionRule:
        """The rule of a kernel module, or a FarmError saying why it has none."""
        import jax

        names = tuple(module.SHAPE_NAMES)
        parallel = tuple(kernels.protocol.hook(module, "PARALLEL_DIMS") or ())
        where = f"tuned({kernel!r}, partition=True)"
        if not parallel:
            raise FarmError(f"{where}: the kernel ({module.__name__}) declares no PARALLEL_DIMS, the task "
                            f"dimensions ({', '.join(names)}) along which a call splits into independent calls; "
                            f"declare them, or call it inside jax.shard_map")
        unknown = [d for d in parallel if d not in names]
        if unknown:
            raise FarmError(f"{where}: {module.__name__}.PARALLEL_DIMS: {unknown} are not task dimensions; expected "
                            f"some of {', '.join(names)}")
        if len(names) > len(_PRIMES):
            raise FarmError(f"{where}: {len(names)} task dimensions; at most {len(_PRIMES)} are supported")
        probe = _PRIMES[:len(names)]
        by_size = dict(zip(probe, names))
        try:
            inputs = jax.eval_shape(lambda: module.make_inputs(probe, "float32", jax.random.key(0)))
            outputs = jax.eval_shape(module.reference, *inputs)
        except Exception as err:  # noqa: BLE001 - a kernel whose inputs need other sizes
            raise FarmError(f"{where}: cannot read which task dimension each input dimension is: its "
                            f"make_inputs and reference at the shape {probe} failed ({type(err).__name__}: "
                            f"{str(err)[:200]})") from None

        def dims(leaf: Any, what: str) -> tuple[str, ...]:
            missing = [d for d in leaf.shape if d not in by_size]
            if missing:
                raise FarmError(f"{where}: {what} has a dimension that is no task dimension (shape {leaf.shape} at "
                                f"the task {dict(zip(names, probe))}); such a kernel cannot be partitioned")
            return tuple(by_size[d] for d in leaf.shape)

        outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        return cls(kernel, tuple(dims(x, f"input {i}") for i, x in enumerate(inputs)),
                   tuple(dims(x, f"output {i}") for i, x in enumerate(outs)), parallel)

    def batched(self, in_batched: Sequence[bool]) -> PartitionRule:
        """The rule of the call vmapped over a new leading dimension of the operands marked in
        `in_batched` and of every result: a parallel dimension (vmap.0 for the innermost vmap,
        which JAX batches first, vmap.1 for the one around it, ...)."""
        name = f"{_BATCH}{sum(d.startswith(_BATCH) for d in self.parallel)}"
        return dataclasses.replace(
            self, operands=tuple((name, *dims) if b else dims for dims, b in zip(self.operands, in_batched)),
            results=tuple((name, *dims) for dims in self.results), parallel=(name, *self.parallel))

    def sharding_rule(self) -> str:
        """The rule in Shardy's einsum-like notation (`custom_partitioning`'s sharding_rule)."""
        def side(arrays: Sequence[tuple[str, ...]]) -> str:
            return ", ".join(" ".join(map(_factor, dims)) for dims in arrays)

        return f"{side(self.operands)} -> {side(self.results)}"

    def replicated(self) -> tuple[str, ...]:
        """The factors that must not be split (every task dimension not parallel)."""
        seen = dict.fromkeys(d for dims in (*self.operands, *self.results) for d in dims)
        return tuple(_factor(d) for d in seen if d not in self.parallel)

    def reduced(self) -> tuple[str, ...]:
        """The parallel factors no output has: the outputs of their pieces are summed (a matmul's k)."""
        in_results = {d for dims in self.results for d in dims}
        return tuple(_factor(d) for d in self.parallel if d not in in_results)

    def split(self, mesh: Any, arg_shapes: Sequence[Any]) -> dict[str, tuple[str, ...]]:
        """Each parallel dimension's mesh axes, as the first input that has it is split (a mesh
        axis used once; a dimension the axes do not divide evenly stays whole)."""
        split: dict[str, tuple[str, ...]] = {}
        used: set[str] = set()
        for dims, arg in zip(self.operands, arg_shapes):
            spec = _spec(arg)
            for i, name in enumerate(dims):
                if name not in self.parallel or name in split or i >= len(spec):
                    continue
                axes = _axes(spec[i])
                if not axes or used & set(axes):
                    continue
                if arg.shape[i] % math.prod(mesh.shape[a] for a in axes):
                    continue
                split[name] = axes
                used |= set(axes)
        return split

    def specs(self, arrays: Sequence[tuple[str, ...]], split: dict[str, tuple[str, ...]]) -> list[Any]:
        """PartitionSpecs of `arrays` (operands or results) under `split`."""
        from jax.sharding import PartitionSpec

        return [PartitionSpec(*(_entry(split.get(d)) for d in dims)) for dims in arrays]


def partitioned(rule: PartitionRule, whole: Callable[..., Any],
                shard_call: Callable[[Sequence[Any]], Callable[..., Any]]) -> Callable[..., Any]:
    """`whole` (the call at the global shape: what one device, or shard_map, runs) wrapped so that
    XLA's partitioner splits it by `rule`; `shard_call(shard_avals)` gives the call for a shard.

    Under `jax.vmap` (which `custom_partitioning` cannot batch) the vmapped call is partitioned
    the same way, its batch dimension one more parallel dimension (`batched`)."""
    from jax.custom_batching import custom_vmap

    split = _split_by(rule, whole, shard_call)

    @custom_vmap
    def call(*args: Any) -> Any:
        return split(*args)

    @call.def_vmap
    def vmapped(axis_size: int, in_batched: Sequence[Any], *args: Any) -> tuple[Any, Any]:
        import jax

        flags = tuple(bool(b) for b in in_batched)
        if not any(flags):
            out = split(*args)
            return out, jax.tree.map(lambda _: False, out)
        out = batched(rule, flags, whole, shard_call)(*args)
        return out, jax.tree.map(lambda _: True, out)

    return call


def batched(rule: PartitionRule, in_batched: Sequence[bool], whole: Callable[..., Any],
            shard_call: Callable[[Sequence[Any]], Callable[..., Any]]) -> Callable[..., Any]:
    """The call vmapped over a leading dimension of the operands marked in `in_batched` (every
    result gets one), partitioned with that dimension parallel: a device runs its slice of the
    batch. The batch is merged into a parallel dimension that every batched operand and every
    result has and no unbatched operand has (a row kernel's rows: one call on batch x rows rows,
    looked up at that shape); where there is none, the call runs once an element (`lax.map`)."""
    return partitioned(rule.batched(in_batched), _over_batch(rule, in_batched, whole),
                       lambda avals: _over_batch(rule, in_batched, shard_call(_unbatched(rule, in_batched, avals))))


def _split_by(rule: PartitionRule, whole: Callable[..., Any],
              shard_call: Callable[[Sequence[Any]], Callable[..., Any]]) -> Callable[..., Any]:
    """`whole` in JAX's `custom_partitioning` with `rule` (see `partitioned`)."""
    import jax
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding

    def plan(mesh: Any, arg_shapes: Sequence[Any]) -> tuple[dict[str, tuple[str, ...]], list[Any], list[Any]]:
        split = rule.split(mesh, arg_shapes)
        args = [NamedSharding(mesh, p) for p in rule.specs(rule.operands, split)]
        results = [NamedSharding(mesh, p) for p in rule.specs(rule.results, split)]
        return split, args, results

    def partition(mesh: Any, arg_shapes: Sequence[Any], result_shape: Any) -> tuple:
        split, args, results = plan(mesh, arg_shapes)
        shards = [jax.ShapeDtypeStruct(_shard_shape(arg.shape, dims, split, mesh), arg.dtype)
                  for arg, dims in zip(arg_shapes, rule.operands)]
        call = shard_call(shards)
        sums = [tuple(a for name, axes in split.items() if name not in dims for a in axes) for dims in rule.results]
        single = not isinstance(result_shape, (tuple, list))

        def lower(*values: Any) -> Any:
            outs = call(*values)
            outs = (outs,) if single else tuple(outs)
            outs = tuple(_summed(o, axes) if axes else o for o, axes in zip(outs, sums))
            return outs[0] if single else outs

        return mesh, lower, results[0] if single else tuple(results), tuple(args)

    def infer(mesh: Any, arg_shapes: Sequence[Any], result_shape: Any) -> Any:
        results = plan(mesh, arg_shapes)[2]
        return results[0] if not isinstance(result_shape, (tuple, list)) else tuple(results)

    def propagate(mesh: Any, user_shape: Any) -> Any:
        return user_shape.sharding

    wrapped = custom_partitioning(whole)
    wrapped.def_partition(partition=partition, infer_sharding_from_operands=infer,
                          propagate_user_sharding=propagate, sharding_rule=rule.sharding_rule(),
                          need_replication_factors=rule.replicated(), reduction_factors=rule.reduced())
    return wrapped


def _merged_dim(rule: PartitionRule, in_batched: Sequence[bool]) -> str | None:
    """The parallel dimension a batch merges into: every result has it, and exactly the batched
    operands do; of several, the outermost (a reshape, not a copy, where it leads)."""
    fits = [d for d in rule.parallel if all(d in dims for dims in rule.results)
            and all((d in dims) == b for dims, b in zip(rule.operands, in_batched))]
    batched = [dims for dims, b in zip(rule.operands, in_batched) if b] + list(rule.results)
    return min(fits, key=lambda d: sum(dims.index(d) for dims in batched), default=None)


def _unbatched(rule: PartitionRule, in_batched: Sequence[bool], avals: Sequence[Any]) -> list[Any]:
    """The operands' shapes as the call under the batch sees them (see `_over_batch`)."""
    import jax

    dim = _merged_dim(rule, in_batched)
    shapes = []
    for aval, dims, b in zip(avals, rule.operands, in_batched):
        shape = tuple(aval.shape)
        if b:
            shape = shape[1:]
            if dim is not None:
                at = dims.index(dim)
                shape = (*shape[:at], shape[at] * aval.shape[0], *shape[at + 1:])
        shapes.append(jax.ShapeDtypeStruct(shape, aval.dtype))
    return shapes


def _over_batch(rule: PartitionRule, in_batched: Sequence[bool], call: Callable[..., Any]) -> Callable[..., Any]:
    """`call` (by `rule`, unbatched) run over operands whose leading dimension is a batch where
    `in_batched`: once on the batch merged into a parallel dimension, else once an element."""
    import jax

    dim = _merged_dim(rule, in_batched)

    def merged(*args: Any) -> Any:
        size = next(a.shape[0] for a, b in zip(args, in_batched) if b)
        ins = [_merge(a, dims.index(dim)) if b else a for a, dims, b in zip(args, rule.operands, in_batched)]
        leaves, tree = jax.tree.flatten(call(*ins))
        return jax.tree.unflatten(tree, [_unmerge(o, dims.index(dim), size) for o, dims in zip(leaves, rule.results)])

    def mapped(*args: Any) -> Any:
        def one(elements: list[Any]) -> Any:
            it = iter(elements)
            return call(*(next(it) if b else a for a, b in zip(args, in_batched)))

        return jax.lax.map(one, [a for a, b in zip(args, in_batched) if b])

    return mapped if dim is None else merged


def _merge(x: Any, at: int) -> Any:
    """`x`'s leading (batch) dimension merged into its dimension `at` (of x without the batch), batch outer."""
    import jax.numpy as jnp

    moved = jnp.moveaxis(x, 0, at)
    return moved.reshape(*moved.shape[:at], moved.shape[at] * moved.shape[at + 1], *moved.shape[at + 2:])


def _unmerge(x: Any, at: int, size: int) -> Any:
    """The inverse of `_merge`: `x`'s dimension `at` split into a leading batch of `size` and the rest."""
    import jax.numpy as jnp

    split = x.reshape(*x.shape[:at], size, x.shape[at] // size, *x.shape[at + 1:])
    return jnp.moveaxis(split, at, 0)


def when_run_whole(value: Any, callback: Callable[[], Any]) -> Any:
    """`value`, marked so that `callback` runs if the call it belongs to is lowered whole: on one
    device, or inside `jax.shard_map` over its whole mesh, JAX lowers the wrapped call as it was
    traced, and the marker with it; where XLA splits it, JAX lowers the shards' calls instead and
    the marker never is. (Run eagerly, outside `jit`, the callback runs too.)"""
    return _marker().bind(value, callback=callback)


@functools.cache
def _marker() -> Any:
    """The marker primitive: the identity, whose lowering (and eager run) calls its callback."""
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    marker = Primitive("farm_partition_run_whole")

    def run(value: Any, *, callback: Callable[[], Any]) -> Any:
        callback()
        return value

    def lower(ctx: Any, value: Any, *, callback: Callable[[], Any]) -> list[Any]:
        callback()
        return [value]

    marker.def_impl(run)
    marker.def_abstract_eval(lambda value, *, callback: value)
    mlir.register_lowering(marker, lower)
    return marker


def _summed(x: Any, axes: tuple[str, ...]) -> Any:
    """`x` summed over the devices along `axes`, in float32 where it is a narrower float."""
    import jax
    import jax.numpy as jnp

    if jnp.issubdtype(x.dtype, jnp.floating) and jnp.finfo(x.dtype).bits < 32:
        return jax.lax.psum(x.astype(jnp.float32), axes).astype(x.dtype)
    return jax.lax.psum(x, axes)


def _factor(name: str) -> str:
    """A task dimension's name as a Shardy factor (a letter, then letters, digits or _)."""
    return name if re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name) else "d_" + re.sub(r"\W", "_", name)


def _spec(arg: Any) -> tuple:
    """The PartitionSpec of a partitioner's argument, () when it has none (replicated)."""
    from jax.sharding import NamedSharding

    sharding = getattr(arg, "sharding", None)
    return tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _entry(axes: tuple[str, ...] | None) -> Any:
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def _shard_shape(shape: Sequence[int], dims: tuple[str, ...], split: dict[str, tuple[str, ...]],
                 mesh: Any) -> tuple[int, ...]:
    return tuple(size // math.prod(mesh.shape[a] for a in split.get(d, ())) for size, d in zip(shape, dims))
