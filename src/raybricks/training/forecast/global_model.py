"""The global forecasting model (task forecast with ``fallback: global``): one lag model
over every series at once, with their static columns (``forecast.static``).

It is fitted once per backtest window, on every series cut at that window's origin (each
series' own: the windows end with each series), and competes in each series' backtest
like a candidate; then once on whole series, stored as the registered model's fallback,
which forecasts a series that chose it by continuing that series' stored history.
"""

from __future__ import annotations

import io
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from raybricks import kinds, metrics
from raybricks.config import CandidateConfig, JobConfig
from raybricks.data import segment_bounds
from raybricks.kinds.base import member_meta
from raybricks.kinds.forecasting import ID, TARGET, ForecastSpec
from raybricks.kinds.lags import Continued, LagsKind, memory
from raybricks.training.forecast.series import Series, clean_series, windows
from raybricks.training.plan import GLOBAL, Plan, global_models
from raybricks.training.search import first_setting
from raybricks.training.selection import Evaluation, member_row

#: The global model learns from at most about this many rows (whole series, sampled).
GLOBAL_ROWS = 1_000_000


def global_candidate(config: JobConfig) -> CandidateConfig:
    """The candidate the global model is fitted as: the first of a table kind (its first
    setting, no search)."""
    return next(model for model in config.models
                if issubclass(kinds.forecaster_kind(model.kind), LagsKind))


def series_rows(block: pa.Table, index: int, plan: Plan, fraction: float) -> pd.DataFrame:
    """A task's body (``Blocks.map``): a seeded share (``fraction``) of the block's
    series, cleaned as their own training cleans them (series it skips are left out),
    with their static values and an id unique in the job (``index``: the block's)."""

    frame = block.select(plan.columns).to_pandas()
    rng = np.random.default_rng(plan.seed + index)
    parts = []
    for position, (_, start, end) in enumerate(segment_bounds(block, plan.segment_by)):
        if rng.random() >= fraction:
            continue
        try:
            series = clean_series(frame.iloc[start:end], plan)
        except Exception:  # noqa: BLE001 - skipped (or failing) series teach nothing
            continue
        parts.append(series.history().assign(**{ID: f"{index}/{position}"}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def fit_global(candidate: CandidateConfig, plan: Plan, *parts: pd.DataFrame
               ) -> tuple[list[list[dict[str, Any]]], str | None]:
    """Ray task body: the global model of each backtest window, then over whole series
    (the last), each as the member rows of a segment model; or no models and why."""
    parts = tuple(p for p in parts if len(p))
    if not parts:
        return [], "no series could be trained (every one was skipped)"
    try:
        return fitted_windows(candidate, plan, pd.concat(parts, ignore_index=True)), None
    except Exception as exc:  # noqa: BLE001 - the series still train without it
        return [], f"{type(exc).__name__}: {exc}"


def global_spec(spec: ForecastSpec) -> ForecastSpec:
    """The global model's spec: the series' with each series standardized (mlforecast's
    ``LocalStandardScaler``) where ``transform`` is none: one model, many levels."""
    return replace(spec, transform="standardize") if spec.transform == "none" else spec


def fitted_windows(candidate: CandidateConfig, plan: Plan, frame: pd.DataFrame
                   ) -> list[list[dict[str, Any]]]:
    """The global model of each backtest window and over whole series (the last)."""
    spec = global_spec(plan.forecast)
    kind = kinds.forecaster(candidate)
    params = first_setting(candidate, plan.seed)
    from_end = frame.groupby(ID, sort=False).cumcount(ascending=False).to_numpy()
    cuts = [spec.horizon + spec.step * (spec.windows - 1 - w)
            for w in range(spec.windows)] + [0]
    meta = member_meta([plan.time_column, *spec.exogenous], plan.task, forecast={
        "frequency": spec.frequency, "exogenous": spec.exogenous})
    models = []
    for cut in cuts:
        model = kind.fit_many(params, frame[from_end >= cut], plan.seed, plan.threads, spec,
                              spec.static)
        row = member_row(candidate, 1.0, params, kind.serialize(model), meta)
        models.append([row | {"kind": kind.name}])
    return models


def block_backtests(found: dict[tuple, Series], plan: Plan) -> dict[tuple, np.ndarray]:
    """The global model's backtest forecasts of a block's series (``found``: cleaned, by
    key), windows concatenated: one prediction per window for every series at once
    instead of one per series and window. Empty when the batch fails; series missing
    from it (skipped ones) are forecast one at a time by ``evaluate_global``, which also
    reports their errors."""
    if not found:
        return {}
    spec, horizon = plan.forecast, plan.forecast.horizon
    paths: list[np.ndarray] = []
    try:
        for window, model in enumerate(global_models(plan)):
            member = model.members[0][0]
            histories, futures = [], []
            for number, series in enumerate(found.values()):
                origin = windows(len(series.frame), spec)[window]
                histories.append(series.history(origin).assign(**{ID: number}))
                futures.append(series.frame.iloc[origin:origin + horizon]
                               .drop(columns=TARGET).assign(**{ID: number}))
            paths.append(member.kind.continue_many(
                member.model, pd.concat(histories, ignore_index=True),
                pd.concat(futures, ignore_index=True), horizon, spec.exogenous))
    except Exception:  # noqa: BLE001 - each series then tries on its own
        return {}
    return {key: np.concatenate([path[number] for path in paths])
            for number, key in enumerate(found)}


def backtest_global(series: Series, plan: Plan, origins: list[int], actual: np.ndarray,
                    divisor: float, forecasts: np.ndarray | None = None) -> Evaluation:
    """The global model on the series' backtest: each window forecast by that window's
    global model from the series' history before the window (``forecasts``: those,
    already made by ``block_backtests``); predictions divided by ``divisor``, as
    ``actual`` is."""
    horizon = plan.forecast.horizon
    try:
        if forecasts is None:
            parts = []
            for model, origin in zip(global_models(plan), origins, strict=True):
                member = model.members[0][0]
                future = series.frame.iloc[origin:origin + horizon].drop(columns=TARGET)
                parts.append(member.kind.forecast_loaded(
                    Continued(member.model, series.history(origin)),
                    future.reset_index(drop=True), member.meta))
            forecasts = np.concatenate(parts)
        predictions = forecasts / divisor
        if not np.isfinite(predictions).all():
            raise ValueError("the forecast has missing or infinite values")
        value = metrics.metric(plan.metric).score(actual, predictions)
    except Exception as exc:  # noqa: BLE001 - the global model not fitting this series
        return Evaluation(GLOBAL, error=f"{type(exc).__name__}: {exc}")
    return Evaluation(GLOBAL, {}, value, predictions)


def history_payload(series: Series, plan: Plan) -> bytes:
    """What a series that chose the global model stores: its last periods (enough for the
    lags, twice over) with its static values, as Parquet."""
    tail = series.history().tail(2 * memory(plan.forecast))
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(tail, preserve_index=False), sink)
    return sink.getvalue()
