"""The forecasting task as the engine runs it: planning a job (the forecast spec from the
config, checked against the table's schema), what a job shares (the latest period of any
series, the global model of every backtest window and the fallback), training a block's
series, the registered model's forecast manifest and the input example.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from raybricks import kinds
from raybricks.config import CandidateConfig, JobConfig
from raybricks.errors import DataError, missing_columns
from raybricks.kinds import ForecastKind
from raybricks.kinds.forecasting import future_times, times_of
from raybricks.results import FAILED, TRAINED, keep_fallback
from raybricks.training.blocks import Blocks
from raybricks.training.forecast import global_model
from raybricks.training.forecast.backtest import (
    OwnForecast,
    baselines,
    block_made,
    train_series,
)
from raybricks.training.forecast.global_model import GLOBAL_ROWS
from raybricks.training.forecast.series import answered, block_times, forecast_spec
from raybricks.training.plan import (
    GivenGlobal,
    Plan,
    SegmentTrainer,
    Shared,
    is_categorical,
    replace_plan,
    shrink_of,
)
from raybricks.training.selection import SegmentResult

log = logging.getLogger(__name__)


def forecast_plan(config: JobConfig, schema: pa.Schema, threads: int) -> Plan:
    """Task forecast: the model's inputs are the time column and the exogenous columns;
    every series competes with its naive forecast."""
    spec = forecast_spec(config)
    needed = config.segment_by + [config.target, config.time_column, *spec.exogenous,
                                  *spec.static]
    missing = [c for c in needed if c not in schema.names]
    if missing:
        raise DataError(missing_columns(missing, schema.names))
    for column in [config.target, *spec.exogenous]:
        kind = schema.field(column).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or pa.types.is_decimal(kind)):
            raise DataError(f"column {column!r} is {kind}, not numeric: task forecast needs "
                            "a numeric target and numeric exogenous columns")
    for column in spec.static:
        kind = schema.field(column).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or is_categorical(kind)
                or pa.types.is_boolean(kind) or pa.types.is_decimal(kind)):
            raise DataError(f"static column {column!r} is {kind}: static columns hold "
                            "numbers or strings (one value per series)")
    time_type = schema.field(config.time_column).type
    dated = pa.types.is_timestamp(time_type) or pa.types.is_date(time_type)
    if dated != isinstance(spec.frequency, str) or not (
            dated or pa.types.is_integer(time_type)):
        raise DataError(
            f"time column {config.time_column!r} is {time_type} but forecast.frequency is "
            f"{spec.frequency!r}: dates and timestamps take a pandas frequency (D, W, MS, "
            "h, ...), integer periods an integer step")
    return Plan(
        segment_by=list(config.segment_by), target=config.target,
        features=[config.time_column, *spec.exogenous], categorical=[],
        time_column=config.time_column, task=config.task, metric=config.metric,
        method="backtest", fraction=0.0, folds=spec.windows,
        candidates=list(config.models), ensemble=config.ensemble.method,
        top_k=config.ensemble.top_k, within=config.ensemble.within,
        margin=config.ensemble.margin, shrink=shrink_of(config, 0.0),
        refit=True, min_rows=config.min_rows, seed=config.seed,
        threads=threads, selection=config.selection,
        pool=baselines(spec) if config.selection == "all" else [],
        serve_skipped=True, large_segment_rows=0, forecast=spec,
        key_fields=[schema.field(name) for name in config.segment_by],
    )


def series_end(blocks: Blocks, time_column: str) -> Any:
    """The latest period of the whole dataset (the end of the longest series)."""
    end = blocks.latest(time_column)
    return end if end is None or isinstance(end, int) else str(end)


def fit_global_models(blocks: Blocks, plan: Plan, config: JobConfig, num_rows: int
                            ) -> tuple[list[list[dict]], str | None]:
    """Task forecast: the global model of every backtest window (what each series'
    backtest compares) and over whole series (the fallback, last), from the series of
    every block (sampled to about GLOBAL_ROWS rows); or no models and why."""
    fraction = min(1.0, GLOBAL_ROWS / max(num_rows, 1))
    log.info("global model: fitted in %s on a sample of at most %d rows", blocks.calls_on,
             GLOBAL_ROWS)
    parts = blocks.map(global_model.series_rows, plan, fraction)
    return blocks.get([blocks.call(global_model.fit_global, global_model.global_candidate(config),
                                   plan, *parts, num_cpus=plan.threads)])[0]


def forecast_manifest(plan: Plan, schema: pa.Schema) -> dict[str, Any] | None:
    """What the registered model records of its forecasts: the
    time column and its type (``date``, ``timestamp``: with a time zone, as Spark's
    TIMESTAMP; ``timestamp_ntz``: without, as TIMESTAMP_NTZ; ``integer``), the
    frequency, the horizon, the exogenous columns."""
    kind = schema.field(plan.time_column).type
    spec = plan.forecast
    time_type = ("date" if pa.types.is_date(kind) else "integer"
                 if not pa.types.is_timestamp(kind) else "timestamp" if kind.tz
                 else "timestamp_ntz")
    found = {"time_column": plan.time_column, "time_type": time_type,
             "frequency": spec.frequency, "horizon": spec.horizon,
             "season_length": spec.season_length, "exogenous": spec.exogenous,
             "answers": answered(spec), "intervals": spec.intervals}
    weights = pretrained_weights(plan)
    return found | ({"pretrained": weights} if weights else {})


def pretrained_weights(plan: Plan) -> dict[str, dict[str, str]]:
    """Per pretrained candidate, where its weights came from: their source, SHA-256 and
    how the registered model keeps them (``store``)."""
    found = {}
    for candidate in plan.candidates:
        weights = kinds.forecaster(candidate).weights()
        if weights is not None:
            found[candidate.name] = weights
    return found


def future_example(rows: pd.DataFrame, plan: Plan, periods: int = 5) -> pd.DataFrame:
    """Rows a forecast takes, for the model's input example: the ``periods`` after the
    series' last date (exogenous values: the last known)."""
    spec = plan.forecast
    times = times_of(rows[plan.time_column], spec.frequency)
    last = rows.iloc[[int(np.argmax(times))]]
    example = pd.concat([last] * periods, ignore_index=True)[plan.segment_by + plan.features]
    example[plan.time_column] = future_times(spec.frequency, times.max(), periods)
    return example


