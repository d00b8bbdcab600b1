"""What the farm tunes: a task (kernel x shape x dtype x target) and the canonical form of a config.

The vocabulary every stage shares (search, run, measure, bundle, deploy); it imports nothing
from them.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any


@dataclasses.dataclass(frozen=True)
class TuningTask:
    """One study: tune `kernel` at `shape` and `dtype` for `target`."""

    kernel: str
    shape: tuple[int, ...]
    dtype: str
    target: str

    @property
    def key(self) -> str:
        """A stable, readable id, also the Optuna study name: kernel/shape/dtype/target."""
        return f"{self.kernel}/{'x'.join(map(str, self.shape))}/{self.dtype}/{self.target}"


def config_json(config: dict[str, Any]) -> str:
    """Canonical JSON of a config: the cache key and the stored form."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def json_object(text: Any) -> dict[str, Any] | None:
    """The dict a JSON object's text holds; None for anything else (a row of an unverified bundle
    may hold any text, or none)."""
    try:
        value = json.loads(text) if isinstance(text, str) and text else None
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
