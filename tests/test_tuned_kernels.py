"""runtime.tuned from user code: every kernel under jax.jit, the target from the device, gradients
through backward kernels, misses warned about, listed and recorded, a deployment without the
tuning install. Real JAX and Pallas (interpret mode on the CPU), real signed bundles."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from farm.deploy import misses, runtime
from farm.measure import validate
from farm.search.spaces import load_space
from tests import bundles as B

REPO = Path(__file__).resolve().parent.parent


def _interpret_task(name: str) -> tuple[tuple[int, ...], str]:
    """The first interpret shape and dtype of the kernel's shipped search space."""
    space = load_space(REPO / "search_spaces" / f"{name}.yaml")
    (target,) = [t for t in space.targets if t.name == "interpret"]
    return tuple(target.shapes[0]), target.dtypes[0]


@pytest.fixture()
def empty() -> runtime.Registry:
    return runtime.Registry(source="empty")


@pytest.mark.parametrize("name", sorted(kernels.REGISTRY))
def test_every_kernel_runs_tuned_under_jit(name, empty):
    module = kernels.load(name)
    shape, dtype = _interpret_task(name)
    inputs = module.make_inputs(shape, dtype, jax.random.key(0))
    fn = runtime.tuned(name, registry=empty)  # no target: the CPU's, interpret
    with pytest.warns(runtime.TuningMissWarning, match=rf"{name} .*rule 'default'"):
        out = jax.jit(fn)(*inputs)  # built while tracing: the inputs are tracers
    error = validate.relative_error(out, module.reference(*validate.upcast(inputs)))
    assert error <= validate.tolerance(dtype, module), f"{name}: relative error {error}"
    (lookup,) = fn.choices()
    assert (lookup.kernel, lookup.shape, lookup.dtype, lookup.target, lookup.rule) == \
        (name, shape, dtype, "interpret", runtime.DEFAULT)
    np.testing.assert_array_equal(jax.tree.leaves(fn(*inputs))[0], jax.tree.leaves(out)[0])  # eager: the same
    assert len(fn.choices()) == 1  # one build per shapes and dtypes, traced or not


@pytest.fixture()
def bundle(tmp_path):
    """A signed bundle with softmax, rms_norm and rms_norm_bwd rows: (folder, public key)."""
    private, public = B.keypair(tmp_path / "keys", "ci")
    rows = [*B.SOFTMAX_ROWS,
            B.row("rms_norm", (32, 512), {"block_rows": 16, "strategy": "one_pass", "block_cols": 128}),
            B.row("rms_norm_bwd", (32, 512), {"block_rows": 8, "strategy": "fori_loop", "block_cols": 128}),
            B.row("softmax", (64, 256), {"block_rows": 8}, target="gpu-triton", median_s=3e-5),
            B.row("softmax", (64, 256), {"block_rows": 8}, target="gpu-mosaic", median_s=2e-5),
            B.row("softmax", (128, 512), {"block_rows": 8}, target="gpu-triton", median_s=1e-5),
            B.row("softmax", (128, 512), {"block_rows": 8}, target="gpu-mosaic", median_s=2e-5)]
    return B.write(tmp_path / "bundle", rows, private), public


@pytest.fixture()
def registry(bundle) -> runtime.Registry:
    return runtime.Registry.load(*bundle, spaces=())


def test_target_follows_the_device_and_an_explicit_target_still_works(registry):
    from kernels import softmax

    x = softmax.make_inputs((64, 256), jnp.float32, jax.random.key(0))[0]
    auto, explicit = runtime.tuned("softmax", registry=registry), runtime.tuned(
        "softmax", target="interpret", registry=registry)
    np.testing.assert_allclose(jax.jit(auto)(x), explicit(x), rtol=1e-6)
    assert auto.choices() == explicit.choices()
    assert auto.choices()[0].target == "interpret" and auto.choice(x).rule == runtime.EXACT
    assert auto.choice(x).config["block_rows"] == 16
    tpu = runtime.tuned("softmax", target="tpu", interpret=True, registry=registry)  # TPU interpret mode
    with pytest.warns(runtime.TuningMissWarning, match=r"softmax \(64, 256\) float32 on tpu"):
        np.testing.assert_allclose(tpu(x), softmax.reference(x), rtol=1e-5, atol=1e-6)
    assert tpu.choices()[0].target == "tpu"


