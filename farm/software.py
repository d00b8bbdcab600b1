"""The software and device a result was measured with."""
from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

import farm

# Distributions whose versions change what a kernel compiles to or how fast it runs.
DISTRIBUTIONS = ("libtpu", "libtpu-nightly", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
                 "jax-cuda13-pjrt", "nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12", "nvidia-cuda-runtime-cu13",
                 "nvidia-cudnn-cu13", "triton")
NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cuda_versions() -> dict[str, str]:
    """CUDA runtime, cuDNN and NVIDIA driver versions where obtainable (no JAX backend is started)."""
    found: dict[str, str] = {}
    try:
        from jax._src.lib import cuda_versions as cuda  # set only when a jax-cuda plugin is installed
    except ImportError:
        cuda = None
    for name, getter in (("cuda_runtime", "cuda_runtime_get_version"), ("cudnn", "cudnn_get_version")):
        try:
            found[name] = str(getattr(cuda, getter)())
        except Exception:  # noqa: BLE001 - no plugin, no library, or no GPU: not obtainable
            continue
    try:
        # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ..." -> "550.54.15"
        words = NVIDIA_DRIVER_FILE.read_text().splitlines()[0].split()
        found["nvidia_driver"] = next(w for w in words if w[:1].isdigit() and "." in w)
    except (OSError, IndexError, StopIteration):
        pass
    return found


def versions() -> dict[str, str | None]:
    """Versions of what a timing depends on: Python, JAX, jaxlib, plugins, CUDA, pallas-farm."""
    import jax

    found = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "pallas_farm": farm.__version__,
    }
    for dist in DISTRIBUTIONS:
        if (v := _version(dist)) is not None:
            found[dist] = v
    found.update(cuda_versions())
    return found


def device_kind() -> str:
    """The first JAX device's kind (e.g. 'NVIDIA H200', 'TPU v6 lite', 'cpu')."""
    import jax

    return jax.devices()[0].device_kind
