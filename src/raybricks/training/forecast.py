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
    Plan,
    Skip,
    key_row,
    member_row,
    result_for_error,
    stable_seed,
)
from raybricks.training.selection import Evaluation, cross_fitted, summarize

#: Rows of a stored series' model answer dates up to this many horizons ahead.
HORIZONS_ANSWERED = 10
#: A series whose values are zero this often is intermittent (reported, still trained).
INTERMITTENT_ZEROS = 0.5
#: The fewest periods AutoETS is fitted on without a backtest (a series too short for
#: one backtest window); it also needs two seasons.
UNSELECTED_MINIMUM = 10


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
        "gaps": forecast.gaps, "duplicates": forecast.duplicates,
        "intervals": sorted(set(forecast.intervals)),
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
    exogenous = spec["exogenous"]
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
        raise Skip(f"dates do not follow frequency {spec['frequency']!r}: they are not every "
                   f"period from {first} (set forecast.frequency to the data's)")
    frame = frame.set_index(TIME).reindex(grid).rename_axis(TIME).reset_index()
    gaps = int(frame[TARGET].isna().sum())
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
    series = Series(frame, notes, static_values(data, plan))
    if y.min() == y.max():
        raise Unfit(f"constant series: every value is {float(y[0])!r}", series)
    if spec["transform"] == "log1p" and y.min() < 0:
        raise Unfit("negative values with forecast.transform=log1p", series)
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
    needed = minimum_length(spec, plan.min_rows)
    if len(y) < needed:
        raise Unfit(f"short series: {len(y)} periods; a backtest of {spec['windows']} "
                    f"window(s) of {spec['horizon']} needs at least {needed}", series,
                    short=True)
    return series


def one_row_per_date(frame: pd.DataFrame, spec: dict[str, Any]
                     ) -> tuple[pd.DataFrame, list[str]]:
    """``frame`` (``dated_rows``) with one row per date, as ``forecast.duplicates`` says:
    ``sum`` adds a date's targets, ``mean`` averages them, ``last`` keeps its last row's
    (the last with a value); exogenous columns take the mean of the date's rows
    (``last``: the last row's). Skip with ``skip``. Also the note saying so."""
    repeated = frame[TIME].duplicated(keep=False)
    if not repeated.any():
        return frame, []
    dates = frame[TIME][repeated].unique()
    policy = spec["duplicates"]
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
    numbers (NaN where missing; an infinite target too)."""
    target = pd.to_numeric(data[plan.target], errors="coerce").astype("float64")
    frame = pd.DataFrame({TIME: times_of(data[plan.time_column], plan.forecast),
                          TARGET: target.where(np.isfinite(target)).to_numpy()})
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


def fitting_windows(n: int, spec: dict[str, Any], min_rows: int) -> int:
    """The most backtest windows, at most the configured ones, that a series of ``n``
    periods fits (``minimum_length``); 0 when not even one does."""
    for count in range(spec["windows"], 0, -1):
        if n >= minimum_length(spec | {"windows": count}, min_rows):
            return count
    return 0


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


def intervals(errors: np.ndarray, divisor: float, plan: Plan) -> dict[str, Any] | None:
    """The series' conformal intervals (``forecast.intervals``; None without levels):
    offsets per bound and step from its backtest errors (``cross_selected_errors``)."""
    spec = plan.forecast
    if not spec["intervals"]:
        return None
    errors = errors * divisor
    offsets = conformal_offsets(errors, spec["intervals"], interval_neighbours(spec["horizon"]))
    return {"levels": spec["intervals"], "offsets": offsets}


def cross_selected_errors(evaluations: list[Evaluation], actual: np.ndarray, plan: Plan,
                          cross: np.ndarray | None = None) -> np.ndarray:
    """Windows x horizon absolute backtest errors, each window's of the ensemble that
    the selection picks on the other windows (``cross``: those forecasts, when the caller
    has them): errors of a choice made without the window, as the future's are (the
    chosen ensemble's own errors on the windows it was chosen on are optimistic, and
    under-cover)."""
    horizon = plan.forecast["horizon"]
    if cross is None:
        cross = cross_fitted(evaluations, actual, np.arange(len(actual)) // horizon, plan)
    return np.abs(actual - cross).reshape(-1, horizon)


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
    row says trained (on fewer backtest windows where it is too short for the
    configured ones: ``backtestable``), skipped (served as ``skipped_members`` says,
    where it has values) or failed."""
    start = time.perf_counter()
    job = plan
    try:
        series, plan, global_backtest = backtestable(data, plan, global_backtest)
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
        window = np.arange(len(actual)) // spec["horizon"]
        cross = cross_fitted(evaluations, actual, window, plan)  # once: metric, intervals
        chosen = summarize(row, evaluations, actual, naive.predictions, plan, window, cross)
        bounds = intervals(cross_selected_errors(evaluations, actual, plan, cross), divisor,
                           plan)
        members = [fitted_member(e.candidate, w, e.params, series, plan, key, bounds)
                   for e, w in chosen]
        row["status"] = TRAINED
        if series.notes:
            row["reason"] = "; ".join(series.notes)
    except Exception as exc:  # noqa: BLE001 - a bad series never stops the job
        row, members = result_for_error(exc, job, key, len(data)), []
        if isinstance(exc, Skip):
            members, served = skipped_members(data, job, key, exc)
            notes = exc.series.notes if isinstance(exc, Unfit) else []
            row["reason"] = "; ".join([row["reason"], *([served] if served else []), *notes])
    row["fit_seconds"] = time.perf_counter() - start
    return row, members


