"""The targets a kernel builds for and the dtypes of its tasks, importable without JAX (the CLI and the space loader read them)."""
from __future__ import annotations

TARGETS = ("interpret", "tpu", "gpu-triton", "gpu-mosaic")
DTYPES = ("float32", "bfloat16", "float16")  # the dtypes a task names (a search space's, a bundle row's)
# The Mosaic GPU kernels here issue Hopper's WGMMA and TMA (sm_90a): CUDA compute capability 9.x.
MOSAIC_GPU_MAJOR = 9


def gpu_targets_for(compute_capability: str | None) -> tuple[str, ...]:
    """The GPU targets whose kernels run on a GPU of this CUDA compute capability ("9.0"; None:
    unknown), in the order a deployment tries their defaults for a task its bundle lacks: on
    Hopper gpu-mosaic first (on an H200 its defaults ran 16 of 22 users' tasks faster than
    gpu-triton's, in 0.75x the time, geometric mean; BENCHMARKS.md, thirty-sixth session: the two
    more tasks measured were a few long rows, which the row kernels send to gpu-triton), on any
    other GPU gpu-triton alone."""
    major = (compute_capability or "").partition(".")[0]
    if major.isdigit() and int(major) == MOSAIC_GPU_MAJOR:
        return ("gpu-mosaic", "gpu-triton")
    return ("gpu-triton",)
