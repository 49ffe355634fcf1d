"""``kind: prophet``: Prophet per series against the naive baseline, the exogenous columns as
its regressors, its holidays and seasonalities, seeded and deterministic fits, the stored
member forecasting with prophet alone (no raybricks), and the config errors (integer time
column, holidays twice, a missing extra)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from raybricks import kinds
from raybricks.config import CandidateConfig, JobConfig
from raybricks.errors import ConfigError
from raybricks.results import TRAINED
from raybricks.segmented_model import SegmentModel
from raybricks.training.forecast.backtest import train_series
from raybricks.training.plan import stable_seed
from raybricks.training.tasks import make_plan
from tests.test_registry import run_without_raybricks

HORIZON = 14
START = pd.Timestamp("2024-01-01")
PROPHET = {"name": "prophet", "kind": "prophet",
           "params": {"yearly_seasonality": False, "changepoint_prior_scale": 0.05}}


def job(**changes) -> JobConfig:
    base = {"source": {"table": "unused"}, "segment_by": ["store"], "target": "sales",
            "time_column": "day", "task": "forecast", "models": [PROPHET],
            "forecast": {"horizon": HORIZON, "frequency": "D"},
            "training": {"progress": False}}
    return JobConfig.from_dict(base | changes)


def plan_for(frame: pd.DataFrame, **changes):
    return make_plan(job(**changes), pa.Schema.from_pandas(frame, preserve_index=False))


def seasonal(store: str, n: int, seed: int, **columns) -> pd.DataFrame:
    """A trend with a weekly pattern and noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    sales = 50 + 0.3 * t + 6 * np.sin(2 * np.pi * t / 7 + seed) + rng.normal(size=n)
    return pd.DataFrame({"store": store, "day": pd.date_range(START, periods=n),
                         "sales": sales, **columns})


def future(frame: pd.DataFrame, periods: int, **columns) -> pd.DataFrame:
    last = frame.day.max()
    return pd.DataFrame({"store": frame.store.iloc[0], "day": pd.date_range(
        last + pd.Timedelta(days=1), periods=periods), **columns})


def test_prophet_beats_the_naive_forecasts_on_trend_and_weekly_season():
    for seed in range(3):
        whole = seasonal(f"s{seed}", 140 + HORIZON, seed)
        history, held_out = whole.iloc[:140], whole.iloc[140:]
        row, members = train_series(history, (f"s{seed}",), plan_for(history))
        row = row.as_row(plan_for(history))
        assert row["status"] == TRAINED, row["reason"]
        assert json.loads(row["chosen"]) == ["prophet"]
        assert [m["kind"] for m in members] == ["prophet"]
        # the backtest: well under the better naive forecast (the trend moves on)
        assert row["prophet_mase"] < 0.7 * row["baseline_mase"]
        # the held-out fortnight: closer than last week repeated, and than the last value
        predicted = SegmentModel.from_rows(members).predict(held_out[["store", "day"]])
        actual = held_out.sales.to_numpy()
        y = history.sales.to_numpy()
        snaive = np.tile(y[-7:], 2)
        mae = np.abs(predicted - actual).mean()
        assert mae < 0.7 * np.abs(snaive - actual).mean()
        assert mae < 0.5 * np.abs(y[-1] - actual).mean()


def test_fits_are_seeded_and_deterministic_and_predict_without_sampling():
    history = seasonal("a", 120, 1)
    plan = plan_for(history)
    runs = [train_series(history, ("a",), plan)[1] for _ in range(2)]
    ahead = future(history, HORIZON)
    first, second = (SegmentModel.from_rows(m).predict(ahead) for m in runs)
    np.testing.assert_array_equal(first, second)
    stored = json.loads(runs[0][0]["payload"])
    assert stored["uncertainty_samples"] == 0  # raybricks' conformal intervals serve
    # the optimizer's seed, passed on to cmdstanpy
    assert stored["fit_kwargs"] == {"seed": stable_seed(plan.seed, ("a",), "prophet", "fit")}
    model = kinds.resolve("prophet").load(runs[0][0]["payload"], {})
    out = model.predict(ahead.rename(columns={"day": "ds"})[["ds"]])
    assert "yhat_lower" not in out  # no uncertainty sampling at predict time
    np.testing.assert_allclose(out.yhat.to_numpy(), first, rtol=1e-12)


