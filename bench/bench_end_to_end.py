"""End to end: from one Spark table to per-segment models on disk, raybricks against the peers.

Every method starts from the same Parquet table read by Spark (``seg, x1, x2, x3, y``:
``bench_training.make_data``), does the same work for every segment (rows in a canonical
order, seeded 80/20 holdout, scikit-learn ``LinearRegression`` fit, validation MAE, refit
on every row) and ends with its results written as Parquet. The clock runs from the
table to the results on disk, so each method's grouping is included:

* ``pandas loop``: ``toPandas()`` of the table, then pandas ``groupby`` and a loop on one
  core, as a user would write it;
* ``spark applyInPandas``: ``groupBy("seg").applyInPandas(...)`` (Spark's shuffle), written
  by Spark;
* ``ray data map_groups``: ``ray.data.read_parquet`` of the table's files (open-source
  ``from_spark`` needs RayDP), ``groupby("seg").map_groups(...)`` (a sort-based shuffle),
  ``write_parquet``;
* ``raybricks``: ``raybricks.train(config, spark, register=False)``: checks, conversion
  of the Spark table into segment-aligned Ray blocks, packed training (baseline, holdout,
  refit, serialized models) and the accounting against the source.

The loop and applyInPandas run before Ray on Spark starts (Ray's worker nodes hold Spark
task slots); the Ray methods then share one Ray on Spark, whose start (a fixed ~20 s
upstream) is reported apart, with raybricks' ratio including it. Each method first runs
untimed on a small table (workers started, libraries imported). BLAS is pinned to one
thread. A method that would take longer than ``--budget`` seconds at a size (estimated
from its rate at the sizes before) is not run there, and the table says so.

Usage: ``python bench/bench_end_to_end.py [--sizes 2000x200,20000x50,1000000x16]
[--only raybricks,...] [--budget 1800] [--output end_to_end.json]``. Results:
``results/<output>``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from sklearn.linear_model import LinearRegression  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
# Spark's and Ray's Python workers import the per-segment work from here too
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.dirname(os.path.abspath(__file__)), *filter(None, [os.environ.get("PYTHONPATH")])])

from bench_training import FEATURES, TARGET, fit_one_segment, make_data, parse_sizes  # noqa: E402
from common import RESULTS  # noqa: E402

RESULT_SCHEMA = "seg long, mae double, intercept double, w1 double, w2 double, w3 double"
LOOP, APPLY, MAP_GROUPS, RAYBRICKS = ("pandas loop", "spark applyInPandas",
                                      "ray data map_groups", "raybricks")
METHODS = (LOOP, APPLY, MAP_GROUPS, RAYBRICKS)


def fit_validate_refit(pdf: pd.DataFrame) -> dict[str, Any]:
    """The per-segment work: ``fit_one_segment`` (canonical order, holdout, fit, MAE),
    then the refit on every row, whose coefficients are the segment's model."""
    found = fit_one_segment(pdf)
    model = LinearRegression().fit(pdf[FEATURES].to_numpy(np.float64),
                                   pdf[TARGET].to_numpy(np.float64))
    return found | {"intercept": float(model.intercept_),
                    **{f"w{i + 1}": float(w) for i, w in enumerate(model.coef_)}}


def fit_frame(pdf: pd.DataFrame) -> pd.DataFrame:
    """``fit_validate_refit`` as a one-row frame, for applyInPandas and map_groups."""
    return pd.DataFrame([fit_validate_refit(pdf)])


def pandas_loop(spark, table: str, out: str) -> int:
    frame = spark.read.parquet(table).toPandas()
    rows = [fit_validate_refit(group) for _, group in frame.groupby("seg", sort=False)]
    pd.DataFrame(rows).to_parquet(out)
    return len(rows)


def spark_apply_in_pandas(spark, table: str, out: str) -> int:
    spark.read.parquet(table).groupBy("seg").applyInPandas(
        fit_frame, schema=RESULT_SCHEMA).write.mode("overwrite").parquet(out)
    return len(pd.read_parquet(out, columns=["seg"]))


def ray_data_map_groups(spark, table: str, out: str) -> int:
    import ray

    ray.data.read_parquet(table).groupby("seg").map_groups(
        fit_frame, batch_format="pandas").write_parquet(out)
    return len(pd.read_parquet(out, columns=["seg"]))


def raybricks_train(spark, table: str, out: str) -> int:
    from raybricks import train
    from raybricks.config import JobConfig

    config = JobConfig.from_dict({
        "source": {"path": table}, "segment_by": ["seg"], "target": TARGET,
        "features": FEATURES, "models": [{
            "name": "lr", "kind": "sklearn",
            "estimator": "sklearn.linear_model.LinearRegression"}],
        "validation": {"method": "holdout", "fraction": 0.2, "metric": "mae"},
        "ensemble": "best", "min_rows": 2,
        "training": {"output_dir": out, "progress": False},
    })
    report = train(config, spark, register=False)
    counts = report.result.counts()
    if counts["trained"] != report.accounting["source_segments"]:
        raise RuntimeError(f"raybricks did not train every segment: {counts}")
    return counts["trained"]


