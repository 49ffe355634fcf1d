"""The Spark Connect client of tests/test_connect.py, in a process of its own:

    python tests/connect_client.py sc://HOST:PORT WORKDIR MODEL_URI FORECAST_URI

Connects, then trains (on the Spark executor; the Ray executor refused), validates,
scores, forecasts, monitors and retrains two segments with raybricks' Python API; writes
the outputs into WORKDIR and prints what it found as one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(url: str, work: Path, model: str, forecasts: str) -> dict:
    import pandas as pd
    import ray
    from pyspark.sql import SparkSession
    from pyspark.sql.utils import is_remote

    import raybricks
    from raybricks.config import JobConfig

    spark = SparkSession.builder.remote(url).getOrCreate()
    found: dict = {"session": type(spark).__module__, "remote": is_remote()}
    try:  # its source does not exist: reading it would fail otherwise
        raybricks.train(JobConfig.load(work / "missing.yml", ["training.executor=ray"]))
        found["refused"] = "trained"
    except raybricks.SetupError as exc:
        found["refused"] = str(exc)
    report = raybricks.train(JobConfig.load(work / "job.yml"))  # auto: Spark's tasks
    found["train"] = {"run_dir": str(report.result.run_dir), "counts": report.result.counts(),
                      "model": f"models:/{report.publication.name}/"
                               f"{report.publication.version}",
                      "stages": list(report.timings)}
    found["ray"] = ray.is_initialized()
    found["validate"] = raybricks.validate(JobConfig.load(work / "job.yml")).source_columns
    frame = pd.read_parquet(work / "input.parquet")
    trained = raybricks.score(found["train"]["model"], spark.createDataFrame(frame)).toPandas()
    trained.attrs.clear()
    trained.to_parquet(work / "trained.parquet")
    lazy = raybricks.score(model, spark.createDataFrame(frame))  # a Connect DataFrame
    scored = lazy.toPandas()
    scored.attrs.clear()  # Connect's query metrics, which Parquet metadata cannot hold
    scored.to_parquet(work / "lazy.parquet")
    summary = raybricks.score(model, str(work / "input.parquet"), str(work / "scored.parquet"))
    found["summary"] = {"rows": summary.rows, "counts": summary.status_counts,
                        "nulls": summary.null_predictions}
    raybricks.forecast(forecasts, str(work / "forecast.parquet"), intervals=True)
    # monitoring the model trained here on outcomes, then retraining two of its segments
    monitored = raybricks.monitor(found["train"]["model"], str(work / "shops.parquet"),
                                  str(work / "monitored.parquet"), log_run=False)
    found["monitor"] = monitored.counts
    retrained = raybricks.train(JobConfig.load(work / "job.yml", [
        f"source.segments={work / 'listed.parquet'}", "registry.promote=replace"]))
    found["retrain"] = {"counts": retrained.result.counts(),
                        "version": retrained.publication.version}
    spark.stop()
    return found


if __name__ == "__main__":
    url, work, model, forecasts = sys.argv[1:]
    print(json.dumps(main(url, Path(work), model, forecasts)))
