"""The software and device a result was measured with."""
from __future__ import annotations

import platform
from importlib import metadata

import farm


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Versions of what a timing depends on: Python, JAX, jaxlib, plugins, pallas-farm."""
    import jax

    found = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "pallas_farm": farm.__version__,
    }
    for dist in ("libtpu", "jax-cuda12-plugin", "jax-cuda13-plugin", "triton"):
        if (v := _version(dist)) is not None:
            found[dist] = v
    return found


def device_kind() -> str:
    """The first JAX device's kind (e.g. 'NVIDIA H200', 'TPU v6 lite', 'cpu')."""
    import jax

    return jax.devices()[0].device_kind
