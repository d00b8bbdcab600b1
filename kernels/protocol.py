"""The contract every kernel module fulfils; the farm relies on nothing else.

A kernel module defines:
  NAME: str, SHAPE_NAMES: tuple[str, ...] (names of the shape's dimensions, usable in a
  search space's constraints), TARGETS: tuple[str, ...] (targets it can be built for), and
  build(config, shape, dtype, platform) -> callable   the Pallas kernel for one config;
  reference(*inputs) -> array                         the math in plain jax.numpy;
  make_inputs(shape, dtype, key) -> tuple[array]       random inputs, never zeros;
  flops(shape), bytes_moved(shape, dtype) -> int       roofline counts;
  footprint(config, shape, dtype, target) -> int       on-chip bytes a config needs;
  default_config(shape, target) -> dict                the safe fallback.
Optionally TOLERANCE: dict[dtype name, float], overriding the farm's relative error bounds.
"""
from __future__ import annotations

from types import ModuleType

REQUIRED = ("NAME", "SHAPE_NAMES", "TARGETS", "build", "reference", "make_inputs", "flops",
            "bytes_moved", "footprint", "default_config")


def check_module(module: ModuleType) -> list[str]:
    """The names of the protocol that `module` lacks (empty when it is a complete kernel)."""
    return [name for name in REQUIRED if not hasattr(module, name)]