def test_gpu_target_is_the_faster_tuned_one_else_triton(registry):
    assert registry.gpu_target("softmax", (64, 256), "float32") == "gpu-mosaic"
    assert registry.gpu_target("softmax", (128, 512), jnp.float32) == "gpu-triton"
    assert registry.gpu_target("softmax", (64, 256), "float32", targets=("gpu-triton",)) == "gpu-triton"
    # No row at the task: the target faster at the nearest shape timed on both
    assert registry.gpu_target("softmax", (96, 256), "float32") == "gpu-mosaic"  # nearest: 64 x 256
    assert registry.gpu_target("softmax", (128, 1000), "float32") == "gpu-triton"  # nearest: 128 x 512
    assert registry.gpu_target("softmax", (96, 256), "float32", device_kind="cpu") == "gpu-mosaic"
    # ... on the device kind asked for, and nothing compared: the first target
    assert registry.gpu_target("softmax", (96, 256), "float32", device_kind="NVIDIA H200") == "gpu-triton"
    assert registry.gpu_target("softmax", (96, 256), "bfloat16") == "gpu-triton"
    assert registry.gpu_target("rms_norm", (32, 512), "float32") == "gpu-triton"
    assert registry.gpu_target("softmax", (96, 256), "float32", targets=("gpu-mosaic", "gpu-triton")) == "gpu-mosaic"


def test_gpu_target_compares_targets_on_one_device_kind(tmp_path):
    # Triton timed on one GPU, Mosaic GPU on another: not a comparison; each GPU's own rows are
    private, public = B.keypair(tmp_path / "keys", "ci")
    rows = [B.row("softmax", (64, 256), {"block_rows": 8}, target="gpu-triton", device_kind="A", median_s=1e-5),
            B.row("softmax", (64, 256), {"block_rows": 8}, target="gpu-mosaic", device_kind="B", median_s=2e-6),
            B.row("softmax", (64, 1024), {"block_rows": 8}, target="gpu-triton", device_kind="B", median_s=3e-5),
            B.row("softmax", (64, 1024), {"block_rows": 8}, target="gpu-mosaic", device_kind="B", median_s=4e-5)]
    registry = runtime.Registry.load(B.write(tmp_path / "bundle", rows, private), public, spaces=())
    targets = ("gpu-mosaic", "gpu-triton")
    assert registry.gpu_target("softmax", (64, 600), "float32", targets=targets) == "gpu-triton"
    assert registry.gpu_target("softmax", (64, 600), "float32", device_kind="B", targets=targets) == "gpu-triton"
    assert registry.gpu_target("softmax", (64, 600), "float32", device_kind="A", targets=targets) == "gpu-mosaic"
    # farther than NEAREST_WARN_DISTANCE from any shape timed on both (64 x 1024 is 1.77 away):
    # the order given, skipping a target whose default the task refuses (Mosaic GPU's staged
    # rows need 128 bytes a row)
    assert registry.gpu_target("softmax", (64, 300), "float32", targets=targets) == "gpu-mosaic"
    assert registry.gpu_target("softmax", (64, 100), "float32", targets=targets) == "gpu-triton"


def test_gpu_target_skips_a_target_faster_nearby_that_takes_no_config_here(tmp_path):
    # Mosaic GPU ran rms norm at 32 x 512 faster; at 32 x 500 (rows of 2000 bytes, no whole
    # 128-byte units) it takes no config, tuned or default: the deployment runs Triton's nearest
    # row, not a config Mosaic GPU's build refuses.
    from kernels import rms_norm

    private, public = B.keypair(tmp_path / "keys", "ci")
    rows = [B.row("rms_norm", (32, 512), rms_norm.default_config((32, 512), target), target=target, median_s=median)
            for target, median in (("gpu-triton", 3e-5), ("gpu-mosaic", 2e-5))]
    registry = runtime.Registry.load(B.write(tmp_path / "bundle", rows, private), public, spaces=())
    targets = ("gpu-mosaic", "gpu-triton")
    assert registry.gpu_target("rms_norm", (32, 512), "float32", targets=targets) == "gpu-mosaic"
    assert registry.gpu_target("rms_norm", (32, 448), "float32", targets=targets) == "gpu-mosaic"  # nearest
    assert registry.gpu_target("rms_norm", (32, 500), "float32", targets=targets) == "gpu-triton"
    choice = registry.lookup("rms_norm", (32, 500), "float32", "gpu-triton")
    assert choice.rule == runtime.NEAREST
    assert rms_norm.check_config(dict(choice.config), (32, 500), "float32", "gpu-triton") is None


