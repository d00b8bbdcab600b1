"""The pattern search strategy (a mode of the valid-set sampler) and the tabular replay benchmark,
with the real Searcher and the real Optuna; no Ray."""
from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter, deque
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest

from bench import search_strategies
from farm.bundle.records import TrialRecord
from farm.cli import options
from farm.measure import outcomes
from farm.run import runlog
from farm.search import pattern
from farm.search.plan import PlannedTask, expand
from farm.search.searcher import OUTSIDE_STUDY, Answer, Proposal, Searcher
from farm.search.space_parts import Param
from farm.search.spaces import parse_space
from farm.search.valid_set import ValidSet
from farm.tasks import config_json

KNOBS = {"block_m": {"pow2": [8, 64]}, "block_n": {"pow2": [8, 64]}, "block_k": {"pow2": [8, 64]},
         "group_m": {"values": [1, 4]}}
BEST = {"block_m": 16, "block_n": 32, "block_k": 16, "group_m": 4}


def _planned(sampler: str = "pattern", trials: int = 200) -> PlannedTask:
    space = parse_space({"kernel": "matmul", "dtypes": ["float32"], "shapes": [[64, 64, 64]],
                         "targets": ["interpret"], "params": KNOBS, "sampler": sampler, "trials": trials,
                         "constraints": ["block_m * block_n <= 32 * 64"]}, "inline.yaml")
    return expand([space])[0]


def _cost(config: dict[str, Any]) -> float:
    """A bowl with its bottom at BEST: the further (in steps of a power of two), the slower."""
    steps = sum(abs(config[k].bit_length() - BEST[k].bit_length()) for k in ("block_m", "block_n", "block_k"))
    return 1e-5 * (1 + steps + (config["group_m"] != BEST["group_m"]))


def _sweep(sampler: str, seed: int, in_flight: int) -> tuple[Searcher, list[Proposal], list[list[dict]]]:
    """Every proposal of a replayed sweep over the bowl, `in_flight` answered oldest first, and
    for each proposal the configs measured (told) before it was asked."""
    searcher = Searcher.open(_planned(sampler), optuna.storages.InMemoryStorage(), seed=seed)
    proposals, known, told, pending = [], [], [], deque()
    while True:
        while len(pending) < in_flight and (p := searcher.ask()) is not None:
            pending.append(p)
            proposals.append(p)
            known.append(list(told))
        if not pending:
            return searcher, proposals, known
        p = pending.popleft()
        searcher.tell(Answer(p.trial, p.key, outcomes.OK, median_s=_cost(p.config)))
        told.append(p.config)


@pytest.mark.parametrize("sampler", ["pattern", "hybrid"])
def test_pattern_proposes_every_open_valid_config_once_with_many_in_flight(sampler):
    searcher, proposals, _ = _sweep(sampler, seed=0, in_flight=16)
    default, *drawn = proposals    # the kernel's default breaks the constraint: measured outside the study
    assert default.trial == OUTSIDE_STUDY and default.config["block_m"] * default.config["block_n"] > 32 * 64
    keys = [p.key for p in drawn]
    assert searcher.valid_set is not None and searcher.exhausted
    assert len(set(keys)) == len(keys) == len(searcher.valid_set)          # never twice, every valid config
    assert set(keys) == set(searcher.valid_set.keys)
    assert all(p.config["block_m"] * p.config["block_n"] <= 32 * 64 for p in drawn)


def test_pattern_repeats_for_a_seed():
    first = [p.key for p in _sweep("pattern", seed=3, in_flight=4)[1]]
    assert first == [p.key for p in _sweep("pattern", seed=3, in_flight=4)[1]]
    assert first != [p.key for p in _sweep("pattern", seed=4, in_flight=4)[1]]
    hybrid = [p.key for p in _sweep("hybrid", seed=3, in_flight=4)[1]]
    start = pattern.STARTUP + 1        # the default and the random start-up, then TPE every other proposal
    assert hybrid[:start] == first[:start] and hybrid != first


