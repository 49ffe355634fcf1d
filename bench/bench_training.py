"""Per-segment model training throughput: raybricks against the obvious peers.

Same synthetic data, same per-segment work, one process run, reported as models/s and as
ratios to the one-core ``sequential`` loop. Every method trains one model per segment with
``fit_one_segment`` (canonical row order, seeded 80/20 holdout, ``LinearRegression`` on
x1..x3 -> y, validation MAE):

* ``sequential``: pandas ``groupby("seg")`` on the driver, one core;
* ``spark_applyInPandas``: ``groupBy("seg").applyInPandas`` on the local SparkSession;
* ``ray_data_map_groups``: ``ray.data.from_pandas(...).groupby("seg").map_groups``;
* ``ray_task_per_segment``: one ``@ray.remote`` task per segment (frames put beforehand);
* ``raybricks``: ``raybricks.training.train_segments`` (skipped while it does not exist).

Only the training is timed: the Spark DataFrame is cached and counted, the Ray Dataset
materialized, the segment frames put in Ray's object store and the raybricks dataset
converted before the clock starts. Every timed run follows an untimed run of the same
method on a tiny table (Python workers started, libraries imported), so the numbers are
steady-state throughput, not start-up cost.
The results of every peer are checked against ``sequential`` (same segments, MAE within
1e-9); raybricks only has to report every segment as trained (its split may differ).

``spark_applyInPandas`` and ``sequential`` run before Ray starts: a running Ray on Spark
holds Spark task slots (its worker nodes are long-running Spark tasks), which would leave
applyInPandas fewer cores than it has. Ray on Spark is then started once for all Ray
methods and sizes. BLAS/OpenMP are pinned to one thread so no method oversubscribes.

Usage: ``python bench/bench_training.py [--sizes 2000x200,20000x50] [--repeats 1]
[--only raybricks,spark_applyInPandas] [--map-groups-partitions N]``.
"""

from __future__ import annotations

import os

# Before numpy / sklearn are imported anywhere (Spark and Ray workers inherit these).
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
for _var in THREAD_VARS:
    os.environ[_var] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib  # noqa: E402
import io  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from sklearn.linear_model import LinearRegression  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

from common import Measurement, best_of, markdown_table, measured, save  # noqa: E402

FEATURES = ["x1", "x2", "x3"]
TARGET = "y"
TRAIN_FRACTION = 0.8
SPLIT_SEED = 0
TOLERANCE = 1e-9
BASELINE = "sequential"
RAY_METHODS = ("ray_data_map_groups", "ray_task_per_segment", "raybricks")
METHODS = ("sequential", "spark_applyInPandas", *RAY_METHODS)
RESULT_SCHEMA = "seg long, mae double"


# --------------------------------------------------------------------------- the work


def fit_one_segment(pdf: pd.DataFrame, seed: int = SPLIT_SEED) -> dict[str, Any]:
    """The per-segment work every method does: holdout split, fit, validation MAE.

    Rows are first put in a canonical order (sorted by every value column): Spark's and
    Ray's shuffles do not keep the row order inside a group, and the seeded permutation
    must pick the same rows whatever order they arrived in.
    """
    seg = int(pdf["seg"].iloc[0])
    x = pdf[FEATURES].to_numpy(dtype=np.float64)
    y = pdf[TARGET].to_numpy(dtype=np.float64)
    canonical = np.lexsort((y, *x.T[::-1]))  # by x1, then x2, x3, y
    x, y = x[canonical], y[canonical]
    order = np.random.default_rng(seed + seg).permutation(len(y))
    n_train = int(len(y) * TRAIN_FRACTION)
    train, valid = order[:n_train], order[n_train:]
    model = LinearRegression().fit(x[train], y[train])
    mae = float(np.mean(np.abs(model.predict(x[valid]) - y[valid])))
    return {"seg": seg, "mae": mae}


def fit_one_segment_frame(pdf: pd.DataFrame) -> pd.DataFrame:
    """``fit_one_segment`` as a one-row DataFrame, for applyInPandas and map_groups."""
    return pd.DataFrame([fit_one_segment(pdf)])


def make_data(segments: int, rows_per_segment: int, seed: int = 0) -> pd.DataFrame:
    """``segments`` segments of ``rows_per_segment`` rows: y = b + x @ w (per segment) + noise."""
    rng = np.random.default_rng(seed)
    seg = np.repeat(np.arange(segments, dtype=np.int64), rows_per_segment)
    x = rng.normal(size=(len(seg), len(FEATURES)))
    weights = rng.normal(size=(segments, len(FEATURES)))
    intercept = rng.normal(scale=5.0, size=segments)
    y = intercept[seg] + np.einsum("ij,ij->i", x, weights[seg]) + rng.normal(size=len(seg))
    frame = pd.DataFrame(x, columns=FEATURES)
    frame.insert(0, "seg", seg)
    frame[TARGET] = y
    return frame


