"""Software fingerprints: everything a tuned config's timing depends on, per task.

A task's fingerprint is a flat JSON object:

    {"jax": "0.10.2", "jaxlib": "0.10.2", "pallas_farm": "0.1.0",     # always
     "libtpu": ..., "jax-cuda12-plugin": ..., "cudnn": ..., "nvidia_driver": ...,   # where installed
     "device_kind": "TPU v6 lite",
     "kernel_source": {"kernels.softmax": "<sha256>", "kernels.rows.kernel": "<sha256>", ...}}

The versions come from the worker that measured the task (`Worker.info()["software"]`, i.e.
`farm.measure.software.versions()` on that host, without the Python version); `kernel_source` hashes the
kernel module's file and, transitively, every `kernels.*` module it imports (and modules of its
own top-level package, for kernels outside `kernels/`), as found in this checkout.

Simulating an upgrade (tests, dry runs): the environment variable FARM_FINGERPRINT_OVERRIDE
holds a JSON object, or `@PATH` of a file holding one, whose entries replace fingerprint
components (`{"jax": "0.99.0"}`; `null` removes a component). It applies wherever fingerprints
are made in that process: `farm sweep` and `farm retune` bundles, and the retune's staleness check.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kernels
from farm.errors import FarmError
from farm.inputs import TooLarge, read_regular

OVERRIDE_ENV = "FARM_FINGERPRINT_OVERRIDE"
MAX_OVERRIDE_BYTES = 1 << 20
KERNEL_SOURCE = "kernel_source"
DEVICE_KIND = "device_kind"
# Software entries that are not part of the fingerprint (a Python patch release does not retune).
NOT_FINGERPRINTED = ("python",)
KERNEL_PACKAGE = "kernels"


def override() -> dict[str, Any]:
    """The components FARM_FINGERPRINT_OVERRIDE replaces ({} when it is unset)."""
    text = os.environ.get(OVERRIDE_ENV, "").strip()
    if not text:
        return {}
    source = OVERRIDE_ENV
    if text.startswith("@"):
        source = f"{OVERRIDE_ENV} file {text[1:]}"
        try:
            text = read_regular(text[1:], MAX_OVERRIDE_BYTES).decode("utf-8", errors="replace")
        except TooLarge:
            raise FarmError(f"{source}: expected a JSON object file of at most {MAX_OVERRIDE_BYTES} bytes") from None
        except OSError as err:
            raise FarmError(f"{source}: cannot be read ({err}); expected a JSON object file") from None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise FarmError(f"{source}: not JSON ({err}); expected an object such as {{\"jax\": \"0.99.0\"}}") from None
    if not isinstance(value, dict):
        raise FarmError(f"{source}: expected a JSON object of fingerprint components, got {type(value).__name__}")
    return value


def imported_modules(path: Path, package: str | None) -> set[str]:
    """Module names a source file imports (absolute, with relative imports resolved)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = (package or "").split(".")
                parent = ".".join(parts[:len(parts) - node.level + 1]) if node.level <= len(parts) else ""
                base = f"{parent}.{base}".strip(".") if base else parent
            if not base:
                continue
            # `from pkg import name`: name may be a submodule (then pkg/__init__ is not what is used).
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            found = [m for m in submodules if _spec(m) is not None]
            names.update(found)
            if len(found) < len(submodules):
                names.add(base)
    return names


def _spec(name: str) -> Any:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None


def kernel_sources(kernel: str) -> dict[str, str]:
    """{module name: sha256 of its file} for the kernel's module and the kernels.* modules it uses."""
    module = kernels.load(kernel)
    root = module.__name__
    local = {KERNEL_PACKAGE, root.split(".")[0]}
    hashes: dict[str, str] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in hashes:
            continue
        spec = _spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        path = Path(spec.origin)
        hashes[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        package = name if spec.submodule_search_locations is not None else name.rpartition(".")[0]
        todo.extend(m for m in imported_modules(path, package) if m.split(".")[0] in local and m not in hashes)
    return dict(sorted(hashes.items()))


def for_task(kernel: str, info: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The fingerprint of a task measured by a worker whose `Worker.info()` is `info` (override applied)."""
    software = {k: v for k, v in (info.get("software") or {}).items() if k not in NOT_FINGERPRINTED}
    fingerprint: dict[str, Any] = {**software, DEVICE_KIND: info.get(DEVICE_KIND),
                                   KERNEL_SOURCE: dict(sources if sources is not None else kernel_sources(kernel))}
    for name, value in override().items():
        if value is None:
            fingerprint.pop(name, None)
        else:
            fingerprint[name] = value
    return fingerprint


def to_json(fingerprint: Mapping[str, Any]) -> str:
    """Canonical JSON of a fingerprint (sorted keys, no spaces): the stored form."""
    return json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))


def digest(fingerprint: Mapping[str, Any]) -> str:
    """Hex sha256 of the canonical JSON."""
    return hashlib.sha256(to_json(fingerprint).encode()).hexdigest()


def parse(text: str | None) -> dict[str, Any] | None:
    """A stored fingerprint, or None when the row has none (older bundles) or it is not a JSON object."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def changes(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprints, in words ("jax 0.10.2 -> 0.99.0"); [] when equal."""
    if old is None:
        return ["no fingerprint recorded"]
    found = []
    for name in sorted(set(old) | set(new)):
        if name == KERNEL_SOURCE:
            continue
        if old.get(name) != new.get(name):
            found.append(f"{name} {old.get(name)} -> {new.get(name)}")
    before, after = old.get(KERNEL_SOURCE) or {}, new.get(KERNEL_SOURCE) or {}
    for module in sorted(set(before) | set(after)):
        if before.get(module) != after.get(module):
            state = "added" if module not in before else "removed" if module not in after else "changed"
            found.append(f"kernel source {module} {state}")
    return found
