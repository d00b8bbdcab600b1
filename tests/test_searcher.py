"""The per-task searcher with the real Optuna (in-memory and journal storage), without Ray."""
from __future__ import annotations

import json
from collections import Counter
from typing import Any

import optuna
import pytest

from farm.measure import outcomes
from farm.search import studies, valid_set
from farm.search.plan import PlannedTask, expand
from farm.search.searcher import OUTSIDE_STUDY, Answer, Proposal, Searcher, outside_trial
from farm.search.space_parts import Param
from farm.search.spaces import load_space, parse_space


def _planned(params: dict[str, Any], *, trials: int, constraints: list[str] | None = None,
             sampler: str = "tpe", kernel: str = "matmul", shape: list[int] | None = None) -> PlannedTask:
    space = parse_space({"kernel": kernel, "dtypes": ["float32"], "shapes": [shape or [64, 64, 64]],
                         "targets": ["interpret"], "params": params, "constraints": constraints or [],
                         "sampler": sampler, "trials": trials}, "inline.yaml")
    return expand([space])[0]


def _searcher(planned: PlannedTask, storage: Any = None, **options: Any) -> tuple[Searcher, list[Any]]:
    answered: list[Any] = []

    def on_answer(answer: Answer) -> Answer:
        answered.append(answer)
        return answer

    storage = storage or optuna.storages.InMemoryStorage()
    return Searcher.open(planned, storage, on_answer=on_answer, **options), answered


@pytest.fixture
def rejection_sampling(monkeypatch):
    """Spaces too large to enumerate: the sampler draws from the product and the searcher answers
    what needs no measuring (invalid, pruned, cached) itself."""
    monkeypatch.setattr(valid_set, "ENUMERATION_LIMIT", 0)


def _ok(p: Proposal, median: float = 1e-3) -> Answer:
    return Answer(p.trial, p.key, outcomes.OK, median_s=median)


# The knobs a plain (interpret) matmul task pins: one group of row tiles, K not split.
PLAIN = {"group_m": {"values": [1]}, "split_k": {"values": [1]}}
PLAIN_CONFIG = {"group_m": 1, "split_k": 1}

MATMUL = {"block_m": {"pow2": [8, 64]}, "block_n": {"pow2": [8, 64]}, "block_k": {"pow2": [8, 64]},
          **PLAIN}


def test_the_default_config_comes_first_then_only_valid_unmeasured_configs():
    planned = _planned(MATMUL, trials=12, constraints=["block_m * block_n <= 32 * 64"])
    searcher, answered = _searcher(planned)
    proposals = []
    while (p := searcher.ask()) is not None:
        proposals.append(p)
        searcher.tell(_ok(p))
    # The default breaks this search preference, and the kernel takes it: it is what a deployment
    # runs untuned, so it is measured first, outside the study (the sampler never hears of it).
    default = {"block_m": 64, "block_n": 64, "block_k": 32, **PLAIN_CONFIG}
    assert (proposals[0].trial, proposals[0].config) == (OUTSIDE_STUDY, default)
    drawn = proposals[1:]
    assert all(p.config["block_m"] * p.config["block_n"] <= 32 * 64 for p in drawn)
    assert len({p.key for p in proposals}) == len(proposals)               # nothing proposed twice
    invalid = [a for a in answered if a.outcome == outcomes.INVALID]
    assert all(json.loads(a.config)["block_m"] * json.loads(a.config)["block_n"] > 32 * 64 for a in invalid)
    counted = len(proposals) + sum(a.outcome == outcomes.CACHED for a in answered)
    assert counted == searcher.asked == 12 and not searcher.wants_trials   # the budget ends asking
    states = Counter(t.state for t in searcher.study.trials)
    assert states[optuna.trial.TrialState.PRUNED] == len(invalid)
    assert states[optuna.trial.TrialState.COMPLETE] == len(drawn)         # the default is not in the study
    assert not states[optuna.trial.TrialState.RUNNING]
    assert all(studies.from_optuna(t.params, searcher.params) != default for t in searcher.study.trials)


