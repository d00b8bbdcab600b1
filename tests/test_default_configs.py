"""Each kernel's default config is a point of its search spaces, so a sweep measures it first."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import kernels
from farm.search import spaces
from tests import shipped_spaces

REPO = Path(__file__).resolve().parent.parent
CASES = [(space, target.name, shape, target.dtypes[0])
         for space in shipped_spaces.every_space()
         for target in space.targets for shape in target.shapes]


def outside(space: spaces.SearchSpace, config: dict[str, Any], shape: tuple[int, ...], dtype: str,
            target: str) -> str | None:
    """Why `config` is not a point of `space` for this task (None: it is)."""
    params = space.params_for(target)
    if set(config) != {p.name for p in params}:
        return f"knobs differ: {sorted(config)}"
    for p in params:
        if config[p.name] not in p.choices:
            return f"{p.name}={config[p.name]!r} is not one of {p.choices}"
    return space.violated(config, shape, dtype, target)


@pytest.mark.parametrize("space,target,shape,dtype", CASES,
                         ids=[f"{Path(c[0].path).stem}-{c[1]}-{'x'.join(map(str, c[2]))}" for c in CASES])
def test_default_config_is_in_the_space(space, target, shape, dtype):
    default = kernels.load(space.kernel).default_config(shape, target)
    assert outside(space, default, shape, dtype, target) is None


# Users' shapes of the row kernels: a few long rows (where the defaults spread a row over programs
# or over the blocks of a cluster), wide vocabularies, odd widths.
USER_ROW_SHAPES = {
    "softmax": [(3, 50257), (8192, 50257), (16, 128256)],
    "rms_norm": [(2, 32768), (4096, 5120), (7, 4000), (4, 16384)],
    "layer_norm": [(4, 16384), (4096, 5120), (5, 3000), (16, 5120)],
    "rms_norm_bwd": [(3, 5120), (200, 4096), (8192, 8192)],
    "cross_entropy": [(8, 128256), (8192, 32000)],
    "welford": [(4, 16384), (1000, 512)],
    # 1000 columns: the default's 4 warps hold the row padded to 1024, which the space's register
    # rule once counted as 1000 (under 8 elements a thread) and answered the default invalid
    "batch_softmax": [(2, 3, 1000), (4, 77, 50257)],
}


@pytest.mark.parametrize("target", ["gpu-triton", "gpu-mosaic"])
def test_the_gpu_default_is_in_the_shipped_space_at_users_shapes(tmp_path, target):
    """A user's three-line space takes the kernel's shipped space; the default of a few long rows
    (split_cols) was once outside the rms norm and layer norm spaces, and their sweeps on the H200
    kept a config 1.5x slower on the device than the default they could not reach."""
    found = []
    for kernel, shapes in USER_ROW_SHAPES.items():
        path = tmp_path / f"{kernel}.yaml"
        path.write_text(f"kernel: {kernel}\nshapes: {[list(s) for s in shapes]}\ndtypes: [bfloat16]\n")
        space = spaces.load_space(path)
        if target not in [t.name for t in space.targets]:
            continue
        module = kernels.load(kernel)
        for shape in shapes:
            default = module.default_config(shape, target)
            if module.check_config(default, shape, "bfloat16", target) is not None:
                continue   # a shape the kernel does not run on this target (Mosaic GPU norms: odd widths)
            why = outside(space, default, shape, "bfloat16", target)
            if why:
                found.append((kernel, shape, why))
    assert found == [], "\n".join(map(str, found))


# Users' shapes on TPU. Compiled deviceless with libtpu's compiler (bench/tpu_deviceless.py), the
# TPU defaults failed at: 3 x 151936 and 77 x 5120 (emit_pipeline sliced a block of all the rows
# at a traced start Mosaic could not prove aligned), 1000 x 50257 (all 1000 rows one block: 289 MB
# of VMEM) and every head dim under 128 (refused). Each now takes a config Mosaic compiles.
TPU_USER_SHAPES = {
    "softmax": [(3, 151936), (7, 128256), (1000, 50257), (1001, 50257)],
    "cross_entropy": [(7, 151936), (1000, 50257), (1023, 151937)],
    "rms_norm_bwd": [(77, 5120), (1000, 4096)],
    "layer_norm": [(1, 16384), (77, 16385)],
    "welford": [(7, 50257), (1001, 100003)],
    "flash_attention": [(32, 12, 197, 64), (1, 32, 2048, 80)],
    "flash_attention_causal": [(2, 8, 1000, 96), (1, 32, 4097, 128)],
}
TPU_SCOPED_VMEM = 32 << 20   # the smallest scoped VMEM limit the kernels ask Mosaic TPU for


@pytest.mark.parametrize("kernel", sorted(TPU_USER_SHAPES))
def test_tpu_defaults_run_users_shapes_within_scoped_vmem(kernel):
    module = kernels.load(kernel)
    for shape in TPU_USER_SHAPES[kernel]:
        config = module.default_config(shape, "tpu")
        assert module.check_config(config, shape, "bfloat16", "tpu") is None, (shape, config)
        assert module.footprint(config, shape, "bfloat16", "tpu") <= TPU_SCOPED_VMEM, (shape, config)


@pytest.mark.parametrize("kernel,shape", [("softmax", (1001, 50257)), ("cross_entropy", (1023, 151937)),
                                          ("welford", (1001, 100003)), ("batch_softmax", (4, 77, 50257)),
                                          ("layer_norm", (77, 16385))], ids=str)
def test_tpu_spaces_tune_row_counts_no_tile_divides(kernel, shape):
    """The shipped spaces asked every target for blocks dividing the rows: on TPU, whose blocks are
    multiples of 8 rows (or all of them), 1001 rows left no config to measure. TPU pads the rows to
    whole blocks, and its spaces admit padding of at most an eighth; the default is among them."""
    space = shipped_spaces.space(kernel)
    module = kernels.load(kernel)
    legal = [c for c in space.configs("tpu") if space.violated(c, shape, "bfloat16", "tpu") is None
             and module.check_config(c, shape, "bfloat16", "tpu") is None]
    rows = shape[-2]
    assert legal and all(-rows % c["block_rows"] <= rows // 8 or rows <= c["block_rows"] < 2 * rows for c in legal)
    assert module.default_config(shape, "tpu") in legal


# Users' shapes the TPU spaces held no config at (rows: fewer than a tile; columns: no chunk of a
# power of two divides 3000 or 1000; GLUs: seq 77 or 197, hidden 1000). A block past the rows,
# columns, seq or hidden is now one block of all of it, the spaces admit that block, and rms norm
# backward pads its rows like the others (the padded rows masked out of dweight's sums). At 13 x
# 151937 its dweight block fills VMEM whatever the rows: the default once took 8 of them, padding
# as many rows as 16 do and more than the space admits, for nothing.
TPU_SPACE_SHAPES = [
    ("softmax", (3, 151936)), ("softmax", (7, 128256)), ("softmax", (4096, 4000)),
    ("softmax_two_pass", (1000, 3000)), ("softmax_two_pass", (5, 640)),
    ("batch_softmax", (2, 3, 1000)), ("batch_softmax", (4, 77, 50257)),
    ("cross_entropy", (7, 151936)), ("cross_entropy", (1000, 50257)),
    ("rms_norm", (3, 14336)), ("rms_norm", (1000, 4000)),
    ("rms_norm_bwd", (77, 5120)), ("rms_norm_bwd", (13, 384)), ("rms_norm_bwd", (13, 151937)),
    ("layer_norm", (1000, 1000)), ("layer_norm", (1, 16384)),
    ("welford", (7, 50257)), ("swiglu", (1, 77, 1000)), ("geglu", (3, 197, 3072)),
    # GLUs at seqs no block divides: 256-row blocks over seq padded; all of seq (4001 in 4096) where
    # it fits the VMEM rule (the space's block_rows stopped at 1024); 3 rows in an 8-row block
    ("swiglu", (1, 50257, 2560)), ("geglu", (3, 4001, 11008)), ("geglu", (2, 3, 1000)),
]


@pytest.mark.parametrize("kernel,shape", TPU_SPACE_SHAPES, ids=str)
def test_tpu_spaces_hold_configs_at_users_shapes_the_default_among_them(kernel, shape):
    space = shipped_spaces.space(kernel)
    module = kernels.load(kernel)
    legal = [c for c in space.configs("tpu") if space.violated(c, shape, "bfloat16", "tpu") is None]
    assert legal, f"{kernel} {shape}: the TPU space holds no config"
    default = module.default_config(shape, "tpu")
    assert outside(space, default, shape, "bfloat16", "tpu") is None


@pytest.mark.parametrize("kernel,shape,plan", [
    ("softmax", (7, 151937), (7, 0, 127, "emit_pipeline")),            # all 7 rows, the row padded
    ("rms_norm_bwd", (13, 50257), (13, 0, 431, "emit_pipeline")),      # 16 padded rows ran out of v4's VMEM
    ("cross_entropy", (1001, 151937), (16, 7, 127, "emit_pipeline")),  # all 1001 rows a chunk: not small
    ("rms_norm", (16384, 16384), (16, 0, 0, "one_pass")),              # whole rows where small: no copies
], ids=str)
def test_tpu_default_streams_rows_too_wide_to_hold_whole(kernel, shape, plan):
    """Where whole rows would not be small, the TPU default streams column chunks (emit_pipeline),
    a row no chunk divides padded to whole chunks of 512 (`Plan.pad_cols`); before, whole rows in
    padded 16-row blocks (rms norm backward 13 x 50257 ran out of v4's VMEM, compiled deviceless)."""
    module = kernels.load(kernel)
    got = module.KERNEL.plan(module.default_config(shape, "tpu"), shape, "tpu")
    assert (got.block_rows, got.pad_rows, got.pad_cols, got.strategy) == plan


# The matmul family's and attention's large GPU tiles were sized in bfloat16: in float32 the
# gpu-triton defaults at matmul 4096^3 and attention (4, 32, 4096, 128) took 288 and 256 KiB of
# shared memory by their own footprint, over the 227 KiB an H100 or H200 block has. The defaults now
# take the task's dtype (`kernels.protocol.task_default`).
GPU_DTYPES = ("float32", "float16", "bfloat16")
GPU_CASES = sorted({(space.kernel, tuple(shape)) for space in shipped_spaces.every_space()
                    for target in space.targets for shape in target.shapes})


@pytest.mark.parametrize("kernel,shape", GPU_CASES, ids=[f"{k}-{'x'.join(map(str, s))}" for k, s in GPU_CASES])
def test_gpu_defaults_fit_shared_memory_in_every_dtype_the_kernel_takes(kernel, shape):
    from kernels.mgpu_launch import SMEM_BYTES
    from kernels.protocol import task_default

    module = kernels.load(kernel)
    for target in ("gpu-triton", "gpu-mosaic"):
        if target not in module.TARGETS:
            continue
        for dtype in GPU_DTYPES:
            config = task_default(module, shape, target, dtype)
            if module.check_config(config, shape, dtype, target) is not None:
                assert dtype == "float32", (target, dtype)  # Mosaic GPU's WGMMA kernels take 2-byte types
                continue
            assert module.footprint(config, shape, dtype, target) <= SMEM_BYTES, (target, dtype, config)


def test_the_dtype_reaches_the_defaults_that_depend_on_it():
    from farm.deploy.registry import DEFAULT, Registry, TuningMissWarning
    from kernels.protocol import task_default

    matmul, attention, softmax = (kernels.load(k) for k in ("matmul", "flash_attention", "softmax"))
    mm, att = (4096, 4096, 4096), (4, 32, 4096, 128)
    # bfloat16 keeps the tiles the H200 measured (BENCHMARKS.md, thirty-third session)
    assert task_default(matmul, mm, "gpu-triton", "bfloat16") == matmul.default_config(mm, "gpu-triton")
    wide = task_default(matmul, mm, "gpu-triton", "bfloat16")
    assert (wide["block_n"], wide["num_warps"]) == (256, 8)
    narrow = task_default(matmul, mm, "gpu-triton", "float32")
    assert (narrow["block_m"], narrow["block_n"], narrow["num_warps"], narrow["num_stages"]) == (128, 128, 4, 3)
    assert task_default(attention, att, "gpu-triton", "float32")["num_stages"] == 2
    assert task_default(attention, att, "gpu-triton", "bfloat16")["num_stages"] == 3
    # a kernel whose default_config takes no dtype is called as before
    assert task_default(softmax, (64, 256), "gpu-triton", "float32") == softmax.default_config((64, 256), "gpu-triton")
    # a deployment without a tuned row runs the default of the task's dtype
    with pytest.warns(TuningMissWarning):
        choice = Registry().lookup("matmul", mm, "float32", "gpu-triton")
    assert choice.rule == DEFAULT and dict(choice.config) == narrow


def test_a_deployment_on_a_gpu_with_less_shared_memory_gets_configs_that_fit_it(tmp_path):
    # An sm89 (L40S, RTX 4090) or sm86 block has 99 KiB of shared memory. A row tuned on an H200
    # (the large Triton tiles: 144 KiB) is refused there and the default is chosen for it: 128 x 128
    # tiles (96 KiB). The registry reads the GPU it runs on; `onchip_bytes` names it here, on a CPU.
    from farm.deploy.registry import DEFAULT, EXACT, Registry, TuningMissWarning
    from farm.errors import FarmError
    from kernels.mgpu_launch import SMEM_BYTES, defaults_for_shared_memory
    from tests import bundles as B

    sm89 = 101376
    matmul, attention = kernels.load("matmul"), kernels.load("flash_attention")
    mm, att = (4096, 4096, 4096), (4, 32, 4096, 128)
    h200 = matmul.default_config(mm, "gpu-triton")
    assert matmul.footprint(h200, mm, "bfloat16", "gpu-triton") > sm89
    private, public = B.keypair(tmp_path / "keys", "ci")
    bundle = B.write(tmp_path / "bundle", [B.row("matmul", mm, h200, target="gpu-triton", dtype="bfloat16")], private)
    assert Registry.load(bundle, [public], onchip_bytes={"gpu-triton": SMEM_BYTES}).lookup(
        "matmul", mm, "bfloat16", "gpu-triton").rule == EXACT
    on_sm89 = Registry.load(bundle, [public], onchip_bytes={"gpu-triton": sm89})
    with pytest.warns(TuningMissWarning):
        choice = on_sm89.lookup("matmul", mm, "bfloat16", "gpu-triton")
    assert choice.rule == DEFAULT and (choice.config["block_n"], choice.config["num_warps"]) == (128, 4)
    assert matmul.footprint(dict(choice.config), mm, "bfloat16", "gpu-triton") <= sm89
    with defaults_for_shared_memory(sm89):
        small = attention.default_config(att, "gpu-triton")
    assert (small["block_q"], small["num_stages"]) == (128, 2)
    assert attention.footprint(small, att, "bfloat16", "gpu-triton") <= sm89
    # outside the context the H200's defaults again
    assert attention.default_config(att, "gpu-triton")["num_stages"] == 3
    with pytest.raises(ValueError, match="positive"), defaults_for_shared_memory(0):
        pass
    for bad in ({"gpu-triton": 0}, {"interpret": sm89}, {"gpu-mosaic": "99 KiB"}):
        with pytest.raises(FarmError, match="onchip_bytes: expected a positive number of bytes per GPU or TPU target"):
            Registry(onchip_bytes=bad)


def test_a_deployment_on_a_tpu_with_less_vmem_gets_configs_that_fit_it(tmp_path):
    # A TPU kernel asks Mosaic for the VMEM its footprint needs (`vmem_limit_bytes`), so a row
    # tuned on a v6e (128 MiB) whose blocks need 48 MiB fits a v7 (64 MiB) and not a v4 (16 MiB),
    # where it would not compile: there the default runs. On a TPU the registry reads the chip.
    from farm.deploy.registry import DEFAULT, EXACT, Registry, TuningMissWarning
    from farm.measure import capacity
    from tests import bundles as B

    softmax, shape = kernels.load("softmax"), (4096, 32768)
    wide = {**softmax.default_config(shape, "tpu"), "strategy": "one_pass", "block_rows": 64, "block_cols": 4096}
    assert softmax.footprint(wide, shape, "float32", "tpu") == 48 * 2**20
    private, public = B.keypair(tmp_path / "keys", "ci")
    bundle = B.write(tmp_path / "bundle", [B.row("softmax", shape, wide, target="tpu", device_kind="TPU v6 lite")],
                     private)
    for chip, rule in [("v6e", EXACT), ("v7", EXACT), ("v4", DEFAULT)]:
        registry = Registry.load(bundle, [public], onchip_bytes={"tpu": capacity.profile(chip).onchip_bytes})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TuningMissWarning)
            choice = registry.lookup("softmax", shape, "float32", "tpu")
        assert choice.rule == rule, chip
        assert softmax.footprint(dict(choice.config), shape, "float32", "tpu") <= capacity.profile(chip).onchip_bytes
    assert Registry.load(bundle, [public]).lookup("softmax", shape, "float32", "tpu").rule == EXACT  # off a TPU
