"""OOM-aware pruning: capacities, footprint models, static and dominance pruning, in real sweeps."""
from __future__ import annotations

import json
from collections import Counter

import jax.numpy as jnp
import optuna
import pyarrow.parquet as pq
import pytest

from farm.measure import capacity, outcomes
from farm.search import pruning, studies
from farm.search.searcher import OUTSIDE_STUDY
from kernels import softmax
from tests.sweeps import run_sweep, space

MIB = 1 << 20


def test_tpu_vmem_per_generation_from_jax_table():
    assert capacity.profile("v4").onchip_bytes == 16 * MIB
    assert capacity.profile("v5e").onchip_bytes == 128 * MIB
    assert capacity.profile("v5p").onchip_bytes == 64 * MIB
    assert capacity.profile("v6e").onchip_bytes == 128 * MIB
    assert capacity.profile("v7").onchip_bytes == 64 * MIB
    assert capacity.profile("h200").onchip_bytes == 232448
    with pytest.raises(KeyError, match="unknown capacity profile"):
        capacity.profile("v1")


# Configs that ran out of shared memory on the H200 (Triton 3.6 through JAX 0.11.2), with the bytes
# Triton asked for (bench/results/h200/oom_probe_seed0.json): wgmma dots (4k warps, 64k rows)
# keep num_stages operand copies, mma.sync dots num_stages - 1.
TRITON_REQUESTED = [
    ("matmul", (8192, 8192, 8192), {"block_m": 256, "block_n": 16, "block_k": 128, "num_warps": 4,
                                    "num_stages": 4, "group_m": 1}, 278528),
    ("broadcast_matmul", (64, 2048, 2048, 2048), {"block_m": 256, "block_n": 128, "block_k": 128, "num_warps": 2,
                                                  "num_stages": 5, "group_m": 1, "fold_batch": False}, 393216),
    ("broadcast_matmul", (64, 2048, 2048, 2048), {"block_m": 256, "block_n": 64, "block_k": 128, "num_warps": 8,
                                                  "num_stages": 3, "group_m": 1, "fold_batch": False}, 245760),
    ("matmul_layernorm", (4096, 4096, 4096), {"block_m": 16, "block_n": 512, "block_k": 128, "num_warps": 4,
                                              "num_stages": 3, "group_m": 1, "ln_strategy": "two_phase",
                                              "ln_rows": 8}, 270336),
    ("matmul_layernorm", (4096, 4096, 4096), {"block_m": 256, "block_n": 16, "block_k": 128, "num_warps": 4,
                                              "num_stages": 5, "group_m": 1, "ln_strategy": "two_phase",
                                              "ln_rows": 8}, 348160),
    ("flash_attention", (8, 32, 8192, 256), {"block_q": 64, "block_kv": 64, "num_warps": 4, "num_stages": 4},
     294912),
    ("flash_attention", (8, 32, 8192, 256), {"block_q": 128, "block_kv": 128, "num_warps": 8, "num_stages": 3},
     458752),
    ("flash_attention", (4, 32, 4096, 128), {"block_q": 64, "block_kv": 128, "num_warps": 4, "num_stages": 4},
     278528),
]


@pytest.mark.parametrize("name,shape,config,requested", TRITON_REQUESTED)
def test_triton_footprints_equal_what_triton_asked_for(name, shape, config, requested):
    import kernels

    assert kernels.load(name).footprint(config, shape, jnp.bfloat16, "gpu-triton") == requested


def test_interpret_target_has_no_capacity_and_emulation_defaults():
    assert capacity.for_target("interpret", interpret=True) == capacity.NONE
    assert capacity.for_target("tpu", interpret=True).source == "table:v7"
    assert capacity.for_target("gpu-triton", interpret=True).onchip_bytes == 232448
    assert capacity.for_target("tpu", interpret=True, emulate="v5e").onchip_bytes == 128 * MIB


class _Sized:
    """A stand-in kernel whose footprint is the config's `bytes` (footprint models are tested per kernel)."""

    @staticmethod
    def footprint(config, shape, dtype, target):
        return config["bytes"]

    @staticmethod
    def bytes_moved(shape, dtype):
        return 1024


@pytest.mark.parametrize("generation,mib,fits", [
    ("v5e", 80, True), ("v6e", 80, True), ("v7", 80, False), ("v7", 64, True), ("v5p", 65, False), ("v4", 17, False),
])
def test_static_verdicts_on_tpu_capacities(generation, mib, fits):
    footprint, verdict = pruning.static_verdict(_Sized, {"bytes": mib * MIB}, (8,), "bfloat16", "tpu",
                                                capacity.profile(generation))
    assert footprint == mib * MIB
    assert (verdict is None) == fits
    if not fits:
        assert verdict.footprint_bytes == footprint
        assert verdict.capacity_bytes == capacity.profile(generation).onchip_bytes
        assert "exceeds vmem capacity" in verdict.reason


def test_hbm_capacity_prunes_shapes_that_cannot_fit():
    tiny = capacity.Capacity(None, 1 << 20, "none", "test")
    _, verdict = pruning.static_verdict(softmax, {"block_rows": 1}, (1024, 1024), "float32", "interpret", tiny)
    assert verdict is not None and "HBM" in verdict.reason