# --------------------------------------------------------------------------- peers


@dataclass
class Case:
    """One data size: the pandas table, and the Spark copy made (and cached) once."""

    segments: int
    rows_per_segment: int
    pdf: pd.DataFrame
    spark: Any
    map_groups_partitions: int | None = None
    _sdf: Any = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"{self.segments}x{self.rows_per_segment}"

    @property
    def sdf(self):
        """The Spark DataFrame, cached and counted on first use (never inside a timing)."""
        if self._sdf is None:
            self._sdf = self.spark.createDataFrame(self.pdf).cache()
            self._sdf.count()
        return self._sdf

    def release(self) -> None:
        if self._sdf is not None:
            self._sdf.unpersist()
            self._sdf = None


def run_sequential(case: Case, out: list[Measurement]) -> pd.DataFrame:
    """pandas groupby on the driver, one segment after another on one core."""
    with measured("sequential", case.segments, out, size=case.label):
        rows = [fit_one_segment(group) for _, group in case.pdf.groupby("seg", sort=True)]
        result = pd.DataFrame(rows)
    return result


def run_spark_apply_in_pandas(case: Case, out: list[Measurement]) -> pd.DataFrame:
    """Spark's grouped-map pandas UDF on the cached Spark DataFrame, collected to pandas."""
    sdf = case.sdf
    with measured("spark_applyInPandas", case.segments, out, size=case.label):
        result = (
            sdf.groupBy("seg").applyInPandas(fit_one_segment_frame, schema=RESULT_SCHEMA)
        ).toPandas()
    return result


def run_ray_data_map_groups(case: Case, out: list[Measurement]) -> pd.DataFrame:
    """Ray Data's groupby + map_groups on a materialized ``from_pandas`` dataset."""
    import ray

    ds = ray.data.from_pandas(case.pdf).materialize()
    with measured("ray_data_map_groups", case.segments, out, size=case.label):
        result = (
            ds.groupby("seg", num_partitions=case.map_groups_partitions)
            .map_groups(fit_one_segment_frame, batch_format="pandas")
            .to_pandas()
        )
    del ds
    return result


def run_ray_task_per_segment(case: Case, out: list[Measurement]) -> pd.DataFrame:
    """One Ray task per segment; the segment frames are in the object store beforehand."""
    import ray

    remote_fit = ray.remote(fit_one_segment)
    refs = [ray.put(group) for _, group in case.pdf.groupby("seg", sort=True)]
    with measured("ray_task_per_segment", case.segments, out, size=case.label):
        result = pd.DataFrame(ray.get([remote_fit.remote(ref) for ref in refs]))
    del refs
    return result


def raybricks_config():
    """The raybricks job that does the same work as ``fit_one_segment``."""
    from raybricks.config import JobConfig

    return JobConfig.model_validate(
        {
            "segment_by": ["seg"],
            "target": TARGET,
            "features": FEATURES,
            "task": "regression",
            "validation": {"method": "holdout", "fraction": 0.2, "metric": "mae"},
            "models": [
                {
                    "name": "lr",
                    "kind": "sklearn",
                    "estimator": "sklearn.linear_model.LinearRegression",
                }
            ],
            "ensemble": "best",
            "refit": False,
            "min_rows": 2,
            "seed": SPLIT_SEED,
            "source": {"table": "unused"},
        }
    )


def raybricks_available() -> bool:
    try:
        training = importlib.import_module("raybricks.training")
        config = importlib.import_module("raybricks.config")
    except ImportError:
        return False
    return hasattr(training, "train_segments") and hasattr(config, "JobConfig")


def run_raybricks(case: Case, out: list[Measurement]):
    """raybricks' training stage on a dataset converted from the Spark DataFrame
    beforehand; returns its ``result.segments`` (seg, status, metric_mae, ...)."""
    from raybricks.data import to_ray_dataset

    # via importlib: the module may not exist yet (and import sorting must not move it)
    train_segments = importlib.import_module("raybricks.training").train_segments
    config = raybricks_config()
    segmented = to_ray_dataset(case.sdf, ["seg"])
    with measured("raybricks", case.segments, out, size=case.label):
        result = train_segments(segmented, config)
    del segmented
    return result.segments


PEERS: dict[str, Callable[[Case, list[Measurement]], pd.DataFrame]] = {
    "sequential": run_sequential,
    "spark_applyInPandas": run_spark_apply_in_pandas,
    "ray_data_map_groups": run_ray_data_map_groups,
    "ray_task_per_segment": run_ray_task_per_segment,
    "raybricks": run_raybricks,
}


