"""``kind: sklearn``: any scikit-learn estimator class or factory, by import path
(``estimator:``). Categoricals are one-hot encoded in a pipeline, missing numbers filled
with the training medians; stored as scikit-learn's pickle."""

from __future__ import annotations

import contextlib
import functools
import json
from typing import Any

import numpy as np

from .base import (
    CLASSIFICATION,
    ModelKind,
    accepted_parameters,
    candidate_settings,
    filled_input,
    import_object,
)

_CHECKED: set[tuple[str, str]] = set()


def trusted_input(validated: bool = True) -> contextlib.AbstractContextManager:
    """Skip scikit-learn's per-call checks that raybricks has already made: the input is
    ``filled_input``'s (always finite) and, when ``validated``, the parameters were checked
    once per setting. On small segments these checks cost as much as the fit itself."""
    import sklearn

    return sklearn.config_context(assume_finite=True, skip_parameter_validation=validated)


def answer_array_sniffing() -> None:
    """scikit-learn 1.9+ asks narwhals, in every ``check_array`` and every feature-name
    check, whether its input is a dataframe or series of any installed library: about
    24 µs a call and several calls per fit, a quarter of a small segment's training
    time. For a plain numpy array (what raybricks passes) the answer is always no (and it
    has no feature names): answer that directly, and leave every other input to
    narwhals. Installed once per process; nothing where scikit-learn has no such check
    (before 1.9)."""
    from sklearn.utils import validation

    sniff = getattr(validation, "_nw_into_df_or_series", None)
    if sniff is None or hasattr(sniff, "__wrapped__"):
        return

    @functools.wraps(sniff)
    def into_df_or_series(x: Any) -> bool:
        return False if type(x) is np.ndarray else sniff(x)

    names = validation._get_feature_names

    @functools.wraps(names)
    def feature_names(x: Any) -> Any:
        return None if type(x) is np.ndarray else names(x)

    validation._nw_into_df_or_series = into_df_or_series
    validation._get_feature_names = feature_names


class SklearnKind(ModelKind):
    name = "sklearn"
    library = "scikit-learn"
    model_input = staticmethod(filled_input)

    @classmethod
    def predict_loaded(cls, model, features, meta) -> np.ndarray:
        with trusted_input(validated=False):
            return super().predict_loaded(model, features, meta)

    @classmethod
    def check_config(cls, candidate) -> None:
        if not candidate.estimator:
            raise ValueError(
                f"models[{candidate.name}] of kind sklearn needs estimator: an import path "
                "such as sklearn.linear_model.Ridge"
            )

    def warm_up(self) -> None:
        import sklearn.pipeline  # noqa: F401 - imported once per worker, not per fit

        import_object(self.candidate.estimator)
        answer_array_sniffing()

    def check(self) -> None:
        """The estimator imports, and (for a class) the fixed parameters and every value
        of the search space (lists value by value, ranges at both ends) pass
        scikit-learn's own validation."""
        from raybricks.errors import ConfigError

        candidate = self.candidate
        import_object(candidate.estimator)
        for setting in candidate_settings(candidate):
            try:
                self.check_parameters(setting)
            except Exception as exc:  # noqa: BLE001 - scikit-learn raises several types
                raise ConfigError(
                    f"models[{candidate.name}]: {setting} is not a valid setting of "
                    f"{candidate.estimator}: {exc}"
                ) from exc

    def check_parameters(self, params: dict[str, Any]) -> bool:
        """scikit-learn's parameter validation of one setting, once per setting; an invalid
        value raises scikit-learn's error. False when it cannot be checked up front (a
        factory, parameters that are not JSON): the fit then validates them itself."""
        factory = import_object(self.candidate.estimator)
        if not isinstance(factory, type):
            return False
        try:
            key = (self.candidate.estimator, json.dumps(params, sort_keys=True))
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

    def build(self, params: dict[str, Any], task: str, seed: int, threads: int,
              meta: dict[str, Any]) -> Any:
        """A fresh estimator for one setting (in a one-hot pipeline with categoricals)."""
        from raybricks.errors import ConfigError

        factory = import_object(self.candidate.estimator)
        accepted = accepted_parameters(factory)
        extra = {}
        if "random_state" in accepted and "random_state" not in params:
            extra["random_state"] = seed
        if "n_jobs" in accepted and "n_jobs" not in params and threads > 1:
            extra["n_jobs"] = threads  # one: its default (LogisticRegression warns of any)
        estimator = factory(**params, **extra)
        if task in CLASSIFICATION and not hasattr(estimator, "predict_proba"):
            raise ConfigError(
                f"models[{self.candidate.name}]: {self.candidate.estimator} has no "
                "predict_proba, which classification needs (pick a classifier, or "
                "probability=True)"
            )
        categorical = list(meta.get("categorical", {}))
        if not categorical:
            return estimator
        from sklearn.compose import ColumnTransformer
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import OneHotEncoder

        numeric = [c for c in meta["features"] if c not in categorical]
        encode = ColumnTransformer(
            [("numeric", "passthrough", numeric),
             ("categorical", OneHotEncoder(handle_unknown="ignore"), categorical)]
        )
        return make_pipeline(encode, estimator)

    def fit(self, params, X, y, task, seed, threads, meta) -> Any:
        estimator = self.build(params, task, seed, threads, meta)
        with trusted_input(self.check_parameters(params)):
            return estimator.fit(X, y)

    def predict(self, model, X, task) -> np.ndarray:
        with trusted_input():
            return super().predict(model, X, task)