def with_final(plan: Plan, fallback: list[dict[str, Any]]) -> Plan:
    """``plan`` with the global model over whole series (``fallback``: its members) for
    the tasks to forecast their series' horizon with, where they do
    (``forecast.own_forecast``)."""
    return replace_plan(plan, global_final=fallback) if plan.forecast.own_forecast else plan


class ForecastTask:
    """The forecasting task (``tasks.Task``): each segment a series, forecast ahead."""

    evaluates_apart = False  # every task holds the GPUs its most demanding candidate asks
    spreads = False  # a series' backtests are short: packing series keeps every CPU busy

    def plan(self, config: JobConfig, schema: pa.Schema, threads: int) -> Plan:
        return forecast_plan(config, schema, threads)

    def kind(self, candidate: CandidateConfig) -> ForecastKind:
        return kinds.forecaster(candidate)

    def share(self, blocks: Blocks, plan: Plan, config: JobConfig, num_rows: int,
              given: GivenGlobal | None = None) -> Shared:
        """The latest period of any series (series ending before it are noted) and, with
        ``fallback: global``, the global model of every backtest window, which competes
        in every series, and over whole series, the fallback. ``given``: the champion's
        global model, kept (it competes in every window and is the fallback), or the
        whole source's blocks the global models learn from."""
        plan = replace_plan(plan, forecast=replace(plan.forecast,
                                                   end=series_end(blocks, plan.time_column)))
        if config.fallback != "global":
            return Shared(plan, lambda run_dir: None)
        if given is not None and given.kept:
            shared = given.shared(plan, plan.forecast.windows)
            return replace(shared, plan=with_final(shared.plan, given.members))
        if given is not None and given.blocks is not None:
            blocks, num_rows = given.blocks, given.num_rows
        models, error = fit_global_models(blocks, plan, config, num_rows)
        if error is not None:
            log.warning("the global model was not trained (%s): every series trains "
                        "without it", error)
            return Shared(plan, lambda run_dir: keep_fallback(
                run_dir, {"status": FAILED, "error": error}, []))
        plan = with_final(replace_plan(plan, global_members=models[:-1],
                                       global_token=uuid.uuid4().hex), models[-1])
        return Shared(plan, lambda run_dir: keep_fallback(run_dir, {"status": TRAINED},
                                                          models[-1]))

    def trainer(self, frame: pd.DataFrame, todo: list, plan: Plan,
                found: list[dict] | None = None) -> SegmentTrainer:
        frame = block_times(frame, plan)
        # every series cleaned once; the global model's and the lag models' backtests
        # of the block's series, each window in one pass
        made = block_made(frame, todo, plan)
        if not plan.forecast.own_forecast:
            return lambda key, start, end: train_series(frame.iloc[start:end], key, plan,
                                                        made.get(key))
        own = OwnForecast(plan)  # each series' own forecast of its horizon too

        def train(key: tuple, start: int, end: int) -> tuple[SegmentResult, list[dict]]:
            row, members = train_series(frame.iloc[start:end], key, plan, made.get(key))
            return row, own.added(members)

        return train

    def train_large(self, refs: list, keys: list[list[tuple]], plan: Plan,
                    config: JobConfig, run_dir: Path) -> None:
        raise NotImplementedError("a forecast plan has no large segments")

    def evaluator(self, frame: pd.DataFrame, todo: list, plan: Plan, names: list[str],
                  store: bool) -> Callable:
        raise NotImplementedError("a series' candidates are backtested on one task")

    def spread_functions(self) -> tuple[Callable, Callable, Callable]:
        raise NotImplementedError("series are packed, never spread")

    def example(self, rows: pd.DataFrame, plan: Plan) -> pd.DataFrame:
        return future_example(rows, plan)

    def manifest(self, plan: Plan, schema: pa.Schema) -> dict[str, Any]:
        return forecast_manifest(plan, schema)


FORECAST = ForecastTask()
