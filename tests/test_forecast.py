"""Task forecast: the config, backtests, per-series selection against the seasonal naive
baseline, data conditions, the registered model answering future dates (plain MLflow,
no raybricks), and ``raybricks forecast``."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from raybricks import kinds, metrics, tracking
from raybricks.cli import main
from raybricks.config import JobConfig, SourceConfig
from raybricks.data import to_ray_dataset
from raybricks.errors import ConfigError, RaybricksError
from raybricks.kinds.base import prepare_features
from raybricks.kinds.forecasting import conformal_offsets, interval_columns
from raybricks.pipeline import validate
from raybricks.results import FAILED, SKIPPED, TRAINED
from raybricks.scoring import (
    REASON_CHARACTERS,
    fetch_model,
    forecast,
    future_rows,
    score,
)
from raybricks.segmented_model import SegmentModel
from raybricks.training import train_segments
from raybricks.training.forecast.backtest import (
    backtestable,
    block_made,
    cross_selected_errors,
    train_series,
)
from raybricks.training.forecast.series import clean_series, periods_per_week, scale, windows
from raybricks.training.plan import stable_seed
from raybricks.training.selection import Evaluation
from raybricks.training.tasks import make_plan
from tests.test_registry import BLOCK_RAYBRICKS

HORIZON = 7
MODELS = [
    {"name": "lgbm", "kind": "lightgbm",
     "params": {"n_estimators": 30, "num_leaves": 7, "min_child_samples": 5}},
    {"name": "theta", "kind": "statsforecast", "estimator": "AutoTheta",
     "params": {"season_length": 7}},
]
#: Quick statistical candidates (no lag model).
FAST = [{"name": "ets", "kind": "statsforecast", "estimator": "AutoETS"},
        {"name": "snaive", "kind": "statsforecast", "estimator": "SeasonalNaive",
         "params": {"season_length": 7}}]
START = pd.Timestamp("2024-01-01")


def forecast_job(tmp_path, **changes) -> JobConfig:
    base = {
        "source": {"table": "unused"}, "segment_by": ["store"], "target": "sales",
        "time_column": "day", "task": "forecast", "models": MODELS, "min_rows": 20,
        "forecast": {"horizon": HORIZON, "frequency": "D", "rolling": {"mean": [7]},
                     "date_features": ["dayofweek"]},
        "training": {"output_dir": str(tmp_path), "progress": False},
    }
    return JobConfig.from_dict(base | changes)


def series(store: str, values: np.ndarray, start: pd.Timestamp = START, **columns
           ) -> pd.DataFrame:
    days = pd.date_range(start, periods=len(values), freq="D")
    return pd.DataFrame({"store": store, "day": days, "sales": values, **columns})


def stores(seed: int = 0) -> pd.DataFrame:
    """``season*``: a weekly pattern on a trend (models beat the seasonal naive
    forecast); ``noise*``: noise around a level (the seasonal naive forecast repeats
    noise); one series ending three weeks before the others."""
    rng = np.random.default_rng(seed)
    frames = []
    t = np.arange(120)
    for s in range(6):
        weekly = 5 * np.sin(2 * np.pi * t / 7 + s)
        frames.append(series(f"season{s}", 50 + 0.3 * t + weekly + rng.normal(size=120)))
        frames.append(series(f"noise{s}", 30 + rng.normal(scale=3, size=120)))
    frames.append(series("early", 40 + 5 * np.sin(2 * np.pi * t[:100] / 7)
                         + rng.normal(size=100)))
    return pd.concat(frames, ignore_index=True)


def plan_for(frame: pd.DataFrame, tmp_path, **changes):
    config = forecast_job(tmp_path, **changes)
    return make_plan(config, pa.Schema.from_pandas(frame, preserve_index=False))


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("changes, message", [
    ({"forecast": None}, "needs a forecast section"),
    ({"time_column": None}, "needs time_column"),
    ({"validation": {"method": "holdout"}}, "validates by backtest only"),
    ({"features": ["x"]}, "forecast.exogenous"),
    ({"fallback": "global", "models": MODELS[1:]}, "needs a candidate of a table kind"),
    ({"forecast": {"horizon": 7, "frequency": "D", "static": ["kind"]}},
     "set fallback: global"),
    ({"global_segment_features": True}, "set fallback: global"),
    ({"forecast": {"horizon": 7, "frequency": "D", "static": ["store"]},
      "fallback": "global"}, "the target, the time column or segment columns"),
    ({"forecast": {"horizon": 7, "frequency": "D", "static": ["x"], "exogenous": ["x"]},
      "fallback": "global"}, "both as forecast.exogenous"),
    ({"forecast": {"horizon": 7, "frequency": "fortnightly"}}, "not a pandas frequency"),
    ({"forecast": {"horizon": 7, "frequency": 1, "date_features": ["month"]}},
     "need a date time column"),
    ({"forecast": {"horizon": 7, "frequency": "D", "date_features": ["weekday_name"]}},
     "unknown"),
    ({"forecast": {"horizon": 7, "frequency": "D", "exogenous": ["sales"]}},
     "the target, the time column"),
    ({"models": [{"name": "ets", "kind": "statsforecast"}]}, "needs estimator"),
    ({"models": [{"name": "g", "kind": "global"}]}, "cannot forecast"),
    ({"validation": {"metric": "logloss"}}, "does not fit task='forecast'"),
    ({"forecast": {"horizon": 7, "frequency": "D", "intervals": [80, 100]}},
     "between 0 and 100"),
    ({"forecast": {"horizon": 7, "frequency": "D", "intervals": [90]},
      "validation": {"windows": 1}}, "windows of at least 2"),
    ({"forecast": {"horizon": 7, "frequency": "W", "holidays": "US"}}, "daily or finer"),
    ({"forecast": {"horizon": 7, "frequency": 1, "holidays": "US"}}, "daily or finer"),
    ({"forecast": {"horizon": 7, "frequency": "D", "holidays": "XX"}},
     "list_supported_countries"),
    ({"forecast": {"horizon": 7, "frequency": "D", "holidays": {"before": 1}}},
     "names no holidays"),
    ({"forecast": {"horizon": 7, "frequency": "D", "duplicates": "max"}},
     "forecast.duplicates: .*'skip', 'sum', 'mean',? (or )?'last' \\(got 'max'\\)"),
    ({"forecast": {"horizon": 7, "frequency": "D", "gaps": "fill"}},
     "forecast.gaps: .*'skip', 'zero',? (or )?'forward' \\(got 'fill'\\)"),
    ({"forecast": {"horizon": 7, "frequency": "D", "exogenous": ["promo"],
                   "output": "out"}}, "needs their future values"),
])
def test_inconsistent_forecast_configs_are_clear_errors(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        forecast_job(tmp_path, **changes)


def test_forecast_output_needs_the_logged_model(tmp_path):
    from raybricks.pipeline import check_job

    config = forecast_job(tmp_path, forecast={"horizon": 7, "frequency": "D",
                                              "output": str(tmp_path / "out")})
    with pytest.raises(ConfigError, match="train with register=True"):
        check_job(config, register=False)


@pytest.mark.parametrize(("estimator", "likely"), [("AutoEts", "AutoETS"),
                                                    ("AutoArim", "AutoARIMA")])
def test_a_misspelt_statsforecast_model_is_named_with_the_likely_one(tmp_path, estimator,
                                                                    likely):
    from raybricks.pipeline import check_job

    config = forecast_job(tmp_path, models=[{"name": "m", "kind": "statsforecast",
                                             "estimator": estimator}])
    with pytest.raises(ConfigError, match=rf"has no model '{estimator}' \(did you mean "
                                          rf"{likely}\b"):
        check_job(config, register=False)


def test_backtest_belongs_to_task_forecast(tmp_path):
    with pytest.raises(ConfigError, match="validation.method=backtest is the validation"):
        JobConfig.from_dict({"source": {"table": "t"}, "segment_by": ["s"], "target": "y",
                             "models": MODELS[:1], "validation": {"method": "backtest"}})


def test_defaults_backtest_mase_and_lags_from_the_season(tmp_path):
    config = forecast_job(tmp_path)
    assert config.validation.method == "backtest" and config.metric == "mase"
    assert config.forecast.seasonality == 7
    assert config.forecast.lag_list == [1, 2, 3, 4, 5, 6, 7]


def test_time_column_type_must_match_the_frequency(tmp_path):
    frame = series("a", np.arange(40.0)).assign(day=np.arange(40))
    with pytest.raises(Exception, match="integer periods an integer step"):
        plan_for(frame, tmp_path)


def test_forecasting_metrics():
    y, pred = np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 2.0, 2.0, 6.0])
    assert metrics.metric("wape").score(y, pred) == pytest.approx(4 / 10)
    assert metrics.metric("bias").score(y, pred) == pytest.approx(0.5)
    bias = metrics.metric("bias")
    assert bias.better(-0.1, 0.5) and not bias.better(-0.6, 0.5)  # closest to zero wins
    assert metrics.metric("mase").scaled
    # in-sample seasonal naive error: |y_t - y_{t-2}| = 2 for every t
    assert scale(np.array([1.0, 5.0, 3.0, 7.0, 5.0]), 2) == pytest.approx(2.0)


# --------------------------------------------------------------------------- one series


def test_backtest_windows_end_with_the_series_and_the_baseline_matches_numpy(tmp_path):
    rng = np.random.default_rng(1)
    y = 50 + 5 * np.sin(2 * np.pi * np.arange(90) / 7) + rng.normal(size=90)
    frame = series("a", y)
    plan = plan_for(frame, tmp_path, validation={"windows": 3, "step": 5}, selection="all")
    origins = windows(90, plan.forecast)
    assert origins == [73, 78, 83] and origins[-1] + HORIZON == 90
    row, members = train_series(frame, ("a",), plan)
    row = row.as_row(plan)
    assert row["status"] == TRAINED
    # the seasonal naive forecast of each window, computed here independently
    predictions = np.concatenate(
        [[y[o - 7 + k % 7] for k in range(HORIZON)] for o in origins])
    actual = np.concatenate([y[o:o + HORIZON] for o in origins])
    denominator = np.mean(np.abs(y[7:73] - y[:66]))
    expected = np.mean(np.abs(actual - predictions)) / denominator
    assert row["baseline_mase"] == pytest.approx(expected, rel=1e-9)
    assert row["metric_mase"] <= row["baseline_mase"]


def test_the_baseline_is_the_better_naive_forecast(tmp_path):
    rng = np.random.default_rng(3)
    y = 100 + np.cumsum(rng.normal(scale=2, size=90))  # a random walk: no season
    frame = series("walk", y)
    plan = plan_for(frame, tmp_path, validation={"windows": 3, "step": 5})
    origins = windows(90, plan.forecast)
    row, _ = train_series(frame, ("walk",), plan)
    row = row.as_row(plan)
    actual = np.concatenate([y[o:o + HORIZON] for o in origins])
    denominator = np.mean(np.abs(y[7:origins[0]] - y[:origins[0] - 7]))
    last = np.concatenate([np.full(HORIZON, y[o - 1]) for o in origins])
    week = np.concatenate([[y[o - 7 + k % 7] for k in range(HORIZON)] for o in origins])
    naive, seasonal = (np.mean(np.abs(actual - p)) / denominator for p in (last, week))
    assert naive < seasonal  # the last value beats last week's on a random walk
    assert row["baseline_mase"] == pytest.approx(naive, rel=1e-9)


def test_defaults_blend_local_candidates_and_selection_all_lets_the_baseline_compete(
        tmp_path):
    t = np.arange(90)
    y = 50 + 10 * np.sin(2 * np.pi * t / 7)  # an exact weekly cycle: last week is perfect
    noisy = series("cycle", y + np.random.default_rng(1).normal(scale=0.5, size=90))
    plan = plan_for(noisy, tmp_path)
    assert (plan.selection, plan.ensemble, plan.top_k, plan.within, plan.pool) == (
        "local_only", "weighted", 3, 0.1, [])
    # with selection: all, a winner is not blended with the naive reference (the table
    # tasks' ensemble.shrink; worse for forecasts, docs/forecasting.md) unless set
    assert plan_for(noisy, tmp_path, selection="all").shrink == 0.0
    assert plan_for(noisy, tmp_path, ensemble={"shrink": 0.3}).shrink == 0.3
    row, members = train_series(noisy, ("cycle",), plan)
    row = row.as_row(plan)
    chosen = json.loads(row["chosen"])
    errors = {name: row[f"{name}_mase"] for name in ("lgbm", "theta")}
    best = min(errors.values())
    # the default blends the candidates within 10% of the best backtest error
    assert sorted(chosen) == sorted(n for n, e in errors.items() if e <= 1.1 * best)
    plan = plan_for(noisy, tmp_path, ensemble={"within": 100})
    row, members = train_series(noisy, ("cycle",), plan)
    row = row.as_row(plan)
    chosen = json.loads(row["chosen"])
    assert sorted(chosen) == ["lgbm", "theta"]  # both, weighted by inverse error
    weights = [m["weight"] for m in members]
    assert sum(weights) == pytest.approx(1.0)
    assert weights[0] / weights[1] == pytest.approx(errors[chosen[1]] / errors[chosen[0]])
    assert max(errors.values()) > 1.1 * best  # so the default above left one out
    frame = series("cycle", y)
    plan = plan_for(frame, tmp_path, selection="all", ensemble="best")
    row, members = train_series(frame, ("cycle",), plan)
    row = row.as_row(plan)
    assert json.loads(row["chosen"]) == ["baseline"]
    assert row["metric_mase"] == row["baseline_mase"] < row["theta_mase"]
    assert json.loads(members[0]["params"]) == {"season_length": 7}


def test_conformal_offsets_cover_a_new_error_at_least_at_their_level():
    levels = [80, 95]
    assert interval_columns(levels) == ["lo_95", "lo_80", "hi_80", "hi_95"]
    rng = np.random.default_rng(5)
    trials = 4000
    errors = np.abs(rng.standard_t(3, size=(trials, 4, 5)))  # 4 windows x 5 steps
    new = np.abs(rng.standard_t(3, size=trials))
    inside = np.zeros(2)
    for trial in range(trials):
        offsets = np.asarray(conformal_offsets(errors[trial], levels, neighbours=5))
        ordered = np.sort(errors[trial].ravel())  # every step pools all 20 errors:
        expected = [ordered[19], ordered[16]]  # the ceil(21 L)-th smallest: 20th, 17th
        np.testing.assert_array_equal(offsets[:, 2], [-expected[0], -expected[1],
                                                      expected[1], expected[0]])
        inside += new[trial] <= offsets[2:, 2]
    # exchangeable errors: a new one is inside with probability >= ceil(21 L) / 21
    assert inside[0] / trials >= 17 / 21 - 0.025 and inside[1] / trials >= 20 / 21 - 0.015
    # too few errors for the level (4 per step): the largest
    alone = np.asarray(conformal_offsets(errors[0], levels))
    np.testing.assert_array_equal(alone[3], errors[0].max(axis=0))
    # with neighbours, step s is calibrated on the errors of steps s-2..s+2 as one step
    errors = np.abs(rng.normal(size=(3, HORIZON)))
    offsets = conformal_offsets(errors, levels)
    pooled = conformal_offsets(errors, levels, neighbours=2)
    for step in (0, 3, HORIZON - 1):
        window = errors[:, max(step - 2, 0):step + 3].reshape(-1, 1)
        alone = np.asarray(conformal_offsets(window, levels))[:, 0]
        np.testing.assert_allclose(np.asarray(pooled)[:, step], alone, rtol=1e-12)
    assert np.ptp(np.asarray(pooled)[3, :]) < np.ptp(np.asarray(offsets)[3, :])  # smoother


def test_interval_errors_are_those_of_the_choice_made_without_each_window(tmp_path):
    frame = series("a", np.arange(60.0))
    plan = plan_for(frame, tmp_path, forecast={"horizon": HORIZON, "frequency": "D",
                                               "intervals": [80, 95]})
    lucky, steady = plan.candidates  # 3 windows x 7 steps of backtest, actuals zero
    actual = np.zeros(3 * HORIZON)
    lucky_errors = np.repeat([0.0, 0.0, 10.0], HORIZON)  # exact until the last window
    evaluations = [Evaluation(lucky, {}, lucky_errors.mean(), lucky_errors),
                   Evaluation(steady, {}, 2.0, np.full(3 * HORIZON, -2.0))]
    errors = cross_selected_errors(evaluations, actual, plan)
    # on all windows the steady candidate wins alone (2 against 3.3) and errs by 2 in
    # each; chosen without the last window, the lucky one wins, and misses it by 10
    np.testing.assert_array_equal(errors, np.repeat([[2.0], [2.0], [10.0]], HORIZON, axis=1))
    offsets = np.asarray(conformal_offsets(errors, [80, 95], HORIZON // 2))
    assert offsets[3].max() == 10.0 and offsets[2].max() == 10.0  # not 2: the choice errs
    # a window whose left-out choice is a blend gets the blend's errors
    evaluations = [Evaluation(lucky, {}, 2.1, np.full(3 * HORIZON, 2.1)),
                   Evaluation(steady, {}, 2.0, np.full(3 * HORIZON, 2.0))]
    blend = cross_selected_errors(evaluations, actual, plan)  # weighted 1 / error:
    np.testing.assert_allclose(blend, 2 / (1 / 2.1 + 1 / 2.0))  # their harmonic mean
    # a metric undefined without the window (wape over two windows of zeros): the
    # choice made on every window stands for that window
    wape = plan_for(frame, tmp_path, validation={"metric": "wape"}, forecast={
        "horizon": HORIZON, "frequency": "D", "intervals": [80, 95]})
    actual = np.repeat([0.0, 0.0, 5.0], HORIZON)
    evaluations = [Evaluation(lucky, {}, 0.8, np.full(3 * HORIZON, 1.0)),
                   Evaluation(steady, {}, 0.4, np.full(3 * HORIZON, 3.0))]
    errors = cross_selected_errors(evaluations, actual, wape)
    assert np.isfinite(errors).all()
    np.testing.assert_allclose(errors[2], 2.0)  # the steady one alone, as chosen on all


def test_direct_strategy_is_mlforecasts_one_model_per_step(tmp_path):
    from mlforecast import MLForecast
    from sklearn.linear_model import Ridge

    rng = np.random.default_rng(4)
    t = np.arange(120)
    frame = series("a", 50 + 0.2 * t + 5 * np.sin(2 * np.pi * t / 7) + rng.normal(size=120))
    ridge = [{"name": "ridge", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge"}]
    plan = plan_for(frame, tmp_path, models=ridge, forecast={
        "horizon": HORIZON, "frequency": "D", "strategy": "direct"})
    row, members = train_series(frame, ("a",), plan)
    row = row.as_row(plan)
    assert row["status"] == TRAINED and json.loads(row["chosen"]) == ["ridge"]
    future = pd.DataFrame({"store": "a", "day": pd.date_range(
        frame.day.max() + pd.Timedelta(days=1), periods=HORIZON + 1)})
    ours = SegmentModel.from_rows(members).predict(future)
    # mlforecast's own direct forecast: the same lags, one Ridge per step
    theirs = MLForecast(models={"ridge": Ridge()}, freq="D", lags=plan.forecast.lags).fit(
        frame.rename(columns={"store": "unique_id", "day": "ds", "sales": "y"}),
        static_features=[], max_horizon=HORIZON).predict(HORIZON)["ridge"].to_numpy()
    np.testing.assert_allclose(ours[:HORIZON], theirs, rtol=1e-9)
    assert np.isnan(ours[HORIZON])  # its regressors stop at the horizon
    recursive = plan_for(frame, tmp_path, models=ridge)
    _, members = train_series(frame, ("a",), recursive)
    assert not np.allclose(SegmentModel.from_rows(members).predict(future)[:HORIZON], ours[
        :HORIZON])


def with_values(values: np.ndarray, at: list[int], value: float) -> np.ndarray:
    changed = values.copy()
    changed[at] = value
    return changed


RISING = np.arange(60.0)  # the seasonal naive forecast of its next day is 53, the last 59
#: name: frame, status, reason, forecast keys, what serves a skipped series next day
#: (a value; "ets": AutoETS; None: nothing)
CONDITIONS = {
    "duplicate": (series("duplicate", RISING).pipe(lambda f: pd.concat([f, f.iloc[[10]]])),
                  TRAINED, "duplicate dates aggregated: 1 (sum)", {}, None),
    "duplicate skip": (series("duplicate skip", RISING).pipe(
        lambda f: pd.concat([f, f.iloc[[10]]])), SKIPPED, "duplicate dates: 1 date(s)",
        {"duplicates": "skip"}, 53.0),
    "offgrid": (series("offgrid", RISING).assign(
        day=lambda f: f.day + pd.Timedelta(hours=12) * (f.index == 5)),
        SKIPPED, "do not follow frequency", {}, 59.0),
    "gaps": (series("gaps", RISING).drop(index=[20, 21]), SKIPPED,
             "gaps: 2 of 60 periods have no value (set forecast.gaps: zero or forward to fill "
             "them); served by its seasonal naive forecast (its last 7 periods repeated)",
             {}, 53.0),
    "late gap": (series("late gap", RISING).drop(index=[55]), SKIPPED,
                 "served by its naive forecast (its last value; 4 complete period(s), fewer "
                 "than a season of 7)", {}, 59.0),
    "short": (series("short", RISING[:25]), SKIPPED, "short series: 25 periods; one "
              "backtest window of 7 needs at least 27; served by AutoETS (season 7)", {},
              "ets"),
    "constant": (series("constant", np.full(60, 4.0)), SKIPPED, "constant series", {}, 4.0),
    "nulls": (series("nulls", np.full(60, np.nan)), SKIPPED, "no value", {}, None),
    "nulls forward": (series("nulls forward", np.full(60, np.nan)), SKIPPED, "no value",
                      {"gaps": "forward"}, None),
    "leading nulls": (series("leading nulls", with_values(RISING, [0, 1, 2], np.nan)),
                      TRAINED, "leading empty periods dropped: 3 (the series starts at its "
                      "first value, 2024-01-04", {"gaps": "forward"}, None),
    "infinite": (series("infinite", with_values(RISING, [0, 1, 58, 59], np.inf)), TRAINED,
                 "leading empty periods dropped: 2", {}, None),
    "intermittent": (series("intermittent", np.where(np.arange(60) % 5 == 0, 3.0, 0.0)),
                     TRAINED, "intermittent", {}, None),
}


@pytest.mark.parametrize("name", list(CONDITIONS))
def test_data_conditions_end_skipped_or_trained_never_failed(tmp_path, name):
    frame, status, reason, keys, served = CONDITIONS[name]
    plan = plan_for(frame, tmp_path, validation={"windows": 2},
                    forecast={"horizon": HORIZON, "frequency": "D", "rolling": {"mean": [7]},
                              "date_features": ["dayofweek"], **keys})
    row, members = train_series(frame.reset_index(drop=True), (name,), plan)
    row = row.as_row(plan)
    assert row["status"] == status and row["status"] != FAILED
    assert reason in (row["reason"] or ""), row["reason"]
    if status == TRAINED:
        return
    if served is None:
        assert members == []
        return
    # served: by its seasonal naive forecast where its last season is complete on the
    # grid, else by its last value; after its last date with a value
    last = frame.replace(np.inf, np.nan).dropna().sort_values("day").iloc[-1]
    future = pd.DataFrame({"store": name, "day": [last.day + pd.Timedelta(days=1)]})
    predicted = SegmentModel.from_rows(members).predict(future)[0]
    if served == "ets":
        assert [m["candidate"] for m in members] == ["auto_ets"] and np.isfinite(predicted)
    else:
        assert predicted == pytest.approx(served)


def test_infinite_values_between_the_first_and_last_are_gaps(tmp_path):
    frame = series("a", with_values(RISING, [0, 30, 59], np.inf))
    for gaps, status in (("skip", SKIPPED), ("forward", TRAINED)):
        plan = plan_for(frame, tmp_path, forecast={"horizon": HORIZON, "frequency": "D",
                                                   "gaps": gaps})
        row, _ = train_series(frame, ("a",), plan)
        row = row.as_row(plan)
        assert row["status"] == status
        if gaps == "skip":
            assert row["reason"].startswith("gaps: 1 of 58 periods have no value")
        else:
            assert row["reason"].split("; ")[::2] == [
                "leading empty periods dropped: 1 (the series starts at its first value, "
                "2024-01-02 00:00:00)", "gaps filled: 1 period(s) (forward)"]


def test_a_frequency_that_fits_no_segment_is_refused_before_training(spark, tmp_path):
    months = pd.date_range("2020-01-01", periods=36, freq="MS")
    monthly = pd.concat([pd.DataFrame({"store": f"s{i}", "day": months,
                                       "sales": np.arange(36.0) + i}) for i in range(3)])

    def checked(frame, **forecast):
        frame.to_parquet(tmp_path / "source.parquet", coerce_timestamps="us")
        config = forecast_job(tmp_path, source={"path": str(tmp_path / "source.parquet")},
                              forecast={"horizon": 3, "frequency": "D"} | forecast)
        return validate(config, spark)

    # monthly dates read as daily: every day between them would be a gap
    with pytest.raises(ConfigError, match="frequency='D' does not fit the data: the dates "
                       "of segment \\('s0',\\) are 'MS': every period between them"):
        checked(monthly)
    # daily dates read as monthly: off the grid of month starts
    daily = monthly.assign(day=pd.Timestamp("2020-01-02") + pd.to_timedelta(
        monthly.groupby("store").cumcount(), unit="D"))
    with pytest.raises(ConfigError, match="not on its grid \\(they are 'D'\\).*3 segment"):
        checked(daily, frequency="MS")
    assert checked(monthly, frequency="MS").source_columns  # the data's frequency
    assert checked(monthly, gaps="zero").source_columns  # gaps asked to be filled
    # one segment that fits is enough: the others are skipped, each with its reason
    mixed = pd.concat([monthly, series("daily", np.ones(40)).assign(
        day=lambda f: f.day.astype("datetime64[us]"))])
    assert checked(mixed).source_columns


def test_dates_answer_as_timestamps_do(tmp_path):
    frame = series("a", 10 + np.arange(60.0) % 7)
    plan = plan_for(frame, tmp_path)
    row, members = train_series(frame, ("a",), plan)
    row = row.as_row(plan)
    model = SegmentModel.from_rows(members)
    future = pd.DataFrame({"store": "a", "day": pd.date_range("2024-03-01", periods=5)})
    stamps = model.predict(future)
    assert np.isfinite(stamps).all()  # 2024-02-29 is the last day: these are the next five
    np.testing.assert_array_equal(model.predict(future.assign(day=future.day.dt.date)),
                                  stamps)


def test_gaps_filled_on_request(tmp_path):
    frame = series("gaps", np.arange(60.0) % 7 + 10).drop(index=[20, 21])
    for gaps in ("zero", "forward"):
        plan = plan_for(frame, tmp_path, forecast={"horizon": HORIZON, "frequency": "D",
                                                   "gaps": gaps})
        row, _ = train_series(frame, ("gaps",), plan)
        row = row.as_row(plan)
        assert row["status"] == TRAINED and f"gaps filled: 2 period(s) ({gaps})" in row["reason"]


def test_empty_periods_before_the_first_value_are_dropped_between_values_gaps(tmp_path):
    # a monthly series whose first months have no value (issue #33: it failed with
    # gaps: forward, which has nothing to fill them from)
    months = pd.date_range("2019-01-01", periods=72, freq="MS")
    rng = np.random.default_rng(4)
    y = 100 + 10 * np.sin(2 * np.pi * np.arange(72) / 12) + rng.normal(size=72)
    y[:5] = np.nan  # leading
    y[40] = np.nan  # between values
    y[71] = np.nan  # trailing
    frame = pd.DataFrame({"store": "m", "day": months, "sales": y})
    monthly = {"horizon": 12, "frequency": "MS", "gaps": "forward"}
    ets = [{"name": "ets", "kind": "statsforecast", "estimator": "AutoETS",
            "params": {"season_length": 12}}]
    plan = plan_for(frame, tmp_path, models=ets, forecast=monthly)
    cleaned = clean_series(frame, plan)
    assert cleaned.frame.ds.iloc[0] == months[5] and cleaned.frame.ds.iloc[-1] == months[70]
    assert cleaned.y[40 - 5] == y[39]  # forward
    row, members = train_series(frame, ("m",), plan)
    row = row.as_row(plan)
    assert row["status"] == TRAINED, row["reason"]
    assert row["reason"].split("; ") == [
        "leading empty periods dropped: 5 (the series starts at its first value, "
        "2019-06-01 00:00:00)",
        "trailing empty periods dropped: 1 (the series ends at its last value, "
        "2024-11-01 00:00:00)",
        "gaps filled: 1 period(s) (forward)"]
    future = pd.DataFrame({"store": "m", "day": [months[71]]})  # after its last value
    assert np.isfinite(SegmentModel.from_rows(members).predict(future)).all()
    # with gaps: skip the empty periods at the ends are not gaps: the one between is
    plan = plan_for(frame, tmp_path, models=ets, forecast=monthly | {"gaps": "skip"})
    row, _ = train_series(frame, ("m",), plan)
    row = row.as_row(plan)
    assert row["status"] == SKIPPED and row["reason"].startswith("gaps: 1 of 66 periods")


def test_duplicate_dates_follow_forecast_duplicates(tmp_path):
    from raybricks.training.selection import Skip

    frame = series("d", 10 + np.arange(60.0) % 7)
    assert (frame.sales[10], frame.sales[30]) == (13.0, 12.0)
    # date 10 twice (13, then 100), date 30 twice (12, then empty)
    twice = pd.concat([frame, frame.iloc[[10, 30]].assign(sales=[100.0, np.nan])])
    assert forecast_job(tmp_path).forecast.duplicates == "sum"  # the default
    for policy, expected in {"sum": 113.0, "mean": 56.5, "last": 100.0}.items():
        plan = plan_for(twice, tmp_path, forecast={"horizon": HORIZON, "frequency": "D",
                                                   "duplicates": policy})
        cleaned = clean_series(twice, plan)
        assert len(cleaned.y) == 60 and cleaned.y[10] == expected and cleaned.y[30] == 12.0
        assert cleaned.notes == [f"duplicate dates aggregated: 2 ({policy})"]
    plan = plan_for(twice, tmp_path, forecast={"horizon": HORIZON, "frequency": "D",
                                               "duplicates": "skip"})
    with pytest.raises(Skip, match="duplicate dates: 2 date\\(s\\) have more than one row"):
        clean_series(twice, plan)
    plan = plan_for(twice, tmp_path, models=FAST)
    row, _ = train_series(twice, ("d",), plan)
    row = row.as_row(plan)
    assert row["status"] == TRAINED and "duplicate dates aggregated: 2 (sum)" in row["reason"]


def test_a_series_too_short_for_its_backtest_steps_down_a_ladder(tmp_path):
    from raybricks.training.forecast.series import minimum_length

    rng = np.random.default_rng(2)
    t = np.arange(43)
    y = 20 + 6 * np.sin(2 * np.pi * t / 7) + 0.2 * t + rng.normal(scale=0.3, size=43)
    forecast_keys = {"horizon": HORIZON, "frequency": "D", "lags": [1, 7],
                     "intervals": [80]}
    plan = plan_for(series("a", y), tmp_path, forecast=forecast_keys)
    assert [minimum_length(replace(plan.forecast, windows=w), 20) for w in (1, 2, 3)] == [
        27, 34, 41]

    def trained(n: int, **changes):
        frame = series("a", y[:n])
        plan = plan_for(frame, tmp_path, **({"forecast": forecast_keys} | changes))
        row, members = train_series(frame, ("a",), plan)
        row = row.as_row(plan)
        future = pd.DataFrame({"store": "a", "day": pd.date_range(
            frame.day.iloc[-1] + pd.Timedelta(days=1), periods=HORIZON)})
        model = SegmentModel.from_rows(members)
        return row, members, model.predict(future), model.predict_intervals(future, [80])

    # fewer backtest windows while the candidates' minimum fits
    row, _, predicted, bounds = trained(36)
    assert row["status"] == TRAINED and row["n_valid"] == 2 * HORIZON
    assert row["reason"] == "short: 2 of 3 backtest windows (36 periods; 3 windows need 41)"
    assert np.isfinite(bounds).all()  # two windows calibrate intervals
    actual = y[36:43]
    assert np.abs(predicted - actual).mean() < np.abs(y[35] - actual).mean() / 2
    row, _, predicted, bounds = trained(28)
    assert row["status"] == TRAINED and row["n_valid"] == HORIZON
    assert row["reason"].startswith("short: 1 of 3 backtest windows (28 periods; 3 windows "
                                    "need 41); no prediction intervals (they need 2 windows)")
    assert np.isfinite(predicted).all() and np.isnan(bounds[:, 1:]).all()
    # then AutoETS on the whole series, where the job has a statistical candidate
    row, members, predicted, _ = trained(20)
    assert row["status"] == SKIPPED and row["reason"] == (
        "short series: 20 periods; one backtest window of 7 needs at least 27; served by "
        "AutoETS (season 7) fitted on the whole series, without a backtest")
    assert [m["candidate"] for m in members] == ["auto_ets"] and np.isfinite(predicted).all()
    # then the seasonal naive forecast, then the last value
    for n, changes in ((20, {"models": MODELS[:1]}), (10, {})):
        row, _, predicted, _ = trained(n, **changes)
        assert row["status"] == SKIPPED and row["reason"].endswith(
            "served by its seasonal naive forecast (its last 7 periods repeated)")
        np.testing.assert_allclose(predicted, y[n - 7:n])
    row, _, predicted, _ = trained(5)
    assert row["reason"].endswith("served by its naive forecast (its last value; 5 complete "
                                  "period(s), fewer than a season of 7)")
    np.testing.assert_allclose(predicted, y[4])


def weekdays(start: str, end: str) -> pd.DataFrame:
    """A series of 10 plus the day of the week, every day."""
    days = pd.date_range(start, end, freq="D")
    return series("a", 10.0 + days.dayofweek, start=days[0])


def test_holiday_weeks_are_replaced_by_the_same_weekday_of_the_nearest_weeks(tmp_path):
    frame = weekdays("2024-10-01", "2024-12-03")
    # US holidays in range: Columbus Day (Oct 14), Veterans Day (Nov 11), Thanksgiving
    # (Nov 28); and a date of the user's. Three days either side: 4 x 7 days.
    near = [pd.Timestamp(d) + pd.Timedelta(days=k) for d in
            ("2024-10-14", "2024-10-25", "2024-11-11", "2024-11-28") for k in range(-3, 4)]
    disturbed = frame.assign(sales=frame.sales.where(~frame.day.isin(near), frame.sales + 50))
    holidays = {"country": "US", "dates": ["2024-10-25"]}
    plan = plan_for(disturbed, tmp_path, forecast={"horizon": HORIZON, "frequency": "D",
                                                   "holidays": holidays})
    cleaned = clean_series(disturbed, plan)
    # Dec 1 has no week after it in the series: the week before fills it
    np.testing.assert_array_equal(cleaned.y, frame.sales.to_numpy())
    assert "holidays replaced: 28 period(s)" in cleaned.notes[0]
    assert [periods_per_week(f) for f in ("D", "B", "h")] == [7, 5, 168]
    plan = plan_for(disturbed, tmp_path, forecast={"horizon": HORIZON, "frequency": "D"})
    np.testing.assert_array_equal(clean_series(disturbed, plan).y, disturbed.sales)


def test_holidays_keep_a_holiday_week_out_of_the_forecast(tmp_path):
    frame = weekdays("2024-09-01", "2024-11-30")
    thanksgiving = frame.day.between("2024-11-25", "2024-11-30")
    low = frame.assign(sales=frame.sales.where(~thanksgiving, 2.0))
    future = pd.DataFrame({"store": "a", "day": pd.date_range("2024-12-01", periods=7)})
    expected = 10.0 + future.day.dt.dayofweek
    errors = {}
    for holidays in (None, "US"):
        plan = plan_for(low, tmp_path, forecast={"horizon": HORIZON, "frequency": "D",
                                                 "holidays": holidays})
        row, members = train_series(low, ("a",), plan)
        row = row.as_row(plan)
        assert row["status"] == TRAINED
        forecasts = SegmentModel.from_rows(members).predict(future)
        errors[holidays] = float(np.mean(np.abs(forecasts - expected)))
    assert errors["US"] < 0.5 < errors[None]


def test_integer_periods(tmp_path):
    y = 10 + np.sin(np.arange(60)) + np.arange(60) * 0.1
    frame = pd.DataFrame({"store": "a", "day": np.arange(100, 160), "sales": y})
    plan = plan_for(frame, tmp_path, forecast={"horizon": 5, "frequency": 1})
    row, members = train_series(frame, ("a",), plan)
    row = row.as_row(plan)
    assert row["status"] == TRAINED
    model = SegmentModel.from_rows(members)
    ahead = model.predict(pd.DataFrame({"store": "a", "day": [160, 164, 159, 300]}))
    assert np.isfinite(ahead[:2]).all() and np.isnan(ahead[2:]).all()


# --------------------------------------------------------------------------- end to end


def predict_without_raybricks(model_uri: str, frame: pd.DataFrame, tmp_path,
                              params: dict | None = None) -> pd.DataFrame:
    """The registered model's output in a fresh interpreter that cannot import
    raybricks, with plain MLflow."""
    frame.to_parquet(tmp_path / "input.parquet")
    code = BLOCK_RAYBRICKS + f"""
