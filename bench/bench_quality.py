"""Quality of what raybricks registers, on real per-segment data shipped by packages.

For every dataset of ``bench/quality_data.py`` (county murder rates, school chemistry
scores, loan defaults per state, HPC job classes per protocol, diamond cuts per colour and
clarity, flight delays and cancellations per route), one raybricks run with the default
``selection: all`` and ``fallback: global`` (local candidates, the global model and the
naive baseline compete per segment, ``ensemble: best``). From the same run and the same
validation rows of every segment, per trained segment:

* ``baseline``: the naive baseline's validation metric;
* ``local_only``: the best local candidate's (what ``selection: local_only`` picks: the
  splits do not depend on the selection);
* ``selection``: what was chosen (local, global or baseline).

Reported per dataset: the median over trained segments of each, the share of segments
where the selection is at least as good as the baseline, and what was chosen. Targets:
the selection is never worse than the baseline on the median segment, and no worse than
local-only where local models are good.

Usage: ``python bench/bench_quality.py [name ...]`` (default: every dataset).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(__file__))

from common import RESULTS  # noqa: E402
from quality_data import DATASETS, Dataset  # noqa: E402

LGBM = {"name": "lgbm", "kind": "lightgbm",
        "params": {"n_estimators": 60, "num_leaves": 15, "min_child_samples": 5,
                   "learning_rate": 0.1}}
CANDIDATES = {
    "regression": [{"name": "ridge", "kind": "sklearn",
                    "estimator": "sklearn.linear_model.Ridge", "params": {"alpha": 1.0}},
                   LGBM],
    "classification": [{"name": "logit", "kind": "sklearn",
                        "estimator": "sklearn.linear_model.LogisticRegression",
                        "params": {"max_iter": 500}},
                       LGBM],
}


def job_config(ds: Dataset, output_dir: str):
    from raybricks.config import JobConfig

    task = "regression" if ds.task == "regression" else "classification"
    return JobConfig.from_dict({
        "source": {"table": ds.name}, "segment_by": ds.segment_by, "target": ds.target,
        "features": ds.features, "time_column": ds.time_column, "task": ds.task,
        "validation": {"method": ds.validation, "metric": ds.metric},
        "models": CANDIDATES[task], "ensemble": "best", "fallback": "global",
        "selection": "all", "min_rows": 8,
        "training": {"output_dir": output_dir, "progress": False},
    })


def quality(segments: pd.DataFrame, config) -> dict:
    """Medians of baseline, local-only and selection over the trained segments."""
    from raybricks.metrics import metric
    from raybricks.results import choice_counts

    m = config.metric
    measure = metric(m)
    trained = segments[segments.status == "trained"]
    local = trained[[f"{c.name}_{m}" for c in config.models]].astype(float)
    best_local = local.min(axis=1) if not measure.greater_is_better else local.max(axis=1)
    chosen = trained[f"metric_{m}"].astype(float)
    baseline = trained[f"baseline_{m}"].astype(float)
    not_worse = [measure.not_worse(a, b) for a, b in zip(chosen, baseline, strict=True)]
    return {
        "metric": m,
        "segments": int(len(segments)),
        "trained": int(len(trained)),
        "skipped": int((segments.status == "skipped").sum()),
        "failed": int((segments.status == "failed").sum()),
        "baseline_median": float(baseline.median()),
        "local_only_median": float(best_local.median()),
        "selection_median": float(chosen.median()),
        "selection_not_worse_than_baseline": float(np.mean(not_worse)) if len(trained) else None,
        "chosen": choice_counts(segments),
    }


def run(names: list[str]) -> list[dict]:
    from raybricks.cluster import start_ray, stop_ray
    from raybricks.config import ClusterConfig
    from raybricks.data import to_ray_dataset
    from raybricks.session import local_spark_session
    from raybricks.training import train_segments

    spark = local_spark_session(cores=2, app_name="raybricks-bench-quality")
    cluster = start_ray(ClusterConfig(mode="local"), spark)
    rows = []
    try:
        for name in names:
            ds = DATASETS[name]()
            config = job_config(ds, tempfile.mkdtemp(prefix="raybricks-quality-"))
            frame = ds.frame[list(dict.fromkeys(
                ds.segment_by + ds.features + [ds.target]
                + ([ds.time_column] if ds.time_column else [])))]
            segmented = to_ray_dataset(spark.createDataFrame(frame), ds.segment_by)
            start = time.perf_counter()
            result = train_segments(segmented, config)
            row = {"dataset": name, "task": ds.task, "validation": ds.validation,
                   "seconds": time.perf_counter() - start} | quality(result.segments, config)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        stop_ray(cluster)
        spark.stop()
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| dataset | task, validation | metric | segments (trained) | baseline | "
             "local only | selection | selection >= baseline | chosen: local / global / "
             "baseline |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        c = r["chosen"]
        lines.append(
            f"| {r['dataset']} | {r['task']}, {r['validation']} | {r['metric']} | "
            f"{r['segments']:,} ({r['trained']:,}) | {r['baseline_median']:.4g} | "
            f"{r['local_only_median']:.4g} | **{r['selection_median']:.4g}** | "
            f"{r['selection_not_worse_than_baseline']:.0%} | {c['local']} / {c['global']} / "
            f"{c['baseline']} |")
    return "\n".join(lines)


def main(names: list[str]) -> None:
    rows = run(names or list(DATASETS))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "quality.json").write_text(json.dumps(rows, indent=2))
    print()
    print(table(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