def test_dominance_requires_same_strategy_and_larger_memory_knobs():
    class Kernel:
        MEMORY_PARAMS = ("block", "stages")

    d = pruning.Dominance(Kernel)
    d.add(7, {"block": 128, "stages": 3, "strategy": "unroll", "num_warps": 4})
    assert d.dominating({"block": 256, "stages": 3, "strategy": "unroll", "num_warps": 4}) == 7
    assert d.dominating({"block": 128, "stages": 3, "strategy": "unroll", "num_warps": 4}) == 7
    assert d.dominating({"block": 256, "stages": 2, "strategy": "unroll", "num_warps": 4}) is None
    assert d.dominating({"block": 256, "stages": 3, "strategy": "emit_pipeline", "num_warps": 4}) is None
    assert d.dominating({"block": 256, "stages": 3, "strategy": "unroll", "num_warps": 8}) is None


def test_default_memory_params_are_the_integer_knobs():
    assert pruning.memory_params(softmax, {"block_rows": 8, "strategy": "x", "flag": True}) == ("block_rows",)


def test_configs_over_shared_memory_are_pruned_never_compiled(ray_local, tmp_path, signing_key):
    # Emulating an H200 (232448 B of shared memory per block): the chunks of f32 rows that the
    # loop pipeliner loads ahead make the larger row blocks too big; they must be pruned without
    # compiling, the rest measured.
    shape, cfg = (16, 8192), {"num_warps": 4, "num_stages": 3, "strategy": "fori_loop", "block_cols": 4096}
    fits = {rows: softmax.footprint({"block_rows": rows, **cfg}, shape, jnp.float32, "gpu-triton") <= 232448
            for rows in (1, 2, 4, 8, 16)}
    assert any(fits.values()) and not all(fits.values())
    out, trials = run_sweep(tmp_path, signing_key, space(
        "softmax", [shape], trials=6, target="gpu-triton", block_rows=[1, 2, 4, 8, 16],
        **{knob: [value] for knob, value in cfg.items()}), "--interpret")
    # Beside the kernel's default (it sets knobs this space does not tune: measured outside the
    # study), the grid visits all five configs before repeating; repeats are answered without measuring.
    default = [t for t in trials if t["trial"] == OUTSIDE_STUDY]
    assert [t["outcome"] for t in default] == [outcomes.OK]
    trials = [t for t in trials if t["trial"] != OUTSIDE_STUDY]
    by_rows = {json.loads(t["config"])["block_rows"]: t for t in trials if t["outcome"] != outcomes.CACHED}
    assert sorted(by_rows) == [1, 2, 4, 8, 16]
    for rows, trial in by_rows.items():
        footprint = softmax.footprint({"block_rows": rows, **cfg}, shape, jnp.float32, "gpu-triton")
        assert trial["footprint_bytes"] == footprint
        if fits[rows]:
            assert trial["outcome"] == outcomes.OK and trial["compile_s"] > 0
        else:
            assert trial["outcome"] == outcomes.PRUNED and trial["compile_s"] is None
            assert trial["capacity_bytes"] == 232448 and "exceeds shared memory capacity" in trial["error"]
    counts = Counter(t["outcome"] for t in trials)
    assert counts[outcomes.OK] == sum(fits.values()) and counts[outcomes.PRUNED] >= list(fits.values()).count(False)
    row = pq.read_table(out / "bundle" / "configs.parquet").to_pylist()[0]
    assert row["pruned"] == counts[outcomes.PRUNED] and row["oom"] == 0 and row["default_median_s"] > 0
    study = optuna.load_study(study_name=row["task_key"], storage=studies.storage(out))
    states = Counter(t.state for t in study.trials)
    assert states[optuna.trial.TrialState.PRUNED] == counts[outcomes.PRUNED]
    assert states[optuna.trial.TrialState.COMPLETE] == counts[outcomes.OK] + counts[outcomes.CACHED]


def test_a_real_oom_prunes_every_larger_config_of_the_same_strategy(ray_local, tmp_path, signing_key):
    out, trials = run_sweep(tmp_path, signing_key, space("tests.fixtures.faulty_softmax", [[64, 128]], trials=4,
                                                         block_rows=[16, 32, 64, 8], fault=["oom"]), "--workers", "1")
    outcome = {json.loads(t["config"])["block_rows"]: t for t in trials if t["outcome"] != outcomes.CACHED}
    assert outcome[8]["outcome"] == outcomes.OK
    ooms = [r for r, t in outcome.items() if t["outcome"] == outcomes.OOM]
    pruned = [r for r, t in outcome.items() if t["outcome"] == outcomes.PRUNED]
    assert len(ooms) >= 1 and sorted(ooms + pruned) == [16, 32, 64]
    for rows in pruned:
        assert min(ooms) <= rows and "ran out of memory" in outcome[rows]["error"]
    assert "Shared memory size limit exceeded" in outcome[ooms[0]]["error"]