import mlflow, pandas as pd
model = mlflow.pyfunc.load_model({model_uri!r})
frame = pd.read_parquet({str(tmp_path / 'input.parquet')!r})
pd.DataFrame(model.predict(frame, params={params!r})).to_parquet(
    {str(tmp_path / 'out.parquet')!r})
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return pd.read_parquet(tmp_path / "out.parquet")


@pytest.fixture(scope="module")
def published(ray_on_spark, spark, tmp_path_factory):
    data = stores()
    config = forecast_job(tmp_path_factory.mktemp("runs"),
                          registry={"name": "tests.forecast.model"},
                          forecast={"horizon": HORIZON, "frequency": "D",
                                    "rolling": {"mean": [7]}, "date_features": ["dayofweek"],
                                    "intervals": [80, 95],
                                    # New Year's Day, MLK Day, Presidents' Day and a date
                                    "holidays": {"country": "US", "dates": ["2024-02-14"],
                                                 "before": 0, "after": 0}})
    ds = to_ray_dataset(spark.createDataFrame(data), ["store"])
    result = train_segments(ds, config)
    return data, result, tracking.publish(result, config)


def test_series_blend_their_local_candidates_and_beat_the_baseline(published):
    _, result, _ = published
    segments = result.segments.set_index("store")
    assert (segments.status == TRAINED).all(), segments.reason
    assert segments.reason.str.contains("holidays replaced: 4 period").all()
    season = segments.filter(like="season", axis=0)
    noise = segments.filter(like="noise", axis=0)
    # the default blends the local candidates within 10% of the best; a naive forecast
    # repeats noise
    for _, row in segments.iterrows():
        errors = {name: row[f"{name}_mase"] for name in ("lgbm", "theta")}
        assert sorted(json.loads(row.chosen)) == sorted(
            n for n, e in errors.items() if e <= 1.1 * min(errors.values()))
    assert (segments.chosen.map(json.loads).map(len) == 2).any()  # some blend both
    assert (noise.metric_mase < noise.baseline_mase).mean() >= 0.8
    assert season.metric_mase.median() < season.baseline_mase.median()


