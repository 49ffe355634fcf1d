"""Selective retraining: what retraining a share of the segments costs against training
them all (issue 38: "a selective retrain of 1% of the segments costs about 1% of a full
retrain plus the fixed costs").

Through the CLI as a user runs it, MLflow on SQLite in a temporary directory: ``raybricks
train --config job.json`` on N segments (``bench_scale``'s table: y linear in three
features plus a per-segment offset; LightGBM, XGBoost and Ridge candidates), then
``raybricks train --config job.json --segments keys.parquet`` on a share of them (the
first of every 1/share), which registers the champion with those segments replaced
(``registry.promote: replace``). Per stage the seconds of both jobs, their ratio, and
what the retrain's training stage costs per segment against the full one's; the merged
version is checked to hold every segment, the listed ones from the retrain.

Usage: ``python bench/bench_retrain.py [--segments 100000] [--share 0.01]``; results in
``bench/results/retrain.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from bench_scale import JOBS, cli_job, report, write_table  # noqa: E402
from common import RESULTS  # noqa: E402

ROWS = 50
NAME = "bench_retrain"


def stage_seconds(found: dict[str, Any]) -> dict[str, float]:
    """A verb's stages by their short name (the label before its first colon)."""
    return {s["label"].split(":")[0].split(" (")[0]: s["seconds"] for s in found["stages"]
            if s["seconds"] is not None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--segments", type=int, default=100_000)
    parser.add_argument("--share", type=float, default=0.01)
    args = parser.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq

    workdir = Path(tempfile.mkdtemp(prefix="rb-retrain-"))
    table = workdir / "segments.parquet"
    write_table(table, args.segments, ROWS)
    every = max(int(round(1 / args.share)), 1)
    listed = list(range(0, args.segments, every))
    pq.write_table(pa.table({"seg": listed}), workdir / "keys.parquet")
    job = cli_job(workdir, table, JOBS["kinds"]["models"], NAME)
    full = report(job.run("train"), args.segments, "segments")
    part = report(job.run("train", "--segments", str(workdir / "keys.parquet")), len(listed),
                  "segments")

    import mlflow

    mlflow.set_tracking_uri(job.env["MLFLOW_TRACKING_URI"])
    local = Path(mlflow.artifacts.download_artifacts(f"models:/{NAME}@champion",
                                                     dst_path=str(workdir / "champion")))
    index = pq.read_table(local / "artifacts" / "segments" / "index.parquet").to_pandas()
    origins = index.groupby("source").seg.apply(set)
    retrained = [s for s in origins.index if len(origins[s]) == len(listed)]
    assert len(index) == args.segments, "the merged version lost segments"
    assert retrained and origins[retrained[0]] == set(listed), "not the listed segments"

    full_stages, part_stages = stage_seconds(full), stage_seconds(part)
    print(f"\n| stage | all {args.segments:,} segments (s) | {len(listed):,} listed "
          f"({args.share:.0%}) (s) | ratio |\n|---|---:|---:|---:|")
    for name in dict.fromkeys([*full_stages, *part_stages]):
        a, b = full_stages.get(name), part_stages.get(name)
        ratio = f"{b / a:.3f}" if a and b is not None else "-"
        print(f"| {name} | {a if a is not None else '-'} | "
              f"{b if b is not None else '-'} | {ratio} |")
    print(f"| **whole CLI** | {full['seconds']:.1f} | {part['seconds']:.1f} | "
          f"{part['seconds'] / full['seconds']:.3f} |")
    training = "training"
    per_full = full_stages[training] / args.segments
    per_part = part_stages[training] / len(listed)
    print(f"\ntraining stage per segment: all {1000 * per_full:.2f} ms, listed "
          f"{1000 * per_part:.2f} ms; the retrain's whole job minus its training stage "
          f"(fixed costs and the merge): {part['seconds'] - part_stages[training]:.1f} s")
    out = {"segments": args.segments, "listed": len(listed), "share": args.share,
           "rows": ROWS, "candidates": [m["name"] for m in JOBS["kinds"]["models"]],
           "full": full, "retrain": part,
           "merged": {"segments": int(len(index)),
                      "from": {k: len(v) for k, v in origins.items()}},
           "machine": {"cores": os.cpu_count(), "python": platform.python_version()}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "retrain.json").write_text(json.dumps(out, indent=2, default=str))
    print(f"saved {RESULTS / 'retrain.json'}")


if __name__ == "__main__":
    main()