# --------------------------------------------------------------------------- checks


def check_same(name: str, got: pd.DataFrame, reference: pd.DataFrame) -> None:
    """Fail loudly unless ``got`` has the reference's segments and MAE values."""
    got = got.sort_values("seg").reset_index(drop=True)
    if len(got) != len(reference):
        raise RuntimeError(f"{name} returned {len(got)} segments, {BASELINE} {len(reference)}")
    if not np.array_equal(got["seg"].to_numpy(np.int64), reference["seg"].to_numpy(np.int64)):
        raise RuntimeError(f"{name} returned other segment ids than {BASELINE}")
    diff = np.abs(got["mae"].to_numpy(np.float64) - reference["mae"].to_numpy(np.float64))
    if not np.all(diff <= TOLERANCE):  # also catches NaN
        worst = int(np.nanargmax(diff)) if not np.all(np.isnan(diff)) else 0
        raise RuntimeError(
            f"{name}: MAE differs from {BASELINE} by up to {np.nanmax(diff):.3g} "
            f"(> {TOLERANCE}) in {int((~(diff <= TOLERANCE)).sum())} segments, "
            f"e.g. seg {int(reference['seg'].iloc[worst])}"
        )


def check_raybricks(segments: pd.DataFrame, reference: pd.DataFrame) -> None:
    """Every segment present once and trained (raybricks' MAE is not compared)."""
    missing = {"seg", "status", "metric_mae"} - set(segments.columns)
    if missing:
        raise RuntimeError(f"raybricks result.segments lacks column(s) {sorted(missing)}")
    if len(segments) != len(reference) or set(segments["seg"].astype("int64")) != set(
        reference["seg"]
    ):
        raise RuntimeError(
            f"raybricks returned {len(segments)} segment rows for {len(reference)} segments"
        )
    not_trained = segments[segments["status"] != "trained"]
    if len(not_trained):
        raise RuntimeError(
            f"raybricks: {len(not_trained)} segments not trained, e.g. "
            f"{not_trained.head(3).to_dict('records')}"
        )


def verify(name: str, result: pd.DataFrame, reference: pd.DataFrame) -> None:
    if name == "raybricks":
        check_raybricks(result, reference)
    elif name != BASELINE:
        check_same(name, result, reference)


def target_lines(measurements: list[Measurement], cores: int) -> list[str]:
    """PASS/FAIL for raybricks' throughput targets (reported, never asserted)."""
    rates = {m.name: m.rate for m in measurements}
    if "raybricks" not in rates:
        return ["targets: SKIP (raybricks not measured)"]
    mine = rates["raybricks"]
    targets = [
        (f"0.9 x {cores} cores x {BASELINE}", "sequential", 0.9 * cores),
        ("2.5 x spark_applyInPandas", "spark_applyInPandas", 2.5),
        ("3 x ray_data_map_groups", "ray_data_map_groups", 3.0),
    ]
    lines = []
    for label, peer, factor in targets:
        if peer not in rates:
            lines.append(f"targets: raybricks >= {label}: SKIP ({peer} not measured)")
            continue
        needed = factor * rates[peer]
        verdict = "PASS" if mine >= needed else "FAIL"
        lines.append(
            f"targets: raybricks >= {label}: {verdict} "
            f"({mine:,.0f} vs {needed:,.0f} models/s; {mine / rates[peer]:.2f}x {peer})"
        )
    return lines


# --------------------------------------------------------------------------- driver


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in text.split(","):
        try:
            segments, rows = (int(part) for part in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--sizes: {item!r} is not SEGMENTSxROWS, e.g. 2000x200") from None
        if segments < 1 or rows < 5:
            raise SystemExit(f"--sizes: {item!r} needs >= 1 segment and >= 5 rows per segment")
        sizes.append((segments, rows))
    return sizes


def parse_methods(text: str | None) -> list[str]:
    if not text:
        return list(METHODS)
    wanted = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(METHODS))
    if unknown:
        raise SystemExit(f"--only: unknown method(s) {unknown}; choose from {list(METHODS)}")
    # sequential always runs: it is the reference for the results and the ratios
    return [name for name in METHODS if name == BASELINE or name in wanted]


