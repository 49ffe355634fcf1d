"""``kind: lightgbm``: LightGBM's scikit-learn estimators (native categorical support),
stored as LightGBM's model text; data-parallel with Ray Train's LightGBMTrainer."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CLASSIFICATION, ModelKind, boosting_params, check_settings, unknown_parameters

OBJECTIVES = {"regression": "regression", "binary": "binary", "multiclass": "multiclass"}
#: Where LightGBM lists its parameters.
REFERENCE = "https://lightgbm.readthedocs.io/en/latest/Parameters.html"
#: Not checked on a booster of four made-up rows (nor their aliases): set by the job's task
#: at fit, naming the data's features, or needing the training host's devices.
UNCHECKED = ("objective", "num_class", "metric", "monotone_constraints",
             "interaction_constraints", "categorical_feature", "max_bin_by_feature",
             "feature_contri", "cegb_penalty_feature_lazy", "cegb_penalty_feature_coupled",
             "forcedsplits_filename", "forcedbins_filename", "ignore_column",
             "weight_column", "group_column", "label_column", "input_model",
             "device_type", "gpu_platform_id", "gpu_device_id", "num_gpu", "tree_learner",
             "class_weight", "importance_type")
VALIDATION_METRICS = {"regression": "l2", "binary": "binary_logloss",
                      "multiclass": "multi_logloss"}


class LightGBMKind(ModelKind):
    name = "lightgbm"
    absolute_error = {"objective": "l1"}
    library = "lightgbm"
    data_parallel = True

    @classmethod
    def load(cls, payload: bytes, meta: dict[str, Any]) -> Any:
        import lightgbm as lgb

        return lgb.Booster(model_str=payload.decode())

    @classmethod
    def predict_loaded(cls, model, features, meta) -> np.ndarray:
        return np.asarray(model.predict(features, num_threads=1), dtype="float64")

    def warm_up(self) -> None:
        import lightgbm  # noqa: F401

    def check(self) -> None:
        """Every name in the candidate's params and search is one LightGBM takes (its
        estimators' arguments, its parameters and their aliases): LightGBM itself only
        logs a warning for an unknown one, which training silences. Then each setting
        (``check_settings``) configures a LightGBM booster: a value it refuses
        (``num_leaves: 1``) is a ConfigError."""
        names = self.parameter_names()
        given = set(self.candidate.params) | set(self.candidate.search)
        if names is None:
            return
        if given - names:
            raise unknown_parameters(self.candidate, given - names, names, "LightGBM",
                                     REFERENCE)
        self.check_values()

    def check_values(self) -> None:
        import contextlib
        import io

        import lightgbm as lgb

        unchecked = lgb.basic._ConfigAliases.get(*UNCHECKED) | set(UNCHECKED)
        rows, target = np.arange(8.0).reshape(4, 2), np.arange(4.0)

        def configure(setting: dict[str, Any]) -> None:
            params = {"verbose": -1, "objective": "regression"} | {
                name: value for name, value in setting.items() if name not in unchecked}
            with contextlib.redirect_stdout(io.StringIO()):  # LightGBM prints its fatal
                lgb.Booster(params, lgb.Dataset(rows, target, params=params))

        check_settings(self.candidate, configure, lgb.basic.LightGBMError, "LightGBM",
                       REFERENCE)

    @staticmethod
    def parameter_names() -> set[str] | None:
        """The names LightGBM takes; None where this version cannot list them."""
        import inspect

        import lightgbm as lgb

        aliases = getattr(getattr(lgb.basic, "_ConfigAliases", None),
                          "_get_all_param_aliases", None)
        if aliases is None:
            return None
        names = set(inspect.signature(lgb.LGBMModel.__init__).parameters) - {"self",
                                                                              "kwargs"}
        for name, others in aliases().items():
            names |= {name, *others}
        return names

    def fit(self, params, X, y, task, seed, threads, meta) -> Any:
        import lightgbm as lgb

        base = {"n_estimators": 100, "verbose": -1, "random_state": seed,
                "n_jobs": threads, "deterministic": True, "force_row_wise": True}
        cls = lgb.LGBMClassifier if task in CLASSIFICATION else lgb.LGBMRegressor
        return cls(**(base | params)).fit(X, y)

    def row_predictor(self, model, meta):
        booster = model.booster_  # as the stored model predicts, without the wrapper's checks
        return lambda rows: booster.predict(rows, num_threads=1)

    def device_params(self, device: str) -> dict[str, Any]:
        # PyPI's wheels are built with the OpenCL tree learner ("gpu"), not CUDA's
        return {"device_type": "gpu"}

    def serialize(self, model) -> bytes:
        return model.booster_.model_to_string().encode()

    def native_params(self, params, task, n_classes) -> tuple[dict[str, Any], int]:
        defaults = {"objective": OBJECTIVES[task], "verbose": -1}
        return boosting_params(params, defaults, task, n_classes)

    def ray_trainer(self) -> type:
        from raybricks.compat import boosting_trainer

        return boosting_trainer("lightgbm", "LightGBMTrainer")

    def fit_shard(self, features, label, params, rounds, init=None, after_round=None
                  ) -> bytes:
        import lightgbm as lgb

        from raybricks.compat import lightgbm_network_params

        callbacks = [] if after_round is None else [
            lambda env: after_round(lambda: env.model.model_to_string().encode())]
        dtrain = lgb.Dataset(features, label=label, free_raw_data=False)
        booster = lgb.train(params | lightgbm_network_params(), dtrain,
                            num_boost_round=rounds, callbacks=callbacks,
                            init_model=None if init is None else self.load(init, {}))
        return booster.model_to_string().encode()

    def fit_reporting(self, train, valid, params, rounds, task, report) -> None:
        import lightgbm as lgb

        metric = VALIDATION_METRICS[task]
        dtrain = lgb.Dataset(train[0], label=train[1])
        lgb.train(params | {"metric": metric, "num_threads": 1}, dtrain,
                  num_boost_round=rounds,
                  callbacks=[lambda env: report(float(env.evaluation_result_list[0][2]))],
                  valid_sets=[lgb.Dataset(valid[0], label=valid[1], reference=dtrain)])
