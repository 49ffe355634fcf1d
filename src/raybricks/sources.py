"""Reading a source, for training and for scoring: the one place that does it.

A source is a Spark DataFrame (used as given), a table name (``catalog.schema.table``)
or a ``SourceConfig`` (a table, or files at a path: Parquet, CSV with a header, Delta; or
files whose paths hold the segment keys, ``.../zip={zip}/*.csv``: ``raybricks.files``).
``source_of`` turns the name-or-path of the command line (``raybricks score``) into a
``SourceConfig`` by its look: a ``/`` or a ``.parquet`` / ``.csv`` suffix makes a path.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from raybricks.config import SourceConfig
from raybricks.errors import DataError, RaybricksError, SourceNotFound, first_line
from raybricks.files import SegmentFiles, is_template

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def source_of(name_or_path: str) -> SourceConfig:
    """A path (a ``/``, a ``{key}`` or a file suffix; CSV where the last part of the path
    holds ``.csv``, else Parquet) or a table."""
    if ("/" in name_or_path or is_template(name_or_path)
            or name_or_path.endswith((".parquet", ".csv"))):
        last = name_or_path.rstrip("/").rsplit("/", 1)[-1]
        fmt = "csv" if ".csv" in last else "parquet"
        return SourceConfig(path=name_or_path, format=fmt)
    return SourceConfig(table=name_or_path)


def read_source(
    source: SourceConfig | DataFrame | str, spark: SparkSession | None = None
) -> DataFrame:
    """The source as a Spark DataFrame: a DataFrame as given, a table by name (a string
    is always a table name: see ``source_of`` for paths), or files at a path. Without
    ``spark``, the active SparkSession. ``source.where`` is not applied here."""
    if isinstance(source, SourceConfig):
        if source.table:
            return _read_table(source.table, spark)
        return _read_files(source, spark)
    if isinstance(source, str):
        return _read_table(source, spark)
    return source


def _read_table(name: str, spark: SparkSession | None) -> DataFrame:
    from pyspark.errors import AnalysisException

    spark = spark or _active_spark()
    if spark is None:
        raise DataError(f"cannot read table {name!r}: no active SparkSession")
    try:
        return spark.table(name)
    except AnalysisException as exc:
        raise SourceNotFound(
            f"table {name!r} not found ({first_line(exc)}): " + (
                likely_table(spark, name) or "check the name (catalog.schema.table) and "
                "that it exists, e.g. with SHOW TABLES")
        ) from exc


def likely_table(spark: SparkSession, name: str) -> str:
    """``did you mean ...?`` with the tables of ``name``'s schema that a misspelt ``name``
    likely meant ('' where none is close or the schema cannot be listed)."""
    from raybricks.kinds import did_you_mean

    schema, _, table = name.rpartition(".")
    try:
        tables = [t.name for t in spark.catalog.listTables(schema or None)]
    except Exception:  # noqa: BLE001 - no such schema, no permission: no hint
        return ""
    return did_you_mean(table, tables, shown=f"{schema}.{{}}".format if schema else str)


def segment_files(source: SourceConfig, spark: SparkSession | None) -> SegmentFiles:
    """The files of a path template (``source.path`` with ``{key}`` parts), read."""
    return SegmentFiles(_spark_for(source, spark), str(source.path), source.format)


def _spark_for(source: SourceConfig, spark: SparkSession | None) -> SparkSession:
    spark = spark or _active_spark()
    if spark is None:
        raise DataError(
            f"cannot read {source.format} at source.path={source.path!r}: "
            "no active SparkSession"
        )
    return spark


def _read_files(source: SourceConfig, spark: SparkSession | None) -> DataFrame:
    from pyspark.errors import AnalysisException

    from raybricks import parquet

    if is_template(source.path):
        return segment_files(source, spark).frame
    spark = _spark_for(source, spark)
    reader = spark.read.format(source.format)
    if source.format == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    try:
        if source.format == "parquet":  # pandas' nanosecond timestamps too
            return parquet.read(spark, reader, source.path)
        return reader.load(source.path)
    except AnalysisException as exc:
        raise SourceNotFound(f"cannot read {source.format} at source.path={source.path!r}: "
                             f"{first_line(exc)}") from exc


def _active_spark() -> SparkSession | None:
    from raybricks.session import active_spark

    return active_spark()



class NothingToTrain(RaybricksError):
    """A monitoring run or table has no segment in the statuses asked to retrain."""


def only_segments(df: DataFrame, segments: str, segment_by: list[str],
                  spark: SparkSession | None = None, statuses: list[str] | None = None
                  ) -> DataFrame:
    """The rows of ``df`` whose segment is listed in ``segments`` (``source.segments``: a
    table or path with the segment columns; a null key matches a null key; with
    ``statuses``: a monitoring table or run, whose segments in those statuses)."""
    spark = spark or df.sparkSession
    listed = (monitored_segments(segments, statuses, spark) if statuses
              else read_source(source_of(segments), spark))
    missing = [c for c in segment_by if c not in listed.columns]
    if missing:
        raise DataError(
            f"source.segments {segments!r} has no column(s) {missing}: it lists segments "
            f"by the segment columns {segment_by} (it has {listed.columns})")
    return join_on_segments(df, listed.select(*segment_by).distinct(), segment_by,
                            "left_semi")


def join_on_segments(left: DataFrame, right: DataFrame, segment_by: list[str], how: str
                     ) -> DataFrame:
    """``left`` joined with ``right`` (``how``: Spark's join types) on the segment columns,
    a null key matching a null key; the segment columns are ``left``'s, once."""
    from functools import reduce

    keys = {c: f"__right_{c}" for c in segment_by}
    renamed = right.select(*[right[c].alias(keys[c]) for c in segment_by],
                           *[right[c] for c in right.columns if c not in keys])
    same = reduce(lambda a, b: a & b, [left[c].eqNullSafe(renamed[k]) for c, k in keys.items()])
    return left.join(renamed, on=same, how=how).drop(*keys.values())


#: An MLflow run id (what ``raybricks monitor`` prints), as opposed to a table or path.
RUN_ID = re.compile(r"[0-9a-f]{32}")


def monitoring_table(segments: str) -> str:
    """The monitoring table behind ``segments``: the output of the MLflow monitoring run
    it names, or itself (a table or path)."""
    if not RUN_ID.fullmatch(segments):
        return segments
    import mlflow

    from raybricks.tracking.target import configure_tracking

    configure_tracking()
    try:
        output = mlflow.get_run(segments).data.params.get("output")
    except mlflow.exceptions.MlflowException as exc:
        raise DataError(f"source.segments {segments!r}: no MLflow run with that id "
                        f"({mlflow.get_tracking_uri()}): give a monitoring run's id or its "
                        "output table") from exc
    if not output:
        raise DataError(f"MLflow run {segments} is not a raybricks monitor run (no output "
                        "parameter): give a monitoring run's id or its output table")
    return output


def global_table(table: str) -> str:
    """Where monitoring writes the health of the model's global models, beside its
    segments' table (or path) ``table``: the same name with ``_global`` after it."""
    return table.rstrip("/") + "_global"


def degraded_globals(segments: str, spark: SparkSession) -> list[str]:
    """The global models a monitoring table (or run) found ``degraded`` in its latest
    period (none where it has no global models' table)."""
    from pyspark.sql import functions as F

    try:
        found = read_source(source_of(global_table(monitoring_table(segments))), spark)
        latest = found.agg(F.max("period")).first()[0]
        current = found if latest is None else found.where(F.col("period") == latest)
        rows = current.where(F.col("status") == "degraded").select("global_model").collect()
    except Exception:  # noqa: BLE001 - a table from before global models, or none
        return []
    return sorted({row["global_model"] for row in rows})


def monitored_segments(segments: str, statuses: list[str], spark: SparkSession
                       ) -> DataFrame:
    """The segments of a monitoring table (or run) whose status in its latest period is
    one of ``statuses``; raises NothingToTrain when there are none."""
    from pyspark.sql import functions as F

    table = monitoring_table(segments)
    found = read_source(source_of(table), spark)
    if not {"status", "period"} <= set(found.columns):
        raise DataError(f"{table!r} is not a monitoring table (no status and period "
                        "columns): give the output of raybricks monitor, or list the "
                        "segments without source.statuses")
    latest = found.agg(F.max("period")).first()[0]
    current = found if latest is None else found.where(F.col("period") == latest)
    chosen = current.where(F.col("status").isin(list(statuses)))
    if not chosen.limit(1).count():
        raise NothingToTrain(f"no segment of monitoring {segments} is "
                             f"{' or '.join(statuses)}"
                             + (f" in its latest period {latest}" if latest else "")
                             + ": nothing to retrain")
    return chosen
