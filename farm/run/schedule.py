"""Which task of a pool proposes the next trial: stride scheduling by how much each task improves.

A sweep that gives every task the same number of trials spends most of them on tasks that have
converged: in the H200 seed suite (28 tasks, 300 s) the memory-bound tasks were within 2% of
their best after 60-180 s, while matmuls with thousands of valid configs were still improving.
Each task has a weight: 1 while it improves, STALLED_WEIGHT once its last STALL_TRIALS `ok`
configs beat its earlier best by less than STALL_GAIN; a task's pass advances by 1 / weight per
trial, and the task with the lowest pass proposes next (ties in round-robin order). With equal
weights this is plain round robin; a stalled task still gets a quarter of the turns, and full
turns again as soon as it improves.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from farm.search.searcher import Proposal

STALL_TRIALS = 16      # ok configs without a gain before a task counts as stalled
STALL_GAIN = 0.01      # the gain (a fraction of the best before) that counts
STALLED_WEIGHT = 0.25  # a stalled task's share of turns, against 1 for an improving one


class Schedulable(Protocol):
    """What the scheduler needs of a task's searcher (`farm.search.searcher.Searcher` is one)."""

    @property
    def key(self) -> str: ...

    @property
    def wants_trials(self) -> bool: ...

    def ask(self) -> Proposal | None: ...

    def stalled(self, trials: int, gain: float) -> bool: ...


S = TypeVar("S", bound=Schedulable)


class StrideScheduler(Generic[S]):
    """Turns for the tasks of one pool, in proportion to their weights."""

    def __init__(self, searchers: Iterable[S]) -> None:
        self._order = list(searchers)               # round-robin order, for ties
        self._pass = {s.key: 0.0 for s in self._order}

    def weight(self, searcher: Schedulable) -> float:
        """1 while the task improves, STALLED_WEIGHT once it has stalled."""
        return STALLED_WEIGHT if searcher.stalled(STALL_TRIALS, STALL_GAIN) else 1.0

    def next(self) -> tuple[S, Proposal] | None:
        """The task whose turn it is and its proposal; None when no task has one now."""
        for searcher in sorted(self._order, key=lambda s: self._pass[s.key]):   # stable: ties round robin
            if not searcher.wants_trials:
                continue
            proposal = searcher.ask()
            if proposal is None:
                continue
            self._pass[searcher.key] += 1.0 / self.weight(searcher)
            self._order.remove(searcher)
            self._order.append(searcher)
            return searcher, proposal
        return None