@pytest.mark.parametrize("capability,expected", [("9.0", ("gpu-mosaic", "gpu-triton")), ("8.0", ("gpu-triton",)),
                                                 ("8.9", ("gpu-triton",)), ("10.0", ("gpu-triton",)),
                                                 (None, ("gpu-triton",)), ("", ("gpu-triton",))])
def test_gpu_mosaic_runs_on_hopper_only_and_is_tried_first_there(capability, expected):
    from kernels.targets import gpu_targets_for

    assert gpu_targets_for(capability) == expected


def test_row_kernels_put_triton_first_for_a_few_long_rows():
    # A decode step's sampling softmax: Triton's default spreads the row over programs
    # (split_cols), 3.4 us against Mosaic GPU's 7.0 at (1, 151936) on the H200
    from kernels import cross_entropy, rms_norm, softmax

    hopper = ("gpu-mosaic", "gpu-triton")
    assert softmax.default_gpu_targets((1, 151936), "bfloat16", hopper) == ("gpu-triton", "gpu-mosaic")
    assert cross_entropy.default_gpu_targets((7, 151936), "bfloat16", hopper) == ("gpu-triton", "gpu-mosaic")
    assert softmax.default_gpu_targets((4096, 50257), "bfloat16", hopper) == hopper
    assert rms_norm.default_gpu_targets((4096, 5120), "bfloat16", hopper) == hopper
    assert softmax.default_gpu_targets((1, 151936), "bfloat16", ("gpu-triton",)) == ("gpu-triton",)
    assert softmax.default_gpu_targets((1, 151936), "bfloat16", ("gpu-mosaic",)) == ("gpu-mosaic",)


def _loss(fn):
    return lambda x, w: jnp.sum(jnp.sin(fn(x, w)) * jnp.arange(x.shape[-1]))


def test_grad_through_tuned_rms_norm_uses_the_tuned_backward_kernel(registry):
    from kernels import rms_norm

    x, w = rms_norm.make_inputs((32, 512), jnp.float32, jax.random.key(1))
    fn = runtime.tuned("rms_norm", registry=registry)
    expected = jax.grad(_loss(rms_norm.reference), argnums=(0, 1))(x, w)
    for grads in (jax.grad(_loss(fn), argnums=(0, 1))(x, w), jax.jit(jax.grad(_loss(fn), argnums=(0, 1)))(x, w)):
        for got, want in zip(grads, expected):
            assert validate.relative_error(got, want) <= validate.tolerance("float32")
    value, grads = jax.value_and_grad(_loss(fn))(x, w)
    assert value == pytest.approx(float(_loss(rms_norm.reference)(x, w)), rel=1e-5)
    used = {(l.kernel, l.rule) for l in registry.lookups()}
    assert {("rms_norm", runtime.EXACT), ("rms_norm_bwd", runtime.EXACT)} <= used  # the backward is tuned too
    assert fn._backward.choices()[0].tuned_shape == (32, 512)