def test_pattern_strides_then_searches_around_the_best_configs_measured():
    """One at a time, so the test knows what was open at each ask: after the start-up, a proposal
    is the stride past the best config when that is open, else a neighbour of one of the best
    configs measured when one is open, else a random open config."""
    searcher, proposals, known = _sweep("pattern", seed=1, in_flight=1)
    replica = ValidSet(searcher.valid_set.configs, searcher.valid_set.params)
    kinds = Counter()
    for p, before in zip(proposals, known):
        if p.trial > pattern.STARTUP:
            anchors = sorted(before, key=_cost)[:pattern.COPIES]      # ties: the earlier trial first
            ahead = pattern.stride(replica, anchors)
            open_near = [c for c in replica.configs if replica.open[replica.index[config_json(c)]]
                         and _nearest(replica, c, anchors) <= pattern.RADIUS]
            if ahead is not None:
                assert p.config == ahead
                kinds["stride"] += 1
            elif open_near:
                assert _nearest(replica, p.config, anchors) <= pattern.RADIUS
                kinds["neighbour"] += 1
        replica.close(p.key)
    assert kinds["stride"] >= 1 and kinds["neighbour"] >= 10
    found = next(i for i, p in enumerate(proposals) if p.config == BEST)
    assert found < len(proposals) // 4        # the bowl's bottom, well before a quarter of its configs


def test_a_stride_follows_the_slope_within_the_choices():
    valid = ValidSet.enumerate(GRID, lambda c: True)
    assert valid.beyond({"block": 16, "strategy": "a"}, {"block": 32, "strategy": "b"}) == {"block": 64, "strategy": "b"}
    assert valid.beyond({"block": 8, "strategy": "a"}, {"block": 64, "strategy": "a"}) == {"block": 512, "strategy": "a"}
    valid.close(config_json({"block": 512, "strategy": "a"}))     # measured: the end of the choices is as far as it goes
    assert valid.beyond({"block": 64, "strategy": "a"}, {"block": 512, "strategy": "a"}) is None
    valid.close(config_json({"block": 64, "strategy": "b"}))
    assert valid.beyond({"block": 16, "strategy": "a"}, {"block": 32, "strategy": "b"}) is None    # not open


def _nearest(valid: ValidSet, config: dict[str, Any], anchors: list[dict[str, Any]]) -> int:
    """Steps from `config` to the nearest of `anchors`."""
    return int(valid.steps(np.array([valid.index[config_json(a)] for a in anchors]), config).min())


GRID = (Param("block", (8, 16, 32, 64, 128, 256, 512), "pow2"), Param("strategy", ("a", "b", "c"), "values"))


def test_neighbours_are_nearest_first_then_better_anchors_then_none():
    valid = ValidSet.enumerate(GRID, lambda c: not (c["strategy"] == "c" and c["block"] == 8))
    rng = random.Random(0)
    around = [{"block": 16, "strategy": "a"}, {"block": 64, "strategy": "c"}]
    valid.close(config_json(around[0]))
    valid.close(config_json(around[1]))
    first_steps = {config_json(c) for c in valid.configs if _nearest(valid, c, around[:1]) == 1}
    taken = []
    while (c := pattern.neighbour(valid, around, rng)) is not None:
        taken.append(c)
        valid.close(config_json(c))
    distances = [min(_nearest(valid, c, [a]) for a in around) for c in taken]
    assert {config_json(c) for c in taken[:len(first_steps)]} == first_steps   # the best anchor's next steps first
    assert distances == sorted(distances) and max(distances) <= pattern.RADIUS
    far = [c for c in valid.configs if valid.open[valid.index[config_json(c)]]]
    assert far and all(_nearest(valid, c, around) > pattern.RADIUS for c in far)


def test_pattern_and_hybrid_are_sampler_names():
    assert _planned("hybrid").space.sampler.name == "hybrid"
    args = options.build_parser().parse_args(["sweep", "x.yaml", "--sampler", "pattern"])
    assert args.sampler == "pattern"


