"""Shared fixtures: one real local Ray for the session, a signing key, repo paths."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# The suite's spaces name kernels in tests/fixtures by module path: the documented opt-in
# (tests of the refusal itself pass allow_kernel_modules=False or clear this variable).
os.environ.setdefault("FARM_ALLOW_KERNEL_MODULES", "1")

# Tests that start Ray (the `ray_local` fixture, or a sweep in a child process) or rank configs by
# measured time are marked `serial`: `make test` runs them alone, after the others run in two
# processes (`-n 2 -m "not serial"`), since a second test process beside them would land inside
# their timing samples and time limits. These modules are serial throughout.
SERIAL_MODULES = frozenset({
    "test_adversarial_runs", "test_bench_tools", "test_cluster", "test_compile_pool", "test_driver_throughput",
    "test_faults", "test_progress", "test_pruning", "test_retune", "test_shape_first", "test_sweep",
    "test_user_loop", "test_warm_start", "test_worker",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that must run alone `serial` (SERIAL_MODULES, and any that uses `ray_local`)."""
    for item in items:
        module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
        if module in SERIAL_MODULES or "ray_local" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.serial)


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


@pytest.fixture(autouse=True)
def _ray_only_in_serial_tests(request: pytest.FixtureRequest):
    """A test that starts Ray in this process must be marked serial (SERIAL_MODULES)."""
    running = _ray_running()
    yield
    if not running and _ray_running() and request.node.get_closest_marker("serial") is None:
        pytest.fail(f"{request.node.nodeid} started Ray but is not marked serial: add its module to "
                    "SERIAL_MODULES in tests/conftest.py")


@pytest.fixture(scope="session")
def worker_modules(tmp_path_factory) -> Path:
    """A folder on the import path of this process and of `ray_local`'s workers, for modules tests write."""
    folder = tmp_path_factory.mktemp("worker_modules")
    sys.path.insert(0, str(folder))
    return folder


@pytest.fixture(scope="session")
def ray_local(worker_modules):
    """A real embedded local Ray (2 CPUs on CI), shared by the tests that sweep."""
    import ray

    from farm.run.pool import connect

    cwd, path = os.getcwd(), os.environ.get("PYTHONPATH")
    os.chdir(REPO)  # workers import tests.fixtures from the repo root
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(worker_modules), path]))
    try:
        connect(None)
    finally:
        os.chdir(cwd)
        if path is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = path
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory):
    """A fresh Ed25519 key pair: (private path, public path)."""
    from farm.bundle import signing

    private, public, _ = signing.generate_keypair(tmp_path_factory.mktemp("keys") / "test.pem")
    return private, public


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository root."""
    return REPO