def test_grad_through_rms_norm_on_mosaic_gpu_uses_its_tuned_mosaic_backward(tmp_path):
    # A bundle of Mosaic GPU rows: the forward's rows staged in shared memory, the backward's rows
    # taken in turn through slots (kernels/rms_norm_bwd_mgpu.py); run in Pallas's GPU interpreter.
    from kernels import rms_norm

    private, public = B.keypair(tmp_path / "keys", "ci")
    backward = {"block_rows": 1, "strategy": "smem_rows", "block_cols": 512, "rows_per_program": 8, "slots": 3,
                "dweight_in": "registers", "approx_math": 0}
    rows = [B.row("rms_norm", (32, 512), {"block_rows": 1, "strategy": "smem_row", "block_cols": 1024},
                  target="gpu-mosaic"),
            B.row("rms_norm_bwd", (32, 512), backward, target="gpu-mosaic")]
    registry = runtime.Registry.load(B.write(tmp_path / "bundle", rows, private), public, spaces=())
    x, w = rms_norm.make_inputs((32, 512), jnp.float32, jax.random.key(1))
    fn = runtime.tuned("rms_norm", target="gpu-mosaic", interpret=True, registry=registry)
    expected = jax.grad(_loss(rms_norm.reference), argnums=(0, 1))(x, w)
    for got, want in zip(jax.grad(_loss(fn), argnums=(0, 1))(x, w), expected):
        assert validate.relative_error(got, want) <= validate.tolerance("float32")
    (choice,) = fn._backward.choices()
    assert (choice.kernel, choice.target, choice.rule) == ("rms_norm_bwd", "gpu-mosaic", runtime.EXACT)
    assert fn._backward.choice(x, w, x).config == backward


def test_grad_through_half_precision_rms_norm_keeps_the_input_dtypes(empty):
    from kernels import rms_norm

    x, w = rms_norm.make_inputs((16, 256), jnp.bfloat16, jax.random.key(2))
    fn = runtime.tuned("rms_norm", registry=empty)
    with pytest.warns(runtime.TuningMissWarning):
        dx, dw = jax.grad(lambda x, w: jnp.sum(fn(x, w).astype(jnp.float32)), argnums=(0, 1))(x, w)
    assert dx.dtype == dw.dtype == jnp.bfloat16
    want = jax.grad(lambda x, w: jnp.sum(rms_norm.reference(x, w).astype(jnp.float32)), argnums=(0, 1))(x, w)
    assert validate.relative_error(dx, want[0]) <= validate.tolerance("bfloat16")
    assert validate.relative_error(dw, want[1]) <= validate.tolerance("bfloat16")


def test_a_kernel_without_a_backward_kernel_refuses_gradients_clearly(registry):
    from kernels import cross_entropy, softmax

    x = softmax.make_inputs((64, 256), jnp.float32, jax.random.key(0))[0]
    fn = runtime.tuned("softmax", registry=registry)
    message = r"kernel 'softmax' has no backward kernel"
    with pytest.raises(runtime.NoBackwardKernel, match=message):
        jax.grad(lambda x: jnp.sum(fn(x) ** 2))(x)
    with pytest.raises(runtime.NoBackwardKernel, match=message):
        jax.jit(jax.grad(lambda x: jnp.sum(fn(x) ** 2)))(x)
    with pytest.raises(runtime.NoBackwardKernel, match=message):
        jax.jvp(fn, (x,), (x,))
    logits, labels = cross_entropy.make_inputs((32, 512), jnp.float32, jax.random.key(0))
    ce = runtime.tuned("cross_entropy", registry=registry)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", runtime.TuningMissWarning)
        with pytest.raises(runtime.NoBackwardKernel, match="kernel 'cross_entropy' has no backward kernel"):
            jax.grad(lambda z: jnp.sum(ce(z, labels)))(logits)
    np.testing.assert_allclose(fn(x), softmax.reference(x), rtol=1e-5, atol=1e-6)  # still runs undifferentiated


def test_backward_hook_is_declared_by_the_kernel():
    from kernels import protocol

    spec = protocol.hook(kernels.load("rms_norm"), "BACKWARD")
    assert spec.kernel == "rms_norm_bwd" and spec.sources() == (("input", 0), ("input", 1), ("cotangent", 0))
    assert protocol.hook(kernels.load("softmax"), "BACKWARD") is None
    with pytest.raises(ValueError, match="expected input<i>, output<i> or cotangent<i>"):
        protocol.Backward("k", inputs=("dy",), grads=(0,))


def _miss_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, runtime.TuningMissWarning)]