def backtestable(data: pd.DataFrame, plan: Plan, global_backtest: np.ndarray | None = None
                 ) -> tuple[Series, Plan, np.ndarray | None]:
    """The series cleaned (``clean_series``), the plan it is backtested with and the
    global model's backtest forecasts of it. A series too short for the configured
    backtest windows gets a plan of as many as it fits, down to one (noted first in its
    reason; with one window, no prediction intervals: they need two), each window the
    one the job's backtest has at that place, the global model's too. Raises Unfit
    (short) when not even one window fits."""
    try:
        return clean_series(data, plan), plan, global_backtest
    except Unfit as unfit:
        if not unfit.short:
            raise
        series, spec = unfit.series, plan.forecast
        n, configured = len(series.frame), spec["windows"]
        count = fitting_windows(n, spec, plan.min_rows)
        if not count:
            one = spec | {"windows": 1}
            raise Unfit(f"short series: {n} periods; one backtest window of "
                        f"{spec['horizon']} needs at least "
                        f"{minimum_length(one, plan.min_rows)}", series, short=True) from None
        note = (f"short: {count} of {configured} backtest windows ({n} periods; "
                f"{configured} windows need {minimum_length(spec, plan.min_rows)})")
        shortened = spec | {"windows": count}
        if spec["intervals"] and count < 2:
            shortened["intervals"] = []
            note += "; no prediction intervals (they need 2 windows)"
        series.notes.insert(0, note)
        plan = replace(plan, forecast=shortened, folds=count,
                       global_members=plan.global_members[-count:],
                       global_token=f"{plan.global_token}/last {count}")
        return series, plan, None  # the block's global backtests left it out


def skipped_members(data: pd.DataFrame, plan: Plan, key: tuple, skip: Skip
                    ) -> tuple[list[dict[str, Any]], str]:
    """What serves a skipped series, so that the registered model still forecasts it,
    and the note saying so: for a series too short for one backtest window, AutoETS
    fitted on the whole series (``unselected_member``); else its seasonal naive
    forecast where it has a season of complete periods, else its naive forecast
    (``naive_members``); nothing without a dated value. The series is the cleaned one
    where cleaning got that far (``Unfit``), else its last complete periods
    (``served_history``)."""
    series = skip.series if isinstance(skip, Unfit) else served_history(data, plan)
    if series is None:
        return [], ""
    if isinstance(skip, Unfit) and skip.short:
        found = unselected_member(series, plan, key)
        if found is not None:
            return found
    return naive_members(series, plan, key)