# -- the replay benchmark ------------------------------------------------------------------------
@dataclasses.dataclass
class _Settings:
    sampler: str = "grid"


def _table(tmp_path: Path) -> Path:
    """A run folder that measured every valid config of the bowl (one compile error, the best)."""
    planned = _planned("grid", trials=8)
    valid = Searcher.open(planned, optuna.storages.InMemoryStorage()).valid_set
    run = tmp_path / "run"
    run.mkdir()
    runlog.save_run(run, [planned], _Settings())
    lines = []
    for i, config in enumerate(valid.configs):
        broken = config == {**BEST, "group_m": 1}
        record = TrialRecord.for_task(planned.task, i, config_json(config),
                                      outcomes.COMPILE_ERROR if broken else outcomes.OK,
                                      median_s=None if broken else _cost(config), elapsed_s=0.5 * (i + 1))
        lines.append(json.dumps(record.to_dict()))
    (run / runlog.TRIALS_LOG).write_text("\n".join(lines) + "\n")
    return run


def test_the_replay_benchmark_reports_every_strategy(tmp_path):
    run = _table(tmp_path)
    (table,), rate = search_strategies.load(run)
    assert table.missing == 0 and table.valid == len(table.answers) and table.best_s == _cost(BEST)
    assert rate == pytest.approx(2.0)
    rows = search_strategies.main([str(run), "--seeds", "2", "--in-flight", "4", "--out", str(tmp_path / "out")])
    report = json.loads((tmp_path / "out" / "search_strategies.json").read_text())
    assert {r["strategy"] for r in rows} == set(search_strategies.STRATEGIES)
    assert {(r["task"], r["strategy"]) for r in report["rows"]} == {
        (task, s) for task in (table.planned.task.key, "all tasks") for s in search_strategies.STRATEGIES}
    runs = report["runs"][table.planned.task.key]
    assert all(len(r) == 2 and all(n is None or 1 <= n <= 8 for n in r) for r in runs.values())
    for row in rows:
        assert row["median_trials"] is None or row["median_s"] == row["median_trials"] / 2.0
        if row["strategy"] == "tpe":     # the others are paired with it, seed by seed
            assert row["won"] is None and row["lost"] is None
        else:
            assert 0 <= row["won"] + row["lost"] <= row["seeds"]
    markdown = (tmp_path / "out" / "search_strategies.md").read_text()
    assert all(f"| {s} |" in markdown for s in search_strategies.STRATEGIES)


def test_a_replay_reaches_the_best_when_the_budget_covers_the_valid_set(tmp_path):
    (table,), _ = search_strategies.load(_table(tmp_path))
    for strategy in search_strategies.STRATEGIES:
        (tmp_path / strategy).mkdir()
        trials = search_strategies.replay(table, strategy, 0, in_flight=16, budget=table.valid, within=0.0,
                                          workdir=tmp_path / strategy)
        assert trials is not None and 1 <= trials <= table.valid


def test_a_replay_can_leave_the_default_out_of_the_space(tmp_path):
    # --default outside: the searcher measures the kernel's default first, outside the study (as a
    # user's space that does not list it gets it), then only what the sampler proposes.
    planned = _planned("pattern", trials=8)
    searcher = search_strategies.OutsideDefaultSearcher.open(planned, optuna.storages.InMemoryStorage())
    first = searcher.ask()
    assert first.trial == OUTSIDE_STUDY and not searcher.study.trials   # nothing queued in the study
    second = searcher.ask()
    assert second.trial == 0 and second.key != first.key
    (table,), _ = search_strategies.load(_table(tmp_path))
    (tmp_path / "w").mkdir()
    trials = search_strategies.replay(table, "pattern", 0, in_flight=1, budget=table.valid + 1, within=0.0,
                                      workdir=tmp_path / "w", default="outside")
    assert trials is not None and 1 <= trials <= table.valid + 1
    search_strategies.main([str(tmp_path / "run"), "--seeds", "1", "--strategies", "pattern", "--default",
                            "outside", "--out", str(tmp_path / "out")])
    assert json.loads((tmp_path / "out" / "search_strategies.json").read_text())["settings"]["default"] == "outside"


