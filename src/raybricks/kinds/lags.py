"""Lag models: any kind that fits tables (LightGBM, XGBoost, scikit-learn, CatBoost, a
user's kind) fitted to one series on its lags, rolling statistics of lags, date features
and exogenous columns, forecasting recursively (or directly: one regressor per step,
``forecast.strategy: direct``), with mlforecast's feature machinery.

A candidate ``{kind: lightgbm}`` of task forecast is stored as kind ``lags:lightgbm``:
the fitted ``MLForecast`` (pickled without its regressor) and the regressor as its own
kind stores it, so the registered model needs mlforecast and the regressor's library.
The job's global model (``fallback: global``) is the same over every series at once,
with their static columns; it forecasts a series by ``Continued``: that series' history.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .base import ModelKind, prepare_features
from .forecasting import ID, TIME, ForecastKind, ForecastSpec

PREFIX = "lags:"
MODEL = "model"  # the regressor's name inside MLForecast


class KindRegressor:
    """A kind as the scikit-learn regressor mlforecast fits and calls: ``fit(X, y)``,
    ``predict(X)``."""

    def __init__(self, kind: ModelKind | type[ModelKind], params: dict[str, Any],
                 seed: int = 0, threads: int = 1, model: Any = None,
                 meta: dict[str, Any] | None = None) -> None:
        self.kind, self.params, self.seed, self.threads = kind, params, seed, threads
        self.model, self.meta = model, meta

    def get_params(self, deep: bool = True) -> dict[str, Any]:  # for sklearn.clone
        return {"kind": self.kind, "params": self.params, "seed": self.seed,
                "threads": self.threads}

    def set_params(self, **params: Any) -> KindRegressor:
        for name, value in params.items():
            setattr(self, name, value)
        return self

    def fit(self, X: pd.DataFrame, y: np.ndarray) -> KindRegressor:
        categorical = {c: sorted(X[c].dropna().unique().tolist()) for c in X.columns
                       if not pd.api.types.is_numeric_dtype(X[c].dtype)}  # static strings
        self.meta = {"features": list(X.columns), "categorical": categorical,
                     "task": "regression", "fill": {c: 0.0 for c in X.columns}}
        data = self.kind.model_input(prepare_features(X, self.meta), self.meta)
        self.model = self.kind.fit(self.params, data, np.asarray(y, dtype="float64"),
                                   "regression", self.seed, self.threads, self.meta)
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        features = prepare_features(X, self.meta)
        if isinstance(self.kind, type):  # loaded: the kind's stored half
            return self.kind.predict_loaded(self.model, features, self.meta)
        return self.kind.predict(self.model, self.kind.model_input(features, self.meta),
                                 "regression")


def lag_transforms(spec: ForecastSpec) -> dict[int, list]:
    from mlforecast import lag_transforms as transforms

    made = {"mean": transforms.RollingMean, "std": transforms.RollingStd,
            "min": transforms.RollingMin, "max": transforms.RollingMax}
    rolling = [made[stat](window_size=w) for stat, windows in spec.rolling.items()
               for w in windows]
    return {spec.rolling_lag: rolling} if rolling else {}


def target_transforms(spec: ForecastSpec) -> list | None:
    if spec.transform == "difference":
        from mlforecast.target_transforms import Differences

        return [Differences([1])]
    if spec.transform == "standardize":
        from mlforecast.target_transforms import LocalStandardScaler

        return [LocalStandardScaler()]
    if spec.transform == "log1p":
        from mlforecast.target_transforms import GlobalSklearnTransformer
        from sklearn.preprocessing import FunctionTransformer

        return [GlobalSklearnTransformer(FunctionTransformer(np.log1p, np.expm1))]
    return None


def memory(spec: ForecastSpec) -> int:
    """How many of the last values the recursive forecast needs."""
    windows = [w for ws in spec.rolling.values() for w in ws]
    return max(spec.lags + [spec.rolling_lag + w for w in windows]) + 1


class SeriesRegressors:
    """Each series' own regressor as the one regressor mlforecast's recursion calls once a
    step for every series: row k of a step's features is series k's (``regressors`` in
    the order of the forecaster's ``ts.uids``)."""

    def __init__(self, regressors: list[KindRegressor]) -> None:
        self.meta = regressors[0].meta  # the same features for every series
        if self.meta["categorical"]:  # rows of strings: each series' regressor as it is
            self.predictors = [lambda rows, r=r: r.predict(rows) for r in regressors]
        else:
            self.predictors = [r.kind.row_predictor(r.model, r.meta) for r in regressors]

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        if len(X) != len(self.predictors):
            raise ValueError(f"{len(X)} rows for {len(self.predictors)} series' regressors")
        rows = X if self.meta["categorical"] else prepare_features(X, self.meta).to_numpy(
            dtype="float64")
        return np.concatenate([np.asarray(predict(rows[k:k + 1]), dtype="float64").reshape(-1)
                               for k, predict in enumerate(self.predictors)])


@dataclass
class Continued:
    """The global lag model forecasting one series: ``history``, that series' last
    periods (``ds``, ``y``, exogenous and static columns), continued by ``forecaster``."""

    forecaster: Any
    history: pd.DataFrame


class LagsKind(ForecastKind):
    """``lags:<kind>``: made by ``for_regressor``; ``regressor`` is the table kind."""

    name = "lags"
    library = "mlforecast"
    regressor: type[ModelKind] = ModelKind

    @classmethod
    def libraries(cls) -> tuple[str, ...]:
        return (cls.library, *cls.regressor.libraries())

    @classmethod
    def for_regressor(cls, regressor: type[ModelKind]) -> type[LagsKind]:
        return type(f"Lags{regressor.__name__}", (cls,), {
            "name": PREFIX + regressor.name, "regressor": regressor,
            "requirements": regressor.requirements, "shipped": regressor.shipped,
            "__module__": cls.__module__})

    # -- stored half

    @classmethod
    def load(cls, payload: bytes, meta: dict[str, Any]) -> Any:
        stored = pickle.loads(payload)  # noqa: S301 - the model's own trusted payload
        forecaster, regressor_meta = stored["mlforecast"], stored["meta"]

        def loaded(data: bytes) -> KindRegressor:
            return KindRegressor(cls.regressor, {}, model=cls.regressor.load(
                data, regressor_meta), meta=regressor_meta)

        if "regressors" in stored:  # direct: one regressor per step, as mlforecast kept them
            steps = {step: loaded(data) for step, data in stored["regressors"].items()}
            fitted = steps if stored["container"] == "dict" else [steps[s] for s in sorted(steps)]
        else:
            fitted = loaded(stored["regressor"])
        forecaster.models_ = {MODEL: fitted}
        return forecaster

    @classmethod
    def forecast_loaded(cls, model, future, meta) -> np.ndarray:
        exogenous = meta["forecast"]["exogenous"]
        if isinstance(model, Continued):
            return cls.continue_many(model.forecaster, model.history.assign(**{ID: 0}),
                                     future.assign(**{ID: 0}), len(future), exogenous)[0]
        X_df = future.assign(**{ID: 0})[[ID, TIME, *exogenous]] if exogenous else None
        return model.predict(len(future), X_df=X_df)[MODEL].to_numpy(dtype="float64")

    @staticmethod
    def continue_many(forecaster: Any, histories: pd.DataFrame, futures: pd.DataFrame,
                      steps: int, exogenous: list[str]) -> np.ndarray:
        """The global model continuing many series at once (series x ``steps``):
        ``histories``, their last periods, and ``futures``, their next ``steps`` periods
        (exogenous values), both with integer ids 0..n-1 in ``unique_id``."""
        X_df = futures[[ID, TIME, *exogenous]] if exogenous else None
        out = forecaster.predict(steps, new_df=histories, X_df=X_df)
        out = out.sort_values([ID, TIME], kind="stable")
        return out[MODEL].to_numpy(dtype="float64").reshape(-1, steps)

    # -- training half

    def check(self) -> None:
        self.regressor(self.candidate).check()

    def warm_up(self) -> None:
        import mlforecast  # noqa: F401

        self.regressor(self.candidate).warm_up()

    def fit_series(self, params, history, seed, threads, spec) -> Any:
        return self.fit_many(params, history.assign(**{ID: 0}), seed, threads, spec)

    def forecaster(self, params: dict[str, Any], seed: int, threads: int,
                   spec: ForecastSpec) -> Any:
        """An unfitted ``MLForecast`` of the spec's features with this kind's regressor."""
        from mlforecast import MLForecast

        return MLForecast(
            models={MODEL: KindRegressor(self.regressor(self.candidate), params, seed,
                                         threads)},
            freq=spec.frequency, lags=spec.lags, lag_transforms=lag_transforms(spec),
            date_features=spec.date_features or None,
            target_transforms=target_transforms(spec))

    def fit_many(self, params: dict[str, Any], frame: pd.DataFrame, seed: int, threads: int,
                 spec: ForecastSpec, static: list[str] | None = None) -> Any:
        """One model over the series of ``frame`` (``unique_id``, ``ds``, ``y``, exogenous
        and ``static`` columns)."""
        direct = spec.strategy == "direct"
        return self.forecaster(params, seed, threads, spec).fit(
            frame, static_features=list(static or []), keep_last_n=memory(spec),
            cache_train_df=False, max_horizon=spec.horizon if direct else None)

    def backtest_many(self, params: dict[str, Any], frames: list[pd.DataFrame],
                      origins: list[list[int]], seeds: list[int], threads: int,
                      spec: ForecastSpec) -> list[np.ndarray] | None:
        """Recursive lag models: the backtests of many series at once, each series' own
        model in each window (fitted on that series' rows of one feature table made for
        all of them, with its own seed) and one recursion per window over every series,
        each step's rows predicted by their series' own regressor: the same forecasts as
        ``backtest`` of each series alone, without mlforecast's per-call set-up for each.
        None with the direct strategy (one model per step: each series alone)."""
        if spec.strategy == "direct":
            return None
        horizon, exogenous = spec.horizon, spec.exogenous
        paths: list[np.ndarray] = []
        for window in range(len(origins[0])):
            cuts = [o[window] for o in origins]
            histories = pd.concat([f.iloc[:cut].assign(**{ID: k})
                                   for k, (f, cut) in enumerate(zip(frames, cuts, strict=True))],
                                  ignore_index=True)
            forecaster = self.forecaster(params, seeds[0], threads, spec)
            prepared = forecaster.preprocess(histories, static_features=[],
                                             keep_last_n=memory(spec))
            features = forecaster.ts.features_order_
            ids = prepared[ID].to_numpy()
            fitted = {}
            for k, seed in enumerate(seeds):
                rows = prepared[ids == k]
                fitted[k] = KindRegressor(self.regressor(self.candidate), params, seed,
                                          threads).fit(rows[features].reset_index(drop=True),
                                                       rows["y"].to_numpy())
            forecaster.models_ = {MODEL: SeriesRegressors([fitted[k]
                                                           for k in forecaster.ts.uids])}
            futures = pd.concat([f.iloc[cut:cut + horizon].assign(**{ID: k})
                                 for k, (f, cut) in enumerate(zip(frames, cuts, strict=True))],
                                ignore_index=True)
            X_df = futures[[ID, TIME, *exogenous]] if exogenous else None
            out = forecaster.predict(horizon, X_df=X_df).sort_values([ID, TIME], kind="stable")
            paths.append(out[MODEL].to_numpy(dtype="float64").reshape(-1, horizon))
        return [np.concatenate([path[k] for path in paths]) for k in range(len(frames))]

    def serialize(self, model) -> bytes:
        fitted, unfitted = model.models_[MODEL], model.models
        model.models_, model.models = {}, {}  # regressors go as their kind stores them
        try:
            if isinstance(fitted, KindRegressor):
                stored = {"regressor": fitted.kind.serialize(fitted.model), "meta": fitted.meta}
            else:  # direct: mlforecast keeps one regressor per step (dict or list)
                steps = dict(fitted.items() if isinstance(fitted, dict) else enumerate(fitted))
                stored = {"regressors": {step: r.kind.serialize(r.model)
                                         for step, r in steps.items()},
                          "meta": next(iter(steps.values())).meta,
                          "container": "dict" if isinstance(fitted, dict) else "list"}
            return pickle.dumps({"mlforecast": model, **stored}, protocol=5)
        finally:
            model.models_, model.models = {MODEL: fitted}, unfitted
