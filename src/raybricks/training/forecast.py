"""Training one series (task forecast): clean it onto its frequency's grid, backtest every
candidate and the naive baselines over rolling origins, blend (or pick) per series,
refit the chosen members on the whole series.

Plain Python on one segment's pandas frame, like ``segment.py``, whose selection and
result rows it shares; the packed engine runs it for many series per task.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from datetime import date
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from raybricks import kinds, metrics
from raybricks.config import CandidateConfig, JobConfig
from raybricks.kinds.forecasting import (
    TARGET,
    TIME,
    conformal_offsets,
    future_times,
    interval_neighbours,
    times_of,
)
from raybricks.kinds.lags import memory
from raybricks.results import TRAINED
from raybricks.training import global_forecast
from raybricks.training.search import trial_settings
from raybricks.training.segment import (
    GLOBAL,
    Evaluation,
    Plan,
    Skip,
    blended,
    choose,
    key_row,
    member_row,
    result_for_error,
    stable_seed,
    summarize,
)

#: Rows of a stored series' model answer dates up to this many horizons ahead.
HORIZONS_ANSWERED = 10
#: A series whose values are zero this often is intermittent (reported, still trained).
INTERMITTENT_ZEROS = 0.5


def forecast_spec(config: JobConfig) -> dict[str, Any]:
    """What every series is trained with, as plain values (travels in the Plan)."""
    forecast, validation = config.forecast, config.validation
    return {
        "horizon": forecast.horizon, "frequency": forecast.frequency,
        "season_length": forecast.seasonality, "lags": forecast.lag_list,
        "rolling": {stat: list(w) for stat, w in forecast.rolling.items()},
        "rolling_lag": forecast.rolling_lag, "date_features": list(forecast.date_features),
        "exogenous": list(forecast.exogenous), "transform": forecast.transform,
        "static": list(dict.fromkeys(forecast.static + (
            config.segment_by if config.global_segment_features else []))),
        "gaps": forecast.gaps, "intervals": sorted(set(forecast.intervals)),
        "strategy": forecast.strategy,
        "holidays": None if forecast.holidays is None else {
            "country": forecast.holidays.country,
            "subdivision": forecast.holidays.subdivision,
            "dates": tuple(sorted(forecast.holidays.dates)),
            "before": forecast.holidays.before, "after": forecast.holidays.after},
        "windows": validation.windows,
        "step": validation.step or forecast.horizon,
    }


def baselines(spec: dict[str, Any]) -> list[CandidateConfig]:
    """The naive forecasts every series is compared with: the last value and, with a
    season, the last season's values; the better of them on the backtest is the
    series' baseline."""
    season = spec["season_length"]
    if season > 1:
        return [CandidateConfig(name="baseline", kind="statsforecast",
                                estimator="SeasonalNaive", params={"season_length": season}),
                NAIVE]
    return [NAIVE]


NAIVE = CandidateConfig(name="baseline", kind="statsforecast", estimator="Naive")


@dataclass
class Series:
    """One series on its frequency's grid: ``frame`` has ``ds``, ``y`` and the exogenous
    columns, in time order; ``notes``: data conditions users should know of;
    ``static``: its values of the static columns."""

    frame: pd.DataFrame
    notes: list[str]
    static: dict[str, Any] = field(default_factory=dict)

    def history(self, end: int | None = None) -> pd.DataFrame:
        """Its periods before ``end`` (all by default), with its static values."""
        return self.frame.iloc[:end].assign(**self.static)

    @property
    def y(self) -> np.ndarray:
        return self.frame[TARGET].to_numpy(dtype="float64")