@pytest.mark.topology
def test_registered_model_forecasts_future_dates_without_raybricks(published, tmp_path):
    data, result, _ = published
    last = data.groupby("store").day.max()
    rows = []
    for store in ["season0", "noise3", "early"]:
        for step in (3, 1, 7, 0, 71):  # 0: inside the history; 71: past ten horizons
            rows.append({"store": store, "day": last[store] + pd.Timedelta(days=step)})
    frame = pd.DataFrame(rows)
    output = predict_without_raybricks("models:/tests.forecast.model@champion", frame,
                                       tmp_path, {"intervals": True})
    assert list(output.columns) == ["prediction", "lo_95", "lo_80", "hi_80", "hi_95"]
    predicted = output.prediction.to_numpy()
    models = result.models().to_pandas()
    for store in ["season0", "noise3", "early"]:
        mask = (frame.store == store).to_numpy()
        members = models[models.store == store].to_dict("records")
        expected = SegmentModel.from_rows(members).predict(frame[mask])
        np.testing.assert_allclose(predicted[mask], expected, rtol=1e-9)
        assert np.isfinite(predicted[mask][:3]).all() and np.isnan(predicted[mask][3:]).all()
        bounds = output[mask].iloc[:3]  # nested, around the forecast, widest at 95%
        assert (bounds.lo_95 <= bounds.lo_80).all() and (bounds.hi_80 <= bounds.hi_95).all()
        assert (bounds.lo_80 < bounds.prediction).all()
        assert (bounds.prediction < bounds.hi_80).all()
        assert output[mask].iloc[3:].isna().all(axis=None)
    # the series that ended early forecasts from its own last date, and says so
    assert last["early"] < last["season0"]
    reason = result.segments.set_index("store").loc["early", "reason"]
    assert "ended early: last value 20 period(s) before" in reason