RUNS: dict[str, Callable[[Any, str, str], int]] = {
    LOOP: pandas_loop, APPLY: spark_apply_in_pandas, MAP_GROUPS: ray_data_map_groups,
    RAYBRICKS: raybricks_train,
}


def timed(method: str, spark, table: str, workdir: Path, segments: int) -> float:
    out = workdir / f"out-{method.replace(' ', '_')}"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    found = RUNS[method](spark, table, str(out))
    seconds = time.perf_counter() - start
    if found != segments:
        raise RuntimeError(f"{method} wrote {found} segments' results, not {segments}")
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def write_table(workdir: Path, segments: int, rows: int) -> str:
    path = workdir / f"table-{segments}x{rows}"
    path.mkdir()
    chunk = max(1, 4_000_000 // rows)  # a few million rows per file
    for first in range(0, segments, chunk):
        part = make_data(min(chunk, segments - first), rows, seed=first)
        part["seg"] += first
        part.to_parquet(path / f"part-{first:09d}.parquet", index=False)
    return str(path)


def package_versions() -> dict[str, str]:
    """The versions of what the methods run on (the lock's, or a runtime profile's)."""
    from importlib.metadata import version

    names = ["pandas", "pyarrow", "pyspark", "ray", "scikit-learn", "raybricks"]
    return {name: version(name) for name in names}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2000x200,20000x50,1000000x16")
    parser.add_argument("--only", default=",".join(METHODS))
    parser.add_argument("--budget", type=float, default=1800.0,
                        help="skip a method at a size it would need longer than this for")
    parser.add_argument("--output", default="end_to_end.json",
                        help="the results file's name, in bench/results")
    args = parser.parse_args()
    sizes = parse_sizes(args.sizes)
    wanted = [m for m in METHODS if m in args.only.split(",")]

    from raybricks.cluster import ray_cluster
    from raybricks.config import ClusterConfig
    from raybricks.session import local_spark_session

    workdir = Path(tempfile.mkdtemp(prefix="rb-e2e-"))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    spark = local_spark_session(driver_memory="6g")
    tables = {size: write_table(workdir, *size) for size in sizes}
    warm = write_table(workdir, 50, 20)
    seconds: dict[str, dict[str, float | None]] = {f"{s}x{r}": {} for s, r in sizes}

    def run(methods: list[str]) -> None:
        for method in methods:
            timed(method, spark, warm, workdir, 50)  # workers up, imports done
            rate = None
            for (segments, rows), table in tables.items():
                label = f"{segments}x{rows}"
                if rate is not None and segments / rate > args.budget:
                    print(f"{method} at {label}: not run (about {segments / rate:.0f} s at "
                          f"its rate so far, over the {args.budget:.0f} s budget)", flush=True)
                    seconds[label][method] = None
                    continue
                took = timed(method, spark, table, workdir, segments)
                rate = segments / took
                seconds[label][method] = took
                print(f"{method} at {label}: {took:.1f} s ({rate:,.0f} segments/s)",
                      flush=True)

    run([m for m in wanted if m in (LOOP, APPLY)])
    ray_start = None
    if any(m in wanted for m in (MAP_GROUPS, RAYBRICKS)):
        start = time.perf_counter()
        with ray_cluster(ClusterConfig(), spark):
            ray_start = time.perf_counter() - start
            print(f"Ray on Spark started in {ray_start:.1f} s", flush=True)
            run([m for m in wanted if m in (MAP_GROUPS, RAYBRICKS)])
    report(seconds, ray_start, wanted)
    RESULTS.mkdir(exist_ok=True)
    import json

    (RESULTS / args.output).write_text(json.dumps({
        "meta": {"cores": os.cpu_count(), "python": platform.python_version(),
                 "packages": package_versions(),
                 "budget_seconds": args.budget, "ray_on_spark_start_seconds": ray_start},
        "seconds": seconds}, indent=2))


def report(seconds: dict[str, dict[str, float | None]], ray_start: float | None,
           methods: list[str]) -> None:
    print("\n| size | " + " | ".join(methods) + " | raybricks vs applyInPandas | "
          "raybricks vs loop |")
    print("|---|" + "---:|" * (len(methods) + 2))
    for label, found in seconds.items():
        cells = ["not run (over budget)" if found.get(m) is None else f"{found[m]:.1f} s"
                 for m in methods]
        ratios = []
        for peer in (APPLY, LOOP):
            mine, theirs = found.get(RAYBRICKS), found.get(peer)
            if mine and theirs:
                started = f" ({theirs / (mine + ray_start):.2f}x with Ray's start)" \
                    if ray_start else ""
                ratios.append(f"{theirs / mine:.2f}x{started}")
            else:
                ratios.append("-")
        print(f"| {label} | " + " | ".join(cells + ratios) + " |")
    if ray_start is not None:
        print(f"\nRay on Spark start (once, shared by the Ray methods): {ray_start:.1f} s")


if __name__ == "__main__":
    main()