def test_a_default_the_kernel_refuses_is_answered_invalid_with_its_reason():
    # Mosaic GPU's rms norm stages whole 128-byte units of a row: 3000 bf16 columns are not, so the
    # kernel refuses its default and every config (gpu-triton takes the width). Nothing is measured;
    # the answers say why.
    space = parse_space({"kernel": "rms_norm", "dtypes": ["bfloat16"], "shapes": [[5, 3000]],
                         "targets": ["gpu-mosaic"],
                         "params": {"block_rows": {"values": [1]}, "strategy": {"values": ["smem_row"]},
                                    "block_cols": {"values": [1024, 2048]}, "approx_math": {"values": [1]},
                                    "stream_cols": {"values": [0]}, "cluster": {"values": [1]}},
                         "trials": 2}, "inline.yaml")
    searcher, answered = _searcher(expand([space])[0])
    assert not searcher.outside and searcher.ask() is None
    assert answered and all(a.outcome == outcomes.INVALID and a.trial >= 0 for a in answered)
    assert all("not whole 128-byte units" in a.error for a in answered)


def test_a_default_off_the_spaces_values_is_measured_once_and_survives_a_resume(tmp_path):
    # The default's block_m 64 is no value of this space's block_m (16, 32).
    planned = _planned({"block_m": {"values": [16, 32]}, "block_n": {"values": [64]}, "block_k": {"values": [32]},
                        **PLAIN}, trials=3, sampler="grid")
    searcher, _ = _searcher(planned, studies.storage(tmp_path))
    first = searcher.ask()
    assert first.trial == OUTSIDE_STUDY and first.config["block_m"] == 64
    log = [Answer(first.trial, first.key, outcomes.OK, median_s=1e-5)]
    searcher.tell(log[0])
    second = searcher.ask()
    log.append(_ok(second))                # logged; the driver dies before telling it
    resumed, answered = _searcher(planned, studies.storage(tmp_path))
    resumed.replay(log)
    rest = []
    while (p := resumed.ask()) is not None:
        rest.append(p)
        resumed.tell(_ok(p))
    assert [p.config["block_m"] for p in rest] == [{16: 32, 32: 16}[second.config["block_m"]]]
    assert resumed.asked == 3 and not answered    # the default is not measured again
    assert resumed.measured[first.key].median_s == 1e-5


def test_a_default_left_out_that_cannot_fit_is_answered_pruned_once(tmp_path):
    import jax.numpy as jnp

    import kernels
    from farm.measure import capacity

    planned = _planned({"block_m": {"values": [8]}, "block_n": {"values": [8]}, "block_k": {"values": [8]}, **PLAIN},
                       trials=3)
    small = {"block_m": 8, "block_n": 8, "block_k": 8, **PLAIN_CONFIG}
    fits = kernels.load("matmul").footprint(small, (64, 64, 64), jnp.float32, "interpret")
    tiny = capacity.Capacity(onchip_bytes=fits, hbm_bytes=None, memory="vmem", source="test")
    searcher, answered = _searcher(planned, studies.storage(tmp_path), capacity=tiny)
    first = searcher.ask()
    assert first.config == small and first.trial == 0
    assert [(a.trial, a.outcome) for a in answered] == [(OUTSIDE_STUDY, outcomes.PRUNED)]   # the default: 64x64x32
    assert answered[0].footprint_bytes > tiny.onchip_bytes
    resumed, _ = _searcher(planned, studies.storage(tmp_path), capacity=tiny)
    resumed.replay(answered)
    assert not resumed.outside and resumed.skipped == 1


def test_default_config_is_trial_zero():
    searcher, _ = _searcher(_planned(MATMUL, trials=3))
    first = searcher.ask()
    assert first.trial == 0 and first.config == {"block_m": 64, "block_n": 64, "block_k": 32, **PLAIN_CONFIG}


