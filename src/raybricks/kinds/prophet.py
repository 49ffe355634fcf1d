"""``kind: prophet``: Meta's Prophet fitted to each series (its MAP fit, Stan's L-BFGS,
seeded), the job's exogenous columns as its extra regressors. ``params`` are Prophet's
arguments (``seasonality_mode``, ``changepoint_prior_scale``, ``yearly_seasonality``,
...; ``uncertainty_samples`` defaults to 0: raybricks' conformal intervals serve
instead), plus ``country_holidays`` (``add_country_holidays``), ``seasonalities`` (a
list of ``add_seasonality`` arguments) and ``holidays`` as a list of rows (Prophet's
holidays frame). Stored as Prophet's own JSON (``prophet.serialize``), so the registered
model loads it with prophet alone. Not on every environment: ``raybricks[prophet]``."""

from __future__ import annotations

import importlib.util
import logging
import warnings
from typing import Any

import numpy as np
import pandas as pd

from .forecasting import TARGET, TIME, ForecastKind

#: ``params`` keys that raybricks applies with Prophet's methods after building it (the
#: other keys are Prophet's own arguments).
METHOD_PARAMS = ("country_holidays", "seasonalities")


def missing_prophet(name: str) -> str:
    """The error when a prophet candidate meets an environment without prophet."""
    return (f"models[{name}] of kind prophet needs prophet, which is not installed: pip "
            "install raybricks[prophet] (Databricks Runtime ML 15.4, 16.4 and 17.3 ship it)")


def quiet() -> None:
    """Prophet and cmdstanpy log each fit at INFO (a line per chain, the seasonalities
    they disable): a job of many series keeps warnings only. cmdstanpy sets its
    logger's level when it first logs (``get_logger``), so that runs first."""
    from cmdstanpy.utils import get_logger

    get_logger()
    for name in ("cmdstanpy", "prophet"):
        logging.getLogger(name).setLevel(logging.WARNING)


def holiday_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``holidays`` given as rows (``holiday``, ``ds``, optional ``lower_window``,
    ``upper_window``, ``prior_scale``), as the frame Prophet takes."""
    frame = pd.DataFrame(rows)
    return frame.assign(ds=pd.to_datetime(frame["ds"])) if "ds" in frame else frame


def build(params: dict[str, Any], exogenous: list[str]) -> Any:
    """An unfitted Prophet with ``params`` (see the module), ``exogenous`` as its
    regressors."""
    from prophet import Prophet

    quiet()
    options = {key: value for key, value in params.items() if key not in METHOD_PARAMS}
    options.setdefault("uncertainty_samples", 0)
    if isinstance(options.get("holidays"), list):
        options["holidays"] = holiday_frame(options["holidays"])
    model = Prophet(**options)
    if params.get("country_holidays"):
        model.add_country_holidays(country_name=str(params["country_holidays"]))
    for seasonality in params.get("seasonalities") or []:
        model.add_seasonality(**seasonality)
    for column in exogenous:
        model.add_regressor(column)
    return model


class ProphetKind(ForecastKind):
    name = "prophet"
    library = "prophet"
    extra = "prophet"

    @classmethod
    def check_config(cls, candidate: Any) -> None:
        if importlib.util.find_spec("prophet") is None:
            raise ValueError(missing_prophet(candidate.name))
        seasonalities = candidate.params.get("seasonalities") or []
        if not isinstance(seasonalities, list) or not all(
                isinstance(s, dict) and {"name", "period", "fourier_order"} <= set(s)
                for s in seasonalities):
            raise ValueError(
                f"models[{candidate.name}].params.seasonalities must be a list of "
                "{name, period, fourier_order} (optional mode, prior_scale), e.g. "
                "[{name: monthly, period: 30.5, fourier_order: 5}]")

    @classmethod
    def check_forecast_config(cls, candidate: Any, forecast: Any) -> None:
        if not isinstance(forecast.frequency, str):
            raise ValueError(
                f"models[{candidate.name}] of kind prophet needs dates: Prophet fits "
                "trends and seasonalities on a calendar, and forecast.frequency="
                f"{forecast.frequency!r} is the integer step of an integer time column; use "
                "a date or timestamp time column with a pandas frequency, or another kind")
        if candidate.params.get("country_holidays") and forecast.holidays is not None:
            raise ValueError(
                f"models[{candidate.name}].params.country_holidays and forecast.holidays "
                "exclude each other: forecast.holidays replaces the periods near holidays in "
                "every history before any model sees them, so Prophet would learn no "
                "holiday effect. Keep country_holidays (and drop forecast.holidays) to "
                "forecast holidays as Prophet sees them, or forecast.holidays alone to "
                "forecast them as ordinary days")

    def check(self) -> None:
        from raybricks.errors import ConfigError

        if importlib.util.find_spec("prophet") is None:
            raise ConfigError(missing_prophet(self.candidate.name))
        try:
            build(self.candidate.params, [])
        except Exception as exc:  # noqa: BLE001 - an unknown argument, a bad value
            raise ConfigError(
                f"models[{self.candidate.name}]: Prophet with {self.candidate.params} cannot "
                f"be built: {exc}") from exc

    def warm_up(self) -> None:
        build({}, [])  # imports prophet and cmdstanpy, finds the compiled Stan model

    def fit_series(self, params, history: pd.DataFrame, seed, threads, spec) -> Any:
        model = build(params, spec.exogenous)
        # the seed reaches cmdstanpy's optimize (Prophet's fit passes its keywords on)
        return model.fit(history[[TIME, TARGET, *spec.exogenous]], seed=int(seed))

    def serialize(self, model: Any) -> bytes:
        from prophet.serialize import model_to_json

        return model_to_json(model).encode()

    @classmethod
    def load(cls, payload: bytes, meta: dict[str, Any]) -> Any:
        from prophet.serialize import model_from_json

        quiet()
        with warnings.catch_warnings():  # prophet 1.1.5 reads dates with a deprecated call
            warnings.simplefilter("ignore", FutureWarning)
            return model_from_json(payload.decode())

    @classmethod
    def forecast_loaded(cls, model: Any, future: pd.DataFrame, meta: dict[str, Any]
                        ) -> np.ndarray:
        columns = [TIME, *meta["forecast"]["exogenous"]]
        return model.predict(future[columns])["yhat"].to_numpy(dtype="float64")
