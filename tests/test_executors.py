"""The Spark executor (``training.executor: spark``) against the Ray executor on the same
jobs: the same statuses, chosen candidates, validation metrics and predictions from the
registry, with the defaults users get (``fallback: global``, the default shrink); runs
cut by bytes never split a segment; ``auto``'s rule.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raybricks import scoring, tracking
from raybricks.config import JobConfig
from raybricks.data import SegmentSizes, to_ray_dataset
from raybricks.errors import ConfigError
from raybricks.pipeline import choose_executor
from raybricks.training import train_segments
from raybricks.training.on_spark import spark_segments
from tests import helpers
from tests.test_forecast import MODELS as FORECAST_MODELS
from tests.test_forecast import forecast_job, stores
from tests.test_training import CANDIDATES, job

#: What both executors must agree on, per segment.
SAME = ["status", "reason", "n_rows", "n_valid", "chosen"]


def by_key(result, keys: list[str]) -> pd.DataFrame:
    return result.segments.sort_values(keys).set_index(keys)


def both(spark, frame: pd.DataFrame, config: JobConfig, keys: list[str]):
    """The job trained on Ray's blocks and in Spark's tasks (its own run each)."""
    df = spark.createDataFrame(frame)
    on_ray = train_segments(to_ray_dataset(df, keys), config)
    on_spark = train_segments(spark_segments(df, keys, len(frame), spark),
                              config.model_copy(update={"training": config.training.model_copy(
                                  update={"run_id": None})}))
    return on_ray, on_spark


def assert_same(on_ray, on_spark, keys: list[str], metric: str) -> None:
    ray_rows, spark_rows = by_key(on_ray, keys), by_key(on_spark, keys)
    assert list(ray_rows.index) == list(spark_rows.index)
    pd.testing.assert_frame_equal(ray_rows[SAME], spark_rows[SAME])
    np.testing.assert_allclose(ray_rows[f"metric_{metric}"].to_numpy(dtype=float),
                               spark_rows[f"metric_{metric}"].to_numpy(dtype=float),
                               rtol=1e-6, equal_nan=True)


@pytest.mark.topology
def test_the_spark_executor_trains_what_the_ray_executor_trains(ray_on_spark, spark,
                                                               tmp_path):
    """Tabular, time-ordered validation, fallback global, the default selection and
    shrink: same rows, same choices and metrics; the registered models predict alike,
    the global fallback included (an unknown store)."""
    config = job(tmp_path, models=[CANDIDATES[0], {**CANDIDATES[1], "trials": 1}],
                 fallback="global", registry={"name": "tests.executors.shops",
                                              "promote": "always"})
    on_ray, on_spark = both(spark, helpers.shops(), config, ["store"])
    assert on_spark.counts() == on_ray.counts() == {"trained": 8, "skipped": 3, "failed": 0}
    assert_same(on_ray, on_spark, ["store"], "rmse")
    frame = helpers.shops(seed=3).drop(columns=["y"])
    frame.loc[frame.index[:5], "store"] = "brand-new"
    frame["row_id"] = np.arange(len(frame))
    predictions = []
    for result in (on_ray, on_spark):
        published = tracking.publish(result, config)
        model = f"models:/{published.name}/{published.version}"
        scored = scoring.score(model, spark.createDataFrame(frame), spark=spark).toPandas()
        predictions.append(scored.sort_values("row_id")["prediction"].to_numpy())
    np.testing.assert_allclose(predictions[0], predictions[1], rtol=1e-6)
    assert not np.isnan(predictions[1]).any()  # the global model serves brand-new


def test_the_spark_executor_forecasts_what_the_ray_executor_forecasts(ray_on_spark, spark,
                                                                     tmp_path):
    config = forecast_job(tmp_path, models=FORECAST_MODELS[:2], fallback="global",
                          forecast={"horizon": 7, "frequency": "D", "intervals": [80]})
    on_ray, on_spark = both(spark, stores(), config, ["store"])
    assert on_spark.counts() == on_ray.counts() and on_spark.counts()["trained"] > 0
    assert_same(on_ray, on_spark, ["store"], config.metric)
    assert on_spark.fallback and len(on_spark.fallback) == len(on_ray.fallback)


def test_runs_cut_by_bytes_keep_every_segment_whole(spark, tmp_path, monkeypatch):
    """Tiny runs and Arrow batches of 7 rows: segments straddle batches and runs end at
    every few segments; each segment still trains once, on all its rows."""
    from raybricks.training import on_spark

    monkeypatch.setattr(on_spark, "RUN_BYTES", 2_000)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")
    try:
        config = job(tmp_path, models=CANDIDATES[:1])
        frame = helpers.shops()
        result = train_segments(spark_segments(spark.createDataFrame(frame), ["store"],
                                               len(frame), spark), config)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    rows = by_key(result, ["store"])
    assert rows.index.is_unique and len(rows) == frame.store.nunique()
    expected = frame.groupby("store").size()
    assert (rows["n_rows"] == expected.loc[rows.index]).all()
    parts = list((result.run_dir / "results").glob("part-spark-*.parquet"))
    assert len(parts) >= 4  # many runs, not one per partition


@pytest.mark.topology
def test_tasks_write_their_parts_where_they_reach_the_run_directory(spark, tmp_path,
                                                                   monkeypatch):
    """Where Spark's tasks see the run directory (here: the same machine; a Volume on a
    cluster) they write their own parts and send the driver no model bytes (a driver
    takes at most spark.driver.maxResultSize of task results in a job), which the driver
    moves into the run as their rows arrive; where they do not, the driver writes what
    they send. The same segments train either way."""
    from raybricks.training import on_spark

    config = job(tmp_path, models=CANDIDATES[:1])
    frame = helpers.shops()
    assert on_spark.reaches(spark, tmp_path)
    assert not list(tmp_path.glob(".reach-*"))  # the probe's file is gone
    sent: list[int] = []
    rows = on_spark.outcome_rows

    def counted(df):
        for row in rows(df):
            sent.append(len(row["results"] or b"") + len(row["models"] or b""))
            yield row

    monkeypatch.setattr(on_spark, "outcome_rows", counted)
    results = {}
    for written_by in ("tasks", "driver"):
        if written_by == "driver":
            monkeypatch.setattr(on_spark, "reaches", lambda spark, run_dir: False)
        sent.clear()
        result = train_segments(spark_segments(spark.createDataFrame(frame), ["store"],
                                               len(frame), spark), config)
        results[written_by] = by_key(result, ["store"])
        assert sent and (max(sent) == 0) == (written_by == "tasks"), written_by
        assert list((result.run_dir / "models").glob("part-spark-*"))
        assert not list((result.run_dir / on_spark.STAGED).glob("*/*/*"))  # all taken
    pd.testing.assert_series_equal(results["tasks"].n_rows, results["driver"].n_rows)
    assert (results["tasks"].status == results["driver"].status).all()


class FakeSession:
    """Stands in for a Spark Connect session where only its module is asked."""

    __module__ = "pyspark.sql.connect.session"


def sized(segments: int, largest: int):
    """A job's segment sizes, as ``choose_executor`` asks for them (counting the calls)."""
    def sizes() -> SegmentSizes:
        sizes.calls += 1
        return SegmentSizes(segments, largest)

    sizes.calls = 0
    return sizes


