"""Scale: 100,000 segments x 50 rows, three candidate kinds, driver memory bounded.

Trains LightGBM, XGBoost and Ridge for every segment (small boosters: the point is the
number of segments, not the size of each fit) with raybricks on Ray on local Spark, and
reports the wall time, models/s and the driver's peak resident memory (target: under
3 GB). Usage: ``python bench/bench_scale.py [--segments 100000] [--rows 50]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

from common import Measurement, PeakRSS, save  # noqa: E402

CANDIDATES = [
    {"name": "lgbm", "kind": "lightgbm",
     "params": {"n_estimators": 10, "num_leaves": 7, "min_child_samples": 5}},
    {"name": "xgb", "kind": "xgboost", "params": {"n_estimators": 10, "max_depth": 3}},
    {"name": "ridge", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge"},
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--segments", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=50)
    args = parser.parse_args()

    import numpy as np
    import pandas as pd
    import psutil

    from raybricks.cluster import ray_cluster
    from raybricks.config import ClusterConfig, JobConfig
    from raybricks.data import to_ray_dataset
    from raybricks.session import local_spark_session
    from raybricks.training import train_segments

    workdir = tempfile.mkdtemp(prefix="rb-scale-")
    rng = np.random.default_rng(0)
    n = args.segments * args.rows
    frame = pd.DataFrame({
        "seg": np.repeat(np.arange(args.segments), args.rows),
        "x1": rng.normal(size=n), "x2": rng.normal(size=n), "x3": rng.normal(size=n),
    })
    frame["y"] = frame.x1 * 2 + frame.seg % 7 + rng.normal(size=n)
    frame.to_parquet(f"{workdir}/data.parquet")
    del frame
    spark = local_spark_session(driver_memory="4g")
    source = spark.read.parquet(f"{workdir}/data.parquet")
    config = JobConfig.from_dict({
        "source": {"path": f"{workdir}/data.parquet"}, "segment_by": ["seg"], "target": "y",
        "models": CANDIDATES, "ensemble": "best", "min_rows": 10,
        "validation": {"method": "holdout", "metric": "mae"},
        "training": {"output_dir": f"{workdir}/runs", "progress": False},
    })
    with ray_cluster(ClusterConfig(), spark) as cluster:
        segmented = to_ray_dataset(source, ["seg"], min_blocks=4 * cluster.num_cpus)
        with PeakRSS() as rss:
            result = train_segments(segmented, config)
    counts = result.counts()
    peak_gb = rss.peak / 2**30
    print(result.summary())
    print(f"{args.segments:,} segments x {args.rows} rows, 3 candidates: "
          f"{result.seconds:.0f} s, {args.segments / result.seconds:,.0f} segments/s, "
          f"driver peak RSS {peak_gb:.2f} GB "
          f"({'PASS' if peak_gb < 3 else 'FAIL'}: target < 3 GB), {counts}")
    measurement = Measurement("raybricks 3 candidates", result.seconds, args.segments,
                    rss.growth_mb, {"driver_peak_rss_gb": peak_gb, "counts": counts})
    save("scale", [measurement], {
        "segments": args.segments, "rows": args.rows, "cores": os.cpu_count(),
        "python": platform.python_version(),
        "driver_rss_at_start_gb": psutil.Process().memory_info().rss / 2**30,
    })


if __name__ == "__main__":
    main()
