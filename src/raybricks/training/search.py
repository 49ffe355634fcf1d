"""The parameter settings a candidate tries on a segment: a grid or seeded random draws."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from raybricks.config import CandidateConfig, RangeSpace

DEFAULT_TRIALS = 10


def trial_settings(candidate: CandidateConfig, seed: int) -> list[dict[str, Any]]:
    """The parameter settings to try: the full grid when the space is only lists and no
    ``trials`` cap is set, otherwise ``trials`` seeded random draws (without repeats
    where the grid is smaller)."""
    space = candidate.search
    if not space:
        return [dict(candidate.params)]
    names = list(space)
    only_lists = all(isinstance(space[n], list) for n in names)
    if only_lists:
        grid = [dict(zip(names, values, strict=True)) for values in
                itertools.product(*(space[n] for n in names))]
        if candidate.trials is None or candidate.trials >= len(grid):
            return [candidate.params | setting for setting in grid]
        rng = np.random.default_rng(seed)
        picks = rng.choice(len(grid), size=candidate.trials, replace=False)
        return [candidate.params | grid[i] for i in sorted(picks)]
    rng = np.random.default_rng(seed)
    trials = candidate.trials or DEFAULT_TRIALS
    return [
        candidate.params | {n: _draw(space[n], rng) for n in names} for _ in range(trials)
    ]


def _draw(space: list | RangeSpace, rng: np.random.Generator) -> Any:
    if isinstance(space, list):
        return space[int(rng.integers(len(space)))]
    if space.log:
        value = math.exp(rng.uniform(math.log(space.low), math.log(space.high)))
    else:
        value = rng.uniform(space.low, space.high)
    return int(round(value)) if space.int else float(value)
