"""The import rules of the layout (see README's Architecture section and shared DESIGN.md).

Data flows one way: search -> run -> measure -> bundle -> deploy. Each package may import only
the packages listed for it in ALLOWED (its own modules always); `kernels/` imports nothing
from `farm/`; `measure`, `search`, `bundle` and `deploy` import no Ray; `bundle` and `deploy`
no Optuna; `deploy` no YAML. Imports inside functions count too: a lazy import is still a
dependency. The last tests load modules in a fresh interpreter and look at `sys.modules`.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from farm.bundle.fingerprint import imported_modules

ROOT = Path(__file__).resolve().parent.parent
CORE = {"farm", "farm.errors", "farm.inputs", "farm.tasks", "kernels"}
# package -> the farm packages (besides CORE and itself) it may import
ALLOWED: dict[str, set[str]] = {
    "farm.measure": set(),
    "farm.search": {"farm.measure"},
    "farm.bundle": {"farm.measure"},
    "farm.deploy": {"farm.bundle", "farm.measure"},
    "farm.run": {"farm.search", "farm.measure", "farm.bundle"},
    "farm.retune": {"farm.search", "farm.measure", "farm.bundle", "farm.run", "farm.deploy"},
    "farm.cli": {"farm.search", "farm.measure", "farm.bundle", "farm.run", "farm.deploy", "farm.retune"},
    "farm.__main__": {"farm.cli"},
}
# third-party packages a farm package must not import
FORBIDDEN: dict[str, set[str]] = {
    "farm.measure": {"ray", "optuna", "yaml"},
    "farm.search": {"ray"},
    "farm.bundle": {"ray", "optuna", "yaml"},
    "farm.deploy": {"ray", "optuna", "yaml"},
    "farm.tasks": {"ray", "optuna", "yaml", "jax"},
    "farm.errors": {"ray", "optuna", "yaml", "jax"},
    "farm.inputs": {"ray", "optuna", "yaml", "jax"},
    "kernels": {"ray", "optuna", "yaml", "farm"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code (relative imports resolved)."""
    module = _module_name(path)
    return imported_modules(path, module if path.name == "__init__.py" else module.rpartition(".")[0])


def _package_of(module: str) -> str:
    """The layout unit a module belongs to: farm.<package>, a top-level farm module, or kernels."""
    parts = module.split(".")
    if parts[0] == "kernels":
        return "kernels"
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def _farm_units(module: str) -> str | None:
    """The farm layout unit an imported name refers to, or None for a third-party module."""
    parts = module.split(".")
    if parts[0] != "farm":
        return None
    if len(parts) == 1:
        return "farm"
    return f"farm.{parts[1]}"


# Departures from the rules, each with its reason.
PENDING: set[tuple[str, str]] = {
    # JAX 0.10 and 0.11 have no public Mosaic GPU interpreter (JAX's own tests import it so);
    # one function, kernels.mgpu_launch._gpu_interpreter, holds the import.
    ("kernels/mgpu_launch.py", "jax._src"),
}
SOURCES = sorted([*ROOT.joinpath("farm").rglob("*.py"), *ROOT.joinpath("kernels").rglob("*.py")])


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layout(path: Path) -> None:
    module = _module_name(path)
    unit = _package_of(module)
    imported = _imports(path)
    if unit == "kernels":
        assert not [m for m in imported if m.split(".")[0] in FORBIDDEN["kernels"]], \
            f"{path}: kernels/ imports nothing from farm/, Ray, Optuna or YAML"
        return
    allowed = CORE | ALLOWED.get(unit, set()) | {unit}
    rel = str(path.relative_to(ROOT))
    upward = sorted(m for m in imported if (u := _farm_units(m)) is not None and u not in allowed
                    and not any(rel == f and m.startswith(name) for f, name in PENDING))
    assert not upward, f"{path} ({unit}) imports {upward}; allowed: {sorted(allowed)}"
    banned = FORBIDDEN.get(unit, set())
    third = sorted(m for m in imported if m.split(".")[0] in banned)
    assert not third, f"{path} ({unit}) must not import {sorted(banned)}; it imports {third}"


def test_every_farm_module_is_in_a_known_unit() -> None:
    units = {_package_of(_module_name(p)) for p in SOURCES}
    known = set(ALLOWED) | set(FORBIDDEN) | {"farm"}
    assert units <= known, f"modules outside the layout: {sorted(units - known)}"


# Third-party imports that set environment variables themselves (jax, ray): loaded first.
THIRD_PARTY = "import jax, jax.experimental.pallas, ray, optuna, pyarrow, yaml, rich"


def _loaded_after(statement: str, prelude: str = "") -> dict[str, object]:
    code = ("import json, os, sys; " + (prelude + "; " if prelude else "") + "env = dict(os.environ); " + statement +
            "; print(json.dumps({'modules': sorted(m for m in ('ray', 'optuna', 'yaml', 'torch') if m in sys.modules),"
            " 'env_changed': sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k))}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_deploy_loads_without_ray_optuna_or_yaml() -> None:
    loaded = _loaded_after("import farm.deploy.runtime, farm.deploy.pull, farm.bundle.artifacts, farm.bundle.trust")
    assert loaded["modules"] == [], f"a deployment would load {loaded['modules']}"


def test_nothing_changes_process_state_at_import() -> None:
    modules = sorted({_module_name(p) for p in SOURCES if p.name != "__main__.py"})
    loaded = _loaded_after("import importlib; [importlib.import_module(m) for m in " + repr(modules) + "]",
                           prelude=THIRD_PARTY)
    assert loaded["env_changed"] == [], f"importing the farm changed the environment: {loaded['env_changed']}"


def test_public_apis_only() -> None:
    """No JAX internals (`jax._src`) and no Optuna private attributes (`_trial_id`, `_storage`)."""
    offenders = []
    for path in SOURCES:
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        offenders += [f"{rel}: {word}" for word in ("jax._src", "._trial_id", "._storage")
                      if word in text and (rel, word) not in PENDING]
    assert not offenders, offenders
