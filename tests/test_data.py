"""Spark -> Ray Dataset: whole segments per block, values and types intact, clear errors."""

from __future__ import annotations

import datetime as dt
import decimal
import os

import pyarrow as pa
import pytest

from raybricks.data import block_segments, split_into_blocks, to_ray_dataset
from raybricks.errors import DataError


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


@pytest.mark.parametrize("strategy", ["parquet", "arrow"])
def test_every_row_arrives_in_whole_segment_blocks(ray_on_spark, sales, strategy):
    segmented = to_ray_dataset(
        sales, ["store", "item"], strategy=strategy, max_block_rows=1_000, arrow_max_rows=50_000
    )
    assert segmented.strategy == strategy
    blocks = blocks_of(segmented)
    seen = assert_segment_aligned(blocks, ["store", "item"], 1_000)
    assert len(seen) == segmented.count_segments() == 3 * 40 + 1
    # what the readers reported about each block is what each block holds
    assert segmented.segments == [block_segments(b, ["store", "item"]) for b in blocks]
    assert (None, "item/ü-0") in seen  # null keys are a segment of their own
    assert sum(b.num_rows for b in blocks) == segmented.num_rows == sales.count()
    got = [row for b in blocks for row in zip(*b.to_pydict().values(), strict=True)]
    expected = [tuple(r) for r in sales.collect()]
    assert sorted(got, key=repr) == sorted(expected, key=repr)


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
    assert os.listdir(staging) == []  # blocks live in Ray; the Parquet files are gone
    assert sum(b.num_rows for b in blocks_of(segmented)) == segmented.num_rows


def test_auto_picks_arrow_for_small_and_parquet_for_large(ray_on_spark, sales):
    small = to_ray_dataset(sales, ["store"], arrow_max_rows=100_000)
    large = to_ray_dataset(sales, ["store"], arrow_max_rows=1_000)
    assert (small.strategy, large.strategy) == ("arrow", "parquet")


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


def test_segment_count_agrees_between_spark_and_ray(ray_on_spark, sales):
    from raybricks.data import count_segments

    segmented = to_ray_dataset(sales, ["store", "item"], strategy="parquet", max_block_rows=500)
    assert segmented.count_segments() == count_segments(sales, ["store", "item"]) == 121