@pytest.mark.topology
def test_forecast_command_writes_every_segment_horizon(published, spark, tmp_path):
    data, _, _ = published
    output = str(tmp_path / "forecasts")
    assert main(["forecast", "--model", "models:/tests.forecast.model@champion",
                 "--output", output, "--intervals"]) == 0
    written = pd.read_parquet(output).sort_values(["store", "day"])
    written["day"] = written.day.dt.tz_convert("UTC").dt.tz_localize(None)  # Spark: UTC
    assert written.groupby("store").size().eq(HORIZON).all()
    assert set(written.store) == set(data.store)
    assert written.prediction.notna().all()
    first = written.groupby("store").day.min()
    last = data.groupby("store").day.max()
    assert (first == last + pd.Timedelta(days=1)).all()
    model = mlflow.pyfunc.load_model("models:/tests.forecast.model@champion")
    again = model.predict(written[["store", "day"]], params={"intervals": True})
    columns = ["prediction", "lo_95", "lo_80", "hi_80", "hi_95"]
    np.testing.assert_allclose(written[columns].to_numpy(), again[columns].to_numpy(),
                               rtol=1e-9)
    assert (written.lo_95 < written.prediction).all()
    assert (written.prediction < written.hi_95).all()
    # a Spark consumer with MLflow's own UDF gets the same forecasts
    udf = mlflow.pyfunc.spark_udf(spark, "models:/tests.forecast.model@champion",
                                  result_type="double", env_manager="local")
    rows = spark.read.parquet(output)
    by_udf = rows.withColumn("udf", udf("store", "day")).select(
        "store", "day", "prediction", "udf").toPandas()
    np.testing.assert_allclose(by_udf.udf.to_numpy(), by_udf.prediction.to_numpy(),
                               rtol=1e-9)
    pd.DataFrame({"store": ["noise1"]}).to_parquet(tmp_path / "wanted.parquet")
    summary = forecast("models:/tests.forecast.model@champion", str(tmp_path / "some"),
                       horizon=3, segments=str(tmp_path / "wanted.parquet"), spark=spark)
    some = pd.read_parquet(tmp_path / "some")
    assert summary.rows == 3 and set(some.store) == {"noise1"}
    with pytest.raises(RaybricksError, match="outside 1..70"):
        forecast("models:/tests.forecast.model@champion", str(tmp_path / "x"), horizon=71,
                 spark=spark)