def test_repeats_are_answered_from_the_cache(rejection_sampling):
    searcher, answered = _searcher(_planned({"block_m": {"values": [32, 64]}, "block_n": {"values": [64]},
                                             "block_k": {"values": [32]}, **PLAIN}, trials=6,
                                            sampler="random"))
    proposals = []
    while (p := searcher.ask()) is not None:
        proposals.append(p)
        searcher.tell(_ok(p, median=p.config["block_m"] * 1e-5))
    assert sorted(p.config["block_m"] for p in proposals) == [32, 64]
    cached = [a for a in answered if a.outcome == outcomes.CACHED]
    assert len(cached) == 4 and all(a.error.startswith("cached from trial") for a in cached)
    assert all(a.median_s == json.loads(a.config)["block_m"] * 1e-5 for a in cached)
    complete = [t for t in searcher.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 6


def test_a_duplicate_of_a_config_in_flight_waits_for_its_measurement(rejection_sampling):
    searcher, answered = _searcher(_planned({"block_m": {"values": [64]}, "block_n": {"values": [64]},
                                             "block_k": {"values": [32]}, **PLAIN}, trials=3))
    first = searcher.ask()
    assert searcher.ask() is None and searcher.asked == 3        # the two repeats wait for the first
    assert not answered
    searcher.tell(Answer(first.trial, first.key, outcomes.COMPILE_ERROR, error="boom"))
    assert [a.outcome for a in answered] == [outcomes.COMPILE_ERROR] * 2   # a failure is repeated, not cached
    assert all("cached from trial 0: boom" == a.error for a in answered)


def _oom_at_16_or_more() -> tuple[dict[int, str], list[Answer]]:
    """A grid over block_rows 16, 8, 32, 64 where 16 and more run out of memory when measured (and
    the kernel's default, fault "none", measured first outside the study)."""
    searcher, answered = _searcher(_planned({"block_rows": {"values": [16, 8, 32, 64]}, "fault": {"values": ["oom"]}},
                                            trials=5, sampler="grid", kernel="tests.fixtures.faulty_softmax",
                                            shape=[64, 128]))
    measured = {}
    while (p := searcher.ask()) is not None:
        if p.trial == OUTSIDE_STUDY:
            assert p.config == {"block_rows": 8, "fault": "none"}
            searcher.tell(Answer(p.trial, p.key, outcomes.OK, median_s=1e-4))
            continue
        outcome = outcomes.OOM if p.config["block_rows"] >= 16 else outcomes.OK
        measured[p.config["block_rows"]] = outcome
        searcher.tell(Answer(p.trial, p.key, outcome, median_s=1e-4 if outcome == outcomes.OK else None))
    return measured, answered


def test_an_oom_prunes_every_config_at_least_as_large(rejection_sampling):
    measured, answered = _oom_at_16_or_more()
    pruned = sorted(json.loads(a.config)["block_rows"] for a in answered if a.outcome == outcomes.PRUNED)
    assert measured[8] == outcomes.OK and pruned and sorted(pruned + [r for r in measured if r != 8]) == [16, 32, 64]
    ooms = [r for r, o in measured.items() if o == outcomes.OOM]
    assert all(r >= min(ooms) for r in pruned)
    assert all("ran out of memory" in a.error for a in answered if a.outcome == outcomes.PRUNED)


def test_static_pruning_never_proposes_what_cannot_fit():
    from farm.measure import capacity

    planned = _planned(MATMUL, trials=20, sampler="grid")
    tiny = capacity.Capacity(onchip_bytes=3 * 32 * 32 * 4, hbm_bytes=None, memory="vmem", source="test")
    searcher, answered = _searcher(planned, capacity=tiny)
    while (p := searcher.ask()) is not None:
        assert p.footprint_bytes is not None and p.footprint_bytes <= tiny.onchip_bytes
        searcher.tell(_ok(p))
    pruned = [a for a in answered if a.outcome == outcomes.PRUNED]
    assert pruned and all(a.footprint_bytes > a.capacity_bytes == tiny.onchip_bytes for a in pruned)


@pytest.mark.parametrize("static_pruning", [True, False])
def test_a_footprint_that_raises_fails_that_config_only(monkeypatch, static_pruning):
    """A kernel's memory model that raises on some configs (a kernel bug) answers each of them
    `invalid` with the error, pruning or not, and the search goes on with the others."""
    import kernels

    module = kernels.load("matmul")
    real = module.footprint

    def footprint(config, shape, dtype, target):
        if config["block_m"] == 16:
            raise KeyError("block_m16")
        return real(config, shape, dtype, target)

    monkeypatch.setattr(module, "footprint", footprint)
    searcher, answered = _searcher(_planned(MATMUL, trials=64, sampler="grid"), static_pruning=static_pruning)
    proposed = []
    while (p := searcher.ask()) is not None:
        proposed.append(p.config)
        searcher.tell(_ok(p))
    invalid = [a for a in answered if a.outcome == outcomes.INVALID]
    assert invalid and all("the kernel's footprint() raised KeyError: 'block_m16'" in a.error for a in invalid)
    assert proposed and all(c["block_m"] != 16 for c in proposed)
    assert len(invalid) + len(proposed) == 4 * 4 * 4


def test_powers_of_two_are_ordered_integers_for_the_sampler():
    planned = _planned(MATMUL, trials=2)
    searcher, _ = _searcher(planned)
    p = searcher.ask()
    frozen = searcher.study.trials[p.trial]
    assert frozen.params == {"log2_block_m": 6, "log2_block_n": 6, "log2_block_k": 5, **PLAIN_CONFIG}
    assert isinstance(frozen.distributions["log2_block_m"], optuna.distributions.IntDistribution)
    assert (frozen.distributions["log2_block_m"].low, frozen.distributions["log2_block_m"].high) == (3, 6)
    assert p.config == {"block_m": 64, "block_n": 64, "block_k": 32, **PLAIN_CONFIG}   # real values
    grid = studies.make_sampler(_planned(MATMUL, trials=2, sampler="grid"))
    assert grid._search_space["log2_block_m"] == [3, 4, 5, 6]   # noqa: SLF001 - the grid Optuna builds


def test_warm_start_is_queued_first_in_order():
    params = (Param("v", (1, 2, 3, 4), "values"),)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    assert studies.enqueue_warm_start(study, params, [{"v": 3}, {"v": 9}, {"v": 1}, {"v": 3}], {"v": 2}) == 3
    asked = [study.ask() for _ in range(3)]
    assert [(t.number, studies.suggest(t, params)) for t in asked] == [(0, {"v": 3}), (1, {"v": 1}), (2, {"v": 2})]
    assert not studies.enqueue_warm_start(study, params, [{"v": 4}], {"v": 2})  # not in a study that has trials


def test_a_searcher_warm_starts_in_order_then_the_default():
    warm = [{"block_m": 16, "block_n": 32, "block_k": 8, **PLAIN_CONFIG},
            {"block_m": 8, "block_n": 8, "block_k": 8, **PLAIN_CONFIG}]
    searcher, _ = _searcher(_planned(MATMUL, trials=5), warm_start=warm)
    first = [searcher.ask() for _ in range(3)]
    assert [p.config for p in first] == [*warm, {"block_m": 64, "block_n": 64, "block_k": 32, **PLAIN_CONFIG}]
    assert [p.trial for p in first] == [0, 1, 2]


def test_warm_starts_come_before_a_default_the_space_leaves_out():
    planned = _planned({"block_m": {"values": [16, 32]}, "block_n": {"values": [64]}, "block_k": {"values": [32]},
                        **PLAIN}, trials=4)
    warm = [{"block_m": 32, "block_n": 64, "block_k": 32, **PLAIN_CONFIG}]
    searcher, _ = _searcher(planned, warm_start=warm)
    first, second, third = searcher.ask(), searcher.ask(), searcher.ask()
    assert (first.trial, first.config) == (0, warm[0])
    assert (second.trial, second.config["block_m"]) == (OUTSIDE_STUDY, 64)
    assert (third.trial, third.config["block_m"]) == (1, 16)


def test_warm_starts_the_space_leaves_out_are_measured_in_order_outside_the_study_once(tmp_path):
    """A bundle's configs that a narrower space leaves out (block_m 64 or 8, a constraint's
    refusal), but the kernel takes, are measured in their warm-start order as trials -2, -3, ...
    The sampler never hears of them; one the kernel refuses is dropped; a resume measures none
    twice and the one not yet logged still comes, before the sampler draws."""
    planned = _planned({"block_m": {"values": [16, 32]}, "block_n": {"values": [64]}, "block_k": {"values": [32]},
                        **PLAIN}, trials=6, constraints=["block_m != 32 or block_k != 32"])
    config = {"block_n": 64, "block_k": 32, **PLAIN_CONFIG}
    warm = [{**config, "block_m": 8}, {**config, "block_m": 16}, {**config, "block_m": 32},
            {**config, "block_m": 3 * 8, "split_k": 0}, {**config, "block_m": 8}]   # refused; a repeat
    searcher, answered = _searcher(planned, studies.storage(tmp_path), warm_start=warm)
    first, second = searcher.ask(), searcher.ask()
    assert [(first.trial, first.config), (second.trial, second.config)] == [
        (outside_trial(0), warm[0]), (0, warm[1])]
    log = [_ok(first, 3e-5), _ok(second, 2e-5)]
    for answer in log:
        searcher.tell(answer)
    third = searcher.ask()   # the constraint refuses block_m 32 with block_k 32: measured outside
    assert (third.trial, third.config) == (outside_trial(1), warm[2])
    assert [t.number for t in searcher.study.trials] == [0]   # the study holds only its own trial
    resumed, answered = _searcher(planned, studies.storage(tmp_path), warm_start=warm)
    resumed.replay(log)    # the driver died with the third in flight, not logged
    rest = []
    while (p := resumed.ask()) is not None:
        rest.append(p)
        resumed.tell(_ok(p))
    # then the default (block_m 64, off the space's values); the space's one valid config is measured
    assert [(p.trial, p.config["block_m"]) for p in rest] == [(outside_trial(1), 32), (OUTSIDE_STUDY, 64)]
    assert resumed.exhausted and not answered and resumed.asked == 4


def test_resume_from_the_log_measures_nothing_twice(tmp_path):
    planned = _planned(MATMUL, trials=6, sampler="grid")
    searcher, answered = _searcher(planned, studies.storage(tmp_path))
    a, b, c = searcher.ask(), searcher.ask(), searcher.ask()
    log = [_ok(a)]                       # a was logged and told; b was logged, the driver died before telling
    searcher.tell(log[0])
    log.append(_ok(b))
    # c was in flight: not logged. A new driver opens the same journal and replays the log.
    resumed, answered = _searcher(planned, studies.storage(tmp_path))
    resumed.replay(log)
    states = {t.number: t.state for t in resumed.study.trials}
    assert states[b.trial] == optuna.trial.TrialState.COMPLETE and states[c.trial] == optuna.trial.TrialState.FAIL
    assert resumed.asked == 2 and set(resumed.measured) == {a.key, b.key}
    proposals = []
    while (p := resumed.ask()) is not None:
        proposals.append(p)
        resumed.tell(_ok(p))
    assert proposals[0].config == c.config              # the lost trial's config comes back first
    assert not {p.key for p in proposals} & {a.key, b.key}
    assert len({p.key for p in proposals}) == len(proposals) == 4
    assert resumed.asked == 6 and not answered


def test_pow2_spaces_load_as_in_the_repository():
    planned = expand([load_space("search_spaces/softmax.yaml")], ["interpret"], 3)[0]
    searcher, _ = _searcher(planned)
    p = searcher.ask()
    assert p.config == {"block_rows": 8, "strategy": "one_pass", "block_cols": 128}


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid", "pattern", "hybrid"])
def test_every_sampler_spends_the_budget(sampler):
    searcher, answered = _searcher(_planned(MATMUL, trials=8, sampler=sampler))
    count = 0
    while (p := searcher.ask()) is not None:
        count += 1
        searcher.tell(_ok(p))
    assert count + sum(a.outcome == outcomes.CACHED for a in answered) == 8


@pytest.mark.parametrize("sampler", ["grid", "tpe", "pattern"])
def test_resume_completes_a_trial_killed_while_its_knobs_were_drawn(tmp_path, sampler):
    planned = _planned({"block_m": {"pow2": [32, 64]}, "block_n": {"pow2": [32, 64]}, "block_k": {"values": [32]},
                        **PLAIN}, trials=4, sampler=sampler)
    searcher, _ = _searcher(planned, studies.storage(tmp_path))
    first = searcher.ask()
    searcher.tell(_ok(first))
    torn = searcher.study.ask()                       # the driver died after drawing one knob of four
    drawn = torn.suggest_int("log2_block_m", 5, 6)
    resumed, answered = _searcher(planned, studies.storage(tmp_path))
    resumed.replay([_ok(first)])
    assert resumed.study.trials[torn.number].state == optuna.trial.TrialState.FAIL
    proposals = []
    while (p := resumed.ask()) is not None:
        proposals.append(p)
        resumed.tell(_ok(p))
    assert proposals[0].config["block_m"] == 1 << drawn
    keys = [first.key, *(p.key for p in proposals)]
    assert len(keys) == len(set(keys))
    if sampler == "grid":   # the grid point of the torn trial is measured, so the whole grid is
        assert len(keys) == 4 and not answered


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid", "pattern", "hybrid"])
def test_an_enumerable_space_wastes_no_draw(sampler):
    """Every ask is a valid config not yet measured (no invalid, pruned or cached answers), until
    every valid config is measured; then the searcher stops, whatever budget is left."""
    planned = _planned(MATMUL, trials=200, constraints=["block_m * block_n <= 32 * 64"], sampler=sampler)
    searcher, answered = _searcher(planned)
    assert searcher.valid_set is not None
    proposals = []
    while (p := searcher.ask()) is not None:
        proposals.append(p)
        searcher.tell(_ok(p, median=1e-6 * (p.config["block_m"] + p.config["block_k"])))
    assert not [a for a in answered if a.outcome in (outcomes.INVALID, outcomes.PRUNED, outcomes.CACHED)]
    # The kernel's default breaks this space's constraint: measured first, outside the study.
    default, *drawn = proposals
    assert (default.trial, default.config) == (OUTSIDE_STUDY, {"block_m": 64, "block_n": 64, "block_k": 32,
                                                               **PLAIN_CONFIG})
    keys = [p.key for p in drawn]
    assert len(set(keys)) == len(keys) == len(searcher.valid_set) and searcher.exhausted
    assert all(p.config["block_m"] * p.config["block_n"] <= 32 * 64 for p in drawn)


def test_shipped_space_tasks_waste_at_most_a_tenth_of_their_asks():
    """A real task of a shipped space, TPE, a budget smaller than its valid set."""
    planned = expand([load_space("search_spaces/softmax.yaml")], ["interpret"], 15)[0]
    searcher, answered = _searcher(planned)
    asks = 0
    while (p := searcher.ask()) is not None:
        asks += 1
        searcher.tell(_ok(p, median=1e-6 * p.config["block_rows"]))
    wasted = [a for a in answered if a.outcome in (outcomes.INVALID, outcomes.PRUNED, outcomes.CACHED)]
    assert asks == 15 and len(wasted) <= 0.1 * (asks + len(wasted))


def test_an_oom_prunes_larger_configs_once_each():
    measured, answered = _oom_at_16_or_more()
    # 16 ran out of memory first: 32 and 64 are never compiled, each answered pruned once.
    assert measured == {16: outcomes.OOM, 8: outcomes.OK}
    assert sorted(json.loads(a.config)["block_rows"] for a in answered) == [32, 64]
    assert all(a.outcome == outcomes.PRUNED for a in answered)


def test_the_run_journal_is_optunas_journal_format(tmp_path):
    # The sweep writes the journal without Optuna's lock and fsync; Optuna's own backend reads it,
    # and what Optuna writes there reads back (one writer at a time).
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    ours = optuna.create_study(storage=studies.storage(tmp_path), study_name="s")
    trial = ours.ask()
    trial.suggest_int("x", 0, 4)
    trial.set_user_attr("outcome", "ok")
    ours.tell(trial, 1.0)
    theirs = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(
        str(tmp_path / studies.JOURNAL))))
    assert [(t.params, t.user_attrs, t.value) for t in theirs.trials] == [(trial.params, {"outcome": "ok"}, 1.0)]
    theirs.tell(theirs.ask(), 2.0)
    assert [t.value for t in optuna.load_study(study_name="s", storage=studies.storage(tmp_path)).trials] == [1.0, 2.0]
    with open(tmp_path / studies.JOURNAL, "a") as f:
        f.write('{"op_code": 5, "worker_id": "x"')      # a torn last line: `farm sweep --resume` cuts it first
    with pytest.raises(ValueError, match="torn"):
        studies.storage(tmp_path)


