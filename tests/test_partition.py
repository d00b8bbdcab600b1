"""Tuned calls that XLA partitions (`partition=True`, `farm.deploy.partition`): under `jax.jit`
with sharded inputs each device runs the kernel on its shard, looked up at the shard's shape.

Every shipped kernel's PARALLEL_DIMS is checked against its reference (split, run on the pieces,
joined: the same numbers). The partitioned calls run on four CPU devices in interpret mode, in a
child process (XLA takes the device count before JAX starts); no GPU or TPU ran them.
"""
from __future__ import annotations

import subprocess
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
import kernels.protocol
from farm.deploy.partition import PartitionRule
from farm.deploy.registry import Registry
from farm.errors import FarmError

NAMES = sorted(kernels.REGISTRY)


def test_the_rule_names_each_dimension_of_each_input_and_output():
    rule = PartitionRule.of("rms_norm_bwd", kernels.load("rms_norm_bwd"))
    assert rule.sharding_rule() == "rows cols, cols, rows cols -> rows cols, cols"
    assert rule.replicated() == ("cols",)
    matmul = PartitionRule.of("matmul", kernels.load("matmul"))
    assert matmul.sharding_rule() == "m k, k n -> m n" and matmul.replicated() == ()
    assert matmul.reduced() == ("k",)   # split k: the pieces' products are summed
    vmapped = rule.batched((True, False, True))   # under jax.vmap: the batch one more parallel dimension
    assert vmapped.sharding_rule() == ("d_vmap_0 rows cols, cols, d_vmap_0 rows cols -> "
                                       "d_vmap_0 rows cols, d_vmap_0 cols")
    assert vmapped.batched((True, True, True)).parallel == ("vmap.1", "vmap.0", "rows")
    attention = PartitionRule.of("flash_attention", kernels.load("flash_attention"))
    assert attention.replicated() == ("seq", "head_dim")


@pytest.mark.parametrize("name", NAMES)
def test_every_kernels_parallel_dims_split_its_reference(name):
    """Split along each parallel dimension, the reference on the two halves, joined (outputs
    without that dimension summed), gives the reference on the whole."""
    module = kernels.load(name)
    rule = PartitionRule.of(name, module)
    assert rule.parallel, f"{name} declares no PARALLEL_DIMS"
    shape = tuple(4 if d in rule.parallel else 6 for d in module.SHAPE_NAMES)
    inputs = module.make_inputs(shape, jnp.float32, jax.random.key(0))
    whole = jax.tree.leaves(module.reference(*inputs))
    for dim in rule.parallel:
        halves = []
        for half in (slice(0, 2), slice(2, 4)):
            piece = [x[tuple(half if d == dim else slice(None) for d in dims)]
                     for x, dims in zip(inputs, rule.operands)]
            halves.append(jax.tree.leaves(module.reference(*piece)))
        for i, dims in enumerate(rule.results):
            joined = (jnp.concatenate([h[i] for h in halves], axis=dims.index(dim)) if dim in dims
                      else halves[0][i] + halves[1][i])
            np.testing.assert_allclose(joined, whole[i], rtol=2e-5, atol=2e-5, err_msg=f"{name} split over {dim}")


def test_a_kernel_without_parallel_dims_or_with_unknown_ones_is_refused_by_name():
    softmax = kernels.load("softmax")
    bare = types.SimpleNamespace(**{k: getattr(softmax, k) for k in kernels.protocol.REQUIRED},
                                 __name__="tests.bare_softmax")
    with pytest.raises(FarmError, match="declares no PARALLEL_DIMS.*rows, cols.*jax.shard_map"):
        PartitionRule.of("bare", bare)
    bare.PARALLEL_DIMS = ("tokens",)
    with pytest.raises(FarmError, match=r"PARALLEL_DIMS: \['tokens'\] are not task dimensions; expected some of rows"):
        PartitionRule.of("bare", bare)
    with pytest.raises(FarmError, match="partition=True cannot run Pallas's tpu interpreter.*target='interpret'"):
        Registry().tuned("softmax", target="tpu", interpret=True, partition=True)
    with pytest.raises(FarmError, match="partition=True takes the kernel's own inputs"):
        Registry().tuned("softmax", target="interpret", partition=True, shape_of=lambda x: x.shape)


def test_a_lookup_left_unnoted_is_noted_when_asked_again():
    """A partitioned call's global shape is looked up to trace it, unnoted: it warns and records
    nothing until a call that runs asks for it."""
    registry = Registry()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.lookup("softmax", (8, 128), "float32", "interpret", note=False)
        assert registry.lookups() == [] and not caught
        registry.lookup("softmax", (8, 128), "float32", "interpret")
    assert [(lookup.shape, lookup.rule) for lookup in registry.lookups()] == [((8, 128), "default")]
    assert len(caught) == 1 and "(8, 128)" in str(caught[0].message)


