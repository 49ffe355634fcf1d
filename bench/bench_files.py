"""One model per file: a folder of small CSV files to fitted (and registered) models.

Ray's "training one million models" guide starts from one file per segment and runs one Ray
task per file. The same folder, the same fit, one run:

* ``ray_task_per_file``: the guide's pattern: ``ray.remote`` over the list of files, each
  task reads its file with pandas and fits; the fitted models come back to the driver.
* ``raybricks``: ``raybricks.train`` with ``source.path: <folder>/{sku}.csv``: Spark reads
  the folder (keys from the paths), Ray trains, MLflow registers one segmented model.

The fit is the same in both: a seeded 80/20 holdout, ``LinearRegression`` on x1..x3 -> y
scored by MAE, refitted on all rows (raybricks also scores its naive baseline and keeps
every segment accounted for). Ray on Spark is started once, before both; each method first
runs untimed on a small folder (workers started, libraries imported). raybricks' time
includes reading the folder, the accounting and the MLflow registration; the peer's
stops when every model is on the driver.

Usage: ``python bench/bench_files.py [--files 100000] [--rows 16] [--warmup 200]``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import pickle  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

from common import Measurement, markdown_table, measured, save  # noqa: E402

FEATURES = ["x1", "x2", "x3"]
TARGET = "y"


def write_folder(folder: Path, files: int, rows: int, seed: int = 0) -> None:
    """``files`` CSV files of ``rows`` rows, one per SKU: ``<folder>/<sku>.csv``."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    x = rng.normal(size=(files, rows, 3)).round(5)
    slopes = rng.normal(size=(files, 3))
    y = (np.einsum("frk,fk->fr", x, slopes) + rng.normal(scale=0.3, size=(files, rows))
         ).round(5)
    header = "x1,x2,x3,y\n"
    for f in range(files):
        lines = "".join(f"{a},{b},{c},{t}\n" for (a, b, c), t in zip(x[f], y[f], strict=True))
        (folder / f"sku{f:07d}.csv").write_text(header + lines)


def fit_one_file(path: str) -> tuple[str, float, bytes]:
    """The peer's task: read the file with pandas, holdout MAE, refit on all rows."""
    from sklearn.linear_model import LinearRegression

    frame = pd.read_csv(path)
    X, y = frame[FEATURES].to_numpy(), frame[TARGET].to_numpy()
    order = np.random.default_rng(abs(hash(path)) % 2**32).permutation(len(frame))
    cut = int(0.8 * len(frame))
    train, valid = order[:cut], order[cut:]
    model = LinearRegression().fit(X[train], y[train])
    mae = float(np.abs(model.predict(X[valid]) - y[valid]).mean())
    return Path(path).stem, mae, pickle.dumps(LinearRegression().fit(X, y))


def ray_task_per_file(folder: Path) -> int:
    import ray

    task = ray.remote(num_cpus=1)(fit_one_file)
    paths = sorted(str(p) for p in folder.glob("*.csv"))  # the guide's list of files
    results = ray.get([task.remote(p) for p in paths])
    return len(results)


def raybricks_job(folder: Path, runs: Path, spark, name: str,
                  timings: dict | None = None) -> int:
    from raybricks import JobConfig, train

    config = JobConfig.model_validate({
        "source": {"path": f"{folder}/{{sku}}.csv", "format": "csv"},
        "segment_by": ["sku"], "target": TARGET, "features": FEATURES, "min_rows": 10,
        "models": [{"name": "linear", "kind": "sklearn",
                    "estimator": "sklearn.linear_model.LinearRegression"}],
        "registry": {"name": name, "promote": "always"},
        "training": {"output_dir": str(runs), "progress": False}})
    report = train(config, spark)
    if timings is not None:
        timings.update({stage: round(seconds, 2) for stage, seconds in report.timings.items()})
    return report.result.counts()["trained"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    work = Path(tempfile.mkdtemp(prefix="bench-files-"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work}/mlflow.db")
    from raybricks.cluster import start_ray, stop_ray
    from raybricks.config import ClusterConfig
    from raybricks.session import local_spark_session

    print(f"writing {args.files:,} files of {args.rows} rows ...")
    write_folder(work / "warm", args.warmup, args.rows, seed=1)
    write_folder(work / "skus", args.files, args.rows)
    spark = local_spark_session(cores=os.cpu_count() or 2, driver_memory="4g",
                                warehouse_dir=str(work / "warehouse"))
    cluster = start_ray(ClusterConfig(mode="spark"), spark)
    out: list[Measurement] = []
    try:
        ray_task_per_file(work / "warm")
        raybricks_job(work / "warm", work / "runs-warm", spark, "bench.files.warm")
        with measured("ray_task_per_file", args.files, out):
            assert ray_task_per_file(work / "skus") == args.files
        stages: dict[str, float] = {}
        with measured("raybricks", args.files, out, stages=stages):
            assert raybricks_job(work / "skus", work / "runs", spark,
                                 "bench.files.skus", stages) == args.files
        print("raybricks' stages (s):", stages)
    finally:
        stop_ray(cluster)
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(markdown_table(out, "ray_task_per_file", "models"))
    meta = {"files": args.files, "rows": args.rows, "cpus": os.cpu_count(),
            "python": platform.python_version(), "machine": platform.machine()}
    print(f"saved {save('files', out, meta)}")


if __name__ == "__main__":
    main()
