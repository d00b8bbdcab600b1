"""Tuned kernels: a kernel bound to a registry, called on JAX arrays (also under `jax.jit`).

The target follows the device unless given; a kernel that declares a backward kernel
(`kernels.protocol.Backward`) is differentiable through a `jax.custom_vjp` that runs it, itself
looked up and tuned. See `farm.deploy.runtime` for the whole story.
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import kernels
import kernels.protocol
from farm.deploy.registry import Choice, Lookup, NoBackwardKernel, Registry, _dtype_name, check_task
from farm.errors import FarmError
from kernels.targets import gpu_targets_for


def _device_target(platform: str) -> tuple[str | None, bool]:
    """(target, interpret) for a JAX platform name; target None: a GPU, chosen per task."""
    if platform == "cpu":
        return "interpret", True
    if platform == "tpu":
        return "tpu", False
    if platform in ("gpu", "cuda", "rocm"):
        return None, False
    raise FarmError(f"tuned(): no kernel target for JAX platform {platform!r}; expected cpu, tpu or gpu, "
                    "or pass target=")


def gpu_targets(kernel: str, shape: tuple[int, ...], dtype: str, compute_capability: str | None,
                device_kind: str = "this GPU") -> tuple[str, ...]:
    """The kernel's GPU targets that run on a GPU of this compute capability ("9.0"), in the order
    to try their defaults: the GPU's (`kernels.targets.gpu_targets_for`), refined by the kernel's
    default_gpu_targets hook. What a deployment on a GPU chooses from (`Registry.gpu_target`)."""
    module = kernels.load(kernel)
    runs = tuple(t for t in gpu_targets_for(compute_capability) if t in module.TARGETS)
    if not runs:
        raise FarmError(f"tuned({kernel!r}): none of the kernel's targets ({', '.join(module.TARGETS)}) runs on "
                        f"{device_kind} (compute capability {compute_capability}); GPU targets there: "
                        f"{', '.join(gpu_targets_for(compute_capability))}")
    order = kernels.protocol.hook(module, "default_gpu_targets")
    return runs if order is None else tuple(t for t in order(shape, dtype, runs) if t in runs)


class TunedKernel:
    """A kernel bound to a registry: called on JAX arrays (or tracers, under `jax.jit`), it runs
    the looked-up config.

    The Pallas call is built and jitted once per input shapes and dtypes, and cached. With
    target=None the target follows `jax.devices()[0]`: "interpret" on CPU, "tpu" on TPU, and on
    a GPU, per task, of the GPU targets that run there (gpu-mosaic on Hopper only), the one with
    the faster tuned median in the registry, else the device's and kernel's order
    (`Registry.gpu_target`). Differentiable when the kernel declares a backward kernel (its BACKWARD hook:
    the backward kernel is tuned too); otherwise differentiating raises NoBackwardKernel.
    """

    def __init__(self, registry: Registry, kernel: str, *, target: str | None = None, device_kind: str | None = None,
                 interpret: bool = False, shape_of: Callable[..., tuple[int, ...]] | None = None,
                 partition: bool = False) -> None:
        self.registry, self.kernel, self.target, self.device_kind = registry, kernel, target, device_kind
        self.interpret = interpret
        self._module = kernels.load(kernel)
        self._shape_of = shape_of or self._module.shape_of
        self._rule = None
        if partition:
            if shape_of is not None:
                raise FarmError(f"tuned({kernel!r}): partition=True takes the kernel's own inputs (its shape_of); "
                                "drop shape_of=, or call the kernel inside jax.shard_map")
            if interpret and target in ("tpu", "gpu-mosaic"):
                raise FarmError(f"tuned({kernel!r}, target={target!r}, interpret=True): partition=True cannot run "
                                f"Pallas's {target} interpreter, whose callbacks JAX's custom_partitioning cannot "
                                f"partition; on CPU use target='interpret' (or no target)")
            from farm.deploy.partition import PartitionRule

            self._rule = PartitionRule.of(kernel, self._module)
        self._built: dict[tuple, tuple[Choice, Callable[..., Any], Lookup]] = {}
        self._noted: set[tuple] = set()   # keys of _built whose task the registry has noted
        self._input_ranks: tuple[int, ...] | None = None
        self._lock = threading.Lock()
        self._warned_sharded = False   # ShardedCallWarning, once per tuned kernel
        backward = kernels.protocol.hook(self._module, "BACKWARD")
        self._backward = None if backward is None else TunedKernel(
            registry, backward.kernel, target=target, device_kind=device_kind, interpret=interpret,
            partition=partition)
        import jax

        self._call = jax.jit(self._differentiable(backward))  # jit: eager calls skip the rule's dispatch

    def _entry(self, inputs: Sequence[Any], *, note: bool = True) -> tuple[Choice, Callable[..., Any], Lookup]:
        """The choice, built call and lookup for these inputs' shapes and dtypes (built once);
        note=False: not yet noted by the registry (`Registry.lookup`), until asked with note=True."""
        key = (*(tuple(x.shape) for x in inputs), *(x.dtype for x in inputs))
        entry = self._built.get(key)
        if entry is None:
            with self._lock:
                entry = self._built.get(key)
                if entry is None:
                    entry = self._built[key] = self._build(inputs, note=note)
                    if note:
                        self._noted.add(key)
        if note and key not in self._noted:
            looked = entry[2]
            self.registry.lookup(looked.kernel, looked.shape, looked.dtype, looked.target, looked.device_kind)
            self._noted.add(key)
        return entry

    def _platform(self, shape: tuple[int, ...], dtype: str) -> tuple[str, bool]:
        """(target, interpret) for a task: the given target, or the one of the device."""
        if self.target is not None:
            return self.target, self.interpret
        import jax

        device = jax.devices()[0]
        target, interpret = _device_target(device.platform)
        if target is None:
            target = self.registry.gpu_target(self.kernel, shape, dtype, self.device_kind,
                                              self._gpu_targets(shape, dtype, device))
        return target, interpret or self.interpret

    def _gpu_targets(self, shape: tuple[int, ...], dtype: str, device: Any) -> tuple[str, ...]:
        """The kernel's GPU targets that run on `device`, in the order to try their defaults."""
        return gpu_targets(self.kernel, shape, dtype, getattr(device, "compute_capability", None),
                           device.device_kind)

    def _build(self, inputs: Sequence[Any], *, note: bool = True) -> tuple[Choice, Callable[..., Any], Lookup]:
        import jax

        from kernels.lowering import Platform

        shapes = ", ".join(str(tuple(x.shape)) for x in inputs)
        ranks = self._ranks()
        if self._shape_of is self._module.shape_of and [len(x.shape) for x in inputs] != list(ranks):
            raise FarmError(f"tuned({self.kernel!r}): inputs of shapes {shapes}: expected {len(ranks)} arrays of "
                            f"{', '.join(map(str, ranks))} dimensions (the kernel's inputs for "
                            f"({', '.join(self._module.SHAPE_NAMES)}))")
        symbolic = [str(d) for x in inputs for d in x.shape if not hasattr(type(d), "__index__")]
        if symbolic:   # jax.export's shape polymorphism: no config can be looked up for a symbol
            raise FarmError(f"tuned({self.kernel!r}): inputs of shapes {shapes}: symbolic dimensions "
                            f"({', '.join(dict.fromkeys(symbolic))}); a tuned kernel is looked up and built for "
                            f"concrete shapes: export one program per shape (jax.export with concrete shapes), or "
                            f"call the kernel's reference ({self._module.__name__}.reference) where a dimension "
                            f"must stay symbolic")
        try:
            shape = tuple(int(d) for d in self._shape_of(*inputs))
        except (TypeError, ValueError, IndexError) as err:
            raise FarmError(f"tuned({self.kernel!r}): inputs of shapes {shapes}: expected the kernel's inputs "
                            f"({err})") from None
        dtype = _dtype_name(inputs[0].dtype)
        check_task(self.kernel, shape, dtype, self.target)
        expected = jax.eval_shape(lambda: self._module.make_inputs(shape, dtype, jax.random.key(0)))
        if [tuple(x.shape) for x in inputs] != [tuple(x.shape) for x in expected]:
            want = ", ".join(str(tuple(x.shape)) for x in expected)
            raise FarmError(f"tuned({self.kernel!r}): inputs of shapes {shapes}: expected {want} for the task "
                            f"{dict(zip(self._module.SHAPE_NAMES, shape))}")
        target, interpret = self._platform(shape, dtype)
        choice = self.registry.lookup(self.kernel, shape, dtype, target, self.device_kind, note=note)
        lookup = Lookup.of(self.kernel, shape, dtype, target, self.device_kind, choice)
        built = self._module.build(dict(choice.config), shape, dtype, Platform(target, interpret=interpret))
        return choice, jax.jit(built), lookup

    def _ranks(self) -> tuple[int, ...]:
        """The number of dimensions of each of the kernel's inputs (its make_inputs at a shape of ones)."""
        if self._input_ranks is None:
            import jax

            ones = tuple(1 for _ in self._module.SHAPE_NAMES)
            made = jax.eval_shape(lambda: self._module.make_inputs(ones, "float32", jax.random.key(0)))
            self._input_ranks = tuple(len(x.shape) for x in made)
        return self._input_ranks

    def _differentiable(self, backward: Any) -> Callable[..., Any]:
        """The kernel call with its derivative rule: the backward kernel's VJP, or a clear refusal."""
        import jax

        def whole(*inputs: Any) -> Any:
            return self._entry(inputs)[1](*inputs)

        run = whole
        if self._rule is not None:
            from farm.deploy.partition import partitioned, when_run_whole

            def traced(*inputs: Any) -> Any:
                """The global call, traced: its task is noted only if it is lowered whole (not split)."""
                shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]
                leaves, tree = jax.tree.flatten(self._entry(inputs, note=False)[1](*inputs))
                leaves[0] = when_run_whole(leaves[0], lambda: self._entry(shapes))
                return jax.tree.unflatten(tree, leaves)

            run = partitioned(self._rule, traced, lambda shards: self._entry(shards)[1])

        if backward is None:
            refused = jax.custom_jvp(run)

            @refused.defjvp
            def _refuse(primals: tuple, tangents: tuple) -> Any:
                raise NoBackwardKernel(
                    f"kernel {self.kernel!r} has no backward kernel: runtime.tuned({self.kernel!r}) cannot be "
                    f"differentiated (jax.grad, jax.jvp, ...). Differentiate its reference "
                    f"({self._module.__name__}.reference) instead, or declare a backward kernel in "
                    f"{self._module.__name__} (the BACKWARD hook, kernels.protocol.Backward)")

            return refused

        differentiable = jax.custom_vjp(run)
        sources = backward.sources()
        keep_outputs = any(kind == "output" for kind, _ in sources)

        def forward(*inputs: Any) -> tuple[Any, tuple]:
            out = run(*inputs)
            return out, (inputs, out if keep_outputs else None)

        def vjp(residuals: tuple, cotangent: Any) -> tuple:
            inputs, out = residuals
            values = {"input": inputs, "output": _as_tuple(out), "cotangent": _as_tuple(cotangent)}
            grads = _as_tuple(self._backward(*(values[kind][i] for kind, i in sources)))
            by_input = dict(zip(backward.grads, grads))
            return tuple(_summed_to(by_input[i].astype(x.dtype), x) if i in by_input else _zeros(x)
                         for i, x in enumerate(inputs))

        differentiable.defvjp(forward, vjp)
        return differentiable

    def choice(self, *inputs: Any) -> Choice:
        """The config (and rule) these inputs run with."""
        return self._entry(inputs)[0]

    def choices(self) -> list[Lookup]:
        """The tasks this kernel was built for, with the rule and distance of each config."""
        return [entry[2] for entry in list(self._built.values())]

    def __call__(self, *inputs: Any) -> Any:
        """Run the kernel on `inputs` (JAX or NumPy arrays) with its tuned config."""
        for i, x in enumerate(inputs):
            if not (hasattr(x, "shape") and hasattr(x, "dtype")):
                raise FarmError(f"tuned({self.kernel!r}): input {i}: expected an array (JAX or NumPy), got "
                                f"{type(x).__name__}")
            if self._rule is None and not self._warned_sharded and _sharded(x):
                self._warned_sharded = True
                warnings.warn(f"tuned({self.kernel!r}): input {i} is sharded over {len(x.sharding.device_set)} "
                              f"devices; XLA does not partition a Pallas kernel, so every device gathers the whole "
                              f"array and runs the whole call. Call it inside jax.shard_map, or make it with "
                              f"partition=True (each shard then runs, and is looked up, at its own shape)",
                              ShardedCallWarning, stacklevel=2)
        return self._call(*inputs)


