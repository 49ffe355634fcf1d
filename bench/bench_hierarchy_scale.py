"""A large hierarchy through the forecasting job: generated weekly sales of ``--series``
items (bottom series) in stores (100 items each) in regions (10), two years each; the
job builds every store's and region's series with Spark, trains every level with a cheap
candidate (statsforecast's SeasonalNaive, 2 backtest windows), reconciles and registers.

With ``--total`` the hierarchy has one root (one tree, reconciled in one Ray task with
the sparse methods); without it, each region is an independent subtree, reconciled in
Ray tasks beside the others. Reported: series (every level) per second per stage, the
reconciliation's share, and the driver's peak resident memory (the whole job runs in this
process's driver). Results: ``bench/results/hierarchy-scale.json`` (one entry per run).

Usage: ``python bench/bench_hierarchy_scale.py --series 100000 [--total]
[--method min_trace_wls_struct] [--executor auto|ray|spark]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from common import RESULTS, PeakRSS  # noqa: E402

WEEKS = 104
ITEMS_PER_STORE = 100
REGIONS = 10


def generate(series: int, path: Path, seed: int = 0) -> None:
    """Weekly sales per item: a level per item, a yearly cycle, noise; written in
    chunks (the frame of 100k series is ~10M rows)."""
    rng = np.random.default_rng(seed)
    weeks = pd.date_range("2023-01-01", periods=WEEKS, freq="W-SUN").date
    writer = None
    chunk = 10_000
    for first in range(0, series, chunk):
        n = min(chunk, series - first)
        item = np.arange(first, first + n)
        store = item // ITEMS_PER_STORE
        level = rng.gamma(2.0, 10.0, n)[:, None]
        cycle = 1 + 0.3 * np.sin(2 * np.pi * np.arange(WEEKS) / 52 + rng.uniform(0, 6, n)
                                 [:, None])
        sales = np.maximum(rng.poisson(level * cycle), 0).astype("float64")
        table = pa.table({
            "region": np.repeat([f"r{s % REGIONS}" for s in store], WEEKS),
            "store": np.repeat([f"s{s}" for s in store], WEEKS),
            "item": np.repeat([f"i{i}" for i in item], WEEKS),
            "week": np.tile(weeks, n), "sales": sales.ravel()})
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--total", action="store_true")
    parser.add_argument("--method", default="min_trace_wls_struct")
    parser.add_argument("--executor", default="auto", choices=["auto", "ray", "spark"])
    args = parser.parse_args()

    from raybricks.config import JobConfig
    from raybricks.pipeline import train
    from raybricks.session import local_spark_session

    spark = local_spark_session(cores=2)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlflow.db")
        path = Path(tmp) / "sales.parquet"
        generate(args.series, path)
        config = JobConfig.from_dict({
            "source": {"path": str(path)}, "segment_by": ["store", "item"],
            "target": "sales", "time_column": "week", "task": "forecast",
            "forecast": {"horizon": 4, "frequency": "W-SUN", "season_length": 52,
                         "hierarchy": {"levels": [["region"], ["region", "store"]],
                                       "total": args.total, "method": args.method}},
            "validation": {"method": "backtest", "windows": 2},
            "models": [{"name": "snaive", "kind": "statsforecast",
                        "estimator": "SeasonalNaive", "params": {"season_length": 52}}],
            "registry": {"name": "bench.hierarchy.scale"},
            "training": {"output_dir": f"{tmp}/runs", "progress": False,
                         "executor": args.executor},
        })
        with PeakRSS() as rss:
            start = time.perf_counter()
            report = train(config, spark)
            seconds = time.perf_counter() - start
    series = report.accounting["source_segments"]
    entry = {
        "bottom_series": args.series, "series": series, "total": args.total,
        "method": args.method, "executor": args.executor, "seconds": round(seconds, 1),
        "series_per_second": round(series / seconds, 1),
        "stages": {k: round(v, 1) for k, v in report.timings.items()},
        "stage_series_per_second": {k: round(series / v, 1) for k, v in
                                    report.timings.items() if v > 0},
        "driver_peak_mb": round(rss.peak / 2**20), "driver_growth_mb": round(rss.growth_mb),
        "counts": report.accounting,
    }
    print(json.dumps(entry, indent=1))
    RESULTS.mkdir(exist_ok=True)
    target = RESULTS / "hierarchy-scale.json"
    runs = json.loads(target.read_text()) if target.exists() else []
    runs.append(entry)
    target.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