def test_an_exogenous_column_is_a_regressor_that_drives_the_forecast():
    rng = np.random.default_rng(3)
    promo = (rng.random(120) < 0.3).astype(float)
    history = seasonal("p", 120, 2, promo=promo)
    history["sales"] += 12 * promo
    plan = plan_for(history, forecast={"horizon": HORIZON, "frequency": "D",
                                       "exogenous": ["promo"]})
    row, members = train_series(history, ("p",), plan)
    assert row.as_row(plan)["status"] == TRAINED
    stored = kinds.resolve("prophet").load(members[0]["payload"], {})
    assert list(stored.extra_regressors) == ["promo"]
    on = future(history, HORIZON, promo=[1.0] * HORIZON)
    off = on.assign(promo=0.0)
    model = SegmentModel.from_rows(members)
    lift = model.predict(on) - model.predict(off)
    np.testing.assert_allclose(lift, 12, atol=1.5)  # the same lift every day
    with pytest.raises(ValueError, match="exogenous values"):  # a period's value missing
        model.predict(on.iloc[[0, 2]])


def forecast_with(params: dict, history: pd.DataFrame, days: pd.DatetimeIndex) -> np.ndarray:
    """One Prophet fitted with ``params`` on ``history`` (ds, y), forecasting ``days``."""
    spec = plan_for(seasonal("a", 10, 0)).forecast
    kind = kinds.forecaster(CandidateConfig(name="p", kind="prophet", params=params))
    model = kind.fit_series(params, history, seed=1, threads=1, spec=spec)
    return kind.forecast(model, pd.DataFrame({"ds": days}), spec)


def test_country_holidays_and_seasonalities_are_added():
    import holidays

    days = pd.date_range("2022-01-01", "2024-06-30")
    us = holidays.country_holidays("US", years=range(2022, 2025))
    rng = np.random.default_rng(4)
    y = 100 + 10 * np.sin(2 * np.pi * days.day.to_numpy() / 30.5) + rng.normal(size=len(days))
    y[np.isin(days.date, list(us))] += 40  # a holiday is busy
    history = pd.DataFrame({"ds": days, "y": y})
    ahead = pd.date_range("2024-07-01", "2024-07-07")  # the 4th of July
    plain = forecast_with({"yearly_seasonality": False}, history, ahead)
    both = forecast_with({"yearly_seasonality": False, "country_holidays": "US",
                          "seasonalities": [{"name": "monthly", "period": 30.5,
                                             "fourier_order": 3}]}, history, ahead)
    july4 = ahead.get_loc(pd.Timestamp("2024-07-04"))
    others = np.delete(np.arange(len(ahead)), july4)
    assert both[july4] - both[others].max() > 25  # the holiday's effect, forecast
    assert plain[july4] - plain[others].max() < 10  # without it: an ordinary day
    truth = 100 + 10 * np.sin(2 * np.pi * ahead.day.to_numpy() / 30.5)
    assert np.abs(both[others] - truth[others]).mean() < 3  # the monthly cycle, learnt


def test_holiday_rows_become_prophets_holidays_frame():
    days = pd.date_range("2023-01-01", "2023-07-29")
    y = 10 + np.random.default_rng(5).normal(scale=0.1, size=len(days))
    sale = pd.to_datetime(["2023-02-01", "2023-04-01", "2023-06-01", "2023-08-01"])
    y[days.isin(sale)] += 20  # a sale day sells more; the last one is in the future
    params = {"weekly_seasonality": False, "yearly_seasonality": False,
              "holidays": [{"holiday": "sale", "ds": str(day.date())} for day in sale]}
    ahead = pd.date_range("2023-07-30", "2023-08-02")
    found = forecast_with(params, pd.DataFrame({"ds": days, "y": y}), ahead)
    day = ahead.get_loc(pd.Timestamp("2023-08-01"))
    assert found[day] - np.delete(found, day).max() > 15


