"""Training one series (task forecast): clean it onto its frequency's grid, backtest every
candidate and the naive baselines over rolling origins, blend (or pick) per series,
refit the chosen members on the whole series.

Plain Python on one series' pandas frame (``series.py`` cleans it), like ``tabular.py``
for a table's segment, with whose selection (``selection.py``) and result rows
(``plan.py``) it shares; ``forecast_task.py`` runs it for the engine.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from raybricks import kinds, metrics, profiles
from raybricks.config import CandidateConfig
from raybricks.errors import first_line
from raybricks.kinds.base import MemberMeta, SeriesMeta, member_meta
from raybricks.kinds.forecasting import (
    TARGET,
    TIME,
    ForecastSpec,
    conformal_offsets,
    future_times,
    interval_neighbours,
)
from raybricks.segmented_model import SegmentModel
from raybricks.training import recipe
from raybricks.training.forecast import global_model
from raybricks.training.forecast.series import (
    Series,
    Unfit,
    answered,
    clean_series,
    dated_rows,
    fitting_windows,
    grid_of,
    minimum_length,
    one_row_per_date,
    scale,
    windows,
)
from raybricks.training.plan import GLOBAL, Plan, stable_seed
from raybricks.training.recipe import Chosen, Unit
from raybricks.training.search import method_of, search_best
from raybricks.training.selection import (
    Evaluation,
    SegmentResult,
    Skip,
    cross_fitted,
    member_row,
    summarize,
)

#: The fewest periods AutoETS is fitted on without a backtest (a series too short for
#: one backtest window); it also needs two seasons.
UNSELECTED_MINIMUM = 10


def baselines(spec: ForecastSpec) -> list[CandidateConfig]:
    """The naive forecasts every series is compared with: the last value and, with a
    season, the last season's values; the better of them on the backtest is the
    series' baseline."""
    season = spec.season_length
    if season > 1:
        return [CandidateConfig(name="baseline", kind="statsforecast",
                                estimator="SeasonalNaive", params={"season_length": season}),
                NAIVE]
    return [NAIVE]


NAIVE = CandidateConfig(name="baseline", kind="statsforecast", estimator="Naive")


def backtest_candidate(series: Series, candidate: CandidateConfig, plan: Plan, key: tuple,
                       origins: list[int], actual: np.ndarray, divisor: float,
                       made: np.ndarray | None = None) -> Evaluation:
    """The settings of a candidate (grid, random draws or bayes: ``search.search_best``),
    backtested; the best by the metric (predictions divided by ``divisor``, as ``actual``
    is). ``made``: the backtest forecasts of its one setting, made for the whole block
    (``block_made``)."""
    metric = metrics.metric(plan.metric)
    kind = kinds.forecaster(candidate)
    seed = stable_seed(plan.seed, key, candidate.name, "fit")

    def fit(params: dict[str, Any]) -> Evaluation:
        forecasts = made if made is not None else kind.backtest(
            params, series.frame, origins, seed, plan.threads, plan.forecast)
        predictions = forecasts / divisor
        if not np.isfinite(predictions).all():
            raise ValueError("the forecast has missing or infinite values")
        return Evaluation(candidate, params, metric.score(actual, predictions), predictions)

    return search_best(candidate, stable_seed(plan.seed, key, candidate.name), plan.metric,
                       fit)


def naive_baseline(series: Series, plan: Plan, key: tuple, origins: list[int],
                   actual: np.ndarray, divisor: float,
                   scored: dict[str, Evaluation] | None = None) -> Evaluation:
    """The better of the naive forecasts (``baselines``) on the backtest; a naive
    forecast that is also a candidate of the job (``scored``: the candidates'
    evaluations by name) is taken from it rather than backtested again."""
    found = [same_backtest(c, scored or {}) or backtest_candidate(
        series, c, plan, key, origins, actual, divisor) for c in baselines(plan.forecast)]
    ok = [e for e in found if e.error is None]
    if not ok:
        raise RuntimeError(f"the naive baseline failed: {found[0].error}")
    return metrics.metric(plan.metric).best(ok, lambda e: e.value)


