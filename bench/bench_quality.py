"""Quality of what raybricks registers, on rows that neither training nor selection saw.

For every dataset of ``bench/quality_data.py`` (county murder rates, school chemistry
scores, loan defaults per state, HPC job classes per protocol, diamond cuts per colour and
clarity, flight delays and cancellations per route: real data shipped by packages, with
small noisy segments, weak features and rare classes), a share of each segment's rows
(``HELD_OUT``: the latest ones where the data has a time column, else a seeded random
draw) is held out of the whole job. Two raybricks runs see only the rest:

* ``registered``: the defaults, ``selection: all`` and ``fallback: global`` (local
  candidates, the global model and the naive baseline compete per segment, with the noise
  rule ``ensemble.margin`` and ``ensemble.shrink``), packaged as the registry would
  serve it;
* ``local_only``: ``selection: local_only`` without a fallback, its best local candidate
  per segment (the baseline where no local model trained).

On the held-out rows of every segment that has some, each is scored beside
``baseline`` (the segment's training mean, last value for time-ordered data, or class
frequencies, from the job's rows) and ``global`` (the first run's global model alone).
Reported per dataset: the median over segments of each; registered minus global per
segment, its median and mean with bootstrap 90% intervals (noise) and the shares of
segments where it is worse and better; and the run's own reported estimate
(``metric_<m>``, cross-fitted) beside what the held-out rows say. Goals:
registered no worse than baseline on the median segment, and no worse than global alone
beyond noise (the interval reaches zero or below).

Usage: ``python bench/bench_quality.py [--margin X] [--until Q,...] [name ...]`` (default:
every dataset; ``--margin 0`` shows what picking the best validation score alone would
register; ``--until 0.5,1`` runs each time-ordered dataset once per share of its time
span, cut there, so the held-out rows are other periods: one period can differ from
everything before it, as the flights' November and December do;
``QUALITY_DUMP=DIR`` also writes each dataset's per-segment scores and result rows there).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(__file__))

from common import RESULTS  # noqa: E402
from quality_data import DATASETS, Dataset  # noqa: E402

#: Share of each segment's rows held out of the job (segments of fewer than
#: ``MIN_HELD_OUT_ROWS / HELD_OUT`` rows keep all theirs for training).
HELD_OUT = 0.2
MIN_HELD_OUT_ROWS = 2

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


#: ``ensemble.margin`` of the runs (``--margin X``; None: raybricks' default).
MARGIN: float | None = None
#: ``--until``: shares of each time-ordered dataset's span to cut it at (None: uncut).
UNTIL: list[float] | None = None


def job_config(ds: Dataset, output_dir: str, selection: str = "all"):
    from raybricks.config import JobConfig

    task = "regression" if ds.task == "regression" else "classification"
    return JobConfig.from_dict({
        "source": {"table": ds.name}, "segment_by": ds.segment_by, "target": ds.target,
        "features": ds.features, "time_column": ds.time_column, "task": ds.task,
        "validation": {"method": ds.validation, "metric": ds.metric},
        "models": CANDIDATES[task],
        "ensemble": {"method": "best"} | ({} if MARGIN is None else {"margin": MARGIN}),
        "fallback": "global" if selection == "all" else "none",
        "selection": selection, "min_rows": 8,
        "training": {"output_dir": output_dir, "progress": False},
    })


def split_held_out(ds: Dataset) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the job's rows, the held-out rows): per segment, the last ``HELD_OUT`` share by
    time where there is a time column, else a seeded random share."""
    frame = ds.frame.reset_index(drop=True)
    rng = np.random.default_rng(0)
    held = np.zeros(len(frame), dtype=bool)
    for _, rows in frame.groupby(ds.segment_by, observed=True, dropna=False).groups.items():
        rows = np.asarray(rows)
        n = int(len(rows) * HELD_OUT)
        if n < MIN_HELD_OUT_ROWS:
            continue
        if ds.time_column:
            rows = rows[np.argsort(frame[ds.time_column].to_numpy()[rows], kind="stable")]
            held[rows[-n:]] = True
        else:
            held[rng.choice(rows, n, replace=False)] = True
    return frame[~held], frame[held]


def baseline_predictions(ds: Dataset, train: pd.DataFrame, test: pd.DataFrame,
                         classes: list | None) -> np.ndarray:
    """Each held-out row's naive prediction from its segment's job rows."""
    keys = ds.segment_by
    if classes is None:
        if ds.time_column:
            ordered = train.dropna(subset=[ds.target]).sort_values(ds.time_column)
            naive = ordered.groupby(keys, observed=True)[ds.target].last()
        else:
            naive = train.groupby(keys, observed=True)[ds.target].mean()
        return test.join(naive.rename("_naive"), on=keys)["_naive"].to_numpy(dtype=float)
    counts = pd.crosstab([train[k] for k in keys], train[ds.target]).reindex(
        columns=classes, fill_value=0)
    shares = counts.div(counts.sum(axis=1), axis=0)
    joined = test[keys].join(shares, on=keys)
    return joined[classes].to_numpy(dtype=float)


