"""Parquet timestamps as pandas writes them (nanoseconds, ``TIMESTAMP(NANOS)``, which
Spark refuses): read as integers and converted (``raybricks.parquet``), in sources,
scoring inputs and monitoring's outcomes; Parquet files disagreeing on a column's type
named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from raybricks import parquet
from raybricks.config import SourceConfig
from raybricks.errors import DataError
from raybricks.sources import read_source, source_of
from tests.test_connect import connect_server  # noqa: F401 - the fixture (by its name)

KEY = parquet.NANOS_AS_LONG
#: Naive times with nanoseconds (one before 1970: cut to the microsecond below it).
NAIVE = ["2024-01-01 00:00:00.123456789", "1969-12-31 23:59:59.9999995",
         "2024-03-10 02:30:00.000000999", None]
#: Integers that look like nanosecond times, and ones that do not.
LONGS = [1_704_067_200_123_456_789, 2**62, -5, 7]


def pandas_frame() -> pd.DataFrame:
    naive = pd.Series([pd.Timestamp(t) if t else pd.NaT for t in NAIVE], dtype="datetime64[ns]")
    return pd.DataFrame({
        "when": naive,
        "utc": naive.fillna(pd.Timestamp("1900-01-01")).dt.tz_localize("Europe/Paris"),
        "count": np.array(LONGS, dtype="int64"),
        "name": ["a", "b", "c", "d"],
    })


def write_nanos(frame: pd.DataFrame, path: Path) -> Path:
    """``frame`` as pandas writes it by default; the file holds ``TIMESTAMP(NANOS)``."""
    frame.to_parquet(path)
    schema = pq.ParquetFile(path).schema
    units = {schema.column(i).name: str(schema.column(i).logical_type)
             for i in range(len(schema))}
    for column in frame.select_dtypes(include=["datetime", "datetimetz"]):
        assert "timeUnit=nanoseconds" in units[column], units  # not coerced to micro
    return path


def micros_text(values: pd.Series) -> list[str | None]:
    """The wall-clock times cut to the microsecond (the floor), as text."""
    return [None if pd.isna(t) else t.floor("us").strftime("%Y-%m-%d %H:%M:%S.%f")
            for t in values]


def check_read(frame, original: pd.DataFrame) -> None:
    """``frame`` (Spark) holds ``original``'s times to the microsecond, its integers and
    strings as they were."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType.typeName() for f in frame.schema.fields}
    assert types == {"when": "timestamp_ntz", "utc": "timestamp", "count": "long",
                     "name": "string"}
    rows = frame.select(
        "name", "count", F.date_format("when", "yyyy-MM-dd HH:mm:ss.SSSSSS").alias("when"),
        F.unix_micros("utc").alias("utc")).orderBy("name").collect()
    assert [r["when"] for r in rows] == micros_text(original["when"])
    instants = original["utc"].dt.tz_convert("UTC").dt.tz_localize(None)
    assert [r["utc"] for r in rows] == [int(t) // 1000 for t in instants.astype("int64")]
    assert [r["count"] for r in rows] == LONGS  # real integers untouched


def test_a_pandas_parquet_file_reads_with_its_times_and_integers(spark, tmp_path):
    original = pandas_frame()
    path = write_nanos(original, tmp_path / "nanos.parquet")
    frame = read_source(SourceConfig(path=str(path), format="parquet"), spark)
    check_read(frame, original)
    assert spark.conf.get(KEY, None) is None  # the setting put back as it was
    check_read(frame, original)  # and the frame still reads without it
    naive = frame.select("when").toPandas()["when"]
    assert naive.tolist()[:3] == [t.floor("us") for t in original["when"][:3]]


def test_the_setting_as_the_user_left_it_is_kept(spark, tmp_path):
    original = pandas_frame()
    path = write_nanos(original, tmp_path / "nanos.parquet")
    try:
        for before in ["true", "false"]:
            spark.conf.set(KEY, before)
            check_read(read_source(SourceConfig(path=str(path), format="parquet"), spark),
                       original)
            assert spark.conf.get(KEY) == before
    finally:
        spark.conf.unset(KEY)


def test_the_paths_scoring_and_monitoring_read_convert_too(spark, tmp_path):
    """``source_of`` (a command's ``--input`` / outcomes path) -> ``read_source``, the
    way ``scoring.score`` and ``monitoring.measure`` read a path; and a folder of files."""
    original = pandas_frame()
    folder = tmp_path / "outcomes"
    folder.mkdir()
    for part in range(3):
        write_nanos(original.assign(name=original.name + str(part)),
                    folder / f"part-{part}.parquet")
    assert source_of(str(folder)).format == "parquet"
    frame = read_source(source_of(str(folder)), spark)
    assert frame.count() == 12
    check_read(frame.where(frame.name.endswith("1")),
               original.assign(name=original.name + "1"))


def test_a_folder_of_many_files_reads_one_footer(spark, tmp_path, monkeypatch):
    """A footer tells which integer columns are times: one, where the first file holds
    every integer column; for a column only one file of many holds (files merged by name,
    ``mergeSchema``), a few more (``FOOTERS``), then the footer of the file a one-column
    job finds its first value in."""
    read_footers = []
    jvm_footer = parquet._jvm_footer

    def counting(spark):
        footer = jvm_footer(spark)

        def counted(file, names):
            read_footers.append(file)
            return footer(file, names)
        return counted

    monkeypatch.setattr(parquet, "_jvm_footer", counting)
    original = pandas_frame()
    folder = tmp_path / "many"
    folder.mkdir()
    for part in range(40):
        write_nanos(original, folder / f"part-{part:03}.parquet")
    frame = parquet.read(spark, spark.read.option("mergeSchema", "true"), str(folder))
    assert len(read_footers) == 1
    assert frame.schema["when"].dataType.typeName() == "timestamp_ntz"
    only = folder / "part-999.parquet"
    write_nanos(original.rename(columns={"when": "later"}), only)
    read_footers.clear()
    frame = parquet.read(spark, spark.read.option("mergeSchema", "true"), str(folder))
    # Spark's listing is unordered: the sampled files may hold part-999 or not.
    assert any(str(only) in file for file in read_footers)
    assert len(read_footers) <= parquet.FOOTERS + 1
    assert frame.schema["later"].dataType.typeName() == "timestamp_ntz"
    assert frame.where(frame.later.isNotNull()).count() == 3
    # Where no sampled file holds it, the one-column job finds the file, read last.
    jvm_files = parquet._jvm_files
    monkeypatch.setattr(parquet, "_jvm_files", lambda frame: (
        file for file in jvm_files(frame) if str(only) not in file))
    read_footers.clear()
    frame = parquet.read(spark, spark.read.option("mergeSchema", "true"), str(folder))
    assert str(only) in read_footers[-1]
    assert len(read_footers) <= parquet.FOOTERS + 1
    assert frame.schema["later"].dataType.typeName() == "timestamp_ntz"


class Refusing:
    """A session that refuses the legacy setting (as a locked-down workspace may)."""

    def __init__(self, spark):
        self._spark = spark

    def __getattr__(self, name):
        return getattr(self._spark, name)

    @property
    def conf(self):
        spark = self._spark

        class Conf:
            def get(self, key, default=None):
                return spark.conf.get(key, default)

            def set(self, key, value):
                raise RuntimeError(f"[CONFIG_NOT_AVAILABLE] {key} is not available")

        return Conf()


def test_a_session_refusing_the_setting_gets_the_way_out(spark, tmp_path):
    path = write_nanos(pandas_frame(), tmp_path / "nanos.parquet")
    with pytest.raises(DataError) as raised:
        parquet.read(Refusing(spark), spark.read, str(path))
    said = str(raised.value)
    assert "nanosecond timestamps" in said and "CONFIG_NOT_AVAILABLE" in said
    assert "coerce_timestamps='us'" in said
    plain = pandas_frame().drop(columns=["when", "utc"])  # no nanoseconds: read as ever
    plain.to_parquet(tmp_path / "plain.parquet")
    assert parquet.read(Refusing(spark), spark.read, str(tmp_path / "plain.parquet")).count() == 4


def test_the_driver_sees_local_and_dbfs_paths_only(tmp_path):
    (tmp_path / "a b.parquet").write_bytes(b"")
    assert parquet._local_path(str(tmp_path / "a b.parquet")) == str(tmp_path / "a b.parquet")
    assert parquet._local_path((tmp_path / "a b.parquet").as_uri()) == str(
        tmp_path / "a b.parquet")
    assert parquet._local_path(str(tmp_path / "*.parquet")) == str(tmp_path / "*.parquet")
    for elsewhere in ["s3://bucket/x.parquet", "abfss://c@a.dfs.core.windows.net/x",
                      "dbfs:/no/such/folder", str(tmp_path / "missing")]:
        assert parquet._local_path(elsewhere) is None


def test_columns_of_any_name_convert(spark, tmp_path):
    original = pandas_frame().rename(columns={"when": "the.time `x`", "count": "a.b"})
    path = write_nanos(original, tmp_path / "odd names.parquet")
    frame = read_source(SourceConfig(path=str(path), format="parquet"), spark)
    assert frame.schema["the.time `x`"].dataType.typeName() == "timestamp_ntz"
    assert frame.schema["a.b"].dataType.typeName() == "long"
    assert frame.where("`the.time ``x``` IS NULL").count() == 1


def test_files_disagreeing_on_a_column_type_name_one_file(spark, tmp_path):
    """Spark's CANNOT_MERGE_SCHEMAS names no file; raybricks scans the column and does."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    for part in range(6):
        pd.DataFrame({"a": [1, 2], "x": [1, 2]}).to_parquet(folder / f"p{part}.parquet")
    pd.DataFrame({"a": [1, 2], "x": ["u", "v"]}).to_parquet(folder / "p3b.parquet")
    reader = spark.read.option("mergeSchema", "true").option("ignoreCorruptFiles", "true")
    with pytest.raises(DataError) as raised:
        parquet.read(spark, reader, str(folder))
    said = str(raised.value)
    assert "disagree on the type of x (BIGINT in some, STRING in others)" in said
    assert str(folder / "p3b.parquet") in said, said


def test_a_stale_checksum_file_is_named_with_the_fix(spark, tmp_path):
    """A Parquet file rewritten by pandas beside the .crc of Spark's earlier write: the
    read stops with the file and the .crc to delete, not Hadoop's ChecksumException."""
    from tests.test_files import stale_checksum

    folder = tmp_path / "rewritten"
    folder.mkdir()
    for part in range(3):
        pd.DataFrame({"a": [part], "x": [1.5]}).to_parquet(folder / f"p{part}.parquet")
    stale_checksum(folder / "p1.parquet", b"an earlier version of the file")
    with pytest.raises(DataError) as raised:
        parquet.read(spark, spark.read.option("mergeSchema", "true"), str(folder))
    said = str(raised.value)
    assert f"delete {folder}/.p1.parquet.crc" in said, said
    (folder / ".p1.parquet.crc").unlink()  # the fix it names works
    frame = parquet.read(spark, spark.read.option("mergeSchema", "true"), str(folder))
    assert sorted(row.a for row in frame.collect()) == [0, 1, 2]


def test_spark_merge_messages_parse_to_fields():
    found = parquet._fields("STRUCT<a: BIGINT, `b: c``d`: ARRAY<STRUCT<x: INT, "
                            "y: DECIMAL(10,2)>>, z: MAP<STRING, INT>>")
    assert found == {"a": "BIGINT", "b: c`d": "ARRAY<STRUCT<x: INT, y: DECIMAL(10,2)>>",
                     "z": "MAP<STRING, INT>"}


# ------------------------------------------------------- scoring and monitoring, end to end

MODEL = "tests.timestamps.model"


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """The merged model of tests/fixtures/registered (with target and profiles),
    registered as it is: no training."""
    import shutil

    import mlflow

    from raybricks.packaging import Packaged
    from raybricks.tracking.model import log_segmented_model
    from raybricks.tracking.target import configure_tracking
    from tests.test_registered_formats import FIXTURES, fixture_manifest

    here = FIXTURES / "merged"
    manifest = fixture_manifest("merged")
    configure_tracking()
    example = pd.read_parquet(here / "input.parquet")
    index = pd.read_parquet(here / "model" / "index.parquet")
    segments = shutil.copytree(here / "model", tmp_path_factory.mktemp("model") / "segments")
    packaged = Packaged(segments, manifest, len(index),
                        int((index.status == "trained").sum()))
    with mlflow.start_run():
        info = log_segmented_model(packaged, example, "segmented_model")
    found = mlflow.register_model(info.model_uri, MODEL)
    return f"models:/{MODEL}/{found.version}", example


def test_a_scoring_input_with_nanosecond_times_scores(spark, registered, tmp_path):
    from raybricks import scoring

    uri, example = registered
    original = pandas_frame()
    frame = example.assign(when=np.resize(original["when"].to_numpy(), len(example)))
    path = write_nanos(frame, tmp_path / "input.parquet")
    scored = scoring.score(uri, str(path), spark=spark)
    assert scored.schema["when"].dataType.typeName() == "timestamp_ntz"
    out = scored.toPandas()
    assert len(out) == len(frame) and out.prediction.notna().all()
    assert sorted(micros_text(out["when"]), key=str) == sorted(micros_text(frame["when"]),
                                                               key=str)


def test_monitoring_outcomes_with_nanosecond_times_are_cut_by_week(spark, registered, tmp_path):
    from raybricks import monitoring

    uri, example = registered
    days = pd.Timestamp("2024-01-01 00:00:00.000000001") + pd.to_timedelta(
        np.arange(len(example)) % 21, unit="D")
    outcomes = example.assign(when=days.astype("datetime64[ns]"), y=1.0)
    path = write_nanos(outcomes, tmp_path / "outcomes.parquet")
    measured = monitoring.measure(uri, str(path), spark, period="week", time_column="when")
    assert measured.latest == "2024-01-15"  # a Monday: the last of three weeks
    rows = measured.table.toPandas()
    assert set(rows.period.dropna()) == {"2024-01-01", "2024-01-08", "2024-01-15"}
    assert rows.rows.sum() == len(outcomes)


# ------------------------------------------------------------------------- Spark Connect

CLIENT = """
import json, sys
from pyspark.sql import SparkSession
from raybricks.config import SourceConfig
from raybricks.sources import read_source
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
frame = read_source(SourceConfig(path=sys.argv[2], format="parquet"), spark)
rows = frame.selectExpr("name", "count", "date_format(`when`, 'yyyy-MM-dd HH:mm:ss.SSSSSS') w",
                        "unix_micros(utc) u").orderBy("name").collect()
print(json.dumps({"types": {f.name: f.dataType.typeName() for f in frame.schema.fields},
                  "when": [r["w"] for r in rows], "utc": [r["u"] for r in rows],
                  "count": [r["count"] for r in rows],
                  "setting": spark.conf.get(sys.argv[3], None)}))
"""


@pytest.mark.heavy
def test_on_spark_connect_the_driver_reads_the_footer(connect_server, tmp_path):  # noqa: F811
    """Spark Connect has no JVM here: the footer is read with pyarrow on the driver, and
    the frame read again with the schema found (Connect works a schema out anew for every
    query, when the setting is put back)."""
    original = pandas_frame()
    path = write_nanos(original, tmp_path / "nanos.parquet")
    done = subprocess.run([sys.executable, "-c", CLIENT, connect_server(), str(path), KEY],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(parquet.__file__)
                                                               .parents[1])})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["types"] == {"when": "timestamp_ntz", "utc": "timestamp", "count": "long",
                              "name": "string"}
    assert found["when"] == micros_text(original["when"])
    assert found["count"] == LONGS and found["setting"] is None
    instants = original["utc"].dt.tz_convert("UTC").dt.tz_localize(None)
    assert found["utc"] == [int(t) // 1000 for t in instants.astype("int64")]

