"""The sweep's task scheduler (`farm.run.schedule`) over real searchers (Optuna, in memory)."""
from __future__ import annotations

from collections import Counter

import optuna

from farm.measure import outcomes
from farm.run import schedule
from farm.search.plan import expand
from farm.search.searcher import Answer, Searcher
from farm.search.spaces import parse_space

BLOCKS = {"block_m": {"pow2": [8, 256]}, "block_n": {"pow2": [8, 256]}, "block_k": {"pow2": [8, 256]},
          "group_m": {"values": [1]}}


def _searcher(shape: list[int]) -> Searcher:
    space = parse_space({"kernel": "matmul", "dtypes": ["float32"], "shapes": [shape], "targets": ["interpret"],
                         "params": BLOCKS, "sampler": "random", "trials": 200}, "inline.yaml")
    return Searcher.open(expand([space])[0], optuna.storages.InMemoryStorage())


def test_equal_weights_are_round_robin_and_a_stalled_task_gets_a_quarter_of_the_turns():
    improving, flat = _searcher([256, 256, 256]), _searcher([256, 256, 512])
    scheduler = schedule.StrideScheduler([improving, flat])
    turns: list[str] = []
    for _ in range(140):
        searcher, proposal = scheduler.next()
        n = sum(1 for t in turns if t == searcher.key)
        median = 0.97 ** n if searcher is improving else 1.0   # 3% better every time, or never better
        searcher.tell(Answer(proposal.trial, proposal.key, outcomes.OK, median_s=median))
        turns.append(searcher.key)
    # Until the flat task has STALL_TRIALS ok configs past its first, the two alternate.
    head = 2 * (schedule.STALL_TRIALS + 1)
    assert all(turns[i] != turns[i + 1] for i in range(head - 1))
    assert not improving.stalled(schedule.STALL_TRIALS, schedule.STALL_GAIN)
    assert flat.stalled(schedule.STALL_TRIALS, schedule.STALL_GAIN)
    # Then the improving task gets 1 / STALLED_WEIGHT = 4 turns to the stalled one's 1.
    tail = Counter(turns[head + 10:])
    assert tail[flat.key] > 0 and 3.5 * tail[flat.key] <= tail[improving.key] <= 4.5 * tail[flat.key], tail


def test_a_task_with_nothing_to_propose_gives_its_turn_away():
    done, busy = _searcher([256, 256, 256]), _searcher([256, 256, 512])
    done.stop()
    scheduler = schedule.StrideScheduler([done, busy])
    for _ in range(5):
        searcher, proposal = scheduler.next()
        assert searcher is busy
        searcher.tell(Answer(proposal.trial, proposal.key, outcomes.OK, median_s=1.0))
    busy.stop()
    assert scheduler.next() is None


def test_stalled_compares_the_last_trials_with_the_best_before_them():
    s = _searcher([256, 256, 256])
    for median in [1.0, 0.5] + [0.499] * 4:
        p = s.ask()
        s.tell(Answer(p.trial, p.key, outcomes.OK, median_s=median))
    assert s.stalled(4, 0.01)            # 0.499 is 0.2% better than 0.5
    assert not s.stalled(5, 0.01)        # the 0.5 beat 1.0 within the last 5
    assert not s.stalled(6, 0.01)        # no best before the last 6
