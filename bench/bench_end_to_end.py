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
* ``raybricks (spark)``: ``raybricks.train(config, spark, register=False)`` with
  ``training.executor: spark``: checks, the source laid out by segment, packed training
  (baseline, holdout, refit, serialized models) in Spark's own ``mapInArrow`` tasks, the
  accounting against the source; no Ray;
* ``raybricks (ray)``: the same with ``training.executor: ray``, as a user runs it: the
  job starts Ray on Spark itself (its ``cluster`` stage), converts the table into
  segment-aligned Ray blocks, trains in Ray's packed tasks and shuts Ray down (its
  ``shutdown`` stage), all inside its wall time.

``--only raybricks`` (the name before there were two executors) means both raybricks
methods; ``raybricks-ray`` and ``raybricks-spark`` pick one.

The loop, applyInPandas and both raybricks methods run before the shared Ray on Spark
starts (Ray's worker nodes hold Spark task slots); Ray Data then runs on it, its start
(a fixed ~20 s upstream) reported apart. raybricks' ratios are given on its wall time
(for the Ray executor, Ray's start and shut-down included) and, for the Ray executor,
without its ``cluster`` and ``shutdown`` stages. Every raybricks run's stages
(``TrainingReport.timings``) are saved. Each method first runs untimed on a small table
(workers started, libraries imported). BLAS is pinned to one thread. A method that
would take longer than ``--budget`` seconds at a size (estimated from its rate at the
sizes before) is not run there, and the table says so.

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
LOOP, APPLY, MAP_GROUPS = "pandas loop", "spark applyInPandas", "ray data map_groups"
RB_SPARK, RB_RAY = "raybricks (spark)", "raybricks (ray)"
METHODS = (LOOP, APPLY, RB_SPARK, RB_RAY, MAP_GROUPS)
#: ``--only`` names: the methods' own, and short ones; ``raybricks`` (one method before
#: the Spark executor) is both executors
ALIASES = {"raybricks": (RB_SPARK, RB_RAY), "raybricks-spark": (RB_SPARK,),
           "raybricks-ray": (RB_RAY,), "loop": (LOOP,), "applyInPandas": (APPLY,),
           "map_groups": (MAP_GROUPS,)}
EXECUTORS = {RB_SPARK: "spark", RB_RAY: "ray"}
#: each raybricks run's stages (``TrainingReport.timings``), by size and method
STAGES: dict[str, dict[str, dict[str, float]]] = {}


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


def raybricks_train(spark, table: str, out: str, executor: str = "auto",
                    stages: dict[str, float] | None = None) -> int:
    """``raybricks.train`` on the table with ``training.executor: executor``; its stages'
    seconds go into ``stages``."""
    from raybricks import train
    from raybricks.config import JobConfig

    config = JobConfig.from_dict({
        "source": {"path": table}, "segment_by": ["seg"], "target": TARGET,
        "features": FEATURES, "models": [{
            "name": "lr", "kind": "sklearn",
            "estimator": "sklearn.linear_model.LinearRegression"}],
        "validation": {"method": "holdout", "fraction": 0.2, "metric": "mae"},
        "ensemble": "best", "min_rows": 2,
        "training": {"output_dir": out, "progress": False, "executor": executor},
    })
    report = train(config, spark, register=False)
    if stages is not None:
        stages.update(report.timings)
    counts = report.result.counts()
    if counts["trained"] != report.accounting["source_segments"]:
        raise RuntimeError(f"raybricks did not train every segment: {counts}")
    return counts["trained"]


RUNS: dict[str, Callable[..., int]] = {
    LOOP: pandas_loop, APPLY: spark_apply_in_pandas, MAP_GROUPS: ray_data_map_groups,
    RB_SPARK: raybricks_train, RB_RAY: raybricks_train,
}


def timed(method: str, spark, table: str, workdir: Path, segments: int,
          stages: dict[str, float] | None = None) -> float:
    out = workdir / f"out-{method.replace(' ', '_').replace('(', '').replace(')', '')}"
    shutil.rmtree(out, ignore_errors=True)
    extra = {"executor": EXECUTORS[method], "stages": stages} if method in EXECUTORS else {}
    start = time.perf_counter()
    found = RUNS[method](spark, table, str(out), **extra)
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
    asked = {m for name in args.only.split(",") for m in ALIASES.get(name.strip(),
                                                                     (name.strip(),))}
    unknown = asked - set(METHODS)
    if unknown:
        parser.error(f"unknown method(s) {sorted(unknown)}: {METHODS} or {sorted(ALIASES)}")
    wanted = [m for m in METHODS if m in asked]

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
                stages = STAGES.setdefault(label, {}).setdefault(method, {}) \
                    if method in EXECUTORS else None
                took = timed(method, spark, table, workdir, segments, stages)
                rate = segments / took
                seconds[label][method] = took
                said = ", ".join(f"{k} {v:.1f}" for k, v in (stages or {}).items())
                print(f"{method} at {label}: {took:.1f} s ({rate:,.0f} segments/s)"
                      + (f"; stages (s): {said}" if said else ""), flush=True)

    load_at_start = os.getloadavg()
    # before the shared Ray: the Ray executor starts (and stops) its own Ray on Spark
    run([m for m in wanted if m != MAP_GROUPS])
    ray_start = None
    if MAP_GROUPS in wanted:
        start = time.perf_counter()
        with ray_cluster(ClusterConfig(), spark):
            ray_start = time.perf_counter() - start
            print(f"Ray on Spark started in {ray_start:.1f} s", flush=True)
            run([MAP_GROUPS])
    ratios = report(seconds, ray_start, wanted)
    RESULTS.mkdir(exist_ok=True)
    import json

    (RESULTS / args.output).write_text(json.dumps({
        "meta": {"cores": os.cpu_count(), "python": platform.python_version(),
                 "packages": package_versions(), "date": time.strftime("%Y-%m-%d %H:%M"),
                 "load_average_at_start": load_at_start,
                 "load_average_at_end": os.getloadavg(),
                 "budget_seconds": args.budget, "ray_on_spark_start_seconds": ray_start,
                 "ray_start_for": "ray data map_groups only (the Ray executor's own start "
                                  "is its stages' cluster)"},
        "seconds": seconds, "stages": STAGES, "ratios": ratios}, indent=2))


def ray_own(stages: dict[str, float]) -> float:
    """The seconds a raybricks run spent starting and stopping its own Ray."""
    return stages.get("cluster", 0.0) + stages.get("shutdown", 0.0)


def report(seconds: dict[str, dict[str, float | None]], ray_start: float | None,
           methods: list[str]) -> dict[str, dict[str, float]]:
    """The tables: seconds per method, raybricks' ratios (peer's seconds / raybricks'),
    its stages. Returns the ratios, by size."""
    ratios: dict[str, dict[str, float]] = {}
    print("\n| size | " + " | ".join(methods) + " |")
    print("|---|" + "---:|" * len(methods))
    for label, found in seconds.items():
        cells = ["not run (over budget)" if found.get(m) is None else f"{found[m]:.1f} s"
                 for m in methods]
        print(f"| {label} | " + " | ".join(cells) + " |")
    mine = [m for m in (RB_SPARK, RB_RAY) if m in methods]
    if mine:
        print("\n| size | raybricks | vs applyInPandas | vs pandas loop | "
              "vs map_groups (+ its Ray start) |")
        print("|---|---|---:|---:|---:|")
    for label, found in seconds.items():
        for method in mine:
            took = found.get(method)
            if not took:
                continue
            own = ray_own(STAGES.get(label, {}).get(method, {}))
            cells = []
            for peer in (APPLY, LOOP, MAP_GROUPS):
                theirs = found.get(peer)
                if not theirs:
                    cells.append("-")
                    continue
                if peer == MAP_GROUPS and ray_start:
                    theirs += ray_start
                ratio = theirs / took
                ratios.setdefault(label, {})[f"{method} vs {peer}"] = ratio
                cell = f"{ratio:.2f}x"
                if own:
                    ratios[label][f"{method} without Ray's start vs {peer}"] = \
                        theirs / (took - own)
                    cell += f" ({theirs / (took - own):.2f}x without Ray's start)"
                cells.append(cell)
            print(f"| {label} | {method} | " + " | ".join(cells) + " |")
    for label, by_method in STAGES.items():
        for method, stages in by_method.items():
            print(f"\n{method} at {label}, stages (s): "
                  + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
    if ray_start is not None:
        print(f"\nRay on Spark start (once, for Ray Data map_groups): {ray_start:.1f} s")
    return ratios


if __name__ == "__main__":
    main()
