"""A user's own kernel module (a space names it by module path) is checked against the kernel
contract as its space loads: each mistake a kernel author makes is one SpaceError naming the
function and what was expected, before Ray starts (`farm.search.contract`)."""
from __future__ import annotations

import sys
import textwrap
import uuid

import pytest

from farm.errors import SpaceError
from farm.search import spaces

# A correct kernel of its author's: softmax, with a `block_rows` knob.
BASE = """
from typing import Any
import jax.numpy as jnp
from kernels import softmax

NAME = "mine"
SHAPE_NAMES = softmax.SHAPE_NAMES
TARGETS = ("interpret",)
reference = softmax.reference
make_inputs = softmax.make_inputs
flops = softmax.flops
bytes_moved = softmax.bytes_moved


def shape_of(x):
    return tuple(x.shape)


def default_config(shape, target):
    return {"block_rows": 8}


def check_config(config, shape, dtype, target):
    return None if shape[0] % config["block_rows"] == 0 else "block_rows must divide the rows"


def footprint(config, shape, dtype, target):
    return softmax.footprint({"block_rows": config["block_rows"]}, shape, dtype, target)


def build(config, shape, dtype, platform):
    return softmax.build({"block_rows": config["block_rows"]}, shape, dtype, platform)
"""

MISTAKES = {
    "default_signature": ("def default_config(shape, target):", "def default_config(shape):",
                          "default_config(shape, target) to return a config dict for interpret 64x128 float32 "
                          "(it raised TypeError"),
    "default_refused": ('return {"block_rows": 8}', 'return {"block_rows": 7}',
                        "default_config to give a config its check_config takes for interpret 64x128 float32 "
                        "(deployments fall back to it; check_config says: block_rows must divide the rows)"),
    "check_raises": ("    return None if shape", "    raise KeyError('x')\n    return None if shape",
                     "check_config to return None or a reason string, not raise (it raised KeyError"),
    "footprint_raises": ("    return softmax.footprint(",
                         "    raise ValueError('no model')\n    return softmax.footprint(",
                         "footprint to return the default's on-chip bytes for interpret 64x128 float32 (it raised "
                         "ValueError: no model)"),
    "inputs_not_a_tuple": ("make_inputs = softmax.make_inputs",
                           "def make_inputs(shape, dtype, key):\n    return softmax.make_inputs(shape, dtype, key)[0]",
                           "make_inputs to return a tuple of arrays (the kernel's inputs, in order), got "),
    "shape_of_reversed": ("    return tuple(x.shape)", "    return tuple(x.shape)[::-1]",
                          "shape_of(*make_inputs((64, 128), ...)) to be (64, 128) (deployments look configs up by "
                          "it), got (128, 64)"),
    "wrong_dtype": ("    return softmax.build({", "    f = softmax.build({",
                    "build(default) on interpret 64x128 float32 to return what reference returns: output 0 is "
                    "float16[64, 128], expected float32[64, 128]"),
    "reference_transposed": ("reference = softmax.reference", "def reference(x):\n    return softmax.reference(x).T",
                             "output 0 is float32[64, 128], expected float32[128, 64]"),
    "build_signature": ("def build(config, shape, dtype, platform):", "def build(config, shape, dtype):",
                        "build(config, shape, dtype, platform) to return a function of the inputs for its default on "
                        "interpret 64x128 float32 (it raised TypeError"),
    "syntax_error": ("def shape_of(x):", "def shape_of(x:",
                     "kernel: expected a known kernel (kernel module"),
}
SUFFIX = {"wrong_dtype": "\n    return lambda x: f(x).astype(jnp.float16)\n"}


def _space(tmp_path, body: str, params: str = "  block_rows: {values: [8, 16]}", dtype: str = "float32") -> str:
    package = f"user_kernels_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "mine.py").write_text(body)
    if str(tmp_path) not in sys.path:
        sys.path.insert(0, str(tmp_path))
    path = tmp_path / f"{package}.yaml"
    path.write_text(f"kernel: {package}.mine\nshapes: [[64, 128]]\ndtypes: [{dtype}]\ntargets: [interpret]\n"
                    f"params:\n{params}\ntrials: 4\n")
    return str(path)


def test_a_correct_kernel_of_ones_own_loads(tmp_path):
    space = spaces.load_space(_space(tmp_path, textwrap.dedent(BASE)), allow_kernel_modules=True)
    assert [p.name for p in space.params_for("interpret")] == ["block_rows"]
    # A reference that computes, and returns, float32 for bfloat16 inputs: the kernel's bfloat16 is the task's.
    upcast = textwrap.dedent(BASE).replace("reference = softmax.reference",
                                           "def reference(x):\n    return softmax.reference(x.astype(jnp.float32))")
    assert spaces.load_space(_space(tmp_path, upcast, dtype="bfloat16"), allow_kernel_modules=True)


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_each_contract_mistake_is_one_clear_error_at_load(tmp_path, mistake):
    old, new, fragment = MISTAKES[mistake]
    body = textwrap.dedent(BASE)
    assert old in body, mistake
    body = body.replace(old, new, 1)
    if mistake in SUFFIX:
        body = body.replace("    f = softmax.build({\"block_rows\": config[\"block_rows\"]}, shape, dtype, platform)",
                            "    f = softmax.build({\"block_rows\": config[\"block_rows\"]}, shape, dtype, platform)"
                            + SUFFIX[mistake], 1)
    with pytest.raises(SpaceError) as err:
        spaces.load_space(_space(tmp_path, body), allow_kernel_modules=True)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    if mistake == "syntax_error":
        assert "fails as it is imported: SyntaxError" in str(err.value) and "line" in str(err.value)


def test_a_knob_the_default_does_not_set_is_named_in_a_warning(tmp_path, caplog):
    """A knob of the space that the kernel's default lacks may be one it never reads (tuned for
    nothing), or an optional one: said by name, not refused."""
    import logging

    with caplog.at_level(logging.WARNING, logger="farm.search.contract"):
        spaces.load_space(_space(tmp_path, textwrap.dedent(BASE),
                                 "  block_rows: {values: [8, 16]}\n  unroll: {values: [1, 2]}"),
                          allow_kernel_modules=True)
    said = [r.getMessage() for r in caplog.records if r.name == "farm.search.contract"]
    assert len(said) == 1 and "params.unroll: " in said[0] and "default_config does not set this knob on " \
        "interpret (it sets block_rows); if the kernel does not read it, it is tuned for nothing" in said[0]


def test_a_default_that_no_longer_builds_is_said_and_left_to_the_sweep(tmp_path, caplog):
    """After an upgrade removed an API the default uses, its build raises: the space still loads (a
    retune repairs exactly this), with a warning, and the sweep records the default's compile error."""
    import logging

    body = textwrap.dedent(BASE).replace(
        "    return softmax.build({", "    if config['block_rows'] == 8:\n"
        "        raise NotImplementedError('gone in this release')\n    return softmax.build({", 1)
    with caplog.at_level(logging.WARNING, logger="farm.search.contract"):
        assert spaces.load_space(_space(tmp_path, body), allow_kernel_modules=True)
    assert any("build(default) on interpret 64x128 float32 raised NotImplementedError: gone in this release"
               in r.getMessage() for r in caplog.records)