def served(store, test: pd.DataFrame, classes: list | None) -> np.ndarray:
    """A packaged model's predictions of the held-out rows (class probabilities in the
    order of ``classes``); NaN where it serves no model."""
    prediction = store.predict(test, probabilities=classes is not None).values
    if classes is None:
        return prediction.to_numpy(dtype=float)
    return prediction.reindex(columns=[str(c) for c in classes]).to_numpy(dtype=float)


def global_alone(result, test: pd.DataFrame, classes: list | None) -> np.ndarray:
    from raybricks.segmented_model import SegmentModel, align_classes

    model = SegmentModel.from_rows(result.fallback)
    raw = model.predict_raw(test.reset_index(drop=True))
    return raw if classes is None else align_classes(raw, model.meta["classes"], classes)


def per_segment(ds: Dataset, test: pd.DataFrame, predictions: np.ndarray, metric,
                classes: list | None) -> pd.Series:
    """The metric of each segment's held-out rows."""
    y = test[ds.target].to_numpy()
    if classes is not None:
        y = pd.Categorical(y, categories=classes).codes
    found = {}
    groups = test.reset_index(drop=True).groupby(ds.segment_by, observed=True).indices
    for key, rows in groups.items():
        found[key] = metric.score(y[rows], predictions[rows])
    return pd.Series(found, dtype=float)


def interval(differences: np.ndarray, statistic=np.median, draws: int = 2000
             ) -> tuple[float, float]:
    """A bootstrap 90% interval of ``statistic`` (the median, or the mean) over segments."""
    rng = np.random.default_rng(0)
    found = statistic(rng.choice(differences, (draws, len(differences))), axis=1)
    return float(np.quantile(found, 0.05)), float(np.quantile(found, 0.95))


def evaluate(ds: Dataset, spark, work: Path) -> dict:
    from raybricks.data import to_ray_dataset
    from raybricks.metrics import metric
    from raybricks.packaging import package_result
    from raybricks.results import choice_counts
    from raybricks.segmented_model import SegmentStore
    from raybricks.training import train_segments

    train, test = split_held_out(ds)
    columns = list(dict.fromkeys(ds.segment_by + ds.features + [ds.target]
                                 + ([ds.time_column] if ds.time_column else [])))
    segmented = to_ray_dataset(spark.createDataFrame(train[columns]), ds.segment_by)
    classes = None if ds.task == "regression" else sorted(ds.frame[ds.target].unique().tolist())
    measure = metric(ds.metric)
    found, results = {}, {}
    start = time.perf_counter()
    for selection in ("all", "local_only"):
        config = job_config(ds, str(work / selection), selection)
        result = train_segments(segmented, config)
        results[selection] = result
        directory = work / f"{selection}-model"
        package_result(result, directory)
        found[selection] = served(SegmentStore(directory), test, classes)
    seconds = time.perf_counter() - start
    naive = baseline_predictions(ds, train, test, classes)
    local = found["local_only"]
    missing = np.isnan(local) if local.ndim == 1 else np.isnan(local).any(axis=1)
    local[missing] = naive[missing]
    scores = pd.DataFrame({
        "registered": per_segment(ds, test, found["all"], measure, classes),
        "baseline": per_segment(ds, test, naive, measure, classes),
        "global": per_segment(ds, test, global_alone(results["all"], test, classes), measure,
                              classes),
        "local_only": per_segment(ds, test, local, measure, classes),
    }).dropna()
    if os.environ.get("QUALITY_DUMP"):  # per-segment scores and results, to study
        scores.to_pickle(f"{os.environ['QUALITY_DUMP']}/{ds.name}-scores.pkl")
        results["all"].segments.to_pickle(f"{os.environ['QUALITY_DUMP']}/{ds.name}-rows.pkl")
    losses = scores.apply(lambda column: pd.Series(measure.losses(column.to_numpy()),
                                                   index=column.index))
    versus_global = (losses.registered - losses["global"]).to_numpy()
    segments = results["all"].segments
    trained = segments[segments.status == "trained"]
    reported = trained.set_index(ds.segment_by)[f"metric_{measure.name}"].astype(float)
    common = reported.index.intersection(scores.index)
    return {
        "metric": measure.name, "seconds": seconds,
        "segments": int(len(segments)), "trained": int(len(trained)),
        "held_out_rows": int(len(test)), "scored_segments": int(len(scores)),
        **{f"{name}_median": float(scores[name].median()) for name in scores},
        "registered_vs_baseline_median_difference": float(np.median(
            losses.registered - losses.baseline)),
        "registered_vs_global_median_difference": float(np.median(versus_global)),
        "registered_vs_global_interval": interval(versus_global),
        "registered_vs_global_mean_difference": float(np.mean(versus_global)),
        "registered_vs_global_mean_interval": interval(versus_global, np.mean),
        "registered_worse_better_than_global": [float(np.mean(versus_global > 1e-12)),
                                                float(np.mean(versus_global < -1e-12))],
        "reported_median": float(reported.loc[common].median()),
        "held_out_median_same_segments": float(scores.registered.loc[common].median()),
        "chosen": choice_counts(segments),
    }


