"""Spark -> Ray Dataset: whole segments per block, values and types intact, clear errors."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import logging
import os
import shutil

import pyarrow as pa
import pytest
import ray

from raybricks import data
from raybricks.data import block_segments, split_into_blocks, to_ray_dataset
from raybricks.databricks import CHUNK_API_CONF, DF_ACLS_CONF, TAGS
from raybricks.errors import DataError
from tests import standins


def blocks_of(segmented):
    """The dataset's blocks as Arrow tables, in order."""
    import ray

    return ray.get(segmented.dataset.to_arrow_refs())


def keys_of(table: pa.Table, segment_by):
    return list(zip(*(table.column(k).to_pylist() for k in segment_by), strict=True))


def assert_segment_aligned(blocks, segment_by, max_block_rows):
    seen: dict[tuple, int] = {}
    for index, block in enumerate(blocks):
        keys = set(keys_of(block, segment_by))
        for key in keys:
            assert key not in seen, f"segment {key} split across blocks {seen[key]} and {index}"
            seen[key] = index
        assert block.num_rows <= max_block_rows or len(keys) == 1
    return seen


def assert_every_row_once(segmented, source, segment_by, max_block_rows):
    """Blocks of whole segments, listed as they are, holding every source row once."""
    blocks = blocks_of(segmented)
    seen = assert_segment_aligned(blocks, segment_by, max_block_rows)
    assert len(seen) == segmented.count_segments()
    # what the readers reported about each block is what each block holds
    assert [list(listed) for listed in segmented.segments] == [
        list(block_segments(b, segment_by)) for b in blocks]
    assert sum(b.num_rows for b in blocks) == segmented.num_rows == source.count()
    got = [row for b in blocks for row in zip(*b.to_pydict().values(), strict=True)]
    expected = [tuple(r) for r in source.collect()]
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    return seen


@pytest.fixture(scope="module")
def sales(spark):
    """Uneven segments: 3 stores x 40 items, 1 to 120 rows each, one null store."""
    from pyspark.sql import functions as F

    df = spark.range(30_000).select(
        (F.col("id") % 3).cast("int").alias("store"),
        F.concat(F.lit("item/ü-"), (F.col("id") % 40).cast("string")).alias("item"),
        (F.col("id") * 0.5).alias("price"),
        (F.col("id") % 7).cast("double").alias("sales"),
    )
    nulls = spark.createDataFrame(
        [(None, "item/ü-0", 1.0, 2.0), (None, "item/ü-0", 3.0, 4.0)],
        "store int, item string, price double, sales double",
    )
    return df.unionByName(nulls)


@pytest.mark.topology
@pytest.mark.parametrize("strategy", ["parquet", "arrow"])
def test_every_row_arrives_in_whole_segment_blocks(ray_on_spark, sales, strategy):
    segmented = to_ray_dataset(
        sales, ["store", "item"], strategy=strategy, max_block_rows=1_000, arrow_max_rows=50_000
    )
    assert segmented.strategy == strategy
    seen = assert_every_row_once(segmented, sales, ["store", "item"], 1_000)
    assert len(seen) == 3 * 40 + 1
    assert (None, "item/ü-0") in seen  # null keys are a segment of their own


def test_columns_and_predicate_are_applied_by_spark(ray_on_spark, sales):
    segmented = to_ray_dataset(
        sales, ["store"], columns=["sales"], where="store = 1 AND sales > 3", strategy="parquet"
    )
    assert segmented.schema.names == ["store", "sales"]
    rows = [r for b in blocks_of(segmented) for r in b.to_pylist()]
    assert rows and all(r["store"] == 1 and r["sales"] > 3 for r in rows)
    assert len(rows) == sales.where("store = 1 AND sales > 3").count()


