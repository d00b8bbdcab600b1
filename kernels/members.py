"""The protocol members a kernel family makes for each of its modules: all of them but NAME.

Where two registered kernels differ only in a parameter (attention: causal or not; gated units:
the activation), their family makes the members with one function returning `Members`, and
each module unpacks it in one statement, so that every member stays a plain module attribute
(`kernels.protocol.check_module` and readers see them) without a list of re-exports per module:

    NAME = "flash_attention_causal"
    (SHAPE_NAMES, TARGETS, reference, make_inputs, shape_of, flops, bytes_moved, footprint,
     default_config, check_config, build) = attention_core.variant(causal=True)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Members(NamedTuple):
    """`kernels.protocol.Kernel`'s members but NAME, in the order a module unpacks them."""

    SHAPE_NAMES: tuple[str, ...]
    TARGETS: tuple[str, ...]
    reference: Callable[..., Any]
    make_inputs: Callable[..., tuple[Any, ...]]
    shape_of: Callable[..., tuple[int, ...]]
    flops: Callable[[tuple[int, ...]], int]
    bytes_moved: Callable[[tuple[int, ...], Any], int]
    footprint: Callable[..., int]
    default_config: Callable[..., dict[str, Any]]
    check_config: Callable[..., str | None]
    build: Callable[..., Callable[..., Any]]
