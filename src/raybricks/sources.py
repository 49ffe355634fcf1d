"""Reading a source, for training and for scoring: the one place that does it.

A source is a Spark DataFrame (used as given), a table name (``catalog.schema.table``)
or a ``SourceConfig`` (a table, or files at a path: Parquet, CSV with a header, Delta; or
files whose paths hold the segment keys, ``.../zip={zip}/*.csv``: ``raybricks.files``).
``source_of`` turns the name-or-path of the command line (``raybricks score``) into a
``SourceConfig`` by its look: a ``/`` or a ``.parquet`` / ``.csv`` suffix makes a path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raybricks.config import SourceConfig
from raybricks.errors import DataError, SourceNotFound
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
            f"table {name!r} not found ({_first_line(exc)}): check the name "
            "(catalog.schema.table) and that it exists, e.g. with SHOW TABLES"
        ) from exc


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

    if is_template(source.path):
        return segment_files(source, spark).frame
    spark = _spark_for(source, spark)
    reader = spark.read.format(source.format)
    if source.format == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    try:
        return reader.load(source.path)
    except Exception as exc:
        where = f"cannot read {source.format} at source.path={source.path!r}"
        if "TIMESTAMP(NANOS" in str(exc):  # Spark 4: AnalysisException; 3.5: a failed job
            raise DataError(
                f"{where}: it holds nanosecond timestamps (pandas' to_parquet writes them "
                "by default), which Spark cannot read. Write microseconds instead, e.g. "
                "df.to_parquet(path, coerce_timestamps='us', allow_truncated_timestamps=True)"
            ) from exc
        if isinstance(exc, AnalysisException):
            raise SourceNotFound(f"{where}: {str(exc).splitlines()[0]}") from exc
        raise


def _active_spark() -> SparkSession | None:
    from raybricks.session import active_spark

    return active_spark()


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def only_segments(df: DataFrame, segments: str, segment_by: list[str],
                  spark: SparkSession | None = None) -> DataFrame:
    """The rows of ``df`` whose segment is listed in ``segments`` (``source.segments``: a
    table or path with the segment columns; a null key matches a null key)."""
    from functools import reduce

    listed = read_source(source_of(segments), spark or df.sparkSession)
    missing = [c for c in segment_by if c not in listed.columns]
    if missing:
        raise DataError(
            f"source.segments {segments!r} has no column(s) {missing}: it lists segments "
            f"by the segment columns {segment_by} (it has {listed.columns})")
    keys = listed.select(*[listed[c].alias(f"__listed_{c}") for c in segment_by]).distinct()
    same = reduce(lambda a, b: a & b, [df[c].eqNullSafe(keys[f"__listed_{c}"])
                                       for c in segment_by])
    return df.join(keys, on=same, how="left_semi")
