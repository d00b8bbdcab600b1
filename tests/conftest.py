"""Shared fixtures: one real local Ray for the session, a signing key, repo paths."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@pytest.fixture(scope="session")
def ray_local():
    """A real embedded local Ray (2 CPUs on CI), shared by the tests that sweep."""
    import ray

    from farm.driver import connect

    cwd = os.getcwd()
    os.chdir(REPO)  # workers import tests.fixtures from the repo root
    try:
        connect(None)
    finally:
        os.chdir(cwd)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory):
    """A fresh Ed25519 key pair: (private path, public path)."""
    from farm import signing

    private, public, _ = signing.generate_keypair(tmp_path_factory.mktemp("keys") / "test.pem")
    return private, public


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository root."""
    return REPO
