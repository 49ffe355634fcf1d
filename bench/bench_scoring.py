"""Batch scoring throughput: ``raybricks.score`` against MLflow's ``spark_udf``.

One registered segmented model (2,000 segments by default, LightGBM and Ridge candidates,
``ensemble: best``) trained by ``raybricks.train`` on local Spark with Ray on Spark; then
the same input (1,000,000 rows by default, segments in random order, Parquet) scored
into Parquet by both methods with the same model URI (``models:/NAME@champion``):

* ``mlflow_spark_udf``: ``mlflow.pyfunc.spark_udf(spark, uri)`` applied to the input as it
  is (every Arrow batch mixes all segments; the pyfunc's segment cache is per worker);
* ``raybricks_score``: ``raybricks.score(uri, input, output)``, which lays the input out
  by segment first so each worker meets a segment in consecutive batches.

Both include reading the input and writing the output. Predictions are checked to agree
(within 1e-9) before the table is printed; results go to ``bench/results/scoring.json``.
Each timed run follows an untimed run on a small input (workers started, imports done).

Usage: ``python bench/bench_scoring.py [--segments 2000] [--rows 1000000] [--repeats 1]``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

from common import Measurement, best_of, markdown_table, measured, save  # noqa: E402

FEATURES = ["x1", "x2", "x3"]
MODEL = "bench.scoring.model"


def synthetic(segments: int, rows_per_segment: int, seed: int) -> pd.DataFrame:
    """Rows of ``segments`` segments, y linear in x per segment, shuffled."""
    rng = np.random.default_rng(seed)
    n = segments * rows_per_segment
    seg = np.repeat(np.arange(segments), rows_per_segment)
    x = rng.normal(size=(n, 3))
    slopes = rng.normal(size=(segments, 3))
    y = (x * slopes[seg]).sum(axis=1) + seg % 7 + rng.normal(scale=0.1, size=n)
    frame = pd.DataFrame({"seg": seg, **{f: x[:, i] for i, f in enumerate(FEATURES)},
                          "y": y})
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def train_model(workdir: Path, segments: int, seed: int) -> str:
    """Train and register the model once; returns its champion URI."""
    from raybricks import JobConfig, train

    source = workdir / "train.parquet"
    synthetic(segments, 60, seed).to_parquet(source)
    config = JobConfig.from_dict({
        "source": {"path": str(source)}, "segment_by": ["seg"], "target": "y",
        "features": FEATURES, "validation": {"method": "holdout", "metric": "mae"},
        "models": [
            {"name": "lgbm", "kind": "lightgbm",
             "params": {"n_estimators": 50, "num_leaves": 7, "min_child_samples": 5}},
            {"name": "ridge", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge"},
        ],
        "ensemble": "best", "registry": {"name": MODEL, "promote": "always"},
        "training": {"output_dir": str(workdir / "runs"), "progress": False},
    })
    print(train(config).summary())
    return f"models:/{MODEL}@champion"


def score_with_spark_udf(spark, uri: str, source: str, output: str) -> None:
    import mlflow

    udf = mlflow.pyfunc.spark_udf(spark, uri, result_type="double", env_manager="local")
    df = spark.read.parquet(source)
    df.withColumn("prediction", udf("seg", *FEATURES)).write.mode("overwrite").parquet(output)


def score_with_raybricks(spark, uri: str, source: str, output: str) -> None:
    from raybricks import score

    score(uri, source, output, spark=spark)


METHODS = {"mlflow_spark_udf": score_with_spark_udf, "raybricks_score": score_with_raybricks}


def check_agreement(outputs: dict[str, str]) -> None:
    frames = {name: pd.read_parquet(path).sort_values(["seg", "x1"]).reset_index(drop=True)
              for name, path in outputs.items()}
    first, *others = frames.values()
    for name, frame in zip(list(frames)[1:], others, strict=True):
        if len(frame) != len(first) or not np.allclose(
                frame.prediction, first.prediction, rtol=1e-9, atol=1e-9):
            raise SystemExit(f"FAIL: {name} predictions differ from {list(frames)[0]}")
    print(f"predictions agree across {', '.join(frames)} ({len(first):,} rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from raybricks.session import local_spark_session

    workdir = Path(tempfile.mkdtemp(prefix="raybricks-bench-scoring-"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    spark = local_spark_session(cores=args.cores + 1, warehouse_dir=str(workdir / "wh"))
    uri = train_model(workdir, args.segments, args.seed)
    source = str(workdir / "input.parquet")
    synthetic(args.segments, args.rows // args.segments, args.seed + 1).drop(
        columns=["y"]).to_parquet(source, row_group_size=100_000)
    small = str(workdir / "small.parquet")
    pd.read_parquet(source).head(5000).to_parquet(small)

    outputs = {name: str(workdir / f"out-{name}.parquet") for name in METHODS}

    def run(out: list[Measurement]) -> None:
        for name, method in METHODS.items():
            method(spark, uri, small, str(workdir / f"warm-{name}.parquet"))
            with measured(name, args.rows, out):
                method(spark, uri, source, outputs[name])

    measurements = best_of(args.repeats, run)
    check_agreement(outputs)
    print()
    print(markdown_table(measurements, "mlflow_spark_udf", "rows"))
    path = save("scoring", measurements, {
        "segments": args.segments, "rows": args.rows, "cores": args.cores,
        "python": platform.python_version(), "model": "lightgbm(50 trees) | ridge, best",
    })
    print(f"\nsaved {path}")
    spark.stop()


if __name__ == "__main__":
    main()