def served_history(data: pd.DataFrame, plan: Plan) -> Series | None:
    """A skipped series' values for its naive forecasts: one per date (a date's rows
    aggregated as ``forecast.duplicates`` says, the last with ``skip``), its periods on
    the grid since its last missing one (its last value only when its dates are off the
    grid); None without a dated value."""
    spec = plan.forecast
    policy = "last" if spec["duplicates"] == "skip" else spec["duplicates"]
    frame, _ = one_row_per_date(dated_rows(data, plan, []), spec | {"duplicates": policy})
    frame = frame.dropna(subset=[TARGET])
    if frame.empty:
        return None
    grid = grid_of(frame[TIME], spec)
    if grid is None:
        frame = frame.iloc[-1:]
    else:
        frame = frame.set_index(TIME).reindex(grid).rename_axis(TIME).reset_index()
        missing = np.flatnonzero(frame[TARGET].isna().to_numpy())
        frame = frame.iloc[missing[-1] + 1 if len(missing) else 0:]
    # the naive forecasts read no exogenous value
    frame = frame.assign(**dict.fromkeys(spec["exogenous"], 0.0))
    return Series(frame.reset_index(drop=True), [])


def naive_members(series: Series, plan: Plan, key: tuple
                  ) -> tuple[list[dict[str, Any]], str]:
    """A skipped series' seasonal naive forecast (its last season repeated) where it has
    a season of periods, else its naive forecast (its last value), after its last date;
    and the note saying which; nothing (and no note) when it cannot be fitted."""
    spec = plan.forecast
    season, n = spec["season_length"], len(series.frame)
    if season > 1 and n >= season:
        candidate = baselines(spec)[0]
        note = f"served by its seasonal naive forecast (its last {season} periods repeated)"
    else:
        candidate = NAIVE
        note = "served by its naive forecast (its last value" + (
            f"; {n} complete period(s), fewer than a season of {season})" if season > 1
            else ")")
    try:
        return [fitted_member(candidate, 1.0, candidate.params, series, plan, key)], note
    except Exception:  # noqa: BLE001 - nothing to serve: the reason stands
        return [], ""


def unselected_member(series: Series, plan: Plan, key: tuple
                      ) -> tuple[list[dict[str, Any]], str] | None:
    """A series too short for one backtest window: AutoETS (the season from the spec)
    fitted on the whole series, without a backtest or selection, where the job has a
    statsforecast candidate and the series two seasons (and ``UNSELECTED_MINIMUM``
    periods); and the note saying so. None otherwise, or when it cannot be fitted."""
    spec = plan.forecast
    season, n = spec["season_length"], len(series.frame)
    statistical = kinds.resolve("statsforecast")
    if n < max(2 * season, UNSELECTED_MINIMUM) or not any(
            issubclass(kinds.forecaster_kind(c.kind), statistical) for c in plan.candidates):
        return None
    candidate = CandidateConfig(name="auto_ets", kind="statsforecast", estimator="AutoETS",
                                params={"season_length": season})
    try:
        member = fitted_member(candidate, 1.0, candidate.params, series, plan, key)
    except Exception:  # noqa: BLE001 - the naive forecasts serve it instead
        return None
    return [member], (f"served by AutoETS (season {season}) fitted on the whole series, "
                      "without a backtest")


def answered(spec: dict[str, Any]) -> int:
    """How many periods after its history a stored series answers: ten horizons, the
    horizon itself with the direct strategy (its regressors stop there)."""
    return spec["horizon"] * (1 if spec["strategy"] == "direct" else HORIZONS_ANSWERED)


def forecast_manifest(plan: Plan, schema: pa.Schema) -> dict[str, Any] | None:
    """What the registered model records of its forecasts (None for other tasks): the
    time column and its type (``date``, ``timestamp``: with a time zone, as Spark's
    TIMESTAMP; ``timestamp_ntz``: without, as TIMESTAMP_NTZ; ``integer``), the
    frequency, the horizon, the exogenous columns."""
    if not plan.forecast:
        return None
    kind = schema.field(plan.time_column).type
    spec = plan.forecast
    time_type = ("date" if pa.types.is_date(kind) else "integer"
                 if not pa.types.is_timestamp(kind) else "timestamp" if kind.tz
                 else "timestamp_ntz")
    return {"time_column": plan.time_column, "time_type": time_type,
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
