"""farm.deploy.runtime: verified loading, lookup rules, software policies, threads, tuned kernels."""
from __future__ import annotations

import json
import threading
import warnings

import pytest

import kernels
from farm.bundle import merge as bundle
from farm.bundle.trust import load_trust
from farm.deploy import pull, runtime
from farm.errors import BundleError, FarmError
from farm.search.spaces import load_space
from tests import bundles as B

# The lookup-rule tests ask for untuned tasks on purpose; warnings are tested in test_tuned_kernels.py.
pytestmark = pytest.mark.filterwarnings("ignore::farm.deploy.runtime.TuningMissWarning")

ROWS = [
    *B.SOFTMAX_ROWS,
    *B.MATMUL_ROWS,
    B.row("softmax", (64, 256), {"block_rows": 8}, device_kind="TPU v6 lite", target="tpu", dtype="bfloat16"),
    B.row("softmax", (1024, 256), {"block_rows": 64}, device_kind="TPU v6 lite", target="tpu", dtype="bfloat16"),
    B.row("softmax", (64, 256), {"block_rows": 16}, device_kind="TPU v5 lite", target="tpu", dtype="bfloat16",
          created="2025-03-01T00:00:00+00:00"),
    B.row("softmax", (32, 256), {}, status="no_valid_config"),
]


def _default(kernel: str, shape: tuple[int, ...], target: str) -> dict:
    return kernels.load(kernel).default_config(shape, target)


@pytest.fixture()
def signed(tmp_path):
    """(bundle folder, public key path, private key)."""
    private, public = B.keypair(tmp_path / "keys", "ci")
    return B.write(tmp_path / "bundle", ROWS, private), public, private


@pytest.fixture()
def registry(signed):
    folder, public, _ = signed
    return runtime.Registry.load(folder, [public], spaces=())


def test_exact_rule(registry):
    choice = registry.lookup("softmax", (64, 256), "float32", "interpret")
    assert choice.rule == runtime.EXACT and dict(choice.config) == {"block_rows": 16}
    assert choice.task_key == "softmax/64x256/float32/interpret" and choice.tuned_shape == (64, 256)
    assert registry.lookup("softmax", [64, 256], "float32", "interpret") is choice  # list shapes hit the cache
    with pytest.raises(TypeError):
        choice.config["block_rows"] = 1  # the cached config is read-only


def test_exact_rule_by_device_kind(registry):
    assert registry.lookup("softmax", (64, 256), "bfloat16", "tpu", "TPU v6 lite").config["block_rows"] == 8
    assert registry.lookup("softmax", (64, 256), "bfloat16", "tpu", "TPU v5 lite").config["block_rows"] == 16
    any_device = registry.lookup("softmax", (64, 256), "bfloat16", "tpu")
    assert any_device.rule == runtime.EXACT and any_device.device_kind == "TPU v5 lite"  # the newest row
    unknown = registry.lookup("softmax", (64, 256), "bfloat16", "tpu", "TPU v7")
    assert unknown.rule == runtime.DEFAULT and dict(unknown.config) == _default("softmax", (64, 256), "tpu")


def test_nearest_rule_by_log_distance(registry):
    choice = registry.lookup("softmax", (128, 1024), "float32", "interpret")
    assert choice.rule == runtime.NEAREST and choice.tuned_shape == (128, 512)
    assert choice.config["block_rows"] == 32 and choice.distance == pytest.approx(1.0)
    matmul = registry.lookup("matmul", (512, 128, 512), "float32", "interpret")
    assert matmul.rule == runtime.NEAREST and matmul.tuned_shape == (256, 128, 256)
    # (128, 128, 128) is nearer than (256, 128, 256), but block_k 32 was chosen for k = 128 ...
    near = registry.lookup("matmul", (128, 128, 64), "float32", "interpret")
    assert near.rule == runtime.NEAREST and near.tuned_shape == (128, 128, 128)


