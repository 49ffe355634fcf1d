"""A series as every forecasting step reads it: the job's forecast spec, one segment's rows
cleaned onto its frequency's grid (``clean_series``), and its backtest windows.

Plain Python on one segment's pandas frame; the per-series recipe (``forecast.py``) and the
global forecasting model (``global_model.py``) both build on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import date
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from raybricks.config import JobConfig
from raybricks.kinds.forecasting import TARGET, TIME, ForecastSpec, HolidaySpec, times_of
from raybricks.kinds.lags import memory
from raybricks.training.plan import Plan
from raybricks.training.selection import Skip

#: Rows of a stored series' model answer dates up to this many horizons ahead.
HORIZONS_ANSWERED = 10


#: A series whose values are zero this often is intermittent (reported, still trained).
INTERMITTENT_ZEROS = 0.5


def forecast_spec(config: JobConfig) -> ForecastSpec:
    """What every series is trained with (travels in the Plan)."""
    forecast, validation = config.forecast, config.validation
    holidays = forecast.holidays
    static = list(dict.fromkeys(forecast.static + (
        config.segment_by if config.global_segment_features else [])))
    return ForecastSpec(
        horizon=forecast.horizon, frequency=forecast.frequency,
        season_length=forecast.seasonality, lags=forecast.lag_list,
        rolling={stat: list(w) for stat, w in forecast.rolling.items()},
        rolling_lag=forecast.rolling_lag, date_features=list(forecast.date_features),
        exogenous=list(forecast.exogenous), transform=forecast.transform,
        static=static,
        gaps=forecast.gaps, duplicates=forecast.duplicates,
        intervals=sorted(set(forecast.intervals)), strategy=forecast.strategy,
        holidays=None if holidays is None else HolidaySpec(
            country=holidays.country, subdivision=holidays.subdivision,
            dates=tuple(sorted(holidays.dates)), before=holidays.before,
            after=holidays.after),
        windows=validation.windows, step=validation.step or forecast.horizon,
        residuals=forecast.hierarchy is not None,
        own_forecast=not forecast.exogenous and not static,
    )


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


class Unfit(Skip):
    """A series cleaned onto its grid that cannot be backtested as configured: constant,
    negative values with ``transform: log1p``, or too short (``short``). ``series``:
    the cleaned series, which serves it (``skipped_members``)."""

    def __init__(self, reason: str, series: Series, short: bool = False) -> None:
        super().__init__(reason)
        self.series = series
        self.short = short


def clean_series(data: pd.DataFrame, plan: Plan) -> Series:
    """The segment's rows as a series on the grid of its frequency: one row per date
    (``forecast.duplicates``), from its first value to its last (empty periods before
    and after them dropped, and noted), gaps between them as ``forecast.gaps`` says.
    Skip for what cannot be forecast (no value, duplicate dates with ``duplicates:
    skip``, dates off the frequency, gaps with ``gaps: skip``); Unfit for a series that
    cannot be backtested as configured (constant, too short, ...)."""
    spec = plan.forecast
    exogenous = spec.exogenous
    frame, notes = on_grid(data, plan)
    if spec.holidays:
        replace = near_holidays(frame[TIME], spec.holidays)
        if replace.any():
            frame[TARGET] = seasonal_fill(frame[TARGET].to_numpy(dtype="float64"), replace,
                                          periods_per_week(spec.frequency))
            notes.append(f"holidays replaced: {int(replace.sum())} period(s) near holidays "
                         "(by the same weekday and time of the nearest weeks)")
    if exogenous:
        frame[exogenous] = frame[exogenous].ffill().bfill()
        if frame[exogenous].isna().any(axis=None):
            raise Skip(f"exogenous column(s) {exogenous} have no value in this series")
    y = frame[TARGET].to_numpy(dtype="float64")
    series = Series(frame, notes, static_values(data, plan))
    if y.min() == y.max():
        raise Unfit(f"constant series: every value is {float(y[0])!r}", series)
    if spec.transform == "log1p" and y.min() < 0:
        raise Unfit("negative values with forecast.transform=log1p", series)
    end = spec.end
    if end is not None:
        end = latest_period(end, spec.frequency)
        last = frame[TIME].iloc[-1]
        behind = len(grid_between(last, end, spec) if last < end else []) - 1
        if behind > 0:
            notes.append(f"ended early: last value {behind} period(s) before the latest "
                         "series' end (its forecasts start after its own last date)")
    zeros = float(np.mean(y == 0))
    if zeros >= INTERMITTENT_ZEROS:
        notes.append(f"intermittent: {zeros:.0%} of periods are zero")
    needed = minimum_length(spec, plan.min_rows)
    if len(y) < needed:
        raise Unfit(f"short series: {len(y)} periods; a backtest of {spec.windows} "
                    f"window(s) of {spec.horizon} needs at least {needed}", series,
                    short=True)
    return series


def on_grid(data: pd.DataFrame, plan: Plan) -> tuple[pd.DataFrame, list[str]]:
    """``clean_series``' first steps: the rows on the frequency's grid (``ds``, ``y``,
    exogenous), one per period from the first value to the last, gaps filled as
    ``forecast.gaps`` says; and the notes saying what was done."""
    spec = plan.forecast
    exogenous = spec.exogenous
    frame = regular_rows(data, plan)
    if frame is not None:
        return frame, []
    frame = dated_rows(data, plan, exogenous)
    if frame.empty:
        raise Skip("no dates: the time column is null in every row")
    frame, notes = one_row_per_date(frame, spec)
    valued = np.flatnonzero(frame[TARGET].notna().to_numpy())
    if not len(valued):
        raise Skip(f"no value: the target is empty (null, NaN or infinite) in every one of "
                   f"its {len(frame)} dated row(s)")
    before, after = int(valued[0]), len(frame) - 1 - int(valued[-1])
    frame = frame.iloc[valued[0]:valued[-1] + 1]
    first, last = frame[TIME].iloc[0], frame[TIME].iloc[-1]
    if before:
        notes.append(f"leading empty periods dropped: {before} (the series starts at its "
                     f"first value, {first})")
    if after:
        notes.append(f"trailing empty periods dropped: {after} (the series ends at its "
                     f"last value, {last})")
    grid = grid_of(frame[TIME], spec)
    if grid is None:
        raise Skip(f"dates do not follow frequency {spec.frequency!r}: they are not every "
                   f"period from {first} (set forecast.frequency to the data's)")
    if len(grid) != len(frame):
        frame = frame.set_index(TIME).reindex(grid).rename_axis(TIME).reset_index()
    gaps = int(np.isnan(frame[TARGET].to_numpy()).sum())
    if gaps:
        if spec.gaps == "skip":
            raise Skip(f"gaps: {gaps} of {len(frame)} periods have no value (set "
                       "forecast.gaps: zero or forward to fill them)")
        filled = frame[TARGET].fillna(0.0) if spec.gaps == "zero" else frame[TARGET].ffill()
        frame[TARGET] = filled
        notes.append(f"gaps filled: {gaps} period(s) ({spec.gaps})")
    return frame, notes


def regular_rows(data: pd.DataFrame, plan: Plan) -> pd.DataFrame | None:
    """The rows as they are where they already are a series on the grid (every period
    once, in time order, each with a value: the common case, without pandas'
    reindexing); None otherwise."""
    spec = plan.forecast
    times = data[plan.time_column]
    kind = times.dtype.kind if isinstance(times.dtype, np.dtype) else ""
    if kind not in ("M" if isinstance(spec.frequency, str) else "iu"):
        return None
    values = times.to_numpy()
    ticks = values.astype("datetime64[ns]").view("int64") if kind == "M" else values
    if not every_period(ticks, spec.frequency):
        return None
    target = numbers(data[plan.target])
    if not np.isfinite(target).all():
        return None
    return pd.DataFrame({TIME: times_of(values, spec.frequency), TARGET: target,
                         **{column: numbers(data[column]) for column in spec.exogenous}})


@lru_cache(maxsize=8)
def latest_period(end: Any, frequency: str | int) -> Any:
    """The job's latest period (``ForecastSpec.end``) as a series' times hold it."""
    return times_of(pd.Series([end]), frequency)[0]


def one_row_per_date(frame: pd.DataFrame, spec: ForecastSpec
                     ) -> tuple[pd.DataFrame, list[str]]:
    """``frame`` (``dated_rows``) with one row per date, as ``forecast.duplicates`` says:
    ``sum`` adds a date's targets, ``mean`` averages them, ``last`` keeps its last row's
    (the last with a value); exogenous columns take the mean of the date's rows
    (``last``: the last row's). Skip with ``skip``. Also the note saying so."""
    repeated = frame[TIME].duplicated(keep=False)
    if not repeated.any():
        return frame, []
    dates = frame[TIME][repeated].unique()
    policy = spec.duplicates
    if policy == "skip":
        raise Skip(f"duplicate dates: {len(dates)} date(s) have more than one row (first "
                   f"{dates[0]}; set forecast.duplicates: sum, mean or last to aggregate "
                   "them)")
    by_date = frame.groupby(TIME, sort=True)
    if policy == "last":
        merged = by_date.last()
    else:
        merged = by_date.mean()
        if policy == "sum":
            merged[TARGET] = by_date[TARGET].sum(min_count=1)
    return (merged.reset_index()[frame.columns],
            [f"duplicate dates aggregated: {len(dates)} ({policy})"])


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


def near_holidays(times: pd.Series, spec: HolidaySpec) -> np.ndarray:
    """Whether each of ``times`` falls from ``before`` days before a holiday of ``spec``
    (``forecast.holidays``) to ``after`` days after it."""
    days = pd.DatetimeIndex(times).tz_localize(None).normalize()
    before, after = spec.before, spec.after
    found = holiday_days(spec.country, spec.subdivision, spec.dates,
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
    columns = plan.forecast.static
    if not columns:
        return {}
    latest_last = data.iloc[np.argsort(times_of(data[plan.time_column], plan.forecast.frequency),
                                       kind="stable")]
    values = {}
    for column in columns:
        present = latest_last[column].dropna()
        values[column] = present.iloc[-1] if len(present) else None
    return values


def numbers(values: pd.Series) -> np.ndarray:
    """A column as float64 (NaN where missing or not a number)."""
    if pd.api.types.is_float_dtype(values.dtype):
        return values.to_numpy(dtype="float64")
    return pd.to_numeric(values, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)


def dated_rows(data: pd.DataFrame, plan: Plan, columns: list[str]) -> pd.DataFrame:
    """The segment's rows with a date, in time order: ``ds``, ``y`` and ``columns`` as
    numbers (NaN where missing; an infinite target too)."""
    times = times_of(data[plan.time_column], plan.forecast.frequency)
    target = numbers(data[plan.target])
    target[~np.isfinite(target)] = np.nan
    frame = pd.DataFrame({TIME: times, TARGET: target,
                          **{column: numbers(data[column]) for column in columns}})
    dated = ~np.asarray(times.isna())
    if not dated.all():
        frame = frame[dated]
    if not frame[TIME].is_monotonic_increasing:
        frame = frame.sort_values(TIME, kind="stable")
    return frame.reset_index(drop=True)


def block_times(frame: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """A block's rows with its time column converted once (``times_of``), so that each
    series' cleaning does not convert its own."""
    column = plan.time_column
    return frame.assign(**{column: np.asarray(times_of(frame[column],
                                                       plan.forecast.frequency))})


def grid_between(first: Any, last: Any, spec: ForecastSpec) -> pd.Index | None:
    """Every period from ``first`` to ``last``; None when ``first`` is not on the grid."""
    frequency = spec.frequency
    if isinstance(frequency, int):
        return pd.Index(np.arange(first, last + 1, frequency))
    grid = pd.date_range(first, last, freq=frequency)
    return grid if len(grid) and grid[0] == first else None


def grid_of(times: pd.Series | pd.Index, spec: ForecastSpec) -> pd.Index | None:
    """Every period from the first of ``times`` (sorted) to the last; None when one of
    them is off that grid."""
    times = pd.Index(times)
    if every_period(times.asi8 if isinstance(times, pd.DatetimeIndex) else times.to_numpy(),
                    spec.frequency):
        return times  # the grid itself
    grid = grid_between(times[0], times[-1], spec)
    return None if grid is None or grid.get_indexer(times).min() < 0 else grid


def every_period(ticks: np.ndarray, frequency: str | int) -> bool:
    """Whether times (``ticks``: integers, nanoseconds for dates) are every period of a
    fixed-step ``frequency`` once, in order, from a first one on its grid."""
    step = fixed_step(frequency)
    if step is None or len(ticks) < 2 or not (np.diff(ticks) == step).all():
        return False
    return isinstance(frequency, int) or pd.tseries.frequencies.to_offset(
        frequency).is_on_offset(pd.Timestamp(int(ticks[0])))


@lru_cache(maxsize=64)
def fixed_step(frequency: str | int) -> int | None:
    """The step between two periods of ``frequency`` in the times' integer unit
    (nanoseconds for dates), where it is fixed (D, h, W-SUN, an integer step); None
    where it varies (MS, ME, B, ...)."""
    if isinstance(frequency, int):
        return frequency
    offset = pd.tseries.frequencies.to_offset(frequency)
    if isinstance(offset, pd.offsets.Week) and offset.n == 1:  # W-SUN: anchored, 7 days
        return 7 * 86_400 * 10**9
    try:
        return int(offset.nanos)
    except ValueError:
        return None


def frequency_problem(times: dict[tuple, pd.Index], spec: ForecastSpec) -> str | None:
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
    frequency = spec.frequency
    reasons = {}
    for key, t in sampled.items():
        grid = grid_of(t, spec)
        spacing = None if isinstance(frequency, int) else pd.infer_freq(t)
        if grid is None:
            reasons[key] = "are not on its grid" + (f" (they are {spacing!r})" if spacing else "")
        elif spec.gaps == "skip" and spacing and len(grid) > len(t):
            reasons[key] = (f"are {spacing!r}: every period between them would be missing, and "
                            "the series skipped (gaps: skip)")
        else:
            return None
    key, reason = next(iter(reasons.items()))
    return (f"forecast.frequency={frequency!r} does not fit the data: the dates of segment "
            f"{key} {reason}, and so for every one of the {len(reasons)} segment(s) "
            "sampled; set forecast.frequency to the data's (a pandas frequency such as D, "
            "W-SUN, MS, h, or an integer step)")


def minimum_length(spec: ForecastSpec, min_rows: int) -> int:
    """The shortest series the backtest can run on: the first window's training part
    (``min_rows``, and enough for the lags) plus every window's origin."""
    train = max(min_rows, memory(spec) + 10)
    return train + spec.horizon + spec.step * (spec.windows - 1)


def fitting_windows(n: int, spec: ForecastSpec, min_rows: int) -> int:
    """The most backtest windows, at most the configured ones, that a series of ``n``
    periods fits (``minimum_length``); 0 when not even one does."""
    for count in range(spec.windows, 0, -1):
        if n >= minimum_length(replace(spec, windows=count), min_rows):
            return count
    return 0


def windows(n: int, spec: ForecastSpec) -> list[int]:
    """The backtest's origins: each window trains on the periods before it and forecasts
    the next ``horizon``; the last window ends with the series."""
    last = n - spec.horizon
    return [last - spec.step * i for i in reversed(range(spec.windows))]


def scale(y: np.ndarray, season: int) -> float:
    """MASE's denominator: the in-sample mean absolute error of the seasonal naive
    forecast (of the naive one when the series is shorter than two seasons); 1 when
    that is zero."""
    season = season if len(y) > season else 1
    errors = np.abs(y[season:] - y[:-season])
    value = float(errors.mean()) if len(errors) else 0.0
    return value if value > 0 else 1.0


def answered(spec: ForecastSpec) -> int:
    """How many periods after its history a stored series answers: ten horizons, the
    horizon itself with the direct strategy (its regressors stop there)."""
    return spec.horizon * (1 if spec.strategy == "direct" else HORIZONS_ANSWERED)