@pytest.mark.heavy
def test_forecast_and_score_name_the_segments_they_cannot_serve(ray_on_spark, spark,
                                                                tmp_path, capsys):
    rng = np.random.default_rng(8)
    t = np.arange(50)
    weekly = 20 + 5 * np.sin(2 * np.pi * t / 7)
    data = pd.concat([
        series("ok0", weekly + rng.normal(size=50)), series("ok1", weekly + rng.normal(size=50)),
        series("boom", 5000 + weekly),  # its only candidate refuses it: failed
        series("empty", np.full(50, np.nan)),  # no value: skipped, nothing serves it
    ], ignore_index=True)
    # naive timestamps: Spark reads them as TIMESTAMP_NTZ
    data.to_parquet(tmp_path / "naive.parquet", coerce_timestamps="us")
    source = spark.read.parquet(str(tmp_path / "naive.parquet"))
    assert source.schema["day"].dataType.typeName() == "timestamp_ntz"
    config = forecast_job(tmp_path, models=[{"name": "mine", "kind": "function",
                                             "function": "tests.helpers.fit_below_1000"}],
                          validation={"windows": 2}, registry={"name": "tests.forecast.unserved"})
    result = train_segments(to_ray_dataset(source, ["store"]), config)
    statuses = result.segments.set_index("store").status.to_dict()
    assert statuses == {"ok0": TRAINED, "ok1": TRAINED, "boom": FAILED, "empty": SKIPPED}
    tracking.publish(result, config)
    uri = "models:/tests.forecast.unserved@champion"
    capsys.readouterr()
    assert main(["forecast", "--model", uri, "--output", str(tmp_path / "out")]) == 0
    said = capsys.readouterr().out
    assert "2 requested segment(s) not served (or not in every row):" in said
    assert ("failed in training, without a model: 1, e.g. store='boom' (RuntimeError: every "
            "candidate failed: mine: ValueError: values above 1000 refused") in said
    assert ("skipped in training, without a model: 1, e.g. store='empty' (no value: the "
            "target is empty") in said
    written = pd.read_parquet(tmp_path / "out")
    assert set(written.store) == {"ok0", "ok1"} and written.prediction.notna().all()
    # the time column as the source typed it: naive timestamps stay naive
    assert written.day.dtype.kind == "M" and written.day.dt.tz is None
    assert (written.groupby("store").day.min() == data.day.max() + pd.Timedelta(days=1)).all()
    # the segments asked for: one without a model, one the model does not know
    pd.DataFrame({"store": ["ok0", "boom", "nowhere"]}).to_parquet(tmp_path / "some.parquet")
    summary = forecast(uri, str(tmp_path / "some"), segments=str(tmp_path / "some.parquet"),
                       spark=spark)
    assert summary.rows == HORIZON and summary.unserved_segments == 2
    examples = {u.reason: u.examples for u in summary.unserved}
    assert examples["not in the model"] == ["store='nowhere'"]
    [failed] = examples["failed in training, without a model"]
    assert failed.startswith("store='boom' (RuntimeError: every candidate failed: mine: "
                             "ValueError: values above 1000 refused")
    assert failed.endswith("...)") and len(failed) == len("store='boom' ()") + REASON_CHARACTERS
    # raybricks score: the rows of every requested segment, and rows a model does not answer
    last = data.day.max()
    rows = pd.DataFrame({"store": ["ok0", "ok0", "boom", "nowhere"],
                         "day": [last + pd.Timedelta(days=1), last + pd.Timedelta(days=300),
                                 last + pd.Timedelta(days=1), last + pd.Timedelta(days=1)]})
    summary = score(uri, spark.createDataFrame(rows), str(tmp_path / "scored"), spark=spark)
    assert summary.null_predictions == 3 and summary.unserved_segments == 3
    assert [(u.reason, u.segments) for u in sorted(summary.unserved, key=lambda u: u.reason)
            ] == [("failed in training, without a model", 1), ("not in the model", 1),
                  ("served, but not every row: dates not among the periods it answers after "
                   "the series' history", 1)]
    assert "store='ok0'" in str(summary)
    # dates stay dates, time-zone aware timestamps stay aware
    local, manifest = fetch_model(uri)
    assert manifest["forecast"]["time_type"] == "timestamp_ntz"
    directory = local / "artifacts" / "segments"
    first = last + pd.Timedelta(days=1)
    for time_type, expected in (("date", first.date()), ("timestamp", first.tz_localize("UTC")),
                                ("timestamp_ntz", first)):
        typed = manifest | {"forecast": manifest["forecast"] | {"time_type": time_type}}
        frame, served = future_rows(spark, directory, typed, 2)
        index = pd.read_parquet(directory / "index.parquet")
        assert served == (index.shard >= 0).sum() == 2  # ok0 and ok1
        frame.write.mode("overwrite").parquet(str(tmp_path / time_type))
        back = pd.read_parquet(tmp_path / time_type).sort_values(["store", "day"])
        assert back.day.iloc[0] == expected and type(back.day.iloc[0]) is type(expected)