def test_table_name_source_and_staging_is_removed(ray_on_spark, sales, spark, tmp_path):
    sales.write.mode("overwrite").saveAsTable("sales_for_data_test")
    staging = tmp_path / "staging"
    staging.mkdir()
    segmented = to_ray_dataset(
        "sales_for_data_test", ["store"], strategy="parquet", staging_dir=str(staging)
    )
    assert segmented.num_rows == sales.count()
    assert segmented.count_segments() == 4
    # the Parquet files stay while training may need them (Ray rebuilds a lost node's
    # blocks from them), then go
    (kept,) = os.listdir(staging)
    assert any(name.endswith(".parquet") for name in os.listdir(staging / kept))
    assert sum(b.num_rows for b in blocks_of(segmented)) == segmented.num_rows
    segmented.release()
    assert os.listdir(staging) == []
    again = to_ray_dataset("sales_for_data_test", ["store"], strategy="parquet",
                           staging_dir=str(staging))
    assert len(os.listdir(staging)) == 1
    del again  # dropped without release: removed all the same
    assert os.listdir(staging) == []


def test_auto_picks_arrow_for_small_and_parquet_for_large(ray_on_spark, sales):
    small = to_ray_dataset(sales, ["store"], arrow_max_rows=100_000)
    large = to_ray_dataset(sales, ["store"], arrow_max_rows=1_000)
    assert (small.strategy, large.strategy) == ("arrow", "parquet")


def test_auto_collects_on_the_driver_only_what_is_small_in_bytes_too(spark):
    wide = pa.schema([("key", pa.string()), ("flag", pa.bool_()),
                      *[(f"x{i}", pa.float64()) for i in range(100)]])
    assert data.arrow_size_estimate(wide, 10) == (32 + 1 + 800) * 10
    rows = data.ARROW_AUTO_MAX_BYTES // 833 + 1  # just over the byte cap, far under the rows
    assert data.choose_strategy(
        "auto", spark, rows, 10**9, data.arrow_size_estimate(wide, rows)) == "parquet"
    assert data.choose_strategy(
        "auto", spark, rows - 1, 10**9, data.arrow_size_estimate(wide, rows - 1)) == "arrow"
    # asked for explicitly, only the row limit applies
    assert data.choose_strategy(
        "arrow", spark, rows, 10**9, data.arrow_size_estimate(wide, rows)) == "arrow"


@pytest.mark.topology
@pytest.mark.parametrize("strategy", ["parquet", "arrow"])
def test_types_survive_the_trip(ray_on_spark, spark, strategy):
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("seg", T.StringType()),
            T.StructField("i", T.IntegerType()),
            T.StructField("l", T.LongType()),
            T.StructField("f", T.FloatType()),
            T.StructField("d", T.DoubleType()),
            T.StructField("dec", T.DecimalType(12, 3)),
            T.StructField("b", T.BooleanType()),
            T.StructField("s", T.StringType()),
            T.StructField("day", T.DateType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("ntz", T.TimestampNTZType()),
        ]
    )
    when = dt.datetime(2024, 3, 1, 12, 30, 15, 123456)
    rows = [
        ("a", 1, 2**40, 1.5, 2.25, decimal.Decimal("123456789.125"), True, "x",
         dt.date(2024, 2, 29), when, when),
        ("a", None, None, None, None, None, None, None, None, None, None),
        ("b", -7, -(2**40), float("nan"), float("inf"), decimal.Decimal("-0.001"), False, "",
         dt.date(1970, 1, 1), dt.datetime(1999, 12, 31, 23, 59, 59), dt.datetime(2000, 1, 1)),
    ]
    df = spark.createDataFrame(rows, schema)
    segmented = to_ray_dataset(df, ["seg"], strategy=strategy)
    table = pa.concat_tables(blocks_of(segmented))
    types = {f.name: f.type for f in table.schema}
    assert types["i"] == pa.int32() and types["l"] == pa.int64()
    assert types["f"] == pa.float32() and types["d"] == pa.float64()
    assert types["dec"] == pa.decimal128(12, 3)
    assert types["b"] == pa.bool_() and types["s"] == pa.string()
    assert types["day"] == pa.date32()
    assert types["ts"] == pa.timestamp("us", tz="UTC")
    assert types["ntz"] == pa.timestamp("us")
    got = {(r["seg"], r["i"]): r for r in table.to_pylist()}
    first = got[("a", 1)]
    assert first["dec"] == decimal.Decimal("123456789.125")
    assert first["ts"] == when.replace(tzinfo=dt.UTC)  # session time zone is UTC
    assert first["ntz"] == when
    assert first["day"] == dt.date(2024, 2, 29)
    assert first["l"] == 2**40 and first["b"] is True
    empty = got[("a", None)]
    assert all(empty[k] is None for k in empty if k != "seg")
    last = got[("b", -7)]
    assert last["f"] != last["f"] and last["d"] == float("inf") and last["s"] == ""


