"""The software and device a result was measured with."""
from __future__ import annotations

import ctypes
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


def _c_version(libraries: tuple[str, ...], function: str, by_reference: bool) -> str | None:
    """A CUDA library's version from its public C API, or None where the library is not found."""
    for name in libraries:
        try:
            lib = ctypes.CDLL(name)
            if by_reference:
                value = ctypes.c_int()
                if getattr(lib, function)(ctypes.byref(value)) != 0:
                    continue
                return str(value.value)
            getattr(lib, function).restype = ctypes.c_size_t
            return str(getattr(lib, function)())
        except (OSError, AttributeError):
            continue
    return None


def cuda_versions() -> dict[str, str]:
    """CUDA runtime, cuDNN and NVIDIA driver versions where obtainable (no JAX backend is started).

    The runtime and cuDNN versions come from the libraries' own C APIs (cudaRuntimeGetVersion,
    cudnnGetVersion); the pip-installed NVIDIA distributions are recorded by `versions()`.
    """
    found: dict[str, str] = {}
    runtime = _c_version(("libcudart.so", "libcudart.so.13", "libcudart.so.12"), "cudaRuntimeGetVersion", True)
    cudnn = _c_version(("libcudnn.so", "libcudnn.so.9"), "cudnnGetVersion", False)
    for name, value in (("cuda_runtime", runtime), ("cudnn", cudnn)):
        if value is not None:
            found[name] = value
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
