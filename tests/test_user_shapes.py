"""Users bring their own shapes: a decode step's few rows, widths that are no power of two, tiny
rows. Each shipped space, given only such a shape (a three-line space over it, as `farm sweep` and
`bench/seed_table.py --shape` write them), loads, and its Triton and interpret tasks have configs
to measure: the spaces' search preferences hold at these shapes, not only at the seed shapes.
(Numerics of such configs: tests/test_kernels_matmul_family.py and the kernels' own tests.)"""
from __future__ import annotations

import pytest

import kernels
from farm.search.spaces import load_space
from farm.search.valid_set import ValidSet

# kernel: shapes nobody here chose (a Llama-sized decode step, GPT-2's 50257 and 768, rows of 3)
USER_SHAPES = {
    "softmax": [(1, 128256), (3, 50257), (1, 100)],
    "cross_entropy": [(5, 50257)],
    "rms_norm": [(1, 4096), (3, 5120), (1, 100)],
    "layer_norm": [(3, 1000)],
    "rms_norm_bwd": [(1, 4096), (3, 5120)],
    "swiglu": [(1, 1, 14336), (4, 1, 11008)],
    "geglu": [(1, 1, 14336), (2, 3, 1000)],
    "matmul": [(1, 4096, 4096), (16, 4096, 14336)],
    "bmm": [(32, 1, 128, 4096)],
    "matmul_layernorm": [(16, 5120, 5120), (3, 768, 64)],
    "flash_attention": [(1, 8, 1000, 64)],
}
CASES = [(kernel, shape) for kernel, shapes in USER_SHAPES.items() for shape in shapes]


@pytest.mark.parametrize("kernel,shape", CASES, ids=[f"{k}-{'x'.join(map(str, s))}" for k, s in CASES])
def test_a_users_shape_loads_and_leaves_configs_to_measure(tmp_path, kernel, shape):
    path = tmp_path / "user.yaml"
    path.write_text(f"kernel: {kernel}\nshapes: [{list(shape)}]\ndtypes: [bfloat16]\n")
    space = load_space(path)
    module = kernels.load(kernel)
    for target in ("gpu-triton", "interpret"):
        if target not in {t.name for t in space.targets}:
            continue
        assert module.check_config(module.default_config(shape, target), shape, "bfloat16", target) is None
        found = ValidSet.enumerate(space.params_for(target), space.leaf_check(shape, "bfloat16", target),
                                   space.prefix_checks(shape, "bfloat16", target))
        assert found is None or len(found) > 0, (kernel, shape, target)


@pytest.mark.parametrize("kernel", sorted(kernels.REGISTRY))
def test_every_default_takes_rows_of_one_two_or_three_elements(kernel):
    """The narrowest shapes: each dimension 1, 2 or 3. Every target's default is a config the kernel
    takes there, or the kernel refuses the target at that shape with a reason (Mosaic GPU's rows
    of whole 128-byte units); the two-pass softmax's Triton default raised at one column (a chunk
    of half the row: 0 columns)."""
    from kernels.protocol import task_default

    module = kernels.load(kernel)
    for size in (1, 2, 3):
        shape = (size,) * len(module.SHAPE_NAMES)
        for target in module.TARGETS:
            config = task_default(module, shape, target, "bfloat16")
            why = module.check_config(config, shape, "bfloat16", target)
            assert why is None or target == "gpu-mosaic", (kernel, shape, target, why)


@pytest.mark.parametrize("shape", [(1000, 50257), (3, 100)])
def test_the_two_pass_softmax_tunes_odd_widths_on_triton(tmp_path, shape):
    # A farm sweep on the H200 answered (1000, 50257) "no valid config" (thirty-second session):
    # the space asked for chunks that divide the row, which Triton's masked last chunk does not
    # need; rows of 100 had no config of 8 elements a thread. (TPU and interpret still take whole
    # chunks; their default stages the whole row, outside the space: not a gap this test covers.)
    path = tmp_path / "user.yaml"
    path.write_text(f"kernel: softmax_two_pass\nshapes: [{list(shape)}]\ndtypes: [bfloat16]\n")
    space = load_space(path)
    found = ValidSet.enumerate(space.params_for("gpu-triton"), space.leaf_check(shape, "bfloat16", "gpu-triton"),
                               space.prefix_checks(shape, "bfloat16", "gpu-triton"))
    assert found is not None and len(found) > 0
    module = kernels.load("softmax_two_pass")
    assert module.check_config(module.default_config(shape, "gpu-triton"), shape, "bfloat16", "gpu-triton") is None
    assert all(module.check_config(config, shape, "bfloat16", "gpu-triton") is None for config in found.configs[:50])
