"""Typed kernel configs: a frozen dataclass per kernel family and target, dicts only at the edges.

A config class's fields are the knobs: each default is written once, on the field; a field
typed `Literal[...]` takes only those values; a default of None means "derived from the other
knobs" (the class says how) and is left out of `to_dict`. `__post_init__` coerces the values
(search spaces and Parquet hand over numpy integers) and checks what the knobs alone decide
(`validate`); a family's `check(problem, dtype)` adds what depends on the shape and dtype.

    >>> @dataclasses.dataclass(frozen=True)
    ... class Blocks(Knobs):
    ...     block: int
    ...     order: Literal["m", "n"] = "n"
    >>> Blocks.from_dict({"block": 128}).to_dict()
    {'block': 128, 'order': 'n'}
    >>> Blocks.from_dict({"block": 128, "blok": 64})
    Traceback (most recent call last):
    kernels.knobs.ConfigError: unknown knob 'blok' (known knobs: block, order)
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

T = TypeVar("T", bound="Knobs")


class ConfigError(ValueError):
    """A config the kernel refuses: an unknown, missing or ill-typed knob, or an illegal value."""


class Unsupported(ConfigError, NotImplementedError):
    """A legal-looking config this kernel has no code for on the target (a NotImplementedError too)."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(every knob, the knobs without a default) of a config class, in field order: asked once
    per class (enumerating a space parses each of its configs)."""
    fields = dataclasses.fields(cls)
    required = tuple(f.name for f in fields
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    return tuple(f.name for f in fields), required


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """`value` as the field's type: int, bool, str, a Literal's value, or None where allowed."""
    args = typing.get_args(hint)
    if value is None and type(None) in args:
        return None
    if typing.get_origin(hint) is Literal:
        if value not in args:
            raise ConfigError(f"{name} = {value!r}: expected one of {', '.join(map(repr, args))}")
        return value
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if base is bool:
        if value not in (True, False):
            raise ConfigError(f"{name} = {value!r}: expected true or false")
        return bool(value)
    try:
        if base is int:
            if isinstance(value, bool) or not float(value).is_integer():
                raise ValueError(value)
            return int(value)
        return base(value) if base in (str, float) else value
    except (TypeError, ValueError):
        raise ConfigError(f"{name} = {value!r}: expected {'an integer' if base is int else base.__name__}") from None


@dataclasses.dataclass(frozen=True)
class Knobs:
    """Base of typed configs: coercion, `Literal` checks, and the dict edge (`from_dict`, `to_dict`)."""

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for field in dataclasses.fields(self):
            value = _coerce(field.name, getattr(self, field.name), hints[field.name])
            object.__setattr__(self, field.name, value)
        self.validate()

    def validate(self) -> None:
        """Refuse values the knobs alone make illegal (raise ConfigError or Unsupported)."""

    @classmethod
    def knob_names(cls) -> tuple[str, ...]:
        """The knobs, in field order."""
        return _fields(cls)[0]

    @classmethod
    def from_dict(cls: type[T], config: Mapping[str, Any]) -> T:
        """The typed config of a dict; an unknown or missing knob is refused with its name."""
        return parse(config, cls)[0]

    def to_dict(self) -> dict[str, Any]:
        """The knobs as a dict, without those left None (derived from the others)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def parse(config: Mapping[str, Any], *types: type[Knobs]) -> tuple[Any, ...]:
    """One typed config per class from one flat dict (a kernel's own knobs beside its family's).

    Every knob must belong to one of `types`; each class takes the knobs it declares.
    """
    known = [name for t in types for name in t.knob_names()]
    unknown = sorted(set(config) - set(known))
    if unknown:
        names = ", ".join(repr(u) for u in unknown)
        raise ConfigError(f"unknown knob{'s' if len(unknown) > 1 else ''} {names} "
                          f"(known knobs: {', '.join(known)})")
    out = []
    for t in types:
        names, required = _fields(t)
        mine = {k: v for k, v in config.items() if k in names}
        missing = [name for name in required if name not in mine]
        if missing:
            raise ConfigError(f"missing knob{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
        out.append(t(**mine))
    return tuple(out)


def refusal(check: Callable[[], object]) -> str | None:
    """None when `check()` passes, else the reason it gave (its ConfigError's message)."""
    try:
        check()
    except ConfigError as err:
        return str(err)
    return None