def unasked() -> SegmentSizes:
    raise AssertionError("the segment sizes were waited for where the choice needs none")


def test_auto_takes_ray_only_for_what_spark_tasks_cannot_do(spark, tmp_path):
    """auto: Spark's tasks unless the job has GPU candidates, says how to run Ray, holds a
    tabular segment above large_segment_rows or a search over fewer segments than cores;
    the sizes (a Spark job) are waited for only where they decide."""
    plain = job(tmp_path, models=[CANDIDATES[2]])
    large = plain.training.large_segment_rows
    executor, why = choose_executor(plain, spark, large, unasked)
    assert executor == "spark" and f"{large:,} rows" in why
    assert choose_executor(plain, spark, 10_000_000, sized(10_000, 1_000))[0] == "spark"
    executor, why = choose_executor(plain, spark, 3 * large, sized(2, large + 1))
    assert executor == "ray" and f"{large + 1:,} rows" in why and "Ray Train" in why
    assert choose_executor(plain, spark, 3 * large, sized(3, large))[0] == "spark"
    forecast = forecast_job(tmp_path)
    assert choose_executor(forecast, spark, 3 * large, unasked)[0] == "spark"

    searched = job(tmp_path)  # ridge and lgbm search
    cores = spark.sparkContext.defaultParallelism
    executor, why = choose_executor(searched, spark, 500, sized(cores - 1, 300))
    assert executor == "ray" and "ridge, lgbm" in why and "spreads" in why
    many = sized(cores, 100)
    assert choose_executor(searched, spark, 500, many)[0] == "spark" and many.calls

    connect = FakeSession()
    executor, why = choose_executor(searched, connect, 3 * large, unasked)
    assert executor == "spark" and "Spark Connect" in why
    asked = job(tmp_path, training={"output_dir": str(tmp_path), "executor": "ray"})
    assert choose_executor(asked, spark, 10, unasked)[0] == "ray"
    for cluster in ({"mode": "local", "num_cpus": 2}, {"mode": "spark"}):
        executor, why = choose_executor(job(tmp_path, cluster=cluster), spark, 10, unasked)
        assert executor == "ray" and f"cluster.mode: {cluster['mode']}" in why
    gpu = job(tmp_path, models=[{**CANDIDATES[2], "resources": {"num_gpus": 1}}])
    assert choose_executor(gpu, spark, 10, unasked)[0] == "ray"
    for session in (connect, spark):
        with pytest.raises(ConfigError, match="ask for GPUs, which only the Ray executor"):
            choose_executor(gpu.model_copy(update={"training": gpu.training.model_copy(
                update={"executor": "spark"})}) if session is spark else gpu, session, 10,
                unasked)


