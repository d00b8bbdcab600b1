"""A user's own kernel module, checked against the kernel contract (`kernels.protocol`) once, as
its space loads: before Ray starts, every contract function is called on each target's first task
and a mistake is one SpaceError naming the function and what was expected.

Without this, a kernel bug that fails every config alike (a `build` of the wrong signature, a
`make_inputs` returning one array, outputs of another dtype than the reference's) spent a sweep's
whole budget and ended `no_valid_config` with the reason only in trials.jsonl; a `default_config`
that raised stopped the driver with a traceback; a default the kernel refused, or a knob the
default does not set, was tuned and shipped silently. Registered kernels are held to the same
contract by the test suite, so only module paths are checked here (it traces each default once).
"""
from __future__ import annotations

import logging
from typing import Any

from farm.errors import SpaceError
from kernels.protocol import task_default

logger = logging.getLogger(__name__)


def _calling(path: str, name: str, what: str, err: Exception) -> SpaceError:
    return SpaceError(path, "kernel", f"{name} to {what} (it raised {type(err).__name__}: {str(err)[:300]})")


def check_kernel_contract(space: Any, module: Any) -> None:
    """SpaceError unless `module`'s contract functions work together on each target's first task:
    a default (a warning where it lacks a knob of the space) that its own `check_config` and `footprint` take,
    `make_inputs` giving a tuple whose `shape_of` is the task's shape, and `build(default)` returning
    outputs shaped as `reference`'s (traced only, `jax.eval_shape`, in interpret mode)."""
    import jax
    import jax.numpy as jnp

    from farm.measure import validate
    from kernels.lowering import Platform

    path, kernel = space.path, space.kernel
    for target in space.targets:
        if not target.shapes or not target.dtypes:
            continue
        shape, dtype = tuple(target.shapes[0]), target.dtypes[0]
        task = f"{target.name} {'x'.join(map(str, shape))} {dtype}"
        try:
            default = task_default(module, shape, target.name, dtype)
        except Exception as err:  # noqa: BLE001 - any failure of a user's function is a clear error
            raise _calling(path, f"{kernel}.default_config(shape, target)", f"return a config dict for {task}",
                           err) from None
        if not isinstance(default, dict):
            raise SpaceError(path, "kernel", f"{kernel}.default_config to return a dict of knobs for {task}", default)
        unset = [p.name for p in space.params_for(target.name) if p.name not in default]
        if unset:   # an optional knob, or one the kernel never reads: said, not refused
            logger.warning("%s: params.%s: %s.default_config does not set this knob on %s (it sets %s); if the "
                           "kernel does not read it, it is tuned for nothing (a default is a complete config: "
                           "kernels/protocol.py)", path, unset[0], kernel, target.name,
                           ", ".join(sorted(default)) or "none")
        try:
            reason = module.check_config(dict(default), shape, dtype, target.name)
        except Exception as err:  # noqa: BLE001
            raise _calling(path, f"{kernel}.check_config", "return None or a reason string, not raise", err) from None
        if reason is not None and not isinstance(reason, str):
            raise SpaceError(path, "kernel", f"{kernel}.check_config to return None or a reason string", reason)
        if reason is not None:
            raise SpaceError(path, "kernel", f"{kernel}.default_config to give a config its check_config takes for "
                             f"{task} (deployments fall back to it; check_config says: {reason[:300]})")
        try:
            int(module.footprint(dict(default), shape, jnp.dtype(dtype), target.name))
        except Exception as err:  # noqa: BLE001
            raise _calling(path, f"{kernel}.footprint", f"return the default's on-chip bytes for {task}", err) from None
        try:
            inputs = jax.eval_shape(lambda: module.make_inputs(shape, jnp.dtype(dtype), jax.random.key(0)))
        except Exception as err:  # noqa: BLE001
            raise _calling(path, f"{kernel}.make_inputs(shape, dtype, key)", f"return the inputs of {task}",
                           err) from None
        if not isinstance(inputs, tuple):
            raise SpaceError(path, "kernel", f"{kernel}.make_inputs to return a tuple of arrays (the kernel's "
                             f"inputs, in order)", type(inputs).__name__)
        try:
            given = tuple(module.shape_of(*inputs))
        except Exception as err:  # noqa: BLE001
            raise _calling(path, f"{kernel}.shape_of(*inputs)", f"give {shape} for {task}", err) from None
        if given != shape:
            raise SpaceError(path, "kernel", f"{kernel}.shape_of(*make_inputs({shape}, ...)) to be {shape} "
                             f"(deployments look configs up by it)", given)
        try:
            want = jax.eval_shape(module.reference, *inputs)
        except Exception as err:  # noqa: BLE001
            raise _calling(path, f"{kernel}.reference(*inputs)", f"take the inputs of {task}", err) from None
        try:
            built = module.build(dict(default), shape, jnp.dtype(dtype), Platform(target.name, interpret=True))
        except TypeError as err:   # called as the contract says and refused: build's own signature
            raise _calling(path, f"{kernel}.build(config, shape, dtype, platform)",
                           f"return a function of the inputs for its default on {task}", err) from None
        except Exception as err:  # noqa: BLE001 - a default that no longer builds (an upgrade removed an API):
            #                       the sweep measures it as the compile_error it is, and the other configs
            logger.warning("%s: %s.build(default) on %s raised %s: %s; the sweep records it as a compile error",
                           path, kernel, task, type(err).__name__, str(err)[:300])
            continue
        try:
            got = jax.eval_shape(built, *inputs)
        except TypeError as err:
            raise _calling(path, f"{kernel}.build(...)'s function", f"take the inputs of {task}", err) from None
        except Exception as err:  # noqa: BLE001
            logger.warning("%s: %s's default on %s fails as it is traced (%s: %s); the sweep records it as a "
                           "compile error", path, kernel, task, type(err).__name__, str(err)[:300])
            continue
        wrong = validate.mismatch(got, want, dtype)
        if wrong is not None:
            raise SpaceError(path, "kernel", f"{kernel}.build(default) on {task} to return what reference "
                             f"returns: {wrong}")