def test_a_config_tuned_for_another_regime_is_not_used(registry):
    """Beyond NEAREST_MAX_DISTANCE the kernel's default, chosen for the asked shape, runs: a
    row-block size tuned for a few rows ran 2048 rows 8x slower than the default (interpret mode)."""
    assert runtime.NEAREST_MAX_DISTANCE == 3.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        within = registry.lookup("softmax", (128, 4096), "float32", "interpret")   # 3.0 from (128, 512)
        beyond = registry.lookup("softmax", (2048, 2048), "float32", "interpret")  # 6.0 from (128, 512)
    assert within.rule == runtime.NEAREST and beyond.rule == runtime.DEFAULT
    assert dict(beyond.config) == kernels.load("softmax").default_config((2048, 2048), "interpret")
    shown = _miss_warnings(caught)
    assert "rule 'default': no config tuned for softmax in float32 on interpret at a shape within log2 " \
           "distance 3.0 is valid for it" in shown[1]


def test_miss_warnings_stop_after_the_limit(registry):
    """A model of many distinct shapes gets WARN_LIMIT warnings and one saying no more follow."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in range(1, runtime.WARN_LIMIT + 10):
            registry.lookup("softmax", (rows, 128), "float16", "interpret")
    shown = _miss_warnings(caught)
    assert len(shown) == runtime.WARN_LIMIT + 1 and "no more are warned" in shown[-1]
    assert len(registry.misses()) == runtime.WARN_LIMIT + 9


def test_misses_warn_once_per_task_and_are_listed(registry):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert registry.lookup("softmax", (8, 128), "float16", "interpret").rule == runtime.DEFAULT
            near = registry.lookup("softmax", (128, 1024), "float32", "interpret")  # distance 1.0: close enough
            far = registry.lookup("softmax", (128, 4096), "float32", "interpret")  # distance 3.0
            registry.lookup("softmax", (64, 256), "float32", "interpret")
        registry.lookup("softmax", (8, 128), "float16", "interpret", device_kind="cpu")  # same task
    assert near.rule == far.rule == runtime.NEAREST and far.distance == pytest.approx(3.0)
    shown = _miss_warnings(caught)
    assert len(shown) == 2 and all(w.filename == __file__ for w in caught)
    assert "softmax (8, 128) float16 on interpret" in shown[0] and "rule 'default'" in shown[0]
    assert "softmax (128, 4096) float32 on interpret" in shown[1] and "rule 'nearest'" in shown[1]
    assert "distance 3.00 > 1.0" in shown[1] and "(128, 512)" in shown[1]
    assert runtime.NEAREST_WARN_DISTANCE == 1.0
    listed = [(l.kernel, l.shape, l.dtype, l.target, l.rule, l.distance) for l in registry.lookups()]
    assert listed == [("softmax", (8, 128), "float16", "interpret", "default", None),
                      ("softmax", (128, 1024), "float32", "interpret", "nearest", 1.0),
                      ("softmax", (128, 4096), "float32", "interpret", "nearest", 3.0),
                      ("softmax", (64, 256), "float32", "interpret", "exact", 0.0),
                      ("softmax", (8, 128), "float16", "interpret", "default", None)]
    assert [l.rule for l in registry.misses()] == ["default", "nearest", "nearest", "default"]


def test_record_writes_each_missing_task_once(tmp_path, registry):
    path = tmp_path / "misses.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", runtime.TuningMissWarning)
        registry.lookup("softmax", (8, 96), "float16", "interpret")  # before recording: written on record()
        with runtime.record(path) as recording:
            assert runtime.recording_path() == path
            registry.lookup("softmax", (64, 256), "float32", "interpret")  # exact: not a miss
            registry.lookup("softmax", (128, 1536), "float32", "interpret")
            registry.lookup("softmax", (128, 1536), "float32", "interpret")
            other = runtime.Registry.load(*_bundle_of(registry), spaces=())  # a second registry, same task
            other.lookup("softmax", (128, 1536), "float32", "interpret")
            with runtime.record(path):  # nested, the same file: nothing twice
                pass
        assert recording.path == path and runtime.recording_path() is None
        registry.lookup("softmax", (16, 96), "float32", "interpret")  # after recording: not written
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # record() also writes the misses of registries other tests left alive (JAX's caches hold
    # tuned kernels); this test's misses are the ones with these shapes (exact tasks: see the next test).
    ours = [line for line in lines if line["shape"] in ([8, 96], [128, 1536], [16, 96])]
    assert ours == [
        {"kernel": "softmax", "shape": [8, 96], "dtype": "float16", "target": "interpret", "rule": "default",
         "distance": None},
        {"kernel": "softmax", "shape": [128, 1536], "dtype": "float32", "target": "interpret", "rule": "nearest",
         "distance": pytest.approx(math.log2(3))}]
    assert len({(l["kernel"], tuple(l["shape"]), l["dtype"], l["target"]) for l in lines}) == len(lines)
    assert misses.Miss("softmax", (8, 96), "float16", "interpret", "default", None) in misses.read_misses(path)
    started = runtime.record(tmp_path / "plain.jsonl")  # as a plain call, until stop()
    assert runtime.recording_path() == tmp_path / "plain.jsonl"
    started.stop()
    started.stop()  # twice: harmless
    assert runtime.recording_path() is None


def _bundle_of(registry: runtime.Registry) -> tuple[str, Path]:
    folder = Path(registry.source)
    return str(folder), next((folder.parent / "keys").glob("*.pub"))


def test_record_from_the_environment_and_through_tuned_kernels(tmp_path, registry, monkeypatch):
    from kernels import rms_norm

    path = tmp_path / "env-misses.jsonl"
    monkeypatch.setenv(runtime.RECORD_ENV, str(path))
    x, w = rms_norm.make_inputs((16, 512), jnp.float32, jax.random.key(0))
    fn = runtime.tuned("rms_norm", registry=registry)
    assert registry.lookup("softmax", (64, 256), "float32", "interpret").rule == runtime.EXACT  # not a miss
    jax.jit(jax.grad(lambda x, w: jnp.sum(fn(x, w)), argnums=(0, 1)))(x, w)
    recorded = misses.read_misses(path)
    assert [(m.kernel, m.shape, m.rule) for m in recorded] == [("rms_norm", (16, 512), "nearest"),
                                                                ("rms_norm_bwd", (16, 512), "nearest")]
    assert all(m.distance == 1.0 and m.target == "interpret" for m in recorded)


def test_record_miss_appends_whole_lines_from_threads_without_duplicates(tmp_path):
    path = tmp_path / "threads.jsonl"
    path.write_bytes(b'{"kernel": "softmax", "shape": [8, 8], "dtype": "float32", "target": "tpu", "rule": "def')
    tasks = [misses.Miss("softmax", (8, 8 * (i % 20 + 1)), "float32", "tpu", "default") for i in range(200)]

    def write(part: int) -> None:
        for miss in tasks[part::4]:
            misses.record_miss(path, miss)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 20 and all(json.loads(line)["rule"] == "default" for line in lines)  # the torn line cut
    assert sorted(m.shape for m in misses.read_misses(path)) == sorted({m.shape for m in tasks})
    other = path.with_name("other.jsonl")  # another process's lines count too
    other.write_text(tasks[0].to_json() + "\n")
    assert not misses.record_miss(other, tasks[0]) and misses.record_miss(other, tasks[1])
    with open(other, "a") as file:
        file.write(tasks[2].to_json() + "\n" + tasks[3].to_json()[:40])  # a writer died mid-line
    assert misses.read_misses(other) == tasks[:3]  # the torn last line is skipped
    assert not misses.record_miss(other, tasks[2]) and misses.read_misses(other) == tasks[:3]


def test_misses_files_are_bounded_and_checked(tmp_path, registry):
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as file:
        file.truncate(misses.MAX_BYTES + 1)
    miss = misses.Miss("softmax", (8, 8), "float32", "interpret", "default")
    with pytest.raises(misses.MissFileError, match="refused over 10485760 bytes"):
        misses.record_miss(big, miss)
    with pytest.raises(misses.MissFileError, match="at most 10485760 bytes"):
        misses.read_misses(big)
    with warnings.catch_warnings(record=True) as caught, runtime.record(big):
        warnings.simplefilter("always")
        registry.lookup("softmax", (8, 256), "float32", "interpret")  # the program runs on
        registry.lookup("softmax", (8, 512), "float32", "interpret")
    assert [str(w.message) for w in caught if w.category is RuntimeWarning][0].startswith("misses not recorded")
    assert len([w for w in caught if w.category is RuntimeWarning]) == 1
    assert big.stat().st_size == misses.MAX_BYTES + 1

    bad = tmp_path / "bad.jsonl"
    bad.write_text(miss.to_json() + "\n\n" + json.dumps({**json.loads(miss.to_json()), "shape": [8, 0]}) + "\n")
    with pytest.raises(misses.MissFileError, match=r"bad.jsonl:3: shape: expected a list of positive integers"):
        misses.read_misses(bad)
    bad.write_text('{"kernel": "softmax"}\n')
    with pytest.raises(misses.MissFileError, match=r"bad.jsonl:1: shape: expected a field of"):
        misses.read_misses(bad)
    with pytest.raises(misses.MissFileError, match="not found"):
        misses.read_misses(tmp_path / "none.jsonl")


def test_misses_module_imports_no_jax():
    code = "import sys, farm.deploy.misses; print(sorted(m for m in ('jax', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


LIGHT = textwrap.dedent("""
    import sys

    class Blocker:  # the light install: no Ray, Optuna or YAML
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("ray", "optuna", "yaml"):
                raise ImportError(f"{name} is not installed (light install)")
            return None

    sys.meta_path.insert(0, Blocker())
    import jax, jax.numpy as jnp, numpy as np
    from farm.deploy import runtime
    from kernels import rms_norm, softmax

    folder, public = sys.argv[1:3]
    registry = runtime.Registry.load(folder, [public], spaces=())
    fn = runtime.tuned("softmax", registry=registry)
    x = softmax.make_inputs((64, 256), jnp.float32, jax.random.key(0))[0]
    np.testing.assert_allclose(jax.jit(fn)(x), softmax.reference(x), rtol=1e-5, atol=1e-6)
    assert fn.choice(x).rule == "exact" and fn.choices()[0].target == "interpret"
    norm = runtime.tuned("rms_norm", registry=registry)
    x, w = rms_norm.make_inputs((32, 512), jnp.float32, jax.random.key(1))
    dx = jax.grad(lambda x: jnp.sum(norm(x, w) ** 2))(x)
    want = jax.grad(lambda x: jnp.sum(rms_norm.reference(x, w) ** 2))(x)
    np.testing.assert_allclose(dx, want, rtol=1e-4, atol=1e-4)
    try:
        import yaml
    except ImportError:
        pass
    else:
        raise AssertionError("yaml was importable")
    print("loaded:", sorted(m for m in ("ray", "optuna", "yaml") if m in sys.modules))
