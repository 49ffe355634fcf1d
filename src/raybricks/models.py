"""The catalogue of candidate kinds: build, fit, predict in memory, serialize, search.

Kinds: ``lightgbm`` and ``xgboost`` (their scikit-learn estimators, native categorical
support, stored in their native formats), ``sklearn`` (any estimator class or factory by
import path; categoricals one-hot encoded in a scikit-learn pipeline; pickled), and
``function`` (a user ``fit(X, y, params)`` returning a model with ``predict`` /
``predict_proba``; pickled). Libraries run with ``threads`` threads.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import itertools
import json
import math
import pickle
from typing import Any

import numpy as np

from raybricks.config import CandidateConfig, RangeSpace
from raybricks.errors import ConfigError
from raybricks.segmented_model import CLASSIFICATION, MemberModel

DEFAULT_TRIALS = 10


@functools.cache
def accepted_parameters(factory: Any) -> frozenset[str]:
    """The keyword parameters an estimator class or factory accepts (looked up once)."""
    try:
        return frozenset(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return frozenset()


@functools.cache
def import_object(path: str) -> Any:
    """Import ``package.module.name``; a clear ConfigError when it does not exist."""
    module_name, _, attribute = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"cannot import {path!r} ({exc}): give a full import path such as "
            "sklearn.linear_model.Ridge"
        ) from exc


def check_importable(candidate: CandidateConfig) -> None:
    """Fail before any cluster starts when a candidate's estimator or function is missing."""
    for path in (candidate.estimator, candidate.function):
        if path:
            import_object(path)


# --------------------------------------------------------------------------- search


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


# --------------------------------------------------------------------------- fitting


def build_estimator(
    candidate: CandidateConfig, params: dict[str, Any], task: str, seed: int, threads: int,
    categorical: list[str], numeric: list[str],
) -> Any:
    """A fresh, unfitted estimator for one setting of a candidate."""
    kind = candidate.kind
    classify = task in CLASSIFICATION
    if kind == "lightgbm":
        import lightgbm as lgb

        base = {"n_estimators": 100, "verbose": -1, "random_state": seed,
                "n_jobs": threads, "deterministic": True, "force_row_wise": True}
        cls = lgb.LGBMClassifier if classify else lgb.LGBMRegressor
        return cls(**(base | params))
    if kind == "xgboost":
        import xgboost as xgb

        base = {"n_estimators": 100, "tree_method": "hist", "enable_categorical": True,
                "random_state": seed, "n_jobs": threads, "verbosity": 0}
        cls = xgb.XGBClassifier if classify else xgb.XGBRegressor
        return cls(**(base | params))
    if kind == "sklearn":
        factory = import_object(candidate.estimator)
        accepted = accepted_parameters(factory)
        extra = {}
        if "random_state" in accepted and "random_state" not in params:
            extra["random_state"] = seed
        if "n_jobs" in accepted and "n_jobs" not in params:
            extra["n_jobs"] = threads
        estimator = factory(**params, **extra)
        if classify and not hasattr(estimator, "predict_proba"):
            raise ConfigError(
                f"models[{candidate.name}]: {candidate.estimator} has no predict_proba, "
                "which classification needs (pick a classifier, or probability=True)"
            )
        if categorical:
            from sklearn.compose import ColumnTransformer
            from sklearn.pipeline import make_pipeline
            from sklearn.preprocessing import OneHotEncoder

            encode = ColumnTransformer(
                [("numeric", "passthrough", numeric),
                 ("categorical", OneHotEncoder(handle_unknown="ignore"), categorical)]
            )
            return make_pipeline(encode, estimator)
        return estimator
    return None  # kind "function": the user's fit builds the model


