"""``kind: xgboost``: XGBoost's scikit-learn estimators (native categorical support),
stored as XGBoost's UBJSON; data-parallel with Ray Train's XGBoostTrainer."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .base import CLASSIFICATION, ModelKind, boosting_params, check_settings, unknown_parameters

OBJECTIVES = {"regression": "reg:squarederror", "binary": "binary:logistic",
              "multiclass": "multi:softprob"}
#: Where XGBoost lists its parameters.
REFERENCE = "https://xgboost.readthedocs.io/en/stable/parameter.html"
#: How XGBoost warns of parameters it does not use.
UNUSED = re.compile(r"Parameters: \{ (.*) \} are not used", re.S)
#: Not checked on a booster of four made-up rows: set by the job's task at fit, or naming
#: the data's features.
UNCHECKED = ("objective", "num_class", "eval_metric", "interaction_constraints",
             "monotone_constraints", "feature_weights", "feature_types", "feature_names")
VALIDATION_METRICS = {"regression": "rmse", "binary": "logloss", "multiclass": "mlogloss"}


class XGBoostKind(ModelKind):
    name = "xgboost"
    absolute_error = {"objective": "reg:absoluteerror"}
    library = "xgboost"
    data_parallel = True

    @classmethod
    def load(cls, payload: bytes, meta: dict[str, Any]) -> Any:
        import xgboost as xgb

        booster = xgb.Booster()
        booster.load_model(bytearray(payload))
        booster.set_param({"nthread": 1})
        return booster

    @classmethod
    def predict_loaded(cls, model, features, meta) -> np.ndarray:
        import xgboost as xgb

        return np.asarray(model.predict(xgb.DMatrix(features, enable_categorical=True)),
                          dtype="float64")

    def warm_up(self) -> None:
        import xgboost  # noqa: F401

    def check(self) -> None:
        """Each setting (``candidate_settings``) configures an XGBoost booster: a value
        XGBoost refuses, or a name it does not use (XGBoost itself only warns, which
        training silences), is a ConfigError."""
        import warnings

        import xgboost as xgb

        tiny = xgb.DMatrix(np.arange(8.0).reshape(4, 2), label=np.arange(4.0))
        unused: set[str] = set()

        def configure(setting: dict[str, Any]) -> None:
            booster = {name: value for name, value in
                       xgb.XGBRegressor(**setting).get_xgb_params().items()
                       if name not in UNCHECKED}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                xgb.Booster(booster, [tiny]).save_config()
            for warning in caught:
                found = UNUSED.search(str(warning.message))
                unused.update(re.findall(r'"([^"]+)"', found.group(1)) if found else ())

        check_settings(self.candidate, configure, xgb.core.XGBoostError, "XGBoost", REFERENCE)
        if unused:
            raise unknown_parameters(self.candidate, unused,
                                     set(xgb.XGBRegressor().get_params()), "XGBoost",
                                     REFERENCE)

    def fit(self, params, X, y, task, seed, threads, meta) -> Any:
        import xgboost as xgb

        base = {"n_estimators": 100, "tree_method": "hist", "enable_categorical": True,
                "random_state": seed, "n_jobs": threads, "verbosity": 0}
        cls = xgb.XGBClassifier if task in CLASSIFICATION else xgb.XGBRegressor
        return cls(**(base | params)).fit(X, y)

    def device_params(self, device: str) -> dict[str, Any]:
        return {"device": device, "tree_method": "hist"}

    def serialize(self, model) -> bytes:
        # UBJSON holds the trees, not the training device: a model fitted with
        # device="cuda" loads and predicts on a CPU-only host
        return bytes(model.get_booster().save_raw("ubj"))

    def native_params(self, params, task, n_classes) -> tuple[dict[str, Any], int]:
        defaults = {"objective": OBJECTIVES[task], "tree_method": "hist", "verbosity": 0}
        return boosting_params(params, defaults, task, n_classes)

    def ray_trainer(self) -> type:
        from raybricks.compat import boosting_trainer

        return boosting_trainer("xgboost", "XGBoostTrainer")

    def fit_shard(self, features, label, params, rounds, init=None, after_round=None
                  ) -> bytes:
        import xgboost as xgb

        callbacks = []
        if after_round is not None:
            class AfterRound(xgb.callback.TrainingCallback):
                def after_iteration(self, model, epoch, evals_log) -> bool:
                    after_round(lambda: bytes(model.save_raw("ubj")))
                    return False

            callbacks.append(AfterRound())
        dtrain = xgb.DMatrix(features, label=label, enable_categorical=True)
        booster = xgb.train(params, dtrain, num_boost_round=rounds, callbacks=callbacks,
                            xgb_model=None if init is None else bytearray(init))
        return bytes(booster.save_raw("ubj"))

    def fit_reporting(self, train, valid, params, rounds, task, report) -> None:
        import xgboost as xgb

        metric = VALIDATION_METRICS[task]

        class Report(xgb.callback.TrainingCallback):
            def after_iteration(self, model, epoch, evals_log) -> bool:
                report(float(evals_log["valid"][metric][-1]))
                return False

        xgb.train(params | {"eval_metric": metric, "nthread": 1},
                  xgb.DMatrix(train[0], label=train[1], enable_categorical=True),
                  num_boost_round=rounds, callbacks=[Report()], verbose_eval=False,
                  evals=[(xgb.DMatrix(valid[0], label=valid[1], enable_categorical=True),
                          "valid")])
