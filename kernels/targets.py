"""The targets a kernel builds for, importable without JAX (the CLI and the space loader read them)."""
from __future__ import annotations

TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")
