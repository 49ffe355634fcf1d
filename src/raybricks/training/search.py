"""The parameter settings a candidate tries on a segment: a grid, seeded random draws, or a
sequential Bayesian search (Optuna's TPE sampler, ``search_method: bayes``)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from raybricks import metrics
from raybricks.config import CandidateConfig, RangeSpace, missing_optuna
from raybricks.training.selection import Evaluation

DEFAULT_TRIALS = 10


def method_of(candidate: CandidateConfig) -> str:
    """How the candidate's space is searched: ``none`` (no space), ``grid``, ``random`` or
    ``bayes``. Unset, the full grid when the space is only lists and no ``trials`` cap is
    set, random draws otherwise."""
    space = candidate.search
    if not space:
        return "none"
    if candidate.search_method:
        return candidate.search_method
    only_lists = all(isinstance(v, list) for v in space.values())
    return "grid" if only_lists and candidate.trials is None else "random"


def sequential(candidate: CandidateConfig) -> bool:
    """Whether each setting depends on the scores of the previous ones (bayes): the
    settings cannot be made up front, and the search runs in one process."""
    return method_of(candidate) == "bayes"


def trial_settings(candidate: CandidateConfig, seed: int) -> list[dict[str, Any]]:
    """The parameter settings to try, made up front (grid or random; a bayes search has
    none: see ``search_best``): the full grid, or ``trials`` seeded random draws (of the
    grid without repeats when the space is only lists)."""
    method = method_of(candidate)
    if method == "none":
        return [dict(candidate.params)]
    if method == "bayes":
        raise ValueError(f"models[{candidate.name}] searches sequentially (bayes): its "
                         "settings follow the scores; use search_best")
    space = candidate.search
    names = list(space)
    trials = candidate.trials or DEFAULT_TRIALS
    if all(isinstance(space[n], list) for n in names):
        grid = [dict(zip(names, values, strict=True)) for values in
                itertools.product(*(space[n] for n in names))]
        if method == "grid" or trials >= len(grid):
            return [candidate.params | setting for setting in grid]
        rng = np.random.default_rng(seed)
        picks = rng.choice(len(grid), size=trials, replace=False)
        return [candidate.params | grid[i] for i in sorted(picks)]
    rng = np.random.default_rng(seed)
    return [
        candidate.params | {n: _draw(space[n], rng) for n in names} for _ in range(trials)
    ]


def spread_settings(candidate: CandidateConfig, seed: int) -> list[dict[str, Any] | None]:
    """What the spread path fits on separate Ray tasks: each setting, or, for a sequential
    (bayes) search, the whole search on one task (``None``: the candidate as configured)."""
    return [None] if sequential(candidate) else trial_settings(candidate, seed)


def _draw(space: list | RangeSpace, rng: np.random.Generator) -> Any:
    if isinstance(space, list):
        return space[int(rng.integers(len(space)))]
    if space.log:
        value = math.exp(rng.uniform(math.log(space.low), math.log(space.high)))
    else:
        value = rng.uniform(space.low, space.high)
    return int(round(value)) if space.int else float(value)


def search_best(candidate: CandidateConfig, seed: int, metric_name: str,
                fit: Callable[[dict[str, Any]], Evaluation]) -> Evaluation:
    """Fit and score the candidate's settings with ``fit`` (an exception: that setting
    failed) and keep the best by the metric. Grid and random settings are made up front;
    bayes asks Optuna's TPE sampler (seeded with ``seed``) for each of ``trials`` settings
    in turn, telling it each score before asking for the next."""
    metric = metrics.metric(metric_name)
    best, errors = Evaluation(candidate), []

    def score(params: dict[str, Any]) -> float | None:
        nonlocal best
        try:
            found = fit(params)
        except Exception as exc:  # noqa: BLE001 - one bad setting must not stop the segment
            errors.append(f"{type(exc).__name__}: {exc}")
            return None
        loss = metric.loss(found.value)
        if best.params is None or loss < metric.loss(best.value):
            best = found
        return loss

    if sequential(candidate):
        _bayes(candidate, seed, score)
    else:
        for params in trial_settings(candidate, seed):
            score(params)
    if best.params is None:
        best.error = "; ".join(dict.fromkeys(errors)) or "no setting could be fitted"
    return best


def first_setting(candidate: CandidateConfig, seed: int) -> dict[str, Any]:
    """The candidate's first setting (the one model a global model fits): the grid's
    first, the first random draw, or the first setting a seeded bayes search asks."""
    if not sequential(candidate):
        return trial_settings(candidate, seed)[0]
    optuna = import_optuna(candidate)
    study = optuna.create_study(direction="minimize", sampler=bayes_sampler(candidate, seed))
    return suggest(study.ask(), candidate)


def startup_trials(trials: int) -> int:
    """TPE's random settings before it models the scores: a third of the trials, 2 to 10
    (Optuna's default, 10, would leave a 10-trial search all random)."""
    return max(2, min(10, trials // 3))


def bayes_sampler(candidate: CandidateConfig, seed: int):
    """Optuna's TPE sampler for the candidate, seeded; Optuna's logging silenced."""
    optuna = import_optuna(candidate)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = candidate.trials or DEFAULT_TRIALS
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials(trials))


def suggest(trial: Any, candidate: CandidateConfig) -> dict[str, Any]:
    """The candidate's parameters for an Optuna trial: lists are categorical (by
    position, so any values work), ranges float or int, on a log scale with ``log``."""
    setting = {}
    for name, space in candidate.search.items():
        if isinstance(space, list):
            setting[name] = space[trial.suggest_categorical(name, list(range(len(space))))]
        elif space.int:
            low = max(int(round(space.low)), 1 if space.log else -math.inf)
            high = max(int(round(space.high)), low)
            setting[name] = trial.suggest_int(name, low, high, log=space.log)
        else:
            setting[name] = trial.suggest_float(name, space.low, space.high, log=space.log)
    return candidate.params | setting


def _bayes(candidate: CandidateConfig, seed: int,
           score: Callable[[dict[str, Any]], float | None]) -> None:
    """``trials`` settings asked of a seeded TPE study one at a time, each told its loss
    (a failed or non-finite one as a failed trial) before the next is asked."""
    optuna = import_optuna(candidate)
    study = optuna.create_study(direction="minimize", sampler=bayes_sampler(candidate, seed))
    for _ in range(candidate.trials or DEFAULT_TRIALS):
        trial = study.ask()
        loss = score(suggest(trial, candidate))
        if loss is None or not math.isfinite(loss):
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, loss)


def import_optuna(candidate: CandidateConfig):
    """Optuna, or the error that names the extra to install."""
    try:
        import optuna
    except ImportError as exc:
        raise ImportError(missing_optuna(candidate.name)) from exc
    return optuna