def test_nearest_skips_configs_invalid_for_the_shape(registry):
    # matmul takes tiles that do not divide (its edge tiles are padded): the nearest tuned config serves m = 96.
    choice = registry.lookup("matmul", (96, 128, 128), "float32", "interpret")
    assert choice.rule == runtime.NEAREST and kernels.load("matmul").check_config(
        dict(choice.config), (96, 128, 128), "float32", "interpret") is None
    # On TPU, 1024 x 256 (block_rows 64) is nearest to 512 x 256, and 64 divides 512.
    tpu = registry.lookup("softmax", (512, 256), "bfloat16", "tpu", "TPU v6 lite")
    assert tpu.rule == runtime.NEAREST and tpu.config["block_rows"] == 64
    # For 36 rows neither 64 nor 8 divides: TPU pads the rows to whole blocks (`Plan.pad_rows`), so
    # the nearest tuned shape, 64 x 256 at 8 rows a block (40 rows run), serves.
    odd = registry.lookup("softmax", (36, 256), "bfloat16", "tpu", "TPU v6 lite")
    assert odd.rule == runtime.NEAREST and odd.tuned_shape == (64, 256) and odd.config["block_rows"] == 8


def test_nearest_uses_the_kernels_legality_and_given_search_spaces(signed, repo):
    folder, public, _ = signed
    plain = runtime.Registry.load(folder, [public])
    # 16 rows per block still divide 64 rows at 300 columns: the kernel accepts it (check_config).
    choice = plain.lookup("softmax", (64, 300), "float32", "interpret")
    assert choice.rule == runtime.NEAREST and choice.config["block_rows"] == 16
    # A given search space adds its own preferences: the shipped one asks rows % block_rows == 0.
    spaced = runtime.Registry.load(folder, [public], spaces=[load_space(repo / "search_spaces" / "softmax.yaml")])
    assert spaced.lookup("softmax", (64, 300), "float32", "interpret").rule == runtime.NEAREST
    assert spaced.lookup("softmax", (60, 256), "float32", "interpret").rule == runtime.DEFAULT


def test_an_exact_row_the_kernel_no_longer_accepts_is_not_used(tmp_path):
    """A bundle tuned with an older knob vocabulary (Triton `passes`) falls back, never fails."""
    private, public = B.keypair(tmp_path / "keys", "ci")
    stale = B.row("softmax", (64, 256), {"block_rows": 8, "passes": 1}, target="gpu-triton", dtype="bfloat16")
    registry = runtime.Registry.load(B.write(tmp_path / "bundle", [stale], private), [public])
    choice = registry.lookup("softmax", (64, 256), "bfloat16", "gpu-triton")
    assert choice.rule == runtime.DEFAULT and "passes" not in choice.config


def test_default_rule_and_no_valid_config_rows(registry):
    choice = registry.lookup("softmax", (8, 128), "float16", "interpret")
    assert choice.rule == runtime.DEFAULT and choice.task_key is None
    assert dict(choice.config) == _default("softmax", (8, 128), "interpret")
    no_valid = registry.lookup("softmax", (32, 256), "float32", "interpret")
    assert no_valid.rule == runtime.NEAREST and no_valid.task_key != "softmax/32x256/float32/interpret"
    assert registry.lookup("softmax", (64, 256), "float32", "gpu-triton").rule == runtime.DEFAULT
    with pytest.raises(LookupError, match="unknown kernel"):
        registry.lookup("conv", (8, 8), "float32", "interpret")


def test_dtype_objects_are_accepted(registry):
    import jax.numpy as jnp
    import numpy as np

    for dtype in (np.float32, np.dtype("float32"), jnp.float32):
        assert registry.lookup("softmax", (64, 256), dtype, "interpret").rule == runtime.EXACT


