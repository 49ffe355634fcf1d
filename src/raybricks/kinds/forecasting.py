"""What forecasting kinds share: a series' spec (``meta["forecast"]``), the future dates
after its history, and the stored half that answers rows of (segment, future date,
exogenous values) with the forecast for that date.

A forecasting kind's training half works on one series as a frame of ``ds`` (the time
column), ``y`` and the exogenous columns: ``fit_series(params, history, seed, threads)``
returns a fitted model, ``forecast(model, future)`` its values for the dates of
``future`` (the next ``len(future)`` periods, with their exogenous values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from .base import StoredKind

#: The series frame's columns (as statsforecast and mlforecast name them).
ID, TIME, TARGET = "unique_id", "ds", "y"


@dataclass(frozen=True)
class HolidaySpec:
    """``forecast.holidays``: the days whose values are replaced before fitting."""

    country: str | None
    subdivision: str | None
    dates: tuple[date, ...]
    before: int
    after: int


@dataclass(frozen=True)
class ForecastSpec:
    """What every series of a job is cleaned, backtested and fitted with: the job's
    ``forecast`` and ``validation`` sections resolved (training's ``forecast_spec``).
    Series kinds' ``fit_series`` and ``forecast`` take it; ``end`` is the latest period
    of any series of the job (None until the job's data is seen)."""

    horizon: int
    frequency: str | int
    season_length: int
    lags: list[int]
    rolling: dict[str, list[int]]
    rolling_lag: int
    date_features: list[str]
    exogenous: list[str]
    transform: str
    static: list[str]
    gaps: str
    duplicates: str
    intervals: list[float]
    strategy: str
    holidays: HolidaySpec | None
    windows: int
    step: int
    end: Any = None
    residuals: bool = False  # store each series' backtest errors (a reconciled hierarchy)
    #: store each series' own forecast of its horizon (``SeriesMeta.base``): a series
    #: without exogenous or static columns, whose next periods need nothing but its dates
    own_forecast: bool = False


@lru_cache(maxsize=4096)
def future_times(frequency: str | int, last: Any, steps: int) -> pd.Index:
    """The ``steps`` periods after ``last`` at ``frequency`` (a pandas frequency, or an
    integer step); remembered, as a series' members and its intervals all ask for them
    (an Index is immutable)."""
    if isinstance(frequency, int):
        return pd.Index(last + frequency * np.arange(1, steps + 1))
    return pd.date_range(pd.Timestamp(last), periods=steps + 1, freq=frequency)[1:]


def times_of(values: pd.Series | np.ndarray, frequency: str | int) -> pd.Index:
    """Time values as a series of ``frequency`` holds them: timestamps (also from
    ``prepare_features``' epoch seconds) or integers (an integer step)."""
    if isinstance(frequency, int):
        return pd.Index(np.asarray(values, dtype="float64").astype("int64"))
    if isinstance(values, np.ndarray) and values.dtype.kind == "M":  # naive, as an array
        return pd.DatetimeIndex(values)
    values = pd.Series(values)
    if isinstance(values.dtype, np.dtype) and values.dtype.kind == "M":  # already naive
        return pd.DatetimeIndex(values)
    if pd.api.types.is_numeric_dtype(values.dtype):
        seconds = values.to_numpy(dtype="float64")
        if len(seconds) and np.isfinite(seconds).all() and (seconds % 1 == 0).all() and (
                np.abs(seconds) < 9e9).all():  # whole seconds: what to_datetime makes
            return pd.DatetimeIndex((seconds.astype("int64") * 10**9).view("datetime64[ns]"))
        return pd.Index(pd.to_datetime(seconds, unit="s"))
    stamps = pd.to_datetime(values)
    if getattr(stamps.dt, "tz", None) is not None:
        stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
    return pd.Index(stamps)


def steps_ahead(times: pd.Index, frequency: str | int, last: Any, limit: int) -> np.ndarray:
    """For each time, how many periods after ``last`` it is (1 = the next period); 0 for
    a time that is not one of the next ``limit`` periods."""
    grid = future_times(frequency, last, limit)
    position = grid.get_indexer(times)
    return np.where(position >= 0, position + 1, 0)


def row_steps(features: pd.DataFrame, meta: dict[str, Any], limit: int | None = None
              ) -> tuple[np.ndarray, Any]:
    """Each row's periods after the stored series' last date (0 outside the next
    ``limit``, by default the periods it answers), and that last date. ``features``:
    the rows as prepared, or as given (their time column either way)."""
    spec = meta["forecast"]
    last = spec["last"] if isinstance(spec["frequency"], int) else pd.Timestamp(spec["last"])
    times = times_of(features[meta["features"][0]], spec["frequency"])
    return steps_ahead(times, spec["frequency"], last, limit or spec["limit"]), last


def interval_columns(levels: list[float]) -> list[str]:
    """The columns of prediction intervals at ``levels`` (percent): every ``lo_<level>``
    (widest first), then every ``hi_<level>``."""
    names = [f"{level:g}".replace(".", "_") for level in levels]
    return [f"lo_{name}" for name in reversed(names)] + [f"hi_{name}" for name in names]


def conformal_offsets(errors: np.ndarray, levels: list[float], neighbours: int = 0
                      ) -> list[list[float]]:
    """Split-conformal interval bounds around a forecast, per step, from ``errors``
    (windows x horizon absolute errors of backtest forecasts), as offsets in
    ``interval_columns`` order: at level L, plus and minus the ceil((n + 1) L)-th smallest
    of the step's n errors (the largest when n is too small for L), which a new error
    exceeds with probability at most 1 - L when errors are exchangeable. ``neighbours``:
    each step also takes the errors of the steps up to that many before and after it."""
    horizon = errors.shape[1]
    columns = []
    for step in range(horizon):
        pooled = np.sort(errors[:, max(step - neighbours, 0):step + neighbours + 1].ravel())
        n = len(pooled)
        bounds = [float(pooled[min(math.ceil((n + 1) * level / 100 - 1e-9), n) - 1])
                  for level in levels]
        columns.append([-b for b in reversed(bounds)] + bounds)
    return np.asarray(columns).T.tolist()


def interval_neighbours(horizon: int) -> int:
    """The steps around each step whose backtest errors calibrate its interval: half
    the horizon each side (a few windows give too few errors per step)."""
    return horizon // 2


def interval_bounds(point: np.ndarray, features: pd.DataFrame, meta: dict[str, Any],
                    levels: list[float]) -> np.ndarray:
    """The rows' interval bounds (n x ``interval_columns``) around ``point``: NaN for a
    row beyond the calibrated horizon or of a series stored without intervals."""
    out = np.full((len(point), 2 * len(levels)), np.nan)
    stored = meta.get("forecast", {}).get("intervals")
    if not stored or [float(v) for v in stored["levels"]] != [float(v) for v in levels]:
        return out
    offsets = np.asarray(stored["offsets"], dtype="float64")  # columns x horizon
    steps, _ = row_steps(features, meta)
    inside = (steps > 0) & (steps <= offsets.shape[1])
    out[inside] = point[inside, None] + offsets[:, steps[inside] - 1].T
    return out


def future_of(features: pd.DataFrame, meta: dict[str, Any]
              ) -> tuple[np.ndarray, pd.DataFrame | None]:
    """What a stored series forecasts for rows of ``features``: each row's periods after
    its history (``row_steps``) and the future to forecast, every period up to the
    furthest row's (``ds`` and the rows' exogenous values); None when no row is one of
    the next periods it answers."""
    spec = meta["forecast"]
    exogenous = spec["exogenous"]
    steps, last = row_steps(features, meta)
    if not steps.any():
        return steps, None
    horizon = int(steps.max())
    future = pd.DataFrame({TIME: future_times(spec["frequency"], last, horizon)})
    if exogenous:
        known = features.loc[steps > 0, exogenous].set_axis(steps[steps > 0] - 1)
        known = known[~known.index.duplicated()].reindex(range(horizon))
        if known.isna().any(axis=None):
            missing = future[TIME][known.isna().any(axis=1).to_numpy()]
            raise ValueError(
                f"exogenous values {exogenous} missing for {len(missing)} period(s) "
                f"from {missing.iloc[0]}: a forecast needs them for every period from "
                f"the first after the history ({future[TIME].iloc[0]}) to the last "
                "one asked for")
        future = pd.concat([future, known.reset_index(drop=True)], axis=1)
    return steps, future


def placed(path: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """A forecast ``path`` (one value per period ahead) at the rows' ``steps`` (NaN
    where a row is none of them)."""
    out = np.full(len(steps), np.nan)
    ahead = steps > 0
    out[ahead] = np.asarray(path, dtype="float64")[steps[ahead] - 1]
    return out


class ForecastKind(StoredKind):
    """A kind that forecasts series (a sibling of the table kinds, ``ModelKind``). Its
    stored half answers rows carrying the time column (``meta["features"][0]``) and the
    exogenous columns: one value per row, the forecast for that row's date; NaN for a
    date that is not one of the next ``meta["forecast"]["limit"]`` periods after the
    series' history. Its training half fits and forecasts one series (``fit_series``,
    ``forecast``)."""

    @classmethod
    def predict_loaded(cls, model: Any, features: pd.DataFrame, meta: dict[str, Any]
                       ) -> np.ndarray:
        steps, future = future_of(features, meta)
        if future is None:
            return np.full(len(features), np.nan)
        return placed(cls.forecast_loaded(model, future, meta), steps)

    @classmethod
    def forecast_loaded(cls, model: Any, future: pd.DataFrame, meta: dict[str, Any]
                        ) -> np.ndarray:
        """A loaded model's forecast for the next ``len(future)`` periods (``future``:
        their ``ds`` and exogenous values)."""
        raise NotImplementedError

    #: Whether ``forecast_many`` forecasts many stored series at once (the registered
    #: model then asks it for every series of a scoring call together).
    forecasts_many: ClassVar[bool] = False

    @classmethod
    def forecast_many(cls, requests: list[tuple[Any, pd.DataFrame, dict[str, Any]]]
                      ) -> list[np.ndarray]:
        """``forecast_loaded`` of many series (each: loaded model, future, meta) at once."""
        return [cls.forecast_loaded(*request) for request in requests]

    # -- the training half

    def weights(self) -> dict[str, str] | None:
        """Where this candidate's pretrained weights come from (``source``, ``sha256``)
        and how the registered model keeps them (``store``), for a kind whose models
        read a folder of weights (``PretrainedKind``); None for one that fits its own."""
        return None

    @classmethod
    def check_forecast_config(cls, candidate: Any, forecast: Any) -> None:
        """Raise ValueError when the candidate cannot forecast as the job's ``forecast``
        section says (run while the job config is parsed; ``forecast``: its
        ``ForecastConfig``)."""

    def fit_series(self, params: dict[str, Any], history: pd.DataFrame, seed: int,
                   threads: int, spec: ForecastSpec) -> Any:
        """A model fitted on one series (``history``: ``ds``, ``y``, exogenous)."""
        raise NotImplementedError

    def backtest(self, params: dict[str, Any], frame: pd.DataFrame, origins: list[int],
                 seed: int, threads: int, spec: ForecastSpec) -> np.ndarray:
        """The forecasts of the backtest windows of one series (``frame``: its whole
        history), concatenated: each window's model fitted on the periods before its
        origin, forecasting the ``spec.horizon`` periods from it. A kind with a faster way
        to fit and forecast at once overrides it (the statistical kinds)."""
        horizon = spec.horizon
        inputs = [position for position, name in enumerate(frame.columns) if name != TARGET]
        parts = []
        for origin in origins:
            model = self.fit_series(params, frame.iloc[:origin], seed, threads, spec)
            future = frame.iloc[origin:origin + horizon, inputs].reset_index(drop=True)
            parts.append(self.forecast(model, future, spec))
        return np.concatenate(parts)

    def backtest_many(self, params: dict[str, Any], frames: list[pd.DataFrame],
                      origins: list[list[int]], seeds: list[int], threads: int,
                      spec: ForecastSpec) -> list[np.ndarray] | None:
        """``backtest`` of many series at once (``frames``, each with its windows'
        ``origins`` and its seed), where the kind has a faster way than one series at a
        time; None (the default): each series alone."""
        return None

    def fit_each(self, params: dict[str, Any], frames: list[pd.DataFrame], seeds: list[int],
                 threads: int, spec: ForecastSpec) -> list[Any] | None:
        """``fit_series`` of many series at once (``frames``, each with its seed), where
        the kind has a faster way than one series at a time (a pretrained model forecasts
        them in batches); None (the default): each chosen member is fitted alone."""
        return None

    def own_intervals(self, params: dict[str, Any], model: Any, levels: list[float]
                      ) -> list[list[float]] | None:
        """A fitted model's own interval offsets around its forecast of the horizon
        (``interval_columns`` order x horizon) at ``levels``, where it has them and the
        candidate asks for them; None (the default): conformal intervals."""
        return None

    def forecast(self, model: Any, future: pd.DataFrame, spec: ForecastSpec) -> np.ndarray:
        """The fitted model's values for the periods of ``future`` (the stored half's
        ``forecast_loaded``, given the meta keys a stored member has of the spec)."""
        return self.forecast_loaded(model, future, {"forecast": {
            "frequency": spec.frequency, "exogenous": spec.exogenous}})
