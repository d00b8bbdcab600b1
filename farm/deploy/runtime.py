"""Deployment-side lookups: which config to run a kernel with, from a verified bundle.

The public face of `farm.deploy`: the registry (`farm.deploy.registry`), tuned kernels
(`farm.deploy.tuned`) and record mode (`farm.deploy.recording`) are re-exported here.

    from farm.deploy import runtime
    registry = runtime.Registry.load("/srv/kernels", ["/etc/farm/trust"])   # verified, or an error
    choice = registry.lookup("matmul", (4096, 4096, 4096), "bfloat16", "tpu", device_kind="TPU v6 lite")
    choice.config, choice.rule                # e.g. {'block_m': 256, ...}, 'nearest'
    matmul = runtime.tuned("matmul", registry=registry)   # target from jax.devices()[0]
    c = jax.jit(lambda a, b: matmul(a, b))(a, b)           # built once per input shapes and dtypes
    norm = runtime.tuned("rms_norm", registry=registry)
    jax.grad(loss)(x)                         # through the tuned rms_norm_bwd (the kernel's BACKWARD)
    registry.lookups()                        # every task asked for: rule and distance
    with runtime.record("misses.jsonl"):      # or FARM_RECORD_MISSES=misses.jsonl
        model(batch)                          # tasks without an exact row -> `farm sweep --tasks`

`Registry.load` takes a bundle folder, a run folder, a bundle archive (.tar.gz) or a deployment
folder made by `farm pull` (its `current` version), and opens it with
`farm.bundle.locate.open_bundle`, which verifies it before a row is read.

Lookup rules, in order (`Choice.rule` says which one chose the config):
  1. "exact": a row for this kernel, shape, dtype, target and device kind (with
     device_kind=None, any device kind: the newest such row) whose config is valid.
  2. "nearest": among rows of the same kernel, dtype, target (and device kind when given) and
     rank, the tuned shape with the smallest log-distance sum_i |log2(tuned_i) - log2(asked_i)|,
     at most NEAREST_MAX_DISTANCE, whose config is valid for the asked shape; ties go to the
     smaller tuned shape, then the newest row. Farther, a config tuned for another regime (3
     rows, asked 2048) is no guide: the default, chosen for the asked shape, runs.
  3. "default": the kernel's `default_config(shape, target)`.
A config is valid for a task when the kernel's own `check_config` accepts it (the legality of a
config is stated once, with the kernel), on a GPU target when its footprint fits the shared memory
of this process's GPU (`farm.measure.capacity`; or `onchip_bytes=` per target: a row tuned on an
H200 is refused on a GPU with 99 KiB a block, and the default is chosen for that GPU), on the TPU
target when it fits the chip's VMEM (a row tuned on a v6e's 128 MiB is refused on a v5p's 64), and, when
search spaces are given (`spaces=`, loaded `farm.search.spaces.SearchSpace` objects), the
kernel's space admits it too. Defaults are chosen for the task's dtype (`kernels.protocol.task_default`).
Rows with status `no_valid_config` are never chosen.

Misses: each distinct task a registry resolves is kept in `lookups()` (kernel, shape, dtype,
target, rule, distance). A "default", or a "nearest" farther than NEAREST_WARN_DISTANCE, warns
once per task (TuningMissWarning), up to WARN_LIMIT tasks a registry, then once more to say so.
While `record(path)` is active, or FARM_RECORD_MISSES names a file, every task without an exact
row is appended to that file once (farm.deploy.misses).

Targets: `tuned(kernel)` without a target follows `jax.devices()[0]`: "interpret" (Pallas
interpret mode) on CPU, "tpu" on TPU, and on a GPU, per task, of the GPU targets that run there
(gpu-mosaic on Hopper, compute capability 9.x, only: `kernels.targets.gpu_targets_for`), the one
with an exact row and the faster median; without one, whichever ran faster at the nearest shape
the bundle timed both at (within NEAREST_WARN_DISTANCE; on the device kind asked for, when
given); else the first whose default config is valid for the task, in the GPU's order (Hopper:
gpu-mosaic, whose defaults ran faster on 16 of 22 users' tasks on an H200) refined by the
kernel (`default_gpu_targets`: the row kernels put gpu-triton first for a few long rows).

Sharded inputs: `tuned(kernel, partition=True)` lets XLA split a call over the kernel's
PARALLEL_DIMS, each device running the kernel looked up at its shard's shape (under `jax.vmap`
too: the batch splits as one more parallel dimension; `farm.deploy.partition`); without it,
call tuned kernels inside `jax.shard_map`.

Gradients: a kernel whose module declares BACKWARD (kernels.protocol.Backward) is wrapped in a
`jax.custom_vjp` that runs its backward kernel, itself looked up and tuned; any other kernel
raises NoBackwardKernel when differentiated.

Software fingerprints: each row records the versions it was tuned with (`software`). The
components in FINGERPRINT_KEYS that both the row and this process have are compared (plus a
row with no fingerprint at all); on a difference the policy decides: "warn" (default: load and
warn), "refuse" (raise SoftwareMismatch) or "accept" (load silently).

Lookups are thread-safe: cached answers are read without a lock (a dict read), misses are
resolved and cached under a lock.
"""
from __future__ import annotations

from farm.deploy.recording import RECORD_ENV, Recording, record, recording_path
from farm.deploy.registry import (
    CACHE_LIMIT,
    DEFAULT,
    EXACT,
    FINGERPRINT_KEYS,
    GPU_TARGETS,
    HISTORY_LIMIT,
    NEAREST,
    NEAREST_MAX_DISTANCE,
    NEAREST_WARN_DISTANCE,
    POLICIES,
    WARN_LIMIT,
    Choice,
    Lookup,
    NoBackwardKernel,
    Registry,
    SoftwareMismatch,
    SoftwareMismatchWarning,
    TuningMissWarning,
    fingerprint_diff,
    log_distance,
)
from farm.deploy.tuned import ShardedCallWarning, TunedKernel, set_default, tuned

__all__ = ["CACHE_LIMIT", "DEFAULT", "EXACT", "FINGERPRINT_KEYS", "GPU_TARGETS", "HISTORY_LIMIT", "NEAREST",
           "NEAREST_MAX_DISTANCE", "NEAREST_WARN_DISTANCE", "POLICIES", "RECORD_ENV", "WARN_LIMIT", "Choice",
           "Lookup", "NoBackwardKernel", "Recording", "Registry", "ShardedCallWarning", "SoftwareMismatch",
           "SoftwareMismatchWarning",
           "TunedKernel", "TuningMissWarning", "fingerprint_diff", "log_distance", "record", "recording_path",
           "set_default", "tuned"]
