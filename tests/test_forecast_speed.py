"""The forecasting fast paths give what the general ones give: statistical candidates
backtested through their models' own ``forecast``, series already on their grid taken as
they are, and lag candidates backtested for a whole block at once."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raybricks import kinds
from raybricks.config import CandidateConfig
from raybricks.kinds.forecasting import ForecastKind
from raybricks.training.forecast.series import block_times, clean_series, windows
from tests.test_forecast import plan_for

STATISTICAL = [("Naive", {}), ("SeasonalNaive", {"season_length": 7}),
               ("WindowAverage", {"window_size": 7}),
               ("SeasonalWindowAverage", {"season_length": 7, "window_size": 2}),
               ("SimpleExponentialSmoothing", {"alpha": 0.3}), ("HistoricAverage", {}),
               ("SeasonalExponentialSmoothing", {"season_length": 7, "alpha": 0.2}),
               ("CrostonClassic", {}), ("ADIDA", {}), ("IMAPA", {}),
               ("AutoETS", {"season_length": 7}), ("AutoARIMA", {"season_length": 7})]


def daily(store: str, n: int, seed: int, start: str = "2024-01-01", **columns) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    sales = 30 + 0.05 * t + 8 * np.sin(2 * np.pi * t / 7) + rng.normal(0, 3, n)
    return pd.DataFrame({"store": store, "day": pd.date_range(start, periods=n, freq="D"),
                         "sales": np.maximum(sales, 0), **columns})


@pytest.mark.parametrize("estimator, params", STATISTICAL)
def test_statistical_backtests_through_forecast_equal_fit_then_predict(tmp_path, estimator,
                                                                       params):
    data = daily("a", 120, 0)
    data["promo"] = (np.arange(120) % 5 == 0).astype(float)
    exogenous = estimator == "AutoARIMA"  # a model that reads exogenous columns
    plan = plan_for(data, tmp_path, forecast={
        "horizon": 7, "frequency": "D", "exogenous": ["promo"] if exogenous else []})
    series = clean_series(data, plan)
    origins = windows(len(series.frame), plan.forecast)
    kind = kinds.forecaster(CandidateConfig(name="m", kind="statsforecast",
                                            estimator=estimator, params=params))
    fast = kind.backtest(params, series.frame, origins, 0, 1, plan.forecast)
    general = ForecastKind.backtest(kind, params, series.frame, origins, 0, 1, plan.forecast)
    assert fast.shape == (len(origins) * 7,) and np.isfinite(fast).all()
    np.testing.assert_allclose(fast, general, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("frequency, step", [("D", "D"), ("W-SUN", "W-SUN"), ("h", "h"),
                                             ("MS", "MS"), (1, None)])
def test_series_on_their_grid_are_cleaned_as_the_general_path_cleans_them(tmp_path,
                                                                          frequency, step):
    n = 150
    if step is None:
        times = np.arange(100, 100 + n)
    else:
        times = pd.date_range("2024-01-07", periods=n, freq=step)
    data = pd.DataFrame({"store": "a", "day": times, "sales": np.arange(n) % 9 + 1.0})
    plan = plan_for(data, tmp_path, forecast={"horizon": 3, "frequency": frequency})
    shuffled = data.sample(frac=1, random_state=0)  # out of order: the general path
    fast = clean_series(block_times(data, plan), plan)
    general = clean_series(shuffled, plan)
    pd.testing.assert_frame_equal(fast.frame, general.frame, check_index_type=False)
    assert fast.notes == general.notes


def test_each_candidates_seconds_are_in_the_result_row(tmp_path):
    """``<candidate>_seconds``: each candidate's evaluation time on the series, a lag
    model's including its share of the block's backtest, within ``fit_seconds``."""
    from dataclasses import replace

    import pyarrow as pa

    from raybricks.data import segment_bounds
    from raybricks.training.forecast.task import FORECAST
    from raybricks.training.packed import warm_up
    from raybricks.training.selection import results_table

    data = pd.concat([daily(s, 150, i) for i, s in enumerate(["a", "b", "c"])])
    plan = plan_for(data, tmp_path, models=[
        {"name": "lgbm", "kind": "lightgbm",
         "params": {"n_estimators": 20, "num_leaves": 7, "min_child_samples": 5}},
        {"name": "snaive", "kind": "statsforecast", "estimator": "SeasonalNaive",
         "params": {"season_length": 7}}])
    plan = replace(plan, forecast=replace(plan.forecast, end=str(data.day.max())))
    table = pa.Table.from_pandas(data, preserve_index=False)
    todo = list(segment_bounds(table, plan.segment_by))
    warm_up(FORECAST, plan)  # as a task does before its clock starts
    train = FORECAST.trainer(table.select(plan.columns).to_pandas(), todo, plan)
    rows = [train(key, start, end)[0] for key, start, end in todo]
    found = results_table(rows, plan).to_pandas()
    assert (found.status == "trained").all()
    assert {"lgbm_seconds", "snaive_seconds"} <= set(found.columns)
    assert "global_seconds" not in found.columns and "baseline_seconds" not in found.columns
    assert (found.lgbm_seconds > 0).all() and (found.snaive_seconds > 0).all()
    assert (found.lgbm_seconds + found.snaive_seconds <= found.fit_seconds).all()
    assert found.lgbm_seconds.sum() > 5 * found.snaive_seconds.sum()  # a booster, a lookup