def test_missing_column_names_what_exists(ray_on_spark, sales):
    with pytest.raises(DataError, match=r"\['region'\] not in the table; it has \['store'"):
        to_ray_dataset(sales, ["region"])


def test_empty_input_and_empty_filter_are_errors(ray_on_spark, sales):
    with pytest.raises(DataError, match="matched no rows"):
        to_ray_dataset(sales, ["store"], where="store = 99")
    with pytest.raises(DataError, match="table is empty"):
        to_ray_dataset(sales.limit(0), ["store"])
    with pytest.raises(DataError, match="not a valid predicate"):
        to_ray_dataset(sales, ["store"], where="no_such_column > 1")


def test_a_misspelt_table_is_named_with_the_likely_one(spark):
    from raybricks.sources import read_source

    spark.createDataFrame([(1, 2.0)], "store int, units double").write.mode(
        "overwrite").saveAsTable("default.hint_units")
    try:
        with pytest.raises(DataError, match=r"'default.hint_unit' not found .*: did you "
                                            r"mean default.hint_units\?"):
            read_source("default.hint_unit", spark)
        with pytest.raises(DataError, match=r"not found .*: check the name"):
            read_source("no_such_schema.hint_units", spark)  # nothing to list there
    finally:
        spark.sql("DROP TABLE IF EXISTS default.hint_units")


def test_missing_table_and_impossible_strategies(ray_on_spark, sales):
    with pytest.raises(DataError, match="table 'nope.nothing' not found"):
        to_ray_dataset("nope.nothing", ["store"])
    with pytest.raises(DataError, match="limited to 10 rows"):
        to_ray_dataset(sales, ["store"], strategy="arrow", arrow_max_rows=10)
    with pytest.raises(DataError, match="Databricks Runtime ML 15"):
        to_ray_dataset(sales, ["store"], strategy="chunks")


def test_split_into_blocks_keeps_segments_whole_and_bounds_size():
    table = pa.table({"k": [None, None, 1, 1, 1, 2, 3, 3, 3, 3, 3, 3, 4], "v": list(range(13))})
    blocks = split_into_blocks(table, ["k"], max_block_rows=4)
    assert [b.column("k").to_pylist() for b in blocks] == [
        [None, None], [1, 1, 1, 2], [3, 3, 3, 3, 3, 3], [4],
    ]
    assert pa.concat_tables(blocks).equals(table)
    two_keys = pa.table({"a": [1, 1, 1, 2], "b": ["x", "x", "y", "y"]})
    assert [b.num_rows for b in split_into_blocks(two_keys, ["a", "b"], 1)] == [2, 1, 1]


@pytest.mark.topology
def test_segment_count_agrees_between_spark_and_ray(ray_on_spark, sales):
    from raybricks.data import segment_sizes

    segmented = to_ray_dataset(sales, ["store", "item"], strategy="parquet", max_block_rows=500)
    sizes = segment_sizes(sales, ["store", "item"])
    assert segmented.count_segments() == sizes.segments == 121
    largest = sales.toPandas().groupby(["store", "item"], dropna=False).size().max()
    assert sizes.largest == largest


# --------------------------------------------------------------------------- chunks
# The runtime's pyspark.databricks.sql.chunk is played by tests/standins: same names and
# signatures, partitions really split into chunks of at most max_bytes_per_chunk bytes.

#: A fixed-size on-demand cluster with the chunk API enabled, as its confs say.
FIXED_ON_DEMAND = {
    CHUNK_API_CONF: "true",
    f"{TAGS}.clusterScalingType": "fixed_size",
    f"{TAGS}.clusterWorkers": "4",
    f"{TAGS}.clusterAvailability": "ON_DEMAND",
}