def test_stored_member_forecasts_with_prophet_alone_without_raybricks(tmp_path):
    history = seasonal("a", 120, 6, promo=np.arange(120) % 5 == 0)
    history["promo"] = history.promo.astype(float)
    plan = plan_for(history, forecast={"horizon": HORIZON, "frequency": "D",
                                       "exogenous": ["promo"]})
    _, members = train_series(history, ("a",), plan)
    ahead = future(history, HORIZON, promo=[1.0, 0.0] * (HORIZON // 2))
    expected = SegmentModel.from_rows(members).predict(ahead)
    (tmp_path / "member.pkl").write_bytes(pickle.dumps(members[0]))
    ahead.to_parquet(tmp_path / "ahead.parquet")
    kinds.ship(["prophet"], tmp_path / "code")
    run_without_raybricks(f"""
import json, pickle, sys, pandas as pd
from prophet.serialize import model_from_json
member = pickle.loads(open({str(tmp_path / 'member.pkl')!r}, "rb").read())
ahead = pd.read_parquet({str(tmp_path / 'ahead.parquet')!r})
# prophet alone: the payload is Prophet's own JSON
model = model_from_json(member["payload"].decode())
alone = model.predict(ahead.rename(columns={{"day": "ds"}})[["ds", "promo"]]).yhat
# the registered model's path: the shipped copy of raybricks.kinds
sys.path.insert(0, {str(tmp_path / 'code')!r})
import raybricks_kinds
kind = raybricks_kinds.resolve(member["kind"])
meta = json.loads(member["meta"])
shipped = kind.predict_loaded(kind.load(member["payload"], meta), ahead, meta)
pd.DataFrame({{"alone": alone.to_numpy(), "shipped": shipped}}).to_parquet(
    {str(tmp_path / 'out.parquet')!r})
""")
    out = pd.read_parquet(tmp_path / "out.parquet")
    np.testing.assert_allclose(out.alone.to_numpy(), expected, rtol=1e-9)
    np.testing.assert_allclose(out.shipped.to_numpy(), expected, rtol=1e-9)


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("changes, message", [
    ({"forecast": {"horizon": 7, "frequency": 1}}, "kind prophet needs dates"),
    ({"forecast": {"horizon": 7, "frequency": "D", "holidays": "US"},
      "models": [PROPHET | {"params": {"country_holidays": "US"}}]},
     "country_holidays and forecast.holidays exclude each other"),
    ({"models": [PROPHET | {"params": {"seasonalities": [{"name": "monthly"}]}}]},
     "must be a list of {name, period, fourier_order}"),
    ({"task": "regression", "forecast": None, "validation": {"method": "holdout"}},
     "need task: forecast"),
])
def test_configs_prophet_cannot_forecast_are_clear_errors(changes, message):
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        job(**changes)


def test_prophet_with_the_jobs_holidays_or_its_own_is_valid():
    job(forecast={"horizon": 7, "frequency": "D", "holidays": "US"})
    job(models=[PROPHET | {"params": {"country_holidays": "US"}}])


def test_arguments_prophet_refuses_are_config_errors_before_training():
    for params in ({"seasonality_mode": "sideways"}, {"changepoint_prior": 0.1},
                   {"country_holidays": "Atlantis"}):
        candidate = job(models=[PROPHET | {"params": params}]).models[0]
        with pytest.raises(ConfigError, match="Prophet with .* cannot be built"):
            kinds.forecaster(candidate).check()


def test_missing_prophet_is_a_config_error_naming_the_extra():
    script = """
import sys
sys.modules["prophet"] = None  # prophet not installed: `import prophet` raises ImportError
from raybricks.config import JobConfig
from raybricks.errors import ConfigError
base = {"source": {"table": "t"}, "segment_by": ["s"], "target": "y", "task": "forecast",
        "time_column": "d", "forecast": {"horizon": 7, "frequency": "D"}}
JobConfig.from_dict(base | {"models": [{"name": "ets", "kind": "statsforecast",
                                        "estimator": "AutoETS"}]})  # needs no prophet
try:
    JobConfig.from_dict(base | {"models": [{"name": "p", "kind": "prophet"}]})
except ConfigError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    assert "models[p] of kind prophet needs prophet, which is not installed" in out
    assert "pip install raybricks[prophet]" in out


# --------------------------------------------------------------------------- end to end


@pytest.mark.heavy
def test_a_prophet_job_registers_a_model_that_needs_prophet_not_raybricks(
        ray_on_spark, spark, tmp_path):
    import mlflow

    from raybricks import tracking
    from raybricks.data import to_ray_dataset
    from raybricks.training import train_segments
    from tests.test_forecast import predict_without_raybricks

    data = pd.concat([seasonal(f"s{i}", 100, i) for i in range(4)], ignore_index=True)
    config = job(registry={"name": "tests.forecast.prophet"}, forecast={
        "horizon": HORIZON, "frequency": "D", "intervals": [80]},
        training={"progress": False, "output_dir": str(tmp_path / "runs")})
    result = train_segments(to_ray_dataset(spark.createDataFrame(data), ["store"]), config)
    assert (result.segments.status == TRAINED).all(), result.segments.reason
    tracking.publish(result, config)
    uri = "models:/tests.forecast.prophet@champion"
    requirements = Path(mlflow.pyfunc.get_model_dependencies(uri)).read_text()
    assert f"prophet=={version('prophet')}" in requirements
    ahead = pd.concat([future(data[data.store == s], HORIZON) for s in ("s0", "s3")])
    output = predict_without_raybricks(uri, ahead, tmp_path, {"intervals": True})
    models = result.models().to_pandas()
    for store in ("s0", "s3"):
        rows = (ahead.store == store).to_numpy()
        members = models[models.store == store].to_dict("records")
        expected = SegmentModel.from_rows(members).predict(ahead[rows])
        np.testing.assert_allclose(output.prediction.to_numpy()[rows], expected, rtol=1e-9)
        bounds = output[rows]  # raybricks' conformal intervals around Prophet's forecast
        assert (bounds.lo_80 < bounds.prediction).all()
        assert (bounds.prediction < bounds.hi_80).all()
