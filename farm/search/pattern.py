"""Pattern search over a task's valid configs: strides and neighbours around the best configs so far.

In the style of Helion's `PatternSearch` (helion/autotuner/pattern_search.py): start from the
default config and a few random ones, then try single-knob moves around the best few configs
(an ordered knob one step up or down among its choices, a categorical knob swapped), and when
nothing near them is left, explore elsewhere. Before the neighbours comes Hooke and Jeeves'
pattern move: one stride further along the way from a next-best config to the best, so that a
slope is followed in strides rather than steps (large block sizes several steps from the default).
Helion measures a whole generation of neighbours and then moves; here every ask is answered from
what is known at that moment, so a sweep with many proposals in flight keeps proposing. The
anchors are the best configs measured so far; until the first result comes back (the default's)
every proposal is random (searching around configs still in flight did worse in the replay).

A neighbour is an open valid config at most `RADIUS` steps away: each ordered knob counts its
steps among its choices, each changed categorical knob one. Two steps reach coupled moves that
one step cannot (a strategy swapped together with the block size it needs). Nearer neighbours
come first, then better anchors; ties are broken by the seeded generator, so a seed repeats.
Measured against TPE and random with `bench/search_strategies.py` (BENCHMARKS.md).
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna
from optuna.trial import TrialState

from farm.search import studies

if TYPE_CHECKING:
    from farm.search.valid_set import ValidSet

STARTUP = 4     # random configs after the queued ones (the default) before the moves begin
COPIES = 3      # how many of the best configs are searched around
RADIUS = 2      # how far (in steps) a neighbour may be


def anchors(study: optuna.Study, valid: ValidSet, copies: int = COPIES) -> list[dict[str, Any]]:
    """The configs to search around: the best `copies` measured so far, best first."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
    done.sort(key=lambda t: (t.value, t.number))
    return [studies.from_optuna(t.params, valid.params) for t in done[:copies]]


def neighbour(valid: ValidSet, around: Sequence[dict[str, Any]], rng: random.Random,
              radius: int = RADIUS) -> dict[str, Any] | None:
    """The nearest open config to one of `around` (within `radius` steps; at equal steps the
    earlier anchor), ties broken by `rng`; None when none is that near."""
    candidates = np.flatnonzero(valid.open)
    if not len(candidates) or not around:
        return None
    steps = np.stack([valid.steps(candidates, config) for config in around])   # anchors x candidates
    for distance in range(1, radius + 1):
        for row in steps:
            near = candidates[row == distance]
            if len(near):
                return valid.configs[int(near[rng.randrange(len(near))])]
    return None


def stride(valid: ValidSet, around: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Hooke and Jeeves' pattern move: the open config one stride past the best of `around`,
    coming from one of the others (the next best first); None when none is open."""
    for start in around[1:]:
        if (ahead := valid.beyond(start, around[0])) is not None:
            return ahead
    return None


def propose(study: optuna.Study, trial: optuna.trial.FrozenTrial, valid: ValidSet,
            rng: random.Random) -> dict[str, Any] | None:
    """Pattern search's next config: random during start-up, then a stride past the best config
    or a neighbour of the anchors, else None (the caller explores: a random open config, or TPE's)."""
    if trial.number <= STARTUP:
        return valid.pick(rng)
    around = anchors(study, valid)
    return stride(valid, around) or neighbour(valid, around, rng)
