"""Spark table -> Ray Dataset: raybricks' strategies against the obvious peers.

Same table (default 5,000,000 rows, 2,000 segments), one run, on Ray on local Spark:

* raybricks ``parquet`` (the default for large tables off Databricks) at two table sizes,
  to show the driver's memory does not grow with the table;
* raybricks ``arrow`` (small-data path, forced here);
* ``ray.data.from_arrow(df.toArrow())`` and ``ray.data.from_pandas(df.toPandas())``:
  the obvious one-liners, whose blocks are NOT segment-aligned;
* ``toArrow`` + sort + split on the driver: the peer that gives the same segment-aligned
  blocks as raybricks, by collecting the table on the driver.

Every method ends with the data in Ray's object store. Usage:
``python bench/bench_conversion.py [--rows 5000000] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

from common import best_of, markdown_table, measured, save  # noqa: E402


def make_table(spark, rows: int, segments: int, path: str):
    """A synthetic sales table written once as Parquet and read back."""
    from pyspark.sql import functions as F

    if not os.path.exists(path):
        spark.range(rows).select(
            (F.col("id") % segments).cast("int").alias("store"),
            F.date_add(F.lit("2023-01-01").cast("date"), (F.col("id") % 365).cast("int")).alias(
                "day"
            ),
            (F.rand(1) * 10).alias("price"),
            (F.rand(2) > 0.8).alias("promo"),
            (F.rand(3) * 100).alias("sales"),
        ).write.parquet(path)
    return spark.read.parquet(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--segments", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "rb-bench"))
    args = parser.parse_args()

    import ray

    from raybricks.cluster import ray_cluster
    from raybricks.config import ClusterConfig
    from raybricks.data import split_into_blocks, to_ray_dataset
    from raybricks.session import local_spark_session

    spark = local_spark_session(driver_memory="8g")
    big = make_table(spark, args.rows, args.segments, f"{args.workdir}/t{args.rows}")
    small_rows = args.rows // 5
    small = make_table(spark, small_rows, args.segments, f"{args.workdir}/t{small_rows}")

    def run(out):
        with measured("raybricks parquet (default)", args.rows, out):
            ds = to_ray_dataset(big, ["store"], strategy="parquet")
        del ds
        with measured(f"raybricks parquet, {small_rows:,} rows", small_rows, out):
            ds = to_ray_dataset(small, ["store"], strategy="parquet")
        del ds
        with measured("raybricks arrow (forced)", args.rows, out):
            ds = to_ray_dataset(big, ["store"], strategy="arrow", arrow_max_rows=args.rows)
        del ds
        with measured("ray.data.from_arrow(df.toArrow())", args.rows, out):
            ds = ray.data.from_arrow(big.toArrow()).materialize()
        del ds
        with measured("ray.data.from_pandas(df.toPandas())", args.rows, out):
            ds = ray.data.from_pandas(big.toPandas()).materialize()
        del ds
        with measured("toArrow + sort + split on driver (aligned)", args.rows, out):
            table = big.toArrow().sort_by([("store", "ascending")])
            ds = ray.data.from_arrow(split_into_blocks(table, ["store"], 200_000)).materialize()
            del table
        del ds

    with ray_cluster(ClusterConfig(), spark):
        results = best_of(args.repeats, run)
    meta = {
        "rows": args.rows,
        "segments": args.segments,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "spark_master": spark.sparkContext.master,
    }
    save("conversion", results, meta)
    print()
    print(markdown_table(results, "ray.data.from_pandas(df.toPandas())", "rows"))


if __name__ == "__main__":
    main()