def trusted_input(kind: str, validated: bool = True) -> contextlib.AbstractContextManager:
    """For ``sklearn`` candidates: skip scikit-learn's per-call checks that raybricks has
    already made. Their input is ``sklearn_input``'s (missing and infinite values filled
    with training medians, so always finite) and, when ``validated``, their parameters
    were checked once per setting by ``check_parameters``. On small segments these checks
    cost as much as the fit itself."""
    if kind != "sklearn":
        return contextlib.nullcontext()
    import sklearn

    return sklearn.config_context(assume_finite=True, skip_parameter_validation=validated)


_CHECKED: set[tuple[str, str]] = set()


def check_parameters(candidate: CandidateConfig, params: dict[str, Any]) -> bool:
    """scikit-learn's own parameter validation for one setting of an ``sklearn``
    estimator class, once per setting; an invalid value raises scikit-learn's error.
    False when it cannot be checked up front (a factory, parameters that are not JSON):
    the fit then validates them itself."""
    if candidate.kind != "sklearn":
        return False
    factory = import_object(candidate.estimator)
    if not isinstance(factory, type):
        return False
    try:
        key = (candidate.estimator, json.dumps(params, sort_keys=True))
    except TypeError:
        return False
    if key not in _CHECKED:
        validate = getattr(factory(**params), "_validate_params", None)
        if validate is None:
            return False
        validate()
        if len(_CHECKED) > 100_000:
            _CHECKED.clear()
        _CHECKED.add(key)
    return True


def check_candidate(candidate: CandidateConfig) -> None:
    """Before any cluster starts: the estimator or function imports, and for ``sklearn``
    estimator classes the fixed parameters and every value of the search space (lists
    value by value, ranges at both ends) pass scikit-learn's validation."""
    check_importable(candidate)
    if candidate.kind != "sklearn":
        return
    settings = [dict(candidate.params)]
    for name, space in candidate.search.items():
        values = space if isinstance(space, list) else [space.low, space.high]
        if isinstance(space, RangeSpace) and space.int:
            values = [int(round(v)) for v in values]
        settings += [candidate.params | {name: value} for value in values]
    for setting in settings:
        try:
            check_parameters(candidate, setting)
        except Exception as exc:  # noqa: BLE001 - scikit-learn raises several types
            raise ConfigError(
                f"models[{candidate.name}]: {setting} is not a valid setting of "
                f"{candidate.estimator}: {exc}"
            ) from exc


def fit(
    candidate: CandidateConfig, params: dict[str, Any], X: Any, y: np.ndarray,
    task: str, seed: int, threads: int, meta: dict[str, Any],
) -> Any:
    """Fit one setting of a candidate on its prepared input (``Prepared.rows``): the
    feature frame, or for ``sklearn`` the matrix of ``sklearn_input``."""
    if candidate.kind == "function":
        return import_object(candidate.function)(X, y, params)
    categorical = list(meta.get("categorical", {}))
    numeric = [c for c in meta["features"] if c not in categorical]
    estimator = build_estimator(candidate, params, task, seed, threads, categorical, numeric)
    with trusted_input(candidate.kind, check_parameters(candidate, params)):
        return estimator.fit(X, y)


def predict(kind: str, model: Any, X: Any, task: str) -> np.ndarray:
    """Predict with a fitted in-memory model: values, or class probabilities."""
    with trusted_input(kind):
        if task in CLASSIFICATION:
            return np.asarray(model.predict_proba(X), dtype="float64")
        return np.asarray(model.predict(X), dtype="float64").reshape(-1)


def serialize(kind: str, model: Any) -> bytes:
    """The model in its library's native format."""
    if kind == "lightgbm":
        return model.booster_.model_to_string().encode()
    if kind == "xgboost":
        return bytes(model.get_booster().save_raw("ubj"))
    return pickle.dumps(model, protocol=5)


def load(kind: str, payload: bytes, meta: dict[str, Any]) -> MemberModel:
    """Reload a stored model exactly as consumers of the registered model will."""
    return MemberModel(kind, payload, json.loads(json.dumps(meta)))