def test_exogenous_columns_drive_the_forecast(ray_on_spark, spark, tmp_path):
    rng = np.random.default_rng(3)
    frames = []
    for s in range(3):
        promo = (rng.random(100) < 0.3).astype(float)
        frames.append(series(f"p{s}", 20 + 10 * promo + rng.normal(scale=0.5, size=100),
                             promo=promo))
    data = pd.concat(frames, ignore_index=True)
    config = forecast_job(tmp_path, models=MODELS[:1],
                          forecast={"horizon": HORIZON, "frequency": "D",
                                    "exogenous": ["promo"]},
                          registry={"name": "tests.forecast.promo"})
    result = train_segments(to_ray_dataset(spark.createDataFrame(data), ["store"]), config)
    assert (result.segments.status == TRAINED).all()
    tracking.publish(result, config)
    last = data.day.max()
    future = pd.DataFrame({"store": "p0", "day": pd.date_range(
        last + pd.Timedelta(days=1), periods=HORIZON), "promo": [1.0, 0.0] * 3 + [1.0]})
    kinds = set(result.models().column("kind").to_pylist())
    assert "lags:lightgbm" in kinds
    # a lag member pins mlforecast and its regressor's library
    requirements = Path(mlflow.pyfunc.get_model_dependencies(
        "models:/tests.forecast.promo@champion")).read_text()
    for library in ("mlforecast", "lightgbm"):
        assert f"{library}=={version(library)}" in requirements
    predicted = predict_without_raybricks("models:/tests.forecast.promo@champion", future,
                                          tmp_path).prediction.to_numpy()
    assert predicted[future.promo == 1].min() > predicted[future.promo == 0].max() + 5
    model = mlflow.pyfunc.load_model("models:/tests.forecast.promo@champion")
    np.testing.assert_allclose(model.predict(future).to_numpy(), predicted, rtol=1e-9)
    with pytest.raises(Exception, match="exogenous values"):  # a period left out
        model.predict(future.iloc[[0, 2]])
    with pytest.raises(RaybricksError, match="needs their future values"):
        forecast("models:/tests.forecast.promo@champion", str(tmp_path / "x"), spark=spark)
    # a model trained without forecast.intervals says so when asked for them
    with pytest.raises(Exception, match="no prediction intervals"):
        model.predict(future, params={"intervals": True})
    with pytest.raises(RaybricksError, match="no prediction intervals"):
        score("models:/tests.forecast.promo@champion", spark.createDataFrame(future),
              str(tmp_path / "y"), spark=spark, intervals=True)