def clean_series(data: pd.DataFrame, plan: Plan) -> Series:
    """The segment's rows as a series on the grid of its frequency; Skip for what
    cannot be forecast (duplicate dates, dates off the frequency, gaps with ``gaps:
    skip``, too short, constant)."""
    spec = plan.forecast
    exogenous = spec["exogenous"]
    frame = dated_rows(data, plan, exogenous)
    if frame.empty:
        raise Skip("no dates: the time column is null in every row")
    duplicated = frame[TIME].duplicated()
    if duplicated.any():
        raise Skip(f"duplicate dates: {int(duplicated.sum())} date(s) appear more than once "
                   f"(first {frame[TIME][duplicated].iloc[0]}); aggregate to one row per date")
    first, last = frame[TIME].iloc[0], frame[TIME].iloc[-1]
    grid = grid_of(frame[TIME], spec)
    if grid is None:
        raise Skip(f"dates do not follow frequency {spec['frequency']!r}: they are not every "
                   f"period from {first} (set forecast.frequency to the data's)")
    frame = frame.set_index(TIME).reindex(grid).rename_axis(TIME).reset_index()
    gaps = int(frame[TARGET].isna().sum())
    notes = []
    if gaps:
        if spec["gaps"] == "skip":
            raise Skip(f"gaps: {gaps} of {len(frame)} periods have no value (set "
                       "forecast.gaps: zero or forward to fill them)")
        filled = frame[TARGET].fillna(0.0) if spec["gaps"] == "zero" else frame[TARGET].ffill()
        frame[TARGET] = filled
        notes.append(f"gaps filled: {gaps} period(s) ({spec['gaps']})")
    if spec.get("holidays"):
        replace = near_holidays(frame[TIME], spec["holidays"])
        if replace.any():
            frame[TARGET] = seasonal_fill(frame[TARGET].to_numpy(dtype="float64"), replace,
                                          periods_per_week(spec["frequency"]))
            notes.append(f"holidays replaced: {int(replace.sum())} period(s) near holidays "
                         "(by the same weekday and time of the nearest weeks)")
    if exogenous:
        frame[exogenous] = frame[exogenous].ffill().bfill()
        if frame[exogenous].isna().any(axis=None):
            raise Skip(f"exogenous column(s) {exogenous} have no value in this series")
    y = frame[TARGET].to_numpy(dtype="float64")
    needed = minimum_length(spec, plan.min_rows)
    if len(y) < needed:
        raise Skip(f"short series: {len(y)} periods; a backtest of {spec['windows']} "
                   f"window(s) of {spec['horizon']} needs at least {needed}")
    if y.min() == y.max():
        raise Skip(f"constant series: every value is {y[0]!r} (served by its naive forecast)")
    if spec["transform"] == "log1p" and y.min() < 0:
        raise Skip("negative values with forecast.transform=log1p")
    end = spec.get("end")
    if end is not None:
        end = times_of(pd.Series([end]), spec)[0]
        behind = len(grid_between(last, end, spec) if last < end else []) - 1
        if behind > 0:
            notes.append(f"ended early: last value {behind} period(s) before the latest "
                         "series' end (its forecasts start after its own last date)")
    zeros = float(np.mean(y == 0))
    if zeros >= INTERMITTENT_ZEROS:
        notes.append(f"intermittent: {zeros:.0%} of periods are zero")
    return Series(frame, notes, static_values(data, plan))


@lru_cache(maxsize=32)
def holiday_days(country: str | None, subdivision: str | None, dates: tuple[date, ...],
                 first_year: int, last_year: int) -> pd.DatetimeIndex:
    """The holidays of ``country`` (the ``holidays`` package) over the years, and
    ``dates``."""
    days = set(dates)
    if country is not None:
        import holidays

        days.update(holidays.country_holidays(country, subdiv=subdivision,
                                              years=range(first_year, last_year + 1)))
    return pd.DatetimeIndex(sorted(days))


def near_holidays(times: pd.Series, spec: dict[str, Any]) -> np.ndarray:
    """Whether each of ``times`` falls from ``before`` days before a holiday of ``spec``
    (``forecast.holidays``) to ``after`` days after it."""
    days = pd.DatetimeIndex(times).tz_localize(None).normalize()
    before, after = spec["before"], spec["after"]
    found = holiday_days(spec["country"], spec["subdivision"], spec["dates"],
                         days[0].year - 1, days[-1].year + 1)
    around = found.to_numpy()[:, None] + np.arange(-before, after + 1) * np.timedelta64(1, "D")
    return days.isin(around.ravel())