def test_load_archive_and_deployment_and_refusals(tmp_path, signed):
    folder, public, private = signed
    archive = tmp_path / "b.tar.gz"
    bundle.merge([folder], archive, private, load_trust([public]))
    assert len(runtime.Registry.load(archive, [public], spaces=())) == len(ROWS) - 1
    pull.pull(str(archive), tmp_path / "deploy", load_trust([public]))
    deployed = runtime.Registry.load(tmp_path / "deploy", public, spaces=())
    assert deployed.lookup("softmax", (64, 256), "float32", "interpret").rule == runtime.EXACT

    other, other_public = B.keypair(tmp_path / "keys", "other")
    with pytest.raises(BundleError, match="not trusted"):
        runtime.Registry.load(folder, [other_public])
    configs = folder / "configs.parquet"
    configs.write_bytes(configs.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(BundleError, match="sha256"):
        runtime.Registry.load(folder, [public])
    with pytest.raises(FarmError, match="not found"):
        runtime.Registry.load(tmp_path / "missing", [public])
    with pytest.raises(FarmError, match="software_policy"):
        runtime.Registry.load(archive, [public], software_policy="maybe")


def _with_software(tmp_path, software):
    private, public = B.keypair(tmp_path / "keys", "sw")
    rows = [B.row("softmax", (64, 256), {"block_rows": 16}, software=software)]
    return B.write(tmp_path / "sw-bundle", rows, private), public


HERE = {"python": "3.12.0", "jax": "0.10.2", "jaxlib": "0.10.2", "pallas_farm": "0.1.0"}


def test_software_fingerprint_policies(tmp_path):
    folder, public = _with_software(tmp_path, {**HERE, "jax": "0.9.0", "libtpu": "0.0.1"})
    with pytest.warns(runtime.SoftwareMismatchWarning, match=r"jax 0.9.0 \(bundle\) vs 0.10.2 \(here\)"):
        warned = runtime.Registry.load(folder, [public], software=HERE, spaces=())
    assert warned.lookup("softmax", (64, 256), "float32", "interpret").rule == runtime.EXACT
    assert warned.software_mismatches == [("softmax/64x256/float32/interpret", {"jax": ("0.9.0", "0.10.2")})]
    with pytest.raises(runtime.SoftwareMismatch, match="software_policy='refuse'"):
        runtime.Registry.load(folder, [public], software=HERE, software_policy="refuse")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runtime.Registry.load(folder, [public], software=HERE, software_policy="accept", spaces=())


def test_matching_fingerprint_ignores_python_and_absent_plugins(tmp_path):
    folder, public = _with_software(tmp_path, {**HERE, "python": "3.11.7", "triton": "3.0"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry = runtime.Registry.load(folder, [public], software=HERE, software_policy="refuse", spaces=())
    assert registry.software_mismatches == []


def test_concurrent_lookups_agree(signed):
    folder, public, _ = signed
    queries = [("softmax", (rows, cols), "float32", "interpret") for rows in (8, 32, 64, 96, 128, 512)
               for cols in (128, 256, 300, 512, 1024)]
    queries += [("matmul", (m, 128, k), "float32", "interpret") for m in (64, 128, 256, 512) for k in (64, 128, 512)]
    expected = {q: runtime.Registry.load(folder, [public], spaces=()).lookup(*q) for q in queries}
    shared = runtime.Registry.load(folder, [public], spaces=())  # cold cache: threads race on misses
    barrier, errors, results = threading.Barrier(8), [], []

    def worker(seed: int) -> None:
        try:
            barrier.wait(timeout=10)
            for i in range(400):
                q = queries[(i * 7 + seed) % len(queries)]
                results.append((q, shared.lookup(*q)))
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(results) == 8 * 400
    for q, choice in results:
        assert (choice.rule, dict(choice.config), choice.task_key) == \
            (expected[q].rule, dict(expected[q].config), expected[q].task_key)
        assert choice is shared.lookup(*q)  # one cached answer per query


def test_tuned_runs_the_kernel_with_the_looked_up_config(registry):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from kernels import matmul, softmax

    fn = runtime.tuned("softmax", target="interpret", registry=registry)
    x = softmax.make_inputs((64, 256), jnp.float32, jax.random.key(0))[0]
    np.testing.assert_allclose(fn(x), softmax.reference(x), rtol=1e-5, atol=1e-6)
    assert fn.choice(x).rule == runtime.EXACT and fn.choice(x).config["block_rows"] == 16
    built = fn._built[((64, 256), x.dtype)][1]
    fn(x)
    assert fn._built[((64, 256), x.dtype)][1] is built and len(fn._built) == 1  # built once per shape/dtype

    y = softmax.make_inputs((128, 1024), jnp.float32, jax.random.key(1))[0]
    np.testing.assert_allclose(fn(y), softmax.reference(y), rtol=1e-5, atol=1e-6)
    assert fn.choice(y).rule == runtime.NEAREST and len(fn._built) == 2

    mm = registry.tuned("matmul", target="interpret")
    a, b = matmul.make_inputs((256, 128, 256), jnp.float32, jax.random.key(2))
    np.testing.assert_allclose(mm(a, b), matmul.reference(a, b), rtol=1e-4, atol=1e-3)
    assert dict(mm.choice(a, b).config) == json.loads(B.MATMUL_ROWS[1]["config"])


@pytest.mark.parametrize("kernel, shape, dtype, target, field", [
    ("softmax", (3, 1000), "float32", "gpu", "target"), ("matmul", (33, 65), "float32", "interpret", "shape"),
    ("softmax", "3x1000", "float32", "interpret", "shape"), ("softmax", (-3, 1000), "float32", "interpret", "shape"),
    ("softmax", (0, 1000), "float32", "interpret", "shape"), ("softmax", (3.0, 1000), "float32", "interpret", "shape"),
    ("softmax", (True, 1000), "float32", "interpret", "shape"), ("softmax", (3, 1000), "bf16", "interpret", "dtype"),
    ("softmax", (3, 1000), "int32", "interpret", "dtype")])
def test_a_task_no_kernel_runs_is_refused_naming_the_field(registry, kernel, shape, dtype, target, field):
    """Never a default for it (nor a miss recorded that `farm sweep --tasks` would then refuse)."""
    with pytest.raises(FarmError, match=f"{field}: expected"):
        registry.lookup(kernel, shape, dtype, target)
    assert registry.lookups() == []
    if target != "gpu":
        with pytest.raises(FarmError, match=f"{field}: expected"):
            registry.gpu_target(kernel, shape, dtype)


def test_tuned_refuses_inputs_that_are_not_the_kernels(registry):
    """Inputs whose shapes the task does not give (a matmul's inner dimensions that differ), an
    integer dtype or an empty array: a FarmError naming them, not a result."""
    import jax
    import jax.numpy as jnp

    mm = registry.tuned("matmul", target="interpret")
    a = jnp.ones((33, 17))
    for b, expected in ((jnp.ones((18, 65)), r"\(33, 17\), \(17, 65\)"), (jnp.ones((5, 65)), r"\(17, 65\)"),
                        (jnp.ones((65,)), "expected 2 arrays of 2, 2 dimensions"),
                        ([[1.0] * 65] * 17, "input 1: expected an array")):
        with pytest.raises(FarmError, match=expected):
            mm(a, b)
    assert mm(a, jnp.ones((17, 65))).shape == (33, 65)
    fn = registry.tuned("softmax", target="interpret")
    with pytest.raises(FarmError, match="dtype: expected"):
        fn(jnp.ones((3, 1000), jnp.int32))
    with pytest.raises(FarmError, match="shape: expected"):
        fn(jnp.ones((0, 1000)))
    from jax import export   # shape polymorphism: a symbolic batch has no config to look up
    with pytest.raises(FarmError, match=r"inputs of shapes \(b, 1000\): symbolic dimensions \(b\)"):
        export.export(jax.jit(fn))(jax.ShapeDtypeStruct(export.symbolic_shape("b, 1000"), jnp.float32))


def test_tuned_needs_a_registry():
    runtime.set_default(None)
    with pytest.raises(FarmError, match="no registry"):
        runtime.tuned("softmax", target="interpret")
    empty = runtime.Registry()
    runtime.set_default(empty)
    try:
        assert runtime.tuned("softmax", target="interpret").registry is empty
    finally:
        runtime.set_default(None)
