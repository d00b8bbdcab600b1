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
        """A complete, safe config: a point of the kernel's search space for `target`."""

    def check_config(self, config: dict[str, Any], shape: Shape, dtype: Any, target: str) -> str | None:
        """None when `build` accepts the config, else a short reason it refuses it."""


class OptionalHooks(Protocol):
    """Names a kernel module may define; `hook(module, name)` reads them with their defaults."""

    # Relative error bounds by dtype name, overriding the farm's (farm.validate.TOLERANCE).
    # Default {}: the farm's bounds.
    TOLERANCE: Mapping[str, float]
    # The knobs whose growth never shrinks the footprint, for OOM dominance pruning
    # (farm.pruning). Default None: every integer knob.
    MEMORY_PARAMS: tuple[str, ...] | None

    def hbm_bytes(self, shape: Shape, dtype: Any) -> int:
        """Device-memory bytes a call needs (inputs, outputs, temporaries), for pruning tasks that
        cannot fit. Default None: the farm uses `bytes_moved`."""


REQUIRED = ("NAME", "SHAPE_NAMES", "TARGETS", "build", "reference", "make_inputs", "shape_of", "flops",
            "bytes_moved", "footprint", "default_config", "check_config")
OPTIONAL: Mapping[str, Any] = MappingProxyType({"TOLERANCE": MappingProxyType({}), "MEMORY_PARAMS": None,
                                                "hbm_bytes": None})

def check_module(module: ModuleType) -> list[str]:
    """The names of the protocol that `module` lacks (empty when it is a complete kernel)."""
    return [name for name in REQUIRED if not hasattr(module, name)]


def hook(module: Any, name: str) -> Any:
    """The kernel's optional hook `name` (one of OPTIONAL), or its documented default."""
    if name not in OPTIONAL:
        raise KeyError(f"{name!r} is not an optional kernel hook; expected one of {sorted(OPTIONAL)}")
    value = getattr(module, name, None)
    return OPTIONAL[name] if value is None else value