""")


def test_a_deployment_runs_without_ray_optuna_or_yaml(bundle, tmp_path):
    folder, public = bundle
    script = tmp_path / "light.py"
    script.write_text(LIGHT)
    out = subprocess.run([sys.executable, str(script), str(folder), str(public)], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env={**_env(), "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "loaded: []"


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != runtime.RECORD_ENV}


def test_a_tuned_kernel_tries_the_gpu_targets_of_its_device_in_its_order(registry):
    # The device as JAX describes a GPU (its kind and compute capability): an H200, an A100
    from types import SimpleNamespace

    h200 = SimpleNamespace(device_kind="NVIDIA H200", compute_capability="9.0")
    a100 = SimpleNamespace(device_kind="NVIDIA A100-SXM4-80GB", compute_capability="8.0")
    fn = runtime.tuned("softmax", registry=registry)
    assert fn._gpu_targets((4096, 50257), "bfloat16", h200) == ("gpu-mosaic", "gpu-triton")
    assert fn._gpu_targets((1, 151936), "bfloat16", h200) == ("gpu-triton", "gpu-mosaic")
    assert fn._gpu_targets((4096, 50257), "bfloat16", a100) == ("gpu-triton",)
    # a bundle's faster Mosaic GPU row is not taken where Mosaic GPU cannot run
    assert registry.gpu_target("softmax", (64, 256), "float32", targets=fn._gpu_targets((64, 256), "float32", a100)) \
        == "gpu-triton"
    assert runtime.tuned("swiglu", registry=registry)._gpu_targets((1, 8, 256), "bfloat16", h200) == ("gpu-triton",)
