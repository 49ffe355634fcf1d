"""Monitoring at scale (issue 38: "monitoring a million segments is a Spark job plus Arrow
columns on the driver, driver under 1 GB"): ``raybricks monitor`` of a model of N
segments on a new draw of the same world, every segment's outcomes scored by raybricks
(the features only), through the CLI as a user runs it, the driver's resident memory
sampled per stage (``bench_scale.run_verb``).

The model is ``bench_scale``'s million-segment job (one LinearRegression per segment, 16
rows each; trained here through ``raybricks train``); the outcomes are 16 new rows per
segment, a share of the segments (``--changed``) with their target shifted, so the
statuses have something to find; then ``raybricks train --segments-from-monitor`` of the
degraded segments on the new rows, merged into the champion (the loop's other half).

Usage: ``python bench/bench_monitor_scale.py [--segments 1000000]``; results in
``bench/results/monitor-scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

from bench_scale import JOBS, cli_job, report, write_table  # noqa: E402
from common import RESULTS  # noqa: E402

ROWS = 16
NAME = "bench_monitor_scale"


def shift_some(path: Path, every: int) -> int:
    """Shift the target of every ``every``-th segment by 10 (in place); how many."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    seg, y = table.column("seg").to_numpy(), table.column("y").to_numpy().copy()
    chosen = seg % every == 0
    y[chosen] += 10.0
    pq.write_table(table.set_column(table.schema.get_field_index("y"), "y", pa.array(y)),
                   path)
    return len(set(seg[chosen].tolist()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--segments", type=int, default=1_000_000)
    parser.add_argument("--changed", type=float, default=0.01)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rb-monitor-scale-"))
    table, outcomes = workdir / "train.parquet", workdir / "outcomes.parquet"
    write_table(table, args.segments, ROWS)
    write_table(outcomes, args.segments, ROWS, seed=1)
    changed = shift_some(outcomes, max(int(round(1 / args.changed)), 1))
    job = cli_job(workdir, table, JOBS["million"]["models"], NAME)
    train = report(job.run("train"), args.segments, "segments")
    monitor = report(job.run("monitor", "--model", f"models:/{NAME}@champion", "--outcomes",
                             str(outcomes), "--output", str(workdir / "monitoring")),
                     args.segments, "segments")
    # the loop's second half: retrain the degraded segments on the new rows, merged into
    # the champion (the merge streams the champion's shards)
    retrain = report(job.run("train", "--set", f"source.path={outcomes}",
                             "--segments-from-monitor", str(workdir / "monitoring"),
                             "--statuses", "degraded"), args.segments, "segments")
    import pyarrow.parquet as pq

    found = pq.read_table(workdir / "monitoring", columns=["seg", "status"]).to_pandas()
    every = max(int(round(1 / args.changed)), 1)
    truth = found.seg % every == 0
    degraded = found.status == "degraded"
    out = {"segments": args.segments, "rows": ROWS, "changed": changed,
           "statuses": found.status.value_counts().to_dict(),
           "changed_found_degraded": int((truth & degraded).sum()),
           "unchanged_found_degraded": int((~truth & degraded).sum()),
           "train": train, "monitor": monitor, "retrain_degraded": retrain,
           "machine": {"cores": os.cpu_count(), "python": platform.python_version()}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "monitor-scale.json").write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps({k: v for k, v in out.items()
                      if k not in ("train", "monitor", "retrain_degraded")},
                     indent=2, default=str))


if __name__ == "__main__":
    main()
