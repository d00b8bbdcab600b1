"""Kernels inside `jax.shard_map`, as a sharded model calls them: each shard runs the kernel on its
own block, and the lookup takes the shape of that block.

JAX refuses a pallas_call under shard_map's default `check_vma=True` unless its output shapes say
which mesh axes they vary over (`kernels.lowering.with_varying_axes`), and Mosaic GPU's launch
returns its outputs invariant (`vary_like`). No accelerator here: every kernel of every shipped
space is lowered for its TPU and GPU targets on CPU, under shard_map with the checks on (TPU
tracing under an abstract TPU mesh, as on a host without one). Running them takes interpret mode,
whose interpreter JAX 0.10 cannot run under those checks (its own message says to pass
`check_vma=False`): the numbers are checked that way.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, Mesh
from jax.sharding import PartitionSpec as P

import kernels
from kernels.lowering import Platform
from kernels.protocol import task_default
from kernels.tpu_mesh import TPU_DEVICE
from tests.shipped_spaces import every_space

PLATFORM = {"tpu": "tpu", "gpu-triton": "cuda", "gpu-mosaic": "cuda"}
CASES = [(s.kernel, target, next(t for t in s.targets if t.name == "interpret").shapes[0])
         for s in every_space() for target in PLATFORM if target in kernels.load(s.kernel).TARGETS]


def _mesh(target: str) -> Mesh | AbstractMesh:
    if target == "tpu":   # Mosaic TPU reads the chip's facts while tracing: an abstract TPU device
        return AbstractMesh((1,), ("d",), (AxisType.Auto,), abstract_device=TPU_DEVICE)
    return Mesh(np.array(jax.devices()[:1]), ("d",))


@pytest.mark.parametrize("name, target, shape", CASES, ids=[f"{k}-{t}" for k, t, _ in CASES])
def test_every_kernel_lowers_inside_shard_map_with_its_checks_on(name, target, shape):
    module = kernels.load(name)
    dtype = jnp.dtype("float32" if target == "tpu" else "bfloat16")
    fn = module.build(task_default(module, shape, target, dtype.name), shape, dtype, Platform(target))
    inputs = jax.eval_shape(lambda: module.make_inputs(shape, dtype, jax.random.key(0)))
    sharded = jax.shard_map(fn, mesh=_mesh(target), in_specs=(P("d"), *[P()] * (len(inputs) - 1)),
                            out_specs=P("d"))
    text = jax.jit(sharded).trace(*inputs).lower(lowering_platforms=(PLATFORM[target],)).as_text()
    assert ("tpu_custom_call" if target == "tpu" else "__gpu$xla.gpu.triton" if target == "gpu-triton"
            else "mosaic_gpu") in text


SHARDED_CALL = """
import os; os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from farm.deploy.registry import Registry
registry = Registry()
tuned = registry.tuned("softmax", target="interpret")
x = jax.random.normal(jax.random.key(0), (4, 128), jnp.float32)
sharded = jax.shard_map(tuned, mesh=Mesh(np.array(jax.devices()), ("d",)), in_specs=P("d"), out_specs=P("d"),
                        check_vma=False)
np.testing.assert_allclose(jax.jit(sharded)(x), jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-6)
import warnings
from jax.sharding import NamedSharding
from farm.deploy.runtime import ShardedCallWarning
spread = jax.device_put(x, NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P("d")))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    np.testing.assert_allclose(tuned(spread), jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-6)
    tuned(spread)
said = [str(w.message) for w in caught if issubclass(w.category, ShardedCallWarning)]
assert len(said) == 1 and "sharded over 2 devices" in said[0] and "jax.shard_map" in said[0], said
print([lookup.shape for lookup in registry.lookups()])
"""


def test_a_tuned_kernel_in_shard_map_runs_its_shard_and_looks_up_the_shard_shape(repo):
    """Two devices, four rows: each shard's two rows are looked up as (2, 128) (the shape to tune
    for a sharded model), and the result equals the unsharded reference. Called outside shard_map on
    an array sharded over both, it says once that every device runs the whole call."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SHARDED_CALL], cwd=repo, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[(2, 128), (4, 128)]"   # the eager call: the whole array


def test_a_tuned_kernels_gradient_inside_shard_map_with_its_checks_on():
    """rms norm's weight, shared by every shard: its gradient varies over the mesh where the weight
    does not, and JAX's checks refuse that from a VJP; the tuned kernel sums it over the shards."""
    from farm.deploy.registry import Registry

    tuned = Registry().tuned("rms_norm", target="gpu-triton")
    x, w = jnp.ones((64, 256), jnp.bfloat16), jnp.ones((256,), jnp.bfloat16)
    sharded = jax.shard_map(tuned, mesh=_mesh("gpu-triton"), in_specs=(P("d"), P()), out_specs=P("d"))
    loss = jax.grad(lambda x, w: sharded(x, w).astype(jnp.float32).sum(), (0, 1))
    with pytest.warns(UserWarning):   # nothing tuned: the defaults run
        text = jax.jit(loss).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert "all_reduce" in text or "all-reduce" in text
