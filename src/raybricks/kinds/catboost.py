"""``kind: catboost``: CatBoost's regressor and classifier, with CatBoost's own handling
of categorical features (ordered target statistics) and missing numbers; stored in
CatBoost's binary format. Not on Databricks Runtime ML: install ``raybricks[catboost]``
(the registered model then requires ``catboost``)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pandas as pd

from .base import CLASSIFICATION, ModelKind, unknown_parameters

#: Parameters that each set the number of trees (CatBoost refuses two of them).
ROUNDS = ("iterations", "n_estimators", "num_boost_round", "num_trees")
MISSING_CATEGORY = "__missing__"


def catboost_input(features: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """Categoricals as strings (CatBoost takes no missing category); numbers as they are
    (CatBoost treats NaN as missing)."""
    categorical = [c for c in meta.get("categorical", {}) if c in features.columns]
    if not categorical:
        return features
    as_text = {c: features[c].astype(object).where(features[c].notna(), MISSING_CATEGORY)
               .astype(str) for c in categorical}
    return features.assign(**as_text)


class CatBoostKind(ModelKind):
    name = "catboost"
    absolute_error = {"loss_function": "MAE"}
    library = "catboost"
    extra = "catboost"
    model_input = staticmethod(catboost_input)

    @classmethod
    def load(cls, payload: bytes, meta: dict[str, Any]) -> Any:
        import catboost

        model_class = (catboost.CatBoostClassifier if meta["task"] in CLASSIFICATION
                       else catboost.CatBoostRegressor)
        return model_class().load_model(blob=payload)

    def warm_up(self) -> None:
        import catboost  # noqa: F401

    def check(self) -> None:
        """Every name in the candidate's params and search is an argument of CatBoost's
        estimators (else each segment's fit would fail with a TypeError)."""
        import inspect

        import catboost

        names = set()
        for estimator in (catboost.CatBoostRegressor, catboost.CatBoostClassifier):
            names |= set(inspect.signature(estimator.__init__).parameters) - {"self"}
        given = set(self.candidate.params) | set(self.candidate.search)
        if given - names:
            raise unknown_parameters(self.candidate, given - names, names, "CatBoost",
                                     "https://catboost.ai/docs/en/references/training-parameters/")

    def fit(self, params, X, y, task, seed, threads, meta) -> Any:
        import catboost

        base = {"verbose": False, "allow_writing_files": False, "random_seed": seed,
                "thread_count": threads}
        if not any(name in params for name in ROUNDS):
            base["iterations"] = 100
        model_class = (catboost.CatBoostClassifier if task in CLASSIFICATION
                       else catboost.CatBoostRegressor)
        categorical = [c for c in meta.get("categorical", {}) if c in X.columns]
        return model_class(**(base | params)).fit(X, y, cat_features=categorical or None)

    def device_params(self, device: str) -> dict[str, Any]:
        return {"task_type": "GPU"}

    def serialize(self, model) -> bytes:
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "model.cbm")
            model.save_model(path, format="cbm")
            with open(path, "rb") as file:
                return file.read()