class ShardedCallWarning(UserWarning):
    """A tuned kernel was called on an array sharded over several devices, outside shard_map."""


def _sharded(x: Any) -> bool:
    """Whether `x` is a concrete array split over several devices (not replicated on them)."""
    sharding = getattr(x, "sharding", None)
    try:
        return sharding is not None and len(sharding.device_set) > 1 and not sharding.is_fully_replicated
    except Exception:  # noqa: BLE001 - a tracer, or a sharding of another kind: nothing to say
        return False


def _as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _summed_to(grad: Any, x: Any) -> Any:
    """`grad` summed over the manual mesh axes it varies over and its input `x` does not: inside
    shard_map, a weight every shard shares gets the sum of the shards' gradients (with its checks
    on, JAX requires a VJP's outputs to vary as its inputs do; with them off, nothing is known)."""
    import jax

    from kernels.lowering import varying_axes

    extra = tuple(sorted(varying_axes(grad) - varying_axes(x)))
    return jax.lax.psum(grad, extra) if extra else grad


def _zeros(x: Any) -> Any:
    """The zero cotangent of an input no backward output covers (float0 for integer inputs)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


_default: Registry | None = None


def set_default(registry: Registry | None) -> None:
    """Make `registry` the one `tuned()` uses when none is passed."""
    global _default
    _default = registry


def tuned(kernel_name: str, *, target: str | None = None, registry: Registry | None = None,
          device_kind: str | None = None, interpret: bool = False,
          shape_of: Callable[..., tuple[int, ...]] | None = None, partition: bool = False) -> TunedKernel:
    """A function that calls `kernel_name` on JAX arrays with the config looked up in `registry`.

    target=None follows the device (see TunedKernel); the result may be called under `jax.jit`
    and differentiated when the kernel has a backward kernel. partition=True lets XLA split a
    call on sharded inputs over the kernel's PARALLEL_DIMS (`farm.deploy.partition`; under
    `jax.vmap` too, the batch split as one more parallel dimension).
    """
    registry = registry if registry is not None else _default
    if registry is None:
        raise FarmError("tuned(): no registry; expected registry=Registry.load(...) or runtime.set_default(...)")
    return registry.tuned(kernel_name, target=target, device_kind=device_kind, interpret=interpret,
                          shape_of=shape_of, partition=partition)
