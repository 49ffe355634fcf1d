"""The verbs end to end: ``train`` reads the source, starts Ray, converts, trains,
then logs the run and registers the model in MLflow (on the driver, after Ray stops).

Everything that can be checked without a cluster (the config, importable estimators,
the registry name, the source's existence, columns and types) is checked before Ray
starts.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from raybricks.cluster import ray_cluster, spark_session
from raybricks.config import JobConfig, SourceConfig
from raybricks.data import resolve_source, select_and_filter, to_ray_dataset
from raybricks.errors import DataError
from raybricks.models import check_importable
from raybricks.training import TrainingResult, train_segments
from raybricks.training.segment import make_plan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def read_source(source: SourceConfig, spark: SparkSession) -> DataFrame:
    """The source as a Spark DataFrame: a table by name, or files at a path."""
    if source.table:
        return resolve_source(source.table, spark)
    from pyspark.errors import AnalysisException

    reader = spark.read.format(source.format)
    if source.format == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    try:
        return reader.load(source.path)
    except AnalysisException as exc:
        raise DataError(
            f"cannot read {source.format} at source.path={source.path!r}: "
            f"{str(exc).splitlines()[0]}"
        ) from exc


def train(
    config: JobConfig, spark: SparkSession | None = None, *, register: bool = True
) -> TrainingResult:
    """Train every segment of the configured source, then (``register``) log one MLflow
    run and register the model; ``result.publication`` says what the registry did."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from raybricks import registry

    timings: dict[str, float] = {}
    start = time.perf_counter()
    for candidate in config.models:
        check_importable(candidate)
    if register:
        registry.check_registry_name(config, registry.configure_tracking().registry_uri)
    spark = spark or spark_session()
    columns = list(dict.fromkeys(
        (config.features or []) + [config.target]
        + ([config.time_column] if config.time_column else [])
    )) if config.features else None
    df = select_and_filter(
        read_source(config.source, spark), config.segment_by, columns, config.source.where
    )
    # column and type errors, before Ray
    make_plan(config, to_arrow_schema(df.schema, timezone="UTC"))
    timings["checks"] = time.perf_counter() - start
    with ray_cluster(config.cluster, spark):
        timings["cluster"] = time.perf_counter() - start - sum(timings.values())
        segmented = to_ray_dataset(
            df, config.segment_by,
            strategy=config.data.strategy, max_block_rows=config.data.max_block_rows,
            staging_dir=config.data.staging_dir,
        )
        timings["data"] = time.perf_counter() - start - sum(timings.values())
        result = train_segments(segmented, config)
        timings["training"] = time.perf_counter() - start - sum(timings.values())
    result.timings = timings
    if register:
        result.publication = registry.publish(result, config)
        timings["registry"] = time.perf_counter() - start - sum(timings.values())
    return result
