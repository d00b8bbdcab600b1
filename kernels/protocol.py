"""The contract every kernel module fulfils; the farm relies on nothing else.

`Kernel` is the contract as a `typing.Protocol`: a kernel is a plain module, and a module
with these names satisfies it (`isinstance(module, Kernel)` checks that the names exist).
`OptionalHooks` declares the names a kernel may define to refine the farm's behaviour; read
them with `hook(module, name)`, which returns the documented default when a kernel has none.

Configs are dicts at this edge (they come from search spaces and bundles); each family turns
them into its typed config (`kernels.knobs`) and refuses unknown knobs. `check_config` states
a config's legality once, with the kernel: the farm asks it before compiling, and `build`
raises (a `kernels.knobs.ConfigError`) for exactly the configs it refuses.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # `import kernels` stays free of JAX
    from kernels.lowering import Platform

Shape = tuple[int, ...]


@runtime_checkable
class Kernel(Protocol):
    """A Pallas kernel the farm can tune, validate, and a deployment can call on user arrays."""

    NAME: str  # the registered name
    SHAPE_NAMES: tuple[str, ...]  # the shape's dimensions, usable in a search space's constraints
    TARGETS: tuple[str, ...]  # targets it can be built for (see kernels.lowering.TARGETS)

    def build(self, config: dict[str, Any], shape: Shape, dtype: Any, platform: Platform) -> Callable[..., Any]:
        """The Pallas kernel for one config: a function of the inputs `make_inputs` returns."""

    def reference(self, *inputs: Any) -> Any:
        """The math in plain jax.numpy: the numerics oracle."""

    def make_inputs(self, shape: Shape, dtype: Any, key: Any) -> tuple[Any, ...]:
        """Random inputs of the task (never zeros)."""

    def shape_of(self, *inputs: Any) -> Shape:
        """The task shape of these inputs: `shape_of(*make_inputs(shape, dtype, key)) == shape`."""

    def flops(self, shape: Shape) -> int:
        """Floating-point operations of one call (roofline)."""

    def bytes_moved(self, shape: Shape, dtype: Any) -> int:
        """Fewest bytes one call moves through device memory (roofline)."""

    def footprint(self, config: dict[str, Any], shape: Shape, dtype: Any, target: str) -> int:
        """On-chip bytes one program needs (VMEM on TPU, shared memory on GPU), for pruning."""

    def default_config(self, shape: Shape, target: str) -> dict[str, Any]:
        """A complete, safe config: a point of the kernel's search space for `target`. A kernel
        whose defaults depend on the element size takes `dtype=` as well (see `task_default`)."""

    def check_config(self, config: dict[str, Any], shape: Shape, dtype: Any, target: str) -> str | None:
        """None when `build` accepts the config, else a short reason it refuses it."""


@dataclasses.dataclass(frozen=True)
class Backward:
    """How another kernel of the suite computes a kernel's vector-Jacobian product.

    kernel: the backward kernel's registered name.
    inputs: the backward kernel's inputs, in order, each "input<i>" (the forward kernel's input i),
        "output<i>" (its output i; a kernel returning one array has output 0) or "cotangent<i>"
        (the cotangent of output i).
    grads: for each output of the backward kernel, in order, the forward input it is the gradient
        of; forward inputs not listed get zero gradients (integer labels, say).

    rms_norm(x, weight) -> y has rms_norm_bwd(x, weight, dy) -> (dx, dweight):

        BACKWARD = Backward("rms_norm_bwd", inputs=("input0", "input1", "cotangent0"), grads=(0, 1))
    """

    kernel: str
    inputs: tuple[str, ...]
    grads: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in self.inputs:
            if not re.fullmatch(r"(input|output|cotangent)\d+", name):
                raise ValueError(f"Backward({self.kernel!r}).inputs: {name!r}; expected input<i>, output<i> or "
                                 "cotangent<i>")
        if len(set(self.grads)) != len(self.grads) or any(i < 0 for i in self.grads):
            raise ValueError(f"Backward({self.kernel!r}).grads: {self.grads}; expected distinct input indices")

    def sources(self) -> tuple[tuple[str, int], ...]:
        """The inputs as (kind, index) pairs: ("input", 0), ("cotangent", 0), ..."""
        return tuple((m.group(1), int(m.group(2))) for m in (re.fullmatch(r"([a-z]+)(\d+)", n) for n in self.inputs))


class OptionalHooks(Protocol):
    """Names a kernel module may define; `hook(module, name)` reads them with their defaults."""

    # Relative error bounds by dtype name, overriding the farm's (farm.validate.TOLERANCE).
    # Default {}: the farm's bounds.
    TOLERANCE: Mapping[str, float]
    # The knobs whose growth never shrinks the footprint, for OOM dominance pruning
    # (farm.pruning). Default None: every integer knob.
    MEMORY_PARAMS: tuple[str, ...] | None
    # The kernel computing this kernel's gradients (see Backward), so that a deployment can
    # differentiate through the tuned kernel. Default None: the kernel has no backward kernel,
    # and differentiating through it is refused with an error naming it.
    BACKWARD: Backward | None
    # The task dimensions along which a call splits into independent calls of the same kernel on
    # the pieces (softmax's rows; a matmul's m, n and k; attention's batch and heads), so that XLA
    # can partition a deployment's call over sharded inputs (`farm.deploy.partition`). An output
    # without one of them holds a sum over it (a matmul's product over k; rms_norm_bwd's weight
    # gradient, over rows): the pieces' outputs are added. Default None: calls are not partitioned.
    PARALLEL_DIMS: tuple[str, ...] | None

    def hbm_bytes(self, shape: Shape, dtype: Any) -> int:
        """Device-memory bytes a call needs (inputs, outputs, temporaries), for pruning tasks that
        cannot fit. Default None: the farm uses `bytes_moved`."""

    def default_gpu_targets(self, shape: Shape, dtype: Any, targets: tuple[str, ...]) -> tuple[str, ...]:
        """`targets` (the GPU targets that run on the deployment's GPU, in the farm's order:
        `kernels.targets.gpu_targets_for`) reordered so that the one whose default config runs
        this task fastest comes first: what a deployment runs a task its bundle lacks on.
        Default None: the farm's order."""


