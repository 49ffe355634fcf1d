"""``kind: xgboost``: XGBoost's scikit-learn estimators (native categorical support),
stored as XGBoost's UBJSON; data-parallel with Ray Train's XGBoostTrainer."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CLASSIFICATION, ModelKind, boosting_params

OBJECTIVES = {"regression": "reg:squarederror", "binary": "binary:logistic",
              "multiclass": "multi:softprob"}
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