def run(names: list[str]) -> list[dict]:
    from raybricks.cluster import start_ray, stop_ray
    from raybricks.config import ClusterConfig
    from raybricks.session import local_spark_session

    spark = local_spark_session(cores=2, app_name="raybricks-bench-quality")
    cluster = start_ray(ClusterConfig(mode="local"), spark)
    rows = []
    try:
        for name in names:
            whole = DATASETS[name]()
            for share, ds in periods(whole):
                with tempfile.TemporaryDirectory(prefix="raybricks-quality-") as work:
                    row = {"dataset": name, "task": ds.task, "validation": ds.validation}
                    row |= ({} if share is None else {"until": share})
                    row |= evaluate(ds, spark, Path(work))
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        stop_ray(cluster)
        spark.stop()
    return rows


def periods(ds: Dataset) -> list[tuple[float | None, Dataset]]:
    """The dataset whole, or (``--until``) cut at each share of its time span (datasets
    without a time column: none)."""
    if UNTIL is None:
        return [(None, ds)]
    if not ds.time_column:
        return []
    times = pd.to_datetime(ds.frame[ds.time_column]) if not pd.api.types.is_numeric_dtype(
        ds.frame[ds.time_column]) else ds.frame[ds.time_column]
    first, last = times.min(), times.max()
    return [(share, replace(ds, frame=ds.frame[(times <= first + (last - first) * share)
                                               .to_numpy()].reset_index(drop=True)))
            for share in UNTIL]


def table(rows: list[dict]) -> str:
    lines = ["| dataset | task, validation | metric | segments (scored) | baseline | global "
             "alone | local only | **registered** | registered - global, median (90%) | "
             "registered - global, mean (90%) | segments worse / better than global | "
             "reported (held out) | chosen: local / global / baseline / blend |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---|---|---|---|"]
    for r in rows:
        c = r["chosen"]
        low, high = r["registered_vs_global_interval"]
        mean_low, mean_high = r["registered_vs_global_mean_interval"]
        worse, better = r["registered_worse_better_than_global"]
        period = f" (until {r['until']:g} of its span)" if "until" in r else ""
        lines.append(
            f"| {r['dataset']}{period} | {r['task']}, {r['validation']} | {r['metric']} | "
            f"{r['segments']:,} ({r['scored_segments']:,}) | {r['baseline_median']:.4g} | "
            f"{r['global_median']:.4g} | {r['local_only_median']:.4g} | "
            f"**{r['registered_median']:.4g}** | {r['registered_vs_global_median_difference']:+.3g}"
            f" ({low:+.3g}, {high:+.3g}) | {r['registered_vs_global_mean_difference']:+.3g} "
            f"({mean_low:+.3g}, {mean_high:+.3g}) | {worse:.0%} / {better:.0%} | "
            f"{r['reported_median']:.4g} "
            f"({r['held_out_median_same_segments']:.4g}) | {c['local']} / {c['global']} / "
            f"{c['baseline']} / {c['blend']} |")
    return "\n".join(lines)


def goals(rows: list[dict]) -> str:
    """PASS/FAIL of the two goals per dataset (the second by the paired median and, more
    strictly, by the paired mean: a few large misses count there)."""
    lines = []
    for r in rows:
        baseline = (r["registered_median"] <= r["baseline_median"]
                    if r["metric"] not in ("auc", "accuracy", "f1", "r2")
                    else r["registered_median"] >= r["baseline_median"])
        global_ = r["registered_vs_global_interval"][0] <= 0
        mean = r["registered_vs_global_mean_interval"][0] <= 0
        name = r["dataset"] + (f" until {r['until']:g}" if "until" in r else "")
        lines.append(f"{name}: not worse than baseline on the median segment "
                     f"{'PASS' if baseline else 'FAIL'}; not worse than global alone beyond "
                     f"noise, paired median {'PASS' if global_ else 'FAIL'}, paired mean "
                     f"{'PASS' if mean else 'FAIL'}")
    return "\n".join(lines)


def main(arguments: list[str]) -> None:
    global MARGIN, UNTIL
    if "--margin" in arguments:
        at = arguments.index("--margin")
        MARGIN = float(arguments[at + 1])
        del arguments[at:at + 2]
    if "--until" in arguments:
        at = arguments.index("--until")
        UNTIL = [float(share) for share in arguments[at + 1].split(",")]
        del arguments[at:at + 2]
    rows = run(arguments or list(DATASETS))
    RESULTS.mkdir(exist_ok=True)
    name = "quality.json" if MARGIN is None else f"quality-margin-{MARGIN:g}.json"
    name = name if UNTIL is None else name.replace(".json", "-periods.json")
    (RESULTS / name).write_text(json.dumps(rows, indent=2))
    print()
    print(table(rows))
    print()
    print(goals(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