# -- the enumeration's bounds --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["matmul", "bmm", "broadcast_matmul"])
def test_a_product_over_the_limit_is_enumerated_when_its_checks_prune_it(repo, name):
    # The matmul family's Mosaic GPU tasks are products of 207,360 and 414,720 configs, over
    # ENUMERATION_LIMIT; the prefix checks leave 20-40k partial configs to check, so their
    # valid configs are enumerated (no wasted draws) rather than sampled with rejection.
    from farm.search import spaces, valid_set

    space = spaces.load_space(repo / "search_spaces" / f"{name}.yaml")
    target = "gpu-mosaic"
    (planned,) = [p for p in expand([space], [target]) if p.task.target == target]
    product = int(np.prod([len(p.choices) for p in space.params_for(target)]))
    assert product > valid_set.ENUMERATION_LIMIT
    found = Searcher.open(planned, optuna.storages.InMemoryStorage()).valid_set
    assert found is not None and len(found) > 1000
    shape, dtype = planned.task.shape, planned.task.dtype
    assert all(space.violated(c, shape, dtype, target) is None for c in found.configs[::97])


def test_a_walk_over_its_bounds_falls_back_to_rejection_sampling(monkeypatch):
    from farm.search import valid_set

    params = tuple(Param(f"k{i}", tuple(range(10)), "range") for i in range(6))   # a million configs
    every = lambda d: (lambda config: True)  # noqa: E731 - checks that prune nothing
    assert ValidSet.enumerate(params, lambda c: True, [every(d) for d in range(6)]) is None
    monkeypatch.setattr(valid_set, "ENUMERATION_LIMIT", 10 ** 4)
    below = [every(d) if d < 2 else (lambda config: config["k2"] == 0) for d in range(6)]
    assert ValidSet.enumerate(params, lambda c: True, below) is None   # 10^5 whole configs under k2 = 0
    monkeypatch.setattr(valid_set, "ENUMERATION_LIMIT", 10 ** 5)
    assert len(ValidSet.enumerate(params, lambda c: True, below)) == 10 ** 5
    small = [every(0)] + [lambda config, d=d: config[f"k{d}"] == 0 for d in range(1, 6)]
    assert len(ValidSet.enumerate(params, lambda c: True, small)) == 10   # a million, pruned to 10
    monkeypatch.setattr(valid_set, "PREFIX_CHECK_LIMIT", 50)
    assert ValidSet.enumerate(params, lambda c: True, small) is None       # 60 partial checks: over 50
    # A product within ENUMERATION_LIMIT is enumerated whatever its partial checks cost, as before.
    tiny = tuple(Param(f"k{i}", tuple(range(10)), "range") for i in range(3))
    assert len(ValidSet.enumerate(tiny, lambda c: True, [every(d) for d in range(3)])) == 1000


def test_a_replay_warm_started_from_a_neighbours_best_measures_it_first(tmp_path):
    """`--warm-start nearest`: a task's seed is the best config of a task at a nearby shape (here
    the table's own best, tuned at 32 x 64 x 64: what `farm sweep --warm-start` would queue)."""
    (table,), _ = search_strategies.load(_table(tmp_path))
    neighbour = dataclasses.replace(table, planned=dataclasses.replace(
        table.planned, task=dataclasses.replace(table.planned.task, shape=(32, 64, 64))))
    assert search_strategies.nearest_warm_starts([table, neighbour])[table.planned.task.key] == (BEST,)
    for strategy in search_strategies.STRATEGIES:
        (tmp_path / strategy).mkdir()
        assert search_strategies.replay(table, strategy, 0, in_flight=4, within=0.0, workdir=tmp_path / strategy,
                                        warm_start=[BEST]) == 1
