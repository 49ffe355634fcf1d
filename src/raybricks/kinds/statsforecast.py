"""``kind: statsforecast``: a statistical model of statsforecast fitted to each series
(``estimator``: a class of ``statsforecast.models``, AutoETS, AutoARIMA, AutoTheta,
SeasonalNaive, CrostonOptimized, ..., or an import path; ``params``: its arguments).
Stored as the fitted model's pickle; the naive baselines of task forecast are this kind."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pandas as pd

from .base import did_you_mean, import_object
from .forecasting import TARGET, ForecastKind


def model_class(estimator: str) -> type:
    """A statsforecast model class by its name in ``statsforecast.models`` or import
    path."""
    if "." in estimator:
        return import_object(estimator)
    import statsforecast.models

    try:
        return getattr(statsforecast.models, estimator)
    except AttributeError:
        models = [name for name in dir(statsforecast.models) if name[:1].isupper()]
        hint = did_you_mean(estimator, models)
        raise ValueError(f"statsforecast.models has no model {estimator!r}"
                         + (f" ({hint})" if hint else "")) from None


#: The models this process has run once (``StatsForecastKind.warm_up``).
WARMED: set[tuple[str, str]] = set()


class StatsForecastKind(ForecastKind):
    name = "statsforecast"
    library = "statsforecast"

    @classmethod
    def check_config(cls, candidate) -> None:
        if not candidate.estimator:
            raise ValueError(
                f"models[{candidate.name}] of kind statsforecast needs estimator: a model "
                "of statsforecast.models, such as AutoETS, AutoARIMA or SeasonalNaive")

    def check(self) -> None:
        from raybricks.errors import ConfigError

        try:
            model_class(self.candidate.estimator)(**self.candidate.params)
        except ImportError as exc:
            raise ConfigError(f"models[{self.candidate.name}]: kind statsforecast needs "
                              f"statsforecast ({exc}): pip install 'raybricks[forecast]'"
                              ) from exc
        except Exception as exc:  # noqa: BLE001 - a model or an argument
            raise ConfigError(
                f"models[{self.candidate.name}]: statsforecast model "
                f"{self.candidate.estimator} with {self.candidate.params} cannot be built: "
                f"{exc}") from exc

    def warm_up(self) -> None:
        """Import the model and run it once, per process, on a short made-up series:
        statsforecast compiles its routines on their first call (about a second for
        AutoETS), which is no series' fit time."""
        build = model_class(self.candidate.estimator)
        key = (self.candidate.estimator, repr(sorted(self.candidate.params.items())))
        if key in WARMED or not callable(getattr(build, "forecast", None)):
            return
        WARMED.add(key)
        t = np.arange(120, dtype="float64")
        y = 20 + 0.05 * t + 3 * np.sin(2 * np.pi * t / 7) + (t % 5 == 0)
        # a model that needs more than this series warms on the first real one
        with contextlib.suppress(Exception):
            build(**self.candidate.params).forecast(y=y, h=2)

    @classmethod
    def forecast_loaded(cls, model, future, meta) -> np.ndarray:
        exogenous = meta["forecast"]["exogenous"]
        X = future[exogenous].to_numpy(dtype="float64") if exogenous else None
        return np.asarray(model.predict(h=len(future), X=X)["mean"], dtype="float64")

    def backtest(self, params, frame, origins, seed, threads, spec) -> np.ndarray:
        """Every window through the model's own ``forecast`` (fit and forecast at once,
        on arrays: what statsforecast's cross-validation calls), where it has one."""
        build = model_class(self.candidate.estimator)
        if not callable(getattr(build, "forecast", None)):
            return super().backtest(params, frame, origins, seed, threads, spec)
        horizon, exogenous = spec.horizon, spec.exogenous
        y = frame[TARGET].to_numpy(dtype="float64")
        X = frame[exogenous].to_numpy(dtype="float64") if exogenous else None
        parts = []
        for origin in origins:
            found = build(**params).forecast(
                y=y[:origin], h=horizon, X=None if X is None else X[:origin],
                X_future=None if X is None else X[origin:origin + horizon])
            parts.append(np.asarray(found["mean"], dtype="float64"))
        return np.concatenate(parts)

    def fit_series(self, params, history: pd.DataFrame, seed, threads, spec) -> Any:
        exogenous = spec.exogenous
        X = history[exogenous].to_numpy(dtype="float64") if exogenous else None
        y = history[TARGET].to_numpy(dtype="float64")
        return model_class(self.candidate.estimator)(**params).fit(y, X)