@pytest.mark.topology
def test_on_the_spark_executor_faulty_segments_fail_alone(spark, tmp_path):
    """With a time limit: a hung fit, a fit that kills its process, one out of memory
    and one that raises each end ``failed`` with their reason; the rest of their run
    trains. Without one: the segment that kills its process every time fails alone
    once Spark gave up on its task."""
    from tests import faults
    from tests.test_reliability import assert_faults_fail_alone, fault_job, statuses

    data = faults.stores({"hang": "hang", "kill": "kill", "memory": "memory",
                          "raise": "raise"})
    config = fault_job(tmp_path, training={"segment_timeout_s": 5, "executor": "spark"})
    result = train_segments(spark_segments(spark.createDataFrame(data), ["store"],
                                           len(data), spark), config)
    rows = statuses(result)
    assert_faults_fail_alone(rows, "worker lost: its process ended")
    assert "SIGKILL" in rows.loc["kill", "reason"]

    data = faults.stores({"kill": "kill"})
    config = fault_job(tmp_path / "again", training={"executor": "spark"})
    result = train_segments(spark_segments(spark.createDataFrame(data), ["store"],
                                           len(data), spark), config)
    rows = statuses(result)
    assert result.counts() == {"trained": 4, "skipped": 0, "failed": 1}
    assert rows.loc["kill", "reason"].startswith("worker lost: its process ended")


def test_a_local_run_directory_on_a_databricks_connect_driver_is_called_out(
        spark, tmp_path, monkeypatch):
    from raybricks.pipeline import durable_run_dir

    config = job(tmp_path)
    assert durable_run_dir(config, FakeSession()) is None  # not on Databricks
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "client.4.0")
    said = durable_run_dir(config, FakeSession())
    assert said and str(tmp_path) in said and "/Volumes/" in said
    assert durable_run_dir(config, spark) is None  # a classic driver keeps its disk
    volume = job(tmp_path, training={"output_dir": "/Volumes/main/ml/runs"})
    assert durable_run_dir(volume, FakeSession()) is None