def same_backtest(candidate: CandidateConfig, scored: dict[str, Evaluation]
                  ) -> Evaluation | None:
    """``candidate``'s backtest from a candidate of the same model and parameters that
    was backtested without a search (None if there is none)."""
    for e in scored.values():
        other = e.candidate
        if (e.error is None and e.predictions is not None and method_of(other) == "none"
                and other.kind == candidate.kind and other.estimator == candidate.estimator
                and dict(other.params) == dict(candidate.params)):
            return Evaluation(candidate, dict(candidate.params), e.value, e.predictions)
    return None


def intervals(errors: np.ndarray, divisor: float, plan: Plan) -> dict[str, Any] | None:
    """The series' conformal intervals (``forecast.intervals``; None without levels):
    offsets per bound and step from its backtest errors (``cross_selected_errors``)."""
    spec = plan.forecast
    if not spec.intervals:
        return None
    errors = errors * divisor
    offsets = conformal_offsets(errors, spec.intervals, interval_neighbours(spec.horizon))
    return {"levels": spec.intervals, "offsets": offsets}


def cross_selected_errors(evaluations: list[Evaluation], actual: np.ndarray, plan: Plan,
                          cross: np.ndarray | None = None) -> np.ndarray:
    """Windows x horizon absolute backtest errors, each window's of the ensemble that
    the selection picks on the other windows (``cross``: those forecasts, when the caller
    has them): errors of a choice made without the window, as the future's are (the
    chosen ensemble's own errors on the windows it was chosen on are optimistic, and
    under-cover)."""
    horizon = plan.forecast.horizon
    if cross is None:
        cross = cross_fitted(evaluations, actual, np.arange(len(actual)) // horizon, plan)
    return np.abs(actual - cross).reshape(-1, horizon)


def series_meta(series: Series, plan: Plan, bounds: dict[str, Any] | None = None,
                residuals: np.ndarray | None = None) -> MemberMeta:
    """What a stored member of this series needs to answer future dates (and
    ``bounds``: its ensemble's interval offsets; ``residuals``: its backtest errors)."""
    spec = plan.forecast
    stored: SeriesMeta = {"frequency": spec.frequency, "exogenous": spec.exogenous,
                          "last": last_period(series), "limit": answered(spec)}
    if bounds:
        stored["intervals"] = bounds
    if residuals is not None:
        stored["residuals"] = np.round(residuals, 10).tolist()
    return member_meta([plan.time_column, *spec.exogenous], plan.task, forecast=stored)


def last_period(series: Series) -> str | int:
    """The series' last period as stored: an ISO date-time (UTC, naive) or an integer."""
    last = series.frame[TIME].iloc[-1]
    return last.isoformat() if isinstance(last, pd.Timestamp) else int(last)


def member_model(candidate: CandidateConfig, params: dict[str, Any], series: Series,
                 plan: Plan, key: tuple) -> Any:
    """A chosen candidate fitted on the whole series (None for the global model's
    member, which continues the series with the job's global model)."""
    if candidate is GLOBAL:
        return None
    seed = stable_seed(plan.seed, key, candidate.name, "fit")
    return kinds.forecaster(candidate).fit_series(params, series.frame, seed, plan.threads,
                                                  plan.forecast)


def fitted_member(candidate: CandidateConfig, weight: float, params: dict[str, Any],
                  series: Series, plan: Plan, key: tuple,
                  bounds: dict[str, Any] | None = None,
                  residuals: np.ndarray | None = None, model: Any = None) -> dict[str, Any]:
    """A chosen candidate refitted on the whole series (``model``: fitted already),
    serialized."""
    meta = series_meta(series, plan, bounds, residuals)
    if candidate is GLOBAL:  # the job's global model continues its stored history
        return member_row(GLOBAL, weight, {}, global_model.history_payload(series, plan),
                          meta)
    if model is None:
        model = member_model(candidate, params, series, plan, key)
    kind = kinds.forecaster(candidate)
    row = member_row(candidate, weight, params, kind.serialize(model), meta)
    return row | {"kind": kind.name}


def model_intervals(chosen: list[tuple[Evaluation, float, Any]], plan: Plan
                    ) -> dict[str, Any] | None:
    """A series' intervals from its model's own quantiles (``ForecastKind.own_intervals``)
    where its ensemble is that one member and its candidate asks for them; None
    otherwise (conformal intervals)."""
    levels = plan.forecast.intervals
    if len(chosen) != 1 or not levels or chosen[0][0].candidate is GLOBAL:
        return None
    found, _, model = chosen[0]
    offsets = kinds.forecaster(found.candidate).own_intervals(found.params, model, levels)
    return None if offsets is None else {"levels": levels, "offsets": offsets,
                                         "method": "quantiles"}


class OwnForecast:
    """Series forecast in the task that fitted them (``ForecastSpec.own_forecast``):
    each series' horizon after its history as its registered model answers it (its
    members, as stored, their weighted mean; a member of the global model continues the
    series with the global model over whole series, ``Plan.global_final``), stored as
    ``base`` in its members' forecast meta. Reconciliation starts from these, and the
    registered model answers its next periods from them (``SegmentModel.stored``)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.fallback = (SegmentModel.from_rows(plan.global_final) if plan.global_final
                         else None)

    def added(self, members: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``members`` (a series' serialized members; none for a failed series) with its
        own forecast in each one's meta; where that forecast fails, with the error
        instead (``SeriesMeta.base_error``: reconciliation counts the series as one
        without a forecast and says why)."""
        if not members:
            return members
        try:
            model = SegmentModel.from_rows(members, self.fallback)
            spec, last = self.plan.forecast, model.meta["forecast"]["last"]
            times = future_times(spec.frequency, last if isinstance(last, int)
                                 else pd.Timestamp(last), spec.horizon)
            found: dict[str, Any] = {"base": model.forecast_next(times).tolist()}
        except Exception as exc:  # noqa: BLE001 - reconciled as a series without one
            found = {"base_error": f"{type(exc).__name__}: {first_line(exc)}"}
        return [member | {"meta": json.dumps(with_forecast(json.loads(member["meta"]),
                                                           found), default=str)}
                for member in members]


def with_forecast(meta: MemberMeta, found: dict[str, Any]) -> MemberMeta:
    """A member's meta with ``found`` (``SeriesMeta.base`` or ``base_error``) added to
    its series' meta."""
    return meta | {"forecast": meta["forecast"] | found}


@dataclass
class BlockMade:
    """What the task made once for a series' whole block (``block_made``): the series
    cleaned, the global model's backtest forecasts of it and the backtest forecasts of
    the candidates whose kind backtests many series at once, by name."""

    series: Series
    global_backtest: np.ndarray | None = None
    forecasts: dict[str, np.ndarray] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # its share of each batch
    fitted: dict[str, Any] = field(default_factory=dict)  # ``ForecastKind.fit_each``'s


def block_made(frame: pd.DataFrame, bounds: list[tuple[tuple, int, int]], plan: Plan
               ) -> dict[tuple, BlockMade]:
    """Each series of a block (``bounds``: key, first and end row in ``frame``) cleaned
    once, with the backtests made for all of them at once: the global model's
    (``global_model.block_backtests``) and those of the candidates of one setting whose
    kind has ``backtest_many`` (lag models). Series that do not clean as configured
    (skipped, too short for the windows) are left out: their own training reports them;
    a batch that fails leaves its candidate to each series, which reports the error."""
    found = {}
    for key, start, end in bounds:
        try:
            found[key] = BlockMade(clean_series(frame.iloc[start:end], plan))
        except Exception:  # noqa: BLE001 - its own training reports why
            continue
    if not found:
        return found
    series = {key: made.series for key, made in found.items()}
    if plan.global_members:
        for key, forecasts in global_model.block_backtests(series, plan).items():
            found[key].global_backtest = forecasts
    keys = list(found)
    frames = [series[key].frame for key in keys]
    origins = [windows(len(f), plan.forecast) for f in frames]
    for candidate in plan.candidates:
        if method_of(candidate) != "none":
            continue  # settings to search: each series searches its own
        seeds = [stable_seed(plan.seed, key, candidate.name, "fit") for key in keys]
        kind, params = kinds.forecaster(candidate), dict(candidate.params)
        began = time.perf_counter()
        try:
            made = kind.backtest_many(params, frames, origins, seeds, plan.threads,
                                      plan.forecast)
            fitted = (kind.fit_each(params, frames, seeds, plan.threads, plan.forecast)
                      if made is not None else None)
        except Exception:  # noqa: BLE001 - each series then tries alone
            continue
        share = (time.perf_counter() - began) / len(keys)
        for position, (key, forecasts) in enumerate(zip(keys, made or [], strict=False)):
            found[key].forecasts[candidate.name] = forecasts
            found[key].seconds[candidate.name] = share
            if fitted is not None:
                found[key].fitted[candidate.name] = fitted[position]
    return found


@dataclass
class Backtest:
    """A series ready to backtest: its cleaned values, the windows' origins, the actual
    values of every window (divided by ``divisor``, the scale of a scaled metric), the
    naive baseline's backtest and the global model's forecasts of it (if made for its
    whole block)."""

    series: Series
    origins: list[int]
    actual: np.ndarray
    divisor: float
    global_backtest: np.ndarray | None
    made: dict[str, np.ndarray] = field(default_factory=dict)  # ``BlockMade.forecasts``
    scored: dict[str, Evaluation] = field(default_factory=dict)  # the candidates', by name
    naive: Evaluation | None = None  # set by ``SeriesUnit.rivals``
    # set by ``SeriesUnit.select``: what was compared and its cross-fitted forecasts
    evaluations: list[Evaluation] = field(default_factory=list)
    cross: np.ndarray | None = None


class SeriesUnit(Unit):
    """A series as the recipe trains it: cleaned and cut into backtest windows
    (``backtestable``), every candidate backtested, the global model's backtest and the
    naive baseline beside them, the choice (cross-fitted over the windows) refitted on
    the whole series with its conformal intervals; a skipped series is served as
    ``skipped_members`` says."""

    def __init__(self, data: pd.DataFrame, key: tuple, plan: Plan,
                 made: BlockMade | None = None) -> None:
        super().__init__(key, plan, self.evaluate_candidate, len(data))
        self.data, self.job, self.made = data, plan, made
        self.shared_seconds = sum(made.seconds.values()) if made is not None else 0.0

    def prepare(self) -> Backtest:
        if self.made is not None:
            series, global_backtest = self.made.series, self.made.global_backtest
        else:
            series, self.plan, global_backtest = backtestable(self.data, self.job)
        spec = self.plan.forecast
        y = series.y
        origins = windows(len(y), spec)
        actual = np.concatenate([y[o:o + spec.horizon] for o in origins])
        divisor = (scale(y[:origins[0]], spec.season_length)
                   if metrics.metric(self.plan.metric).scaled else 1.0)
        return Backtest(series, origins, actual / divisor, divisor, global_backtest,
                        self.made.forecasts if self.made is not None else {})

    def evaluate_candidate(self, bt: Backtest, candidate: CandidateConfig) -> Evaluation:
        """The evaluator: every setting of the candidate backtested here (or its
        forecasts made for the whole block, scored)."""
        found = backtest_candidate(bt.series, candidate, self.plan, self.key, bt.origins,
                                   bt.actual, bt.divisor, bt.made.get(candidate.name))
        bt.scored[candidate.name] = found
        return found

    def rivals(self, bt: Backtest) -> list[Evaluation]:
        found = []
        if self.plan.global_members:
            found.append(global_model.backtest_global(
                bt.series, self.plan, bt.origins, bt.actual, bt.divisor, bt.global_backtest))
        bt.naive = naive_baseline(bt.series, self.plan, self.key, bt.origins, bt.actual,
                                  bt.divisor, bt.scored)
        if self.plan.pool:  # selection all: the baseline competes
            found.append(bt.naive)
        return found

    def select(self, bt: Backtest, row: SegmentResult, evaluations: list[Evaluation]
               ) -> Chosen:
        window = np.arange(len(bt.actual)) // self.plan.forecast.horizon
        bt.cross = cross_fitted(evaluations, bt.actual, window, self.plan)  # metric, intervals
        bt.evaluations = evaluations
        chosen = summarize(row, evaluations, bt.actual, bt.naive.predictions, self.plan,
                           window, bt.cross)
        for name, share in (self.made.seconds if self.made is not None else {}).items():
            if name in row.seconds:  # backtested with its block: its share of that
                row.seconds[name] += share
        if bt.series.notes:  # after the selection's own (summarize), if it wrote one
            row.reason = "; ".join([*([row.reason] if row.reason else []), *bt.series.notes])
        return chosen

    def members(self, bt: Backtest, chosen: Chosen) -> list[dict[str, Any]]:
        made = self.made.fitted if self.made is not None else {}
        fitted = [(e, w, made[e.candidate.name] if e.candidate.name in made else
                   member_model(e.candidate, e.params, bt.series, self.plan, self.key))
                  for e, w in chosen]
        bounds = model_intervals(fitted, self.plan) or intervals(cross_selected_errors(
            bt.evaluations, bt.actual, self.plan, bt.cross), bt.divisor, self.plan)
        residuals = (((bt.actual - bt.cross) * bt.divisor).reshape(
            -1, self.plan.forecast.horizon) if self.plan.forecast.residuals else None)
        return [fitted_member(e.candidate, w, e.params, bt.series, self.plan, self.key,
                              bounds, residuals, model) for e, w, model in fitted]

    def profile(self, bt: Backtest) -> dict[str, Any]:
        """The series' naive forecast (its last season, or value, as its baseline chose),
        MASE's scale on its whole history, its last period and its numeric exogenous
        columns' bins."""
        spec, y = self.plan.forecast, bt.series.y
        season = (spec.season_length if bt.naive is not None
                  and bt.naive.candidate.estimator == "SeasonalNaive" else 1)
        numeric = [c for c in spec.exogenous
                   if pd.api.types.is_numeric_dtype(bt.series.frame[c].dtype)]
        values = (bt.series.frame[numeric].to_numpy(dtype="float64", na_value=np.nan)
                  if numeric else np.empty((len(y), 0)))
        return profiles.profile(values, numeric, None, [], y[-season:].tolist(),
                                len(bt.actual)) | {
            "scale": scale(y, spec.season_length), "last": last_period(bt.series)}

    def served(self, error: Exception, row: SegmentResult) -> list[dict[str, Any]]:
        if not isinstance(error, Skip):
            return []
        members, served = skipped_members(self.data, self.job, self.key, error)
        notes = error.series.notes if isinstance(error, Unfit) else []
        row.reason = "; ".join([row.reason, *([served] if served else []), *notes])
        return members


def train_series(data: pd.DataFrame, key: tuple, plan: Plan, made: BlockMade | None = None
                 ) -> tuple[SegmentResult, list[dict[str, Any]]]:
    """Train one series (its rows as a frame; ``made``: what was made for its whole
    block, ``block_made``). Never raises: the result row says trained (on fewer backtest
    windows where it is too short for the configured ones: ``backtestable``), skipped
    (served as ``skipped_members`` says, where it has values) or failed."""
    return recipe.train(SeriesUnit(data, key, plan, made))


def backtestable(data: pd.DataFrame, plan: Plan
                 ) -> tuple[Series, Plan, np.ndarray | None]:
    """The series cleaned (``clean_series``), the plan it is backtested with and the
    global model's backtest forecasts of it (none: made for its block, they are in
    ``BlockMade``). A series too short for the configured
    backtest windows gets a plan of as many as it fits, down to one (noted first in its
    reason; with one window, no prediction intervals: they need two), each window the
    one the job's backtest has at that place, the global model's too. Raises Unfit
    (short) when not even one window fits."""
    try:
        return clean_series(data, plan), plan, None
    except Unfit as unfit:
        if not unfit.short:
            raise
        series, spec = unfit.series, plan.forecast
        n, configured = len(series.frame), spec.windows
        count = fitting_windows(n, spec, plan.min_rows)
        if not count:
            one = replace(spec, windows=1)
            raise Unfit(f"short series: {n} periods; one backtest window of "
                        f"{spec.horizon} needs at least "
                        f"{minimum_length(one, plan.min_rows)}", series, short=True) from None
        note = (f"short: {count} of {configured} backtest windows ({n} periods; "
                f"{configured} windows need {minimum_length(spec, plan.min_rows)})")
        shortened = replace(spec, windows=count)
        if spec.intervals and count < 2:
            shortened = replace(shortened, intervals=[])
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
    policy = "last" if spec.duplicates == "skip" else spec.duplicates
    frame, _ = one_row_per_date(dated_rows(data, plan, []), replace(spec, duplicates=policy))
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
    frame = frame.assign(**dict.fromkeys(spec.exogenous, 0.0))
    return Series(frame.reset_index(drop=True), [])


def naive_members(series: Series, plan: Plan, key: tuple
                  ) -> tuple[list[dict[str, Any]], str]:
    """A skipped series' seasonal naive forecast (its last season repeated) where it has
    a season of periods, else its naive forecast (its last value), after its last date;
    and the note saying which; nothing (and no note) when it cannot be fitted."""
    spec = plan.forecast
    season, n = spec.season_length, len(series.frame)
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
    season, n = spec.season_length, len(series.frame)
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


__all__ = ["baselines", "train_series"]