@pytest.mark.parametrize("breaker", [True, False])
def test_a_converged_sampler_does_not_spend_the_budget_on_repeats(rejection_sampling, monkeypatch, breaker):
    # TPE over a product it cannot enumerate, on a landscape with one clear best, soon draws the
    # best configs again; each repeat counts against the budget (answered from the cache). After a
    # repeat the searcher queues a random valid config not yet measured, so at least half of the
    # budget measures new configs while the product has any left.
    if not breaker:
        monkeypatch.setattr("farm.search.searcher.REPEAT_STREAK", 10**9)
    wide = {name: {"pow2": [8, 512]} for name in ("block_m", "block_n", "block_k")} | {**PLAIN}
    # the shipped spaces' preference: tiles under twice their dimension (any tile is legal, padded)
    tiles = ["block_m < max(2 * m, 128) and block_n < max(2 * n, 128) and block_k < max(2 * k, 128)"]
    searcher, answered = _searcher(_planned(wide, trials=80, constraints=tiles))
    proposals = []
    while (p := searcher.ask()) is not None:
        proposals.append(p)
        distance = sum(abs(p.config[k].bit_length() - 6) for k in ("block_m", "block_n", "block_k"))
        searcher.tell(_ok(p, median=1e-4 * (1 + distance)))
    repeats = sum(a.outcome == outcomes.CACHED for a in answered)
    assert len({p.key for p in proposals}) == len(proposals)
    assert len(proposals) + repeats == searcher.asked == 80
    print(f"breaker={breaker}: {len(proposals)} measured, {repeats} repeats")
    assert (len(proposals) >= 40) == breaker, (len(proposals), repeats)
