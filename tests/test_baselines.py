"""bench/baselines.py on the CPU: every torch baseline computes its kernel's reference function.

Skipped without torch (it is not a project dependency); kernels not written yet are skipped.
"""
from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import yaml

torch = pytest.importorskip("torch")

import kernels  # noqa: E402
from bench import baselines  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CPU_COLUMNS = ("torch", "torch_sdpa", "xla")   # cheap to build on a CPU (torch.compile is not)


def _small_shape(kernel: str) -> tuple[int, ...]:
    """The first interpret shape of the kernel's space (search_spaces/<kernel>.yaml)."""
    space = yaml.safe_load((REPO / "search_spaces" / f"{kernel}.yaml").read_text())
    return tuple(space["targets"]["interpret"]["shapes"][0])


def _case(kernel: str, dtype: str, seed: int) -> baselines.Case:
    try:
        module = kernels.load(kernel)
    except kernels.UnknownKernel as err:
        pytest.skip(str(err))
    shape = _small_shape(kernel)
    return baselines.Case(module, shape, dtype, [module.make_inputs(shape, jnp.dtype(dtype), jax.random.key(seed))])


def test_every_registered_kernel_has_baselines() -> None:
    assert set(kernels.REGISTRY) <= set(baselines.BASELINES)
    for columns in baselines.BASELINES.values():
        assert {"xla", "torch", "torch_compile"} <= set(columns)


@pytest.mark.parametrize("kernel,column", [(k, c) for k, cols in sorted(baselines.BASELINES.items())
                                           for c in CPU_COLUMNS if c in cols])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_baseline_matches_reference(kernel: str, column: str, dtype: str) -> None:
    for seed in (1, 2):   # fresh inputs each time: the same function on any input
        case = _case(kernel, dtype, seed)
        prepared = baselines.BASELINES[kernel][column](case)
        error, tolerance = baselines.check(prepared, case)
        assert error <= tolerance, f"{kernel} {column} {dtype}: relative error {error:.2e} > {tolerance:.0e}"


def test_torch_baseline_is_zero_copy_and_timeable() -> None:
    case = _case("softmax", "float32", 3)
    prepared = baselines.BASELINES["softmax"]["torch"](case)
    (x,) = case.input_sets[0]
    (t,) = prepared.inputs[0]
    assert t.data_ptr() == x.unsafe_buffer_pointer()   # DLPack view, not a copy
    synced = []
    prepared.sync = lambda: synced.append(True)
    out = jax.block_until_ready(prepared.call(0))      # the farm's wait reaches torch's sync
    assert synced and isinstance(out.value, torch.Tensor)


@pytest.mark.skipif(baselines.on_gpu(), reason="CPU behaviour")
@pytest.mark.parametrize("kernel,column", [("matmul", "xla_cublas"), ("matmul", "pallas_ops_mgpu"),
                                           ("flash_attention", "cudnn"), ("flash_attention", "torch_sdpa_cudnn")])
def test_gpu_only_columns_say_so_on_cpu(kernel: str, column: str) -> None:
    with pytest.raises(baselines.Unavailable, match="unavailable on cpu"):
        baselines.BASELINES[kernel][column](_case(kernel, "float32", 0))


def test_seed_table_dry_run(tmp_path: Path) -> None:
    from bench import seed_table

    seed_table.main(["--small", "--out", str(tmp_path), "--spaces", str(REPO / "search_spaces" / "rms_norm.yaml"),
                     "--no-compile", "--repetitions", "3", "--columns", "torch", "pallas_ops_triton"])
    report = json.loads((tmp_path / "seed_table.json").read_text())
    (row,) = report["results"]
    statuses = {name: c["status"] for name, c in row["columns"].items()}
    assert statuses == {"farm:interpret": "ok", "xla": "ok", "torch": "ok", "pallas_ops_triton": "ok"}
    assert row["speedup_vs_xla"] > 0 and report["geomean"]["rows_with_farm"] == 1
    assert "| rms_norm | 32x512 | float32 |" in (tmp_path / "seed_table.md").read_text()


def test_a_strided_torch_result_is_described_and_a_dense_one_is_not() -> None:
    padded = torch.zeros(4, 16)
    view = "a strided view, shape (4, 13), strides (16, 1) (not compacted)"
    assert baselines.strided_layout(padded[:, :13]) == view
    assert baselines.strided_layout((padded, padded[:, :13])).startswith("a strided view")
    assert baselines.strided_layout(padded) is None
    assert baselines.strided_layout((padded, padded.T.contiguous())) is None
