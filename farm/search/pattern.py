"""Pattern search over a task's valid configs: propose open neighbours of the best configs so far.

In the style of Helion's `PatternSearch` (helion/autotuner/pattern_search.py): start from the
default config and a few random ones, then try single-knob moves around the best few configs
(an ordered knob one step up or down among its choices, a categorical knob swapped), and when
nothing near them is left, explore elsewhere. Helion measures a whole generation of neighbours
and then moves; here every ask is answered from what is known at that moment, so a sweep with
many proposals in flight keeps proposing: the best configs measured so far are the anchors,
and while fewer than `COPIES` are measured the proposals in flight (the default first) fill in.

A neighbour is an open valid config at most `RADIUS` steps away: each ordered knob counts its
steps among its choices, each changed categorical knob one. Two steps reach coupled moves that
one step cannot (a strategy swapped together with the block size it needs). Nearer neighbours
come first, then better anchors; ties are broken by the seeded generator, so a seed repeats.
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
    """The configs to search around: the best `copies` measured, best first, padded with the
    proposals in flight (oldest first) while fewer are measured."""
    names = {studies.optuna_name(p) for p in valid.params}
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
    done.sort(key=lambda t: (t.value, t.number))
    chosen = [t.params for t in done[:copies]]
    if len(chosen) < copies:
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        chosen += [t.params for t in running if set(t.params) == names][:copies - len(chosen)]
    return [studies.from_optuna(params, valid.params) for params in chosen]


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


def propose(study: optuna.Study, trial: optuna.trial.FrozenTrial, valid: ValidSet,
            rng: random.Random) -> dict[str, Any] | None:
    """Pattern search's next config: random during start-up, then a neighbour of the anchors,
    else None (the caller explores: a random open config, or TPE's)."""
    if trial.number <= STARTUP:
        return valid.pick(rng)
    return neighbour(valid, anchors(study, valid), rng)