def typed_stores(seed: int = 5) -> pd.DataFrame:
    """Short noisy series whose weekly pattern is set by their store ``type`` (a static
    string): one series alone shows it poorly, all series of a type show it well."""
    rng = np.random.default_rng(seed)
    patterns = {"mall": np.array([0, 0, 0, 0, 6, 12, 9.0]),
                "street": np.array([8, 7, 6, 5, 4, 0, 0.0])}
    frames = []
    for s in range(24):
        kind = "mall" if s % 2 else "street"
        t = np.arange(56)
        values = 20 + s + patterns[kind][t % 7] + rng.normal(scale=3, size=len(t))
        frames.append(series(f"s{s}", values, type=kind, area=float(s % 3)))
    return pd.concat(frames, ignore_index=True)


@pytest.mark.heavy
def test_global_model_learns_across_series_from_static_columns(ray_on_spark, spark,
                                                                tmp_path):
    data = typed_stores()
    lgbm = {"name": "lgbm", "kind": "lightgbm",
            "params": {"n_estimators": 60, "num_leaves": 7, "min_child_samples": 5}}
    config = forecast_job(
        tmp_path, models=[lgbm, MODELS[1]], fallback="global", min_rows=20,
        forecast={"horizon": HORIZON, "frequency": "D", "lags": [1, 7],
                  "date_features": ["dayofweek"], "static": ["type", "area"]},
        registry={"name": "tests.forecast.global"})
    # train's checks read the static columns from the source
    data.to_parquet(tmp_path / "typed.parquet", coerce_timestamps="us")
    typed = SourceConfig(path=str(tmp_path / "typed.parquet"))
    source = config.model_copy(update={"source": typed})
    assert validate(source, spark).source_columns == ["store", "type", "area", "sales", "day"]
    result = train_segments(to_ray_dataset(spark.createDataFrame(data), ["store"]), config)
    segments = result.segments
    assert (segments.status == TRAINED).all(), segments.reason
    # the global model is backtested in every series, like a candidate, and learns the
    # pattern a short noisy series shows poorly
    assert segments.global_mase.notna().all()
    assert segments.global_mase.median() < segments.lgbm_mase.median()
    assert segments.global_mase.median() < segments.theta_mase.median()
    assert segments.chosen.map(lambda c: "global" in json.loads(c)).mean() >= 0.5
    tracking.publish(result, config)
    # the registered model forecasts with the stored global model from each series'
    # history: a mall's weekend peak, a street store's weekday high
    last = data.day.max()
    days = pd.date_range(last + pd.Timedelta(days=1), periods=HORIZON)
    stores = sorted(data.store.unique())
    frame = pd.DataFrame([{"store": store, "day": day} for store in stores for day in days])
    predicted = predict_without_raybricks("models:/tests.forecast.global@champion", frame,
                                          tmp_path).prediction.to_numpy()
    models = result.models().to_pandas()
    fallback = SegmentModel.from_rows(result.fallback)
    # the series that continue the global model are continued together in one call
    # (GlobalKind.continue_many_series): the same forecasts as each series alone
    assert models[models.kind == "global"].store.nunique() >= 2
    for store in stores:
        mask = (frame.store == store).to_numpy()
        members = models[models.store == store].to_dict("records")
        expected = SegmentModel.from_rows(members, fallback).predict(frame[mask])
        np.testing.assert_allclose(predicted[mask], expected, rtol=1e-9)
    built = {store: SegmentModel.from_rows(models[models.store == store].to_dict("records"),
                                           fallback) for store in stores}
    continuing = [(store, built[store].members[position][0]) for store in stores
                  if (position := built[store].continued_member()) is not None]
    requests = [(member.model, prepare_features(frame[frame.store == store], member.meta),
                 member.meta) for store, member in continuing]
    pooled = fallback.members[0][0]
    together = continuing[0][1].kind.continue_many_series(requests, pooled)
    for (history, rows, meta), values in zip(requests, together, strict=True):
        alone = continuing[0][1].kind.continue_series(history, pooled, rows, meta)
        assert np.isfinite(values).all()
        np.testing.assert_allclose(values, alone, rtol=1e-9)
    weekend = frame.day.dt.dayofweek.isin([5, 6]).to_numpy()
    mall, street = (frame.store == "s1").to_numpy(), (frame.store == "s2").to_numpy()
    assert predicted[mall & weekend].mean() > predicted[mall & ~weekend].mean() + 3
    assert predicted[street & weekend].mean() < predicted[street & ~weekend].mean() - 3
    # the static string is the global model's feature: a mall's history with the other
    # type forecasts another week
    chosen = models[(models.store == "s1") & (models.kind == "global")]
    member = SegmentModel.from_rows(chosen.to_dict("records"), fallback).members[0][0]
    assert set(member.model["type"]) == {"mall"}
    pooled = fallback.members[0][0]
    rows = frame[mall]

    def global_forecast(history):
        return member.kind.continue_series(history, pooled, rows, member.meta)

    as_mall, as_street = global_forecast(member.model), global_forecast(
        member.model.assign(type="street"))
    assert as_mall[weekend[mall]].mean() > as_street[weekend[mall]].mean() + 3
    # raybricks forecast serves every series, those that chose the global model too
    summary = forecast("models:/tests.forecast.global@champion", str(tmp_path / "out"),
                       spark=spark)
    written = pd.read_parquet(tmp_path / "out")
    assert summary.rows == len(written) == HORIZON * data.store.nunique()
    assert written.prediction.notna().all()