def test_on_one_device_a_partitioned_call_runs_whole_and_is_noted():
    """A task is noted once its call is lowered whole (not under jax.grad alone, where XLA drops
    the forward call whose value nobody reads: there only the backward kernel runs)."""
    registry = Registry()
    norm = registry.tuned("rms_norm", target="interpret", partition=True)
    module = kernels.load("rms_norm")
    x, w = module.make_inputs((8, 128), jnp.float32, jax.random.key(0))
    with pytest.warns(UserWarning, match="rms_norm"):   # nothing tuned: the default runs, and says so
        value, got = jax.jit(jax.value_and_grad(lambda x, w: norm(x, w).sum(), argnums=(0, 1)))(x, w)
    want = jax.grad(lambda x, w: module.reference(x, w).sum(), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(value, module.reference(x, w).sum(), rtol=1e-4)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
    assert sorted((lookup.kernel, lookup.shape) for lookup in registry.lookups()) == [
        ("rms_norm", (8, 128)), ("rms_norm_bwd", (8, 128))]


PARTITIONED = r"""
import os; os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import warnings; warnings.simplefilter("ignore")
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import kernels
from farm.deploy.registry import Registry
from farm.errors import FarmError
from farm.measure import validate

mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))
put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
CASES = [  # kernel, shape, input specs, the shard's task, whether XLA must gather an input[, dtype]
    ("softmax", (8, 128), [P("x")], (4, 128), False),
    ("rms_norm_bwd", (16, 256), [P(("x", "y")), P(), P(("x", "y"))], (4, 256), False, jnp.bfloat16),
    ("rms_norm", (8, 128), [P(("x", "y")), P()], (2, 128), False),
    ("rms_norm_bwd", (8, 128), [P("x"), P(), P("x")], (4, 128), False),
    ("cross_entropy", (8, 256), [P("y"), P("y")], (4, 256), False),
    ("matmul", (64, 64, 32), [P("x"), P(None, "y")], (32, 32, 32), False),
    ("matmul", (64, 96, 128), [P("y", "x"), P("x")], (32, 96, 64), False, jnp.bfloat16),  # k split: summed
    ("bmm", (4, 32, 32, 16), [P("x", "y"), P("x")], (2, 16, 32, 16), False),
    ("flash_attention_causal", (2, 2, 64, 32), [P("x", "y")] * 3, (1, 1, 64, 32), False),
    ("swiglu", (2, 8, 128), [P("x", None, "y")] * 2, (1, 8, 64), False),
    ("matmul_layernorm", (64, 64, 32), [P("x"), P(None, "y"), P(), P()], (32, 64, 32), True),  # n stays whole
    ("softmax", (6, 128), [P(("x", "y"))], (6, 128), True),  # 6 rows over 4 devices: gathered, not padded
]
for name, shape, specs, shard, gathers, *dtype in CASES:
    registry = Registry()
    module = kernels.load(name)
    dtype = jnp.dtype(dtype[0] if dtype else jnp.float32)
    inputs = module.make_inputs(shape, dtype, jax.random.key(0))
    tuned = registry.tuned(name, target="interpret", partition=True)
    # the inputs split as a model's jitted code splits them (XLA pads a split it cannot divide)
    call = jax.jit(lambda *xs: tuned(*(jax.lax.with_sharding_constraint(x, NamedSharding(mesh, s))
                                       for x, s in zip(xs, specs))))
    error = validate.relative_error(call(*inputs), module.reference(*validate.upcast(inputs)))
    assert error <= validate.tolerance(dtype.name), (name, error)   # as a sweep validates a trial
    hlo = call.lower(*inputs).compile().as_text()
    print(name, [l.shape for l in registry.lookups()], "all-gather" in hlo, "all-reduce" in hlo)
    assert [l.shape for l in registry.lookups()] == [shard], (name, registry.lookups())
    assert ("all-gather" in hlo) == gathers, name

# gradients: rms norm's backward kernel partitioned too, its weight gradient summed over the row shards
registry = Registry()
norm = registry.tuned("rms_norm", target="interpret", partition=True)
module = kernels.load("rms_norm")
x, w = module.make_inputs((8, 128), jnp.float32, jax.random.key(1))
loss = lambda f: (lambda x, w: (f(x, w) ** 2).sum())
got = jax.jit(jax.grad(loss(norm), argnums=(0, 1)))(put(x, P("x")), w)
want = jax.grad(loss(module.reference), argnums=(0, 1))(x, w)
for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
print("grad", sorted({(l.kernel, l.shape) for l in registry.lookups()}))
assert sorted({(l.kernel, l.shape) for l in registry.lookups()}) == [("rms_norm", (4, 128)), ("rms_norm_bwd", (4, 128))]

# inside shard_map over the whole mesh, and eagerly on a sharded array
registry = Registry()
softmax = registry.tuned("softmax", target="interpret", partition=True)
x = jax.random.normal(jax.random.key(2), (16, 128))
inside = jax.jit(jax.shard_map(softmax, mesh=mesh, in_specs=P(("x", "y")), out_specs=P(("x", "y")), check_vma=False))
np.testing.assert_allclose(inside(x), jax.nn.softmax(x), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(softmax(put(x, P("y"))), jax.nn.softmax(x), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(softmax(x[:5]), jax.nn.softmax(x[:5]), rtol=1e-5, atol=1e-6)  # on one of the four
print("shard_map, eager, one device", [l.shape for l in registry.lookups()])
assert [l.shape for l in registry.lookups()] == [(4, 128), (8, 128), (5, 128)]

# jax.vmap: the batch one more parallel dimension, merged into one the kernel splits where every
# batched input and every output has it (one call a device on its batch x rows rows), else mapped
VMAPPED = [  # kernel, shape, batch, in_axes, input specs (the batch first), the shard's task
    ("softmax", (8, 128), 4, 0, [P("x", "y")], (8, 128)),                  # 2 elements x 4 rows
    ("rms_norm", (8, 128), 4, (0, None), [P("x", "y"), P()], (8, 128)),    # the weight shared
    ("rms_norm", (8, 128), 4, (0, 0), [P("x", "y"), P("x")], (4, 128)),    # a weight each: mapped
    ("matmul", (16, 32, 16), 2, (None, 0), [P(), P("x", None, "y")], (16, 16, 16)),  # merged into n
    ("matmul", (16, 32, 16), 2, (0, 0), [P("x"), P("x")], (16, 32, 16)),    # no dimension fits: mapped
    ("flash_attention", (2, 2, 64, 32), 2, (0, 0, 0), [P("x", "y")] * 3, (1, 2, 64, 32)),
    ("softmax", (8, 128), 3, 0, [P(None, ("x", "y"))], (6, 128)),          # 3 elements, rows over 4
]
for name, shape, batch, in_axes, specs, shard in VMAPPED:
    registry = Registry()
    module = kernels.load(name)
    tuned = registry.tuned(name, target="interpret", partition=True)
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,)
    each = [module.make_inputs(shape, jnp.float32, key) for key in jax.random.split(jax.random.key(3), batch)]
    inputs = [jnp.stack([e[i] for e in each]) if a is not None else each[0][i] for i, a in enumerate(axes)]
    call = jax.jit(lambda *xs: jax.vmap(tuned, in_axes=in_axes)(*(jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, s)) for x, s in zip(xs, specs))))
    error = validate.relative_error(call(*inputs), jax.vmap(module.reference, in_axes=in_axes)(*inputs))
    assert error <= validate.tolerance("float32"), (name, error)
    hlo = call.lower(*inputs).compile().as_text()
    print("vmap", name, axes, [l.shape for l in registry.lookups()], "all-gather" in hlo)
    assert [l.shape for l in registry.lookups()] == [shard], (name, axes, registry.lookups())
    assert "all-gather" not in hlo, name

# gradients through a vmap and a vmap of gradients; vmap in vmap; the batch on another axis, eagerly
registry = Registry()
norm = registry.tuned("rms_norm", target="interpret", partition=True)
each = kernels.load("rms_norm").make_inputs((16, 128), jnp.float32, jax.random.key(4))
xs, w = jnp.stack([each[0] * s for s in (1, 2, -1, 0.5)]), each[1]
for how, transform in [("grad of vmap", lambda f: jax.grad(loss(jax.vmap(f, in_axes=(0, None))), argnums=(0, 1))),
                       ("vmap of grad", lambda f: jax.vmap(jax.grad(loss(f), argnums=(0, 1)), in_axes=(0, None)))]:
    got = jax.jit(transform(norm))(put(xs, P("x", "y")), w)
    for g, r in zip(got, transform(kernels.load("rms_norm").reference)(xs, w)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
print("vmap grads", sorted({(l.kernel, l.shape) for l in registry.lookups()}))
assert sorted({(l.kernel, l.shape) for l in registry.lookups()}) == [("rms_norm", (16, 128)),
                                                                      ("rms_norm_bwd", (8, 128))]
registry = Registry()
softmax = registry.tuned("softmax", target="interpret", partition=True)
z = jax.random.normal(jax.random.key(5), (2, 3, 8, 128))
np.testing.assert_allclose(jax.jit(jax.vmap(jax.vmap(softmax)))(put(z, P("x", None, "y"))), jax.nn.softmax(z),
                           rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(jax.vmap(softmax, in_axes=1, out_axes=1)(put(z[0, :2], P(None, ("x", "y")))),
                           jax.nn.softmax(z[0, :2]), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(jax.vmap(softmax)(z[0]), jax.nn.softmax(z[0]), rtol=1e-5, atol=1e-6)  # one device
print("vmap in vmap, axis 1, one device", [l.shape for l in registry.lookups()])
assert [l.shape for l in registry.lookups()] == [(12, 128), (4, 128), (24, 128)]
print("ok")
"""


def test_partitioned_calls_run_each_shard_at_its_own_shape_on_four_devices(repo):
    """On a 2 x 2 mesh of CPU devices: each kernel's output equals its reference, the registry
    looked up the shard's task only (never the global shape, which no device runs), and XLA
    gathers nothing where the inputs are split along parallel dimensions that divide evenly.
    Gradients go through the partitioned backward kernel; shard_map and eager calls work; under
    vmap the batch splits too, merged into a parallel dimension or mapped."""
    done = subprocess.run([sys.executable, "-c", PARTITIONED], cwd=repo, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "ok"