def periods_per_week(frequency: str) -> int:
    """How many periods of ``frequency`` (daily or finer) one week has: 7 for D, 5 for
    B, 168 for h."""
    monday = pd.Timestamp("2024-01-01")
    return len(pd.date_range(monday, monday + pd.Timedelta(days=7), freq=frequency,
                             inclusive="left"))


def seasonal_fill(y: np.ndarray, replace: np.ndarray, period: int) -> np.ndarray:
    """``y`` with each ``replace`` period set to the mean of the nearest periods a
    whole number of ``period`` before and after it that are not replaced (one side at a
    series' ends; left as it is where there is none)."""
    at = np.flatnonzero(replace)
    sides = []
    for direction in (-1, 1):
        found = np.full(len(at), np.nan)
        for k in range(1, len(y) // period + 1):
            other = at + direction * k * period
            inside = (other >= 0) & (other < len(y))
            usable = np.zeros(len(at), bool)
            usable[inside] = ~replace[other[inside]]
            take = usable & np.isnan(found)
            found[take] = y[other[take]]
            if not inside.any() or not np.isnan(found).any():
                break
        sides.append(found)
    sides = np.stack(sides)
    counts = np.isfinite(sides).sum(axis=0)
    filled = y.copy()
    some = counts > 0
    filled[at[some]] = np.nansum(sides, axis=0)[some] / counts[some]
    return filled


def static_values(data: pd.DataFrame, plan: Plan) -> dict[str, Any]:
    """A series' value of each static column: that of its latest row with one (None if
    none has)."""
    columns = plan.forecast["static"]
    if not columns:
        return {}
    latest_last = data.iloc[np.argsort(times_of(data[plan.time_column], plan.forecast),
                                       kind="stable")]
    values = {}
    for column in columns:
        present = latest_last[column].dropna()
        values[column] = present.iloc[-1] if len(present) else None
    return values


def dated_rows(data: pd.DataFrame, plan: Plan, columns: list[str]) -> pd.DataFrame:
    """The segment's rows with a date, in time order: ``ds``, ``y`` and ``columns`` as
    numbers (NaN where missing)."""
    frame = pd.DataFrame({TIME: times_of(data[plan.time_column], plan.forecast),
                          TARGET: pd.to_numeric(data[plan.target], errors="coerce")})
    for column in columns:
        frame[column] = pd.to_numeric(data[column], errors="coerce").to_numpy()
    return frame[frame[TIME].notna()].sort_values(TIME, kind="stable")


def grid_between(first: Any, last: Any, spec: dict[str, Any]) -> pd.Index | None:
    """Every period from ``first`` to ``last``; None when ``first`` is not on the grid."""
    frequency = spec["frequency"]
    if isinstance(frequency, int):
        return pd.Index(np.arange(first, last + 1, frequency))
    grid = pd.date_range(first, last, freq=frequency)
    return grid if len(grid) and grid[0] == first else None


def grid_of(times: pd.Series | pd.Index, spec: dict[str, Any]) -> pd.Index | None:
    """Every period from the first of ``times`` (sorted) to the last; None when one of
    them is off that grid."""
    times = pd.Index(times)
    grid = grid_between(times[0], times[-1], spec)
    return None if grid is None or grid.get_indexer(times).min() < 0 else grid


def frequency_problem(times: dict[tuple, pd.Index], spec: dict[str, Any]) -> str | None:
    """Why ``forecast.frequency`` fits none of the sampled segments' dates (``times``,
    each segment's, any subset of them), so that training would skip every series; None
    when a segment with three dates or more fits it, or none has three. A segment does
    not fit when a date is off the frequency's grid, or (``gaps: skip``) when its dates
    are evenly spaced further apart than the frequency (every period between them
    missing)."""
    sampled = {key: pd.Index(t).dropna().unique().sort_values() for key, t in times.items()}
    sampled = {key: t for key, t in sampled.items() if len(t) >= 3}
    if not sampled:
        return None
    frequency = spec["frequency"]
    reasons = {}
    for key, t in sampled.items():
        grid = grid_of(t, spec)
        spacing = None if isinstance(frequency, int) else pd.infer_freq(t)
        if grid is None:
            reasons[key] = "are not on its grid" + (f" (they are {spacing!r})" if spacing else "")
        elif spec["gaps"] == "skip" and spacing and len(grid) > len(t):
            reasons[key] = (f"are {spacing!r}: every period between them would be missing, and "
                            "the series skipped (gaps: skip)")
        else:
            return None
    key, reason = next(iter(reasons.items()))
    return (f"forecast.frequency={frequency!r} does not fit the data: the dates of segment "
            f"{key} {reason}, and so for every one of the {len(reasons)} segment(s) "
            "sampled; set forecast.frequency to the data's (a pandas frequency such as D, "
            "W-SUN, MS, h, or an integer step)")


def minimum_length(spec: dict[str, Any], min_rows: int) -> int:
    """The shortest series the backtest can run on: the first window's training part
    (``min_rows``, and enough for the lags) plus every window's origin."""
    train = max(min_rows, memory(spec) + 10)
    return train + spec["horizon"] + spec["step"] * (spec["windows"] - 1)


def windows(n: int, spec: dict[str, Any]) -> list[int]:
    """The backtest's origins: each window trains on the periods before it and forecasts
    the next ``horizon``; the last window ends with the series."""
    last = n - spec["horizon"]
    return [last - spec["step"] * i for i in reversed(range(spec["windows"]))]


def scale(y: np.ndarray, season: int) -> float:
    """MASE's denominator: the in-sample mean absolute error of the seasonal naive
    forecast (of the naive one when the series is shorter than two seasons); 1 when
    that is zero."""
    season = season if len(y) > season else 1
    errors = np.abs(y[season:] - y[:-season])
    value = float(errors.mean()) if len(errors) else 0.0
    return value if value > 0 else 1.0


def backtest(kind: kinds.ForecastKind, params: dict[str, Any], series: Series,
             origins: list[int], seed: int, plan: Plan) -> np.ndarray:
    """The forecasts of every backtest window, concatenated."""
    spec, horizon = plan.forecast, plan.forecast["horizon"]
    parts = []
    for origin in origins:
        model = kind.fit_series(params, series.frame.iloc[:origin], seed, plan.threads, spec)
        future = series.frame.iloc[origin:origin + horizon].drop(columns=TARGET)
        parts.append(kind.forecast(model, future.reset_index(drop=True), spec))
    return np.concatenate(parts)


def evaluate(series: Series, candidate: CandidateConfig, plan: Plan, key: tuple,
             origins: list[int], actual: np.ndarray, divisor: float) -> Evaluation:
    """Every setting of a candidate, backtested; the best by the metric (predictions
    divided by ``divisor``, as ``actual`` is)."""
    metric = metrics.metric(plan.metric)
    kind = kinds.forecaster(candidate)
    best, errors = Evaluation(candidate), []
    seed = stable_seed(plan.seed, key, candidate.name, "fit")
    for params in trial_settings(candidate, stable_seed(plan.seed, key, candidate.name)):
        try:
            predictions = backtest(kind, params, series, origins, seed, plan) / divisor
            if not np.isfinite(predictions).all():
                raise ValueError("the forecast has missing or infinite values")
            value = metric.score(actual, predictions)
        except Exception as exc:  # noqa: BLE001 - one bad setting must not stop the series
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        if best.params is None or metric.loss(value) < metric.loss(best.value):
            best = Evaluation(candidate, params, value, predictions)
    if best.params is None:
        best.error = "; ".join(dict.fromkeys(errors)) or "no setting could be fitted"
    return best


def baseline(series: Series, plan: Plan, key: tuple, origins: list[int],
             actual: np.ndarray, divisor: float) -> Evaluation:
    """The better of the naive forecasts (``baselines``) on the backtest."""
    found = [evaluate(series, c, plan, key, origins, actual, divisor)
             for c in baselines(plan.forecast)]
    ok = [e for e in found if e.error is None]
    if not ok:
        raise RuntimeError(f"the naive baseline failed: {found[0].error}")
    return metrics.metric(plan.metric).best(ok, lambda e: e.value)


def intervals(evaluations: list[Evaluation], actual: np.ndarray, divisor: float,
              plan: Plan) -> dict[str, Any] | None:
    """The series' conformal intervals (``forecast.intervals``; None without levels):
    offsets per bound and step from its backtest errors (``cross_selected_errors``)."""
    spec = plan.forecast
    if not spec["intervals"]:
        return None
    errors = cross_selected_errors(evaluations, actual, plan) * divisor
    offsets = conformal_offsets(errors, spec["intervals"], interval_neighbours(spec["horizon"]))
    return {"levels": spec["intervals"], "offsets": offsets}


def cross_selected_errors(evaluations: list[Evaluation], actual: np.ndarray, plan: Plan
                          ) -> np.ndarray:
    """Windows x horizon absolute backtest errors, each window's of the ensemble that
    the selection picks on the other windows: errors of a choice made without the
    window, as the future's are (the chosen ensemble's own errors on the windows it was
    chosen on are optimistic, and under-cover)."""
    metric = metrics.metric(plan.metric)
    fitted = [e for e in evaluations if e.error is None]
    window = np.arange(len(actual)) // plan.forecast["horizon"]
    errors = []
    for left_out in range(plan.forecast["windows"]):
        others = window != left_out
        rescored = [replace(e, value=metric.score(actual[others], e.predictions[others]))
                    for e in fitted]
        if not all(np.isfinite(e.value) for e in rescored):  # e.g. wape on zero windows
            rescored = fitted  # no choice without the window: the one made with it
        forecast = blended(choose(rescored, plan))
        errors.append(np.abs(actual - forecast)[~others])
    return np.stack(errors)


def member_meta(series: Series, plan: Plan, bounds: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """What a stored member of this series needs to answer future dates (and
    ``bounds``: its ensemble's interval offsets)."""
    last = series.frame[TIME].iloc[-1]
    spec = plan.forecast
    return {
        "features": [plan.time_column, *spec["exogenous"]], "categorical": {},
        "task": plan.task, "forecast": {
            "frequency": spec["frequency"], "exogenous": spec["exogenous"],
            "last": last.isoformat() if isinstance(last, pd.Timestamp) else int(last),
            "limit": answered(spec),
        } | ({"intervals": bounds} if bounds else {}),
    }


def fitted_member(candidate: CandidateConfig, weight: float, params: dict[str, Any],
                  series: Series, plan: Plan, key: tuple,
                  bounds: dict[str, Any] | None = None) -> dict[str, Any]:
    """A chosen candidate refitted on the whole series, serialized."""
    if candidate is GLOBAL:  # the job's global model continues its stored history
        return member_row(GLOBAL, weight, {}, global_forecast.history_payload(series, plan),
                          member_meta(series, plan, bounds))
    kind = kinds.forecaster(candidate)
    seed = stable_seed(plan.seed, key, candidate.name, "fit")
    model = kind.fit_series(params, series.frame, seed, plan.threads, plan.forecast)
    row = member_row(candidate, weight, params, kind.serialize(model),
                     member_meta(series, plan, bounds))
    return row | {"kind": kind.name}


def train_series(data: pd.DataFrame, key: tuple, plan: Plan,
                 global_backtest: np.ndarray | None = None
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Train one series (its rows as a frame; ``global_backtest``: the global model's
    backtest forecasts of it, when made for its whole block). Never raises: the result
    row says trained, skipped (served by its naive forecast where it has values) or
    failed."""
    start = time.perf_counter()
    try:
        series = clean_series(data, plan)
        spec = plan.forecast
        y = series.y
        origins = windows(len(y), spec)
        actual = np.concatenate([y[o:o + spec["horizon"]] for o in origins])
        divisor = (scale(y[:origins[0]], spec["season_length"])
                   if metrics.metric(plan.metric).scaled else 1.0)
        actual = actual / divisor
        evaluations = [evaluate(series, c, plan, key, origins, actual, divisor)
                       for c in plan.candidates]
        if plan.global_members:
            evaluations.append(global_forecast.evaluate_global(
                series, plan, origins, actual, divisor, global_backtest))
        naive = baseline(series, plan, key, origins, actual, divisor)
        if plan.pool:  # selection all: the baseline competes
            evaluations.append(naive)
        row = key_row(plan, key, len(data))
        chosen = summarize(row, evaluations, actual, naive.predictions, plan)
        bounds = intervals(evaluations, actual, divisor, plan)
        members = [fitted_member(e.candidate, w, e.params, series, plan, key, bounds)
                   for e, w in chosen]
        row["status"] = TRAINED
        if series.notes:
            row["reason"] = "; ".join(series.notes)
    except Exception as exc:  # noqa: BLE001 - a bad series never stops the job
        row, members = result_for_error(exc, plan, key, len(data)), []
        if isinstance(exc, Skip):
            members = naive_member(data, plan, key)
    row["fit_seconds"] = time.perf_counter() - start
    return row, members


def naive_member(data: pd.DataFrame, plan: Plan, key: tuple) -> list[dict[str, Any]]:
    """A skipped series' naive forecast (its last value, after its last date), so the
    registered model still serves it; none when it has no dated value."""
    frame = dated_rows(data, plan, []).dropna()
    frame = frame[~frame[TIME].duplicated(keep="last")]
    if frame.empty:
        return []
    for column in plan.forecast["exogenous"]:
        frame[column] = 0.0  # the naive forecast reads no exogenous value
    try:
        return [fitted_member(NAIVE, 1.0, {}, Series(frame.reset_index(drop=True), []),
                              plan, key)]
    except Exception:  # noqa: BLE001 - nothing to serve: the reason stands
        return []


def answered(spec: dict[str, Any]) -> int:
    """How many periods after its history a stored series answers: ten horizons, the
    horizon itself with the direct strategy (its regressors stop there)."""
    return spec["horizon"] * (1 if spec["strategy"] == "direct" else HORIZONS_ANSWERED)


def forecast_manifest(plan: Plan, schema: pa.Schema) -> dict[str, Any] | None:
    """What the registered model records of its forecasts (None for other tasks): the
    time column and its type, the frequency, the horizon, the exogenous columns."""
    if not plan.forecast:
        return None
    kind = schema.field(plan.time_column).type
    spec = plan.forecast
    return {"time_column": plan.time_column,
            "time_type": "date" if pa.types.is_date(kind) else "timestamp"
            if pa.types.is_timestamp(kind) else "integer",
            "frequency": spec["frequency"], "horizon": spec["horizon"],
            "season_length": spec["season_length"], "exogenous": spec["exogenous"],
            "answers": answered(spec), "intervals": spec["intervals"]}


def future_example(rows: pd.DataFrame, plan: Plan, periods: int = 5) -> pd.DataFrame:
    """Rows a forecast takes, for the model's input example: the ``periods`` after the
    series' last date (exogenous values: the last known)."""
    spec = plan.forecast
    times = times_of(rows[plan.time_column], spec)
    last = rows.iloc[[int(np.argmax(times))]]
    example = pd.concat([last] * periods, ignore_index=True)[plan.segment_by + plan.features]
    example[plan.time_column] = future_times(spec, times.max(), periods)
    return example


__all__ = ["baselines", "forecast_spec", "future_example", "train_series"]