def run_methods(
    cases: list[Case],
    methods: list[str],
    repeats: int,
    references: dict[str, pd.DataFrame],
    results: dict[str, list[Measurement]],
) -> None:
    """Time ``methods`` on every case (best of ``repeats``) and check their results.

    Each timed run is preceded by an untimed run of the same method on a tiny table, so
    its Python workers are up and have imported pandas and scikit-learn.
    """
    if not methods:
        return
    tiny = Case(8, 20, make_data(8, 20, seed=1), cases[0].spark, cases[0].map_groups_partitions)
    tiny_reference = pd.DataFrame([fit_one_segment(g) for _, g in tiny.pdf.groupby("seg")])
    for case in cases:
        print(f"\n== {case.label}: {case.segments:,} segments x {case.rows_per_segment} rows")

        def run(out: list[Measurement], case: Case = case) -> None:
            for name in methods:
                with contextlib.redirect_stdout(io.StringIO()):  # warm-up, not reported
                    verify(name, PEERS[name](tiny, []), tiny_reference)
                result = PEERS[name](case, out)
                if name == BASELINE:
                    references[case.label] = result.sort_values("seg").reset_index(drop=True)
                verify(name, result, references[case.label])

        results[case.label].extend(best_of(repeats, run))
    tiny.release()


def thread_settings(_: Any = None) -> dict[str, str | None]:
    return {var: os.environ.get(var) for var in THREAD_VARS}


def spark_thread_settings(spark) -> dict[str, str | None]:
    """The thread variables as a Spark Python worker sees them."""
    rdd = spark.sparkContext.parallelize([0], 1)
    return rdd.map(thread_settings).collect()[0]


def versions() -> dict[str, str]:
    import pyspark
    import ray
    import sklearn

    return {
        "python": platform.python_version(),
        "ray": ray.__version__,
        "pyspark": pyspark.__version__,
        "pandas": pd.__version__,
        "numpy": np.__version__,
        "scikit-learn": sklearn.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="2000x200,20000x50", help="SEGMENTSxROWS, comma-separated"
    )
    parser.add_argument("--repeats", type=int, default=1, help="keep the best of N runs")
    parser.add_argument(
        "--only",
        default=None,
        help=f"comma-separated methods out of {', '.join(METHODS)} ({BASELINE} always runs)",
    )
    parser.add_argument("--cores", type=int, default=2, help="local Spark cores, local[N]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    parser.add_argument(
        "--map-groups-partitions",
        type=int,
        default=None,
        help="num_partitions of ray_data_map_groups' groupby (default: Ray's, 200)",
    )
    args = parser.parse_args()
    sizes = parse_sizes(args.sizes)
    methods = parse_methods(args.only)

    if "raybricks" in methods and not raybricks_available():
        print("raybricks: training stage not available yet")
        methods.remove("raybricks")

    from raybricks.cluster import ray_cluster
    from raybricks.config import ClusterConfig
    from raybricks.session import local_spark_session

    spark = local_spark_session(cores=args.cores, driver_memory="6g")
    cases = [
        Case(
            segments, rows, make_data(segments, rows, args.seed), spark, args.map_groups_partitions
        )
        for segments, rows in sizes
    ]
    references: dict[str, pd.DataFrame] = {}
    results: dict[str, list[Measurement]] = {case.label: [] for case in cases}

    # Phase 1, no Ray running: Spark gets all its task slots.
    plain = [name for name in methods if name not in RAY_METHODS]
    run_methods(cases, plain, args.repeats, references, results)

    # Phase 2: Ray on Spark, started once for every Ray method and size.
    ray_methods = [name for name in methods if name in RAY_METHODS]
    ray_cpus = None
    worker_threads = None
    if ray_methods:
        import ray

        with ray_cluster(ClusterConfig(), spark):
            ray_cpus = int(ray.cluster_resources().get("CPU", 0))
            print(f"\nRay on Spark: {ray_cpus} CPUs")
            # the same for map_groups and raybricks; progress logs would swamp the output
            ray.data.DataContext.get_current().enable_progress_bars = False
            worker_threads = ray.get(ray.remote(thread_settings).remote())
            run_methods(cases, ray_methods, args.repeats, references, results)

    cores = ray_cpus or args.cores
    measurements: list[Measurement] = []
    for case in cases:
        rows = sorted(results[case.label], key=lambda m: METHODS.index(m.name))
        measurements.extend(rows)
        print(f"\n### {case.label} ({case.segments:,} segments x {case.rows_per_segment} rows)\n")
        print(markdown_table(rows, BASELINE, "models"))
        print()
        for line in target_lines(rows, cores):
            print(line)
        case.release()

    meta = {
        "sizes": [case.label for case in cases],
        "repeats": args.repeats,
        "methods": methods,
        "cores": os.cpu_count(),
        "spark_cores": args.cores,
        "ray_cpus": ray_cpus,
        "spark_master": spark.sparkContext.master,
        "threads": {var: os.environ[var] for var in THREAD_VARS},
        "threads_in_spark_workers": spark_thread_settings(spark),
        "threads_in_ray_workers": worker_threads,
        "map_groups_partitions": args.map_groups_partitions,
        "versions": versions(),
    }
    path = save("training", measurements, meta)
    print(f"\nsaved {path}")
    spark.stop()


if __name__ == "__main__":
    main()