@contextlib.contextmanager
def spark_confs(spark, confs: dict[str, str]):
    """The Spark confs set for the block, as they were afterwards."""
    before = {key: spark.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


@pytest.fixture
def chunk_api_here(spark):
    """The stand-in chunk API importable in this process only, on a fixed on-demand cluster."""
    standins.install()
    try:
        with spark_confs(spark, FIXED_ON_DEMAND):
            yield
    finally:
        standins.uninstall()


@pytest.mark.parametrize(
    "tags",
    [
        {"clusterScalingType": "autoscaling", "clusterMinWorkers": "2",
         "clusterMaxWorkers": "8"},
        {"clusterScalingType": "fixed_size", "clusterAvailability": "SPOT_WITH_FALLBACK",
         "clusterFirstOnDemand": "1"},
        {"clusterScalingType": "fixed_size", "clusterAvailability": "SPOT_AZURE"},
        {"clusterScalingType": "fixed_size", "clusterAvailability": "PREEMPTIBLE_GCP"},
        {"clusterScalingType": "", "clusterAvailability": ""},  # tags that do not say
    ],
)
def test_auto_avoids_chunks_where_executors_may_go_away(spark, chunk_api_here, tags, caplog):
    with spark_confs(spark, {f"{TAGS}.{name}": value for name, value in tags.items()}):
        assert data.choose_strategy("auto", spark, 10, 100) == "arrow"
        assert data.choose_strategy("auto", spark, 1_000, 100) == "parquet"
        with caplog.at_level(logging.WARNING, logger="raybricks.data"):
            assert data.choose_strategy("chunks", spark, 1_000, 100) == "chunks"
    assert "chunks are lost with their executor" in caplog.text


def test_auto_picks_chunks_on_a_fixed_on_demand_cluster(spark, chunk_api_here):
    assert data.choose_strategy("auto", spark, 10, 100) == "chunks"
    all_on_demand = {f"{TAGS}.clusterAvailability": "SPOT_WITH_FALLBACK",
                     f"{TAGS}.clusterFirstOnDemand": "5"}  # the driver and all 4 workers
    with spark_confs(spark, all_on_demand):
        assert data.choose_strategy("auto", spark, 10, 100) == "chunks"


def test_chunks_need_the_conf_and_a_dedicated_cluster(spark, chunk_api_here):
    with spark_confs(spark, {DF_ACLS_CONF: "true"}):
        assert data.choose_strategy("auto", spark, 1_000, 100) == "parquet"
        with pytest.raises(DataError, match="dfAclsEnabled=true .* dedicated"):
            data.choose_strategy("chunks", spark, 1_000, 100)
    with (spark_confs(spark, {CHUNK_API_CONF: "false"}),
          pytest.raises(DataError, match="dataFrameChunk.enabled is not true")):
        data.choose_strategy("chunks", spark, 1_000, 100)


def test_a_segment_listed_in_two_blocks_is_refused_null_keys_included():
    table = pa.table({"store": ["a", "a", None, None, "b"], "day": [1, 1, 2, 2, None]})
    first, second = block_segments(table.slice(0, 3), ["store", "day"]), block_segments(
        table.slice(3), ["store", "day"])
    assert list(first) == [(("a", 1), 2), ((None, 2), 1)]
    assert list(second) == [((None, 2), 1), (("b", None), 1)]
    with pytest.raises(DataError, match=r"segment \(None, 2\) arrived in two blocks"):
        data.check_segments_whole([first, second])
    data.check_segments_whole([first, block_segments(table.slice(4), ["store", "day"])])


def test_split_evenly_and_pack_pieces():
    assert data.split_evenly([1] * 7, 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert data.split_evenly([5, 1, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4, 5]]
    assert data.split_evenly([1, 1], 5) == [[0], [1]]
    pieces = [(("a",), 3, "a1"), (("b",), 4, "b1"), (("a",), 2, "a2"), (("c",), 9, "c1")]
    # all of a key's pieces in one task, next to each other; tasks of about 6 rows
    assert data.pack_pieces(pieces, 6) == [["a1", "a2"], ["b1"], ["c1"]]


@pytest.fixture(scope="class")
def chunk_api(ray_on_spark, spark):
    """The stand-in chunk API, Ray's workers importing it too (``TestChunksThroughRay``)."""
    with standins.ray_job_with_standins(), spark_confs(spark, FIXED_ON_DEMAND):
        from pyspark.databricks.sql import chunk

        yield chunk
        shutil.rmtree(chunk.STORE, ignore_errors=True)


class TestChunksThroughRay:
    """The whole chunks path, with Ray workers importing the stand-in (a Ray job of their
    own, see tests.standins.ray_job_with_standins)."""

    @staticmethod
    def assert_all_unpersisted(chunk_api, before: int) -> list:
        """The chunks persisted since ``before`` (a length of PERSISTED): some, all freed."""
        chunks = chunk_api.PERSISTED[before:]
        assert chunks and {c.id for c in chunks} <= set(chunk_api.UNPERSISTED)
        assert not any(os.path.exists(c.id) for c in chunks)
        return chunks

    @pytest.mark.topology
    @pytest.mark.parametrize("chunk_bytes", [2_000, 40_000])
    def test_every_row_arrives_once_in_whole_segments(self, chunk_api, sales, chunk_bytes):
        """2 kB chunks: every segment spans several chunks; 40 kB: a few segments per
        chunk, some straddling two."""
        before = len(chunk_api.PERSISTED)
        segmented = to_ray_dataset(
            sales, ["store", "item"], max_block_rows=1_000, chunk_bytes=chunk_bytes
        )
        assert segmented.strategy == "chunks"  # auto, on a fixed on-demand cluster
        chunks = self.assert_all_unpersisted(chunk_api, before)
        most_partitions = data.BLOCKS_PER_CPU * ray.cluster_resources()["CPU"]
        assert len(chunks) > 2 * most_partitions  # partitions became several chunks each
        seen = assert_every_row_once(segmented, sales, ["store", "item"], 1_000)
        assert len(seen) == 3 * 40 + 1 and (None, "item/ü-0") in seen
        if chunk_bytes == 2_000:  # segments longer than any chunk: all of them straddle
            longest_chunk = max(c.row_count for c in chunks)
            sizes = [rows for block in segmented.segments for _, rows in block]
            assert sum(rows > longest_chunk for rows in sizes) == 3 * 40

    def test_types_survive_the_chunks(self, chunk_api, spark):
        df = spark.createDataFrame(
            [("a", dt.datetime(2024, 3, 1, 12, 30), decimal.Decimal("1.250"), "ü")] * 3
            + [("b", None, None, None)],
            "seg string, ts timestamp, dec decimal(12,3), s string",
        )
        segmented = to_ray_dataset(df, ["seg"], strategy="chunks", chunk_bytes=64)
        table = pa.concat_tables(blocks_of(segmented))
        assert segmented.schema == table.schema.remove_metadata()
        assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
        assert table.schema.field("dec").type == pa.decimal128(12, 3)
        rows = sorted(table.to_pylist(), key=lambda row: row["seg"])
        assert [row["seg"] for row in rows] == ["a", "a", "a", "b"]
        assert rows[0]["ts"] == dt.datetime(2024, 3, 1, 12, 30, tzinfo=dt.UTC)
        assert rows[0]["dec"] == decimal.Decimal("1.250") and rows[0]["s"] == "ü"
        assert rows[3]["ts"] is None and rows[3]["s"] is None

    def test_chunks_are_unpersisted_when_a_reader_fails(self, chunk_api, sales):
        before = len(chunk_api.PERSISTED)
        marker = os.path.join(chunk_api.STORE, chunk_api.FAIL_READS)
        open(marker, "w").close()  # every readChunk in the Ray workers raises
        try:
            with pytest.raises(DataError, match="reading Spark's Arrow chunks into Ray"):
                to_ray_dataset(sales, ["store"], strategy="chunks", chunk_bytes=50_000)
        finally:
            os.remove(marker)
        self.assert_all_unpersisted(chunk_api, before)

    def test_chunks_are_unpersisted_on_interrupt(self, chunk_api, sales, monkeypatch):
        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        before = len(chunk_api.PERSISTED)
        monkeypatch.setattr(data, "_gather_blocks", interrupted)
        with pytest.raises(KeyboardInterrupt):
            to_ray_dataset(sales, ["store"], strategy="chunks")
        self.assert_all_unpersisted(chunk_api, before)