def test_the_global_backtest_of_a_block_is_each_series_own(tmp_path):
    from raybricks.data import segment_bounds
    from raybricks.training.forecast import global_model as gf
    from raybricks.training.plan import replace_plan

    data = typed_stores()
    data["promo"] = np.random.default_rng(1).integers(0, 2, len(data)).astype(float)
    day = data.day - data.day.min()
    ends_early = data.store.isin(["s1", "s4"]) & (day >= pd.Timedelta(days=50))
    starts_late = data.store.isin(["s2", "s5"]) & (day < pd.Timedelta(days=9))
    data = data[~ends_early & ~starts_late]  # series of several lengths and ends
    short = series("short", np.arange(10.0), type="mall", area=0.0, promo=0.0)
    # two of the three backtest windows: the global model's of the last two
    shorter = series("shorter", 20 + np.arange(36.0) % 7, type="mall", area=0.0, promo=0.0)
    data = pd.concat([data, short, shorter], ignore_index=True).sort_values(["store", "day"])
    lgbm = {"name": "lgbm", "kind": "lightgbm",
            "params": {"n_estimators": 30, "num_leaves": 7, "min_child_samples": 5}}
    changes = {"models": [lgbm], "fallback": "global", "min_rows": 20,
               "forecast": {"horizon": HORIZON, "frequency": "D", "lags": [1, 7],
                            "exogenous": ["promo"], "static": ["type"]}}
    plan = plan_for(data, tmp_path, **changes)
    block = pa.Table.from_pandas(data, preserve_index=False)
    models, error = gf.fit_global(gf.global_candidate(forecast_job(tmp_path, **changes)),
                                  plan, gf.series_rows(block, 0, plan, 1.0))
    assert error is None
    plan = replace_plan(plan, global_members=models[:-1], global_token="block-backtests")
    frame, bounds = data.reset_index(drop=True), list(segment_bounds(block, ["store"]))
    made = block_made(frame, bounds, plan)
    batched = {key: m.global_backtest for key, m in made.items()}
    # one prediction per window for the block: each series' forecasts as its own, the
    # series too short for the backtest left to their own training
    assert set(batched) == {key for key, _, _ in bounds} - {("short",), ("shorter",)}
    start, end = next((s, e) for key, s, e in bounds if key == ("shorter",))
    row, _ = train_series(frame.iloc[start:end], ("shorter",), plan)
    row = row.as_row(plan)
    assert row["status"] == TRAINED and row["reason"].startswith("short: 2 of 3 backtest")
    assert np.isfinite(row["global_mase"]) and row["n_valid"] == 2 * HORIZON
    _, shortened, _ = backtestable(frame.iloc[start:end], plan)
    assert shortened.global_members == models[1:3]  # the windows at its windows' places
    assert shortened.forecast.windows == 2 and plan.forecast.windows == 3
    for key, start, end in bounds:
        if key in {("short",), ("shorter",)}:
            continue
        own = clean_series(frame.iloc[start:end], plan)
        origins = windows(len(own.frame), plan.forecast)
        actual = np.concatenate([own.y[o:o + HORIZON] for o in origins])
        alone = gf.backtest_global(own, plan, origins, actual, 1.0)
        assert alone.error is None
        np.testing.assert_allclose(batched[key], alone.predictions, rtol=1e-9)
        # the lag candidate's backtest, made for the whole block in one recursion a
        # window, is the series' own backtest alone
        lag = kinds.forecaster(plan.candidates[0])
        seed = stable_seed(plan.seed, key, "lgbm", "fit")
        own_backtest = lag.backtest(plan.candidates[0].params, own.frame, origins, seed,
                                    plan.threads, plan.forecast)
        np.testing.assert_allclose(made[key].forecasts["lgbm"], own_backtest, rtol=1e-9)


def test_a_global_model_that_cannot_fit_says_why(tmp_path):
    from raybricks.training.forecast.global_model import fit_global

    data = typed_stores()
    config = forecast_job(tmp_path, fallback="global", min_rows=20,
                          forecast={"horizon": HORIZON, "frequency": "D", "static": ["type"]})
    plan = plan_for(data, tmp_path, fallback="global", min_rows=20,
                    forecast={"horizon": HORIZON, "frequency": "D", "static": ["type"]})
    assert fit_global(config.models[0], plan) == (
        [], "no series could be trained (every one was skipped)")
    two_rows = pd.DataFrame({"unique_id": "a", "ds": [START, START + pd.Timedelta(days=1)],
                             "y": [1.0, 2.0], "type": "mall"})
    models, error = fit_global(config.models[0], plan, two_rows)
    assert models == [] and error


def test_the_manifest_records_the_time_columns_type(tmp_path):
    from raybricks.training.forecast.task import forecast_manifest

    frame = series("a", RISING)
    plan = plan_for(frame, tmp_path)
    found = {}
    for kind in (pa.date32(), pa.timestamp("us", tz="UTC"), pa.timestamp("us"), pa.int64()):
        schema = pa.schema([("store", pa.string()), ("day", kind), ("sales", pa.float64())])
        found[str(kind)] = forecast_manifest(plan, schema)["time_type"]
    assert found == {"date32[day]": "date", "timestamp[us, tz=UTC]": "timestamp",
                     "timestamp[us]": "timestamp_ntz", "int64": "integer"}


def test_validate_reports_duplicate_dates_before_training(spark, tmp_path):
    frames = [series(f"s{i}", np.arange(40.0)) for i in range(3)]
    source = tmp_path / "twice.parquet"

    def described(frame, **forecast):
        frame.to_parquet(source, coerce_timestamps="us")
        config = forecast_job(tmp_path, source={"path": str(source)},
                              forecast={"horizon": 3, "frequency": "D"} | forecast)
        return validate(config, spark).describe()

    twice = pd.concat([*frames, frames[1].iloc[[9, 5, 5]]], ignore_index=True)
    assert ("duplicate dates: 1 of 3 series have dates with more than one row (2 such "
            "date(s) in all; e.g. store='s1' on 2024-01-06 00:00:00); forecast.duplicates: "
            "sum adds each such date's targets into one value") in described(twice)
    assert "forecast.duplicates: skip skips those series (set forecast.duplicates: sum, " \
        "mean or last to keep them)" in described(twice, duplicates="skip")
    assert "duplicate dates: none" in described(pd.concat(frames))


@pytest.mark.topology
def test_a_retrain_of_some_series_keeps_every_other_forecast(ray_on_spark, spark, tmp_path,
                                                             monkeypatch):
    """``fallback: global`` with a global lag model that series continue or blend with:
    each series' next periods are answered from the forecast its training task stored,
    which is what its members answer; a retrain of two series keeps the champion's
    global model (``global_model: keep``), and with ``global_model: refit`` a new one
    fitted on every series; either way every other series forecasts exactly as before,
    intervals included."""
    import mlflow

    from raybricks import pipeline

    name = "tests.forecast.retrain"
    data = stores()
    data.to_parquet(tmp_path / "stores.parquet", coerce_timestamps="us")
    settings = {"models": MODELS, "fallback": "global",
                "forecast": {"horizon": HORIZON, "frequency": "D", "lags": [1, 7],
                             "date_features": ["dayofweek"], "intervals": [80]},
                "registry": {"name": name}}
    first = pipeline.train(forecast_job(tmp_path / "runs", source={
        "path": str(tmp_path / "stores.parquet")}, **settings), spark).publication
    days = pd.date_range(data.day.max() + pd.Timedelta(days=1), periods=HORIZON)
    frame = pd.DataFrame([{"store": store, "day": day} for store in data.store.unique()
                          for day in days])

    def forecasts() -> pd.DataFrame:
        model = mlflow.pyfunc.load_model(f"models:/{name}@champion")
        return pd.DataFrame(model.predict(frame, params={"intervals": True}))

    before = forecasts()
    with monkeypatch.context() as members_answer:  # the members, not the stored forecast
        members_answer.setattr(SegmentModel, "stored", lambda self, frame: None)
        pd.testing.assert_frame_equal(forecasts(), before, rtol=1e-9)
    segments = Path(mlflow.artifacts.download_artifacts(
        f"models:/{name}/{first.version}", dst_path=str(tmp_path / "first"))
        ) / "artifacts" / "segments"
    index = pd.read_parquet(segments / "index.parquet")
    assert index.chosen.str.contains("global").sum() >= 3  # the global model serves
    shards = sorted(segments.glob("models-*.parquet"))
    stored = pd.concat([pd.read_parquet(f, columns=["store", "meta"]) for f in shards])
    bases = stored.meta.map(lambda m: json.loads(m)["forecast"].get("base"))
    assert set(stored.store) == set(data.store) and bases.map(len).eq(HORIZON).all()
    later = data.copy()
    later.loc[later.store.isin(["season0", "noise0"]), "sales"] += 25
    later.to_parquet(tmp_path / "later.parquet", coerce_timestamps="us")
    pd.DataFrame({"store": ["season0", "noise0"]}).to_parquet(tmp_path / "retrain.parquet")
    retrain = {"source": {"path": str(tmp_path / "later.parquet"),
                          "segments": str(tmp_path / "retrain.parquet")}} | settings
    others = ~frame.store.isin(["season0", "noise0"]).to_numpy()
    for choice in ("keep", "refit"):
        report = pipeline.train(forecast_job(tmp_path / "runs", global_model=choice,
                                             **retrain), spark)
        assert report.publication.decision["decision"] == "merged", choice
        after = forecasts()
        pd.testing.assert_frame_equal(after[others], before[others], check_exact=True)
        moved = frame.store.eq("season0").to_numpy()
        assert after.prediction[moved].mean() > before.prediction[moved].mean() + 15, choice