REQUIRED = ("NAME", "SHAPE_NAMES", "TARGETS", "build", "reference", "make_inputs", "shape_of", "flops",
            "bytes_moved", "footprint", "default_config", "check_config")
OPTIONAL: Mapping[str, Any] = MappingProxyType({"TOLERANCE": MappingProxyType({}), "MEMORY_PARAMS": None,
                                                "BACKWARD": None, "PARALLEL_DIMS": None, "hbm_bytes": None,
                                                "default_gpu_targets": None})

def check_module(module: ModuleType) -> list[str]:
    """The names of the protocol that `module` lacks (empty when it is a complete kernel)."""
    return [name for name in REQUIRED if not hasattr(module, name)]


def task_default(module: Any, shape: Shape, target: str, dtype: Any) -> dict[str, Any]:
    """The kernel's default for a task: `default_config(shape, target, dtype=dtype)` where the
    kernel's default_config takes a dtype (the matmul family's and attention's GPU tiles then fit
    shared memory in float32 too), else `default_config(shape, target)`."""
    if _takes_dtype(module.default_config):
        return module.default_config(shape, target, dtype=dtype)
    return module.default_config(shape, target)


def _takes_dtype(function: Callable[..., Any]) -> bool:
    try:
        return "dtype" in inspect.signature(function).parameters
    except (TypeError, ValueError):  # a callable without a signature: the two-argument form
        return False


def hook(module: Any, name: str) -> Any:
    """The kernel's optional hook `name` (one of OPTIONAL), or its documented default."""
    if name not in OPTIONAL:
        raise KeyError(f"{name!r} is not an optional kernel hook; expected one of {sorted(OPTIONAL)}")
    value = getattr(module, name, None)
    return OPTIONAL[name] if value is None else value
