"""Scale: the whole ``raybricks train`` job at a million segments, with the driver's memory.

Runs the CLI as a user would (``raybricks train --config job.yaml``: checks, Ray on the
local Spark, conversion, training, accounting, MLflow logging and registration on
SQLite), then ``raybricks score`` over a table that covers every segment of the
registered model. A sampler thread reads the CLI process's resident memory every 0.1 s
and charges each sample to the stage the CLI says is running (its ``> stage ...`` lines),
so the report says where the driver's peak is. The driver is the Python process that
runs the verb: Spark's JVM, Ray's processes and the Python workers are processes of
their own and are not counted.

Jobs (``--jobs``, default both):

* ``million``: 1,000,000 segments x 16 rows, one scikit-learn ``LinearRegression`` per
  segment, holdout validation (target: driver peak under 1 GB);
* ``kinds``: 100,000 segments x 50 rows, three kinds (LightGBM, XGBoost, Ridge; small
  boosters: the point is the number of segments).

Usage: ``python bench/bench_scale.py [--jobs million,kinds] [--segments N] [--no-score]``
(``--segments`` overrides both jobs' segment counts, for a quick run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(__file__))

from common import RESULTS  # noqa: E402

GB = 2**30
DRIVER_TARGET_GB = 1.0
STARTS = re.compile(r"^(\s*)> (.*) \.\.\.$")
ENDS = re.compile(r"^(\s*)  (.*): ([\d.]+) s$")

JOBS: dict[str, dict[str, Any]] = {
    "million": {"segments": 1_000_000, "rows": 16, "models": [
        {"name": "linear", "kind": "sklearn",
         "estimator": "sklearn.linear_model.LinearRegression"}]},
    "kinds": {"segments": 100_000, "rows": 50, "models": [
        {"name": "lgbm", "kind": "lightgbm",
         "params": {"n_estimators": 10, "num_leaves": 7, "min_child_samples": 5}},
        {"name": "xgb", "kind": "xgboost", "params": {"n_estimators": 10, "max_depth": 3}},
        {"name": "ridge", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge"}]},
}


@dataclass
class Stage:
    label: str
    seconds: float | None = None
    peak_gb: float = 0.0


@dataclass
class Verb:
    """One CLI verb's run: wall time, its stages, the driver's peak and where it was."""

    command: list[str]
    seconds: float = 0.0
    peak_gb: float = 0.0
    stages: list[Stage] = field(default_factory=list)
    output: list[str] = field(default_factory=list)

    @property
    def peak_stage(self) -> str:
        return max(self.stages, key=lambda s: s.peak_gb).label if self.stages else "-"


def run_verb(command: list[str], env: dict[str, str]) -> Verb:
    """Run a raybricks verb, sampling its resident memory per stage."""
    verb = Verb(command)
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, bufsize=1)
    driver = psutil.Process(process.pid)
    open_stages: list[Stage] = []
    # time outside every stage is charged to the gap it falls in (the last stage listed
    # while none is open), named by the stage that ended before it
    verb.stages.append(Stage("(outside stages: before the first)"))
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                rss = driver.memory_info().rss / GB
            except psutil.Error:
                return
            verb.peak_gb = max(verb.peak_gb, rss)
            current = open_stages[-1] if open_stages else verb.stages[-1]
            current.peak_gb = max(current.peak_gb, rss)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip("\n")
        verb.output.append(line)
        print(line, flush=True)
        if started := STARTS.match(line):
            stage = Stage(started.group(2))
            verb.stages.append(stage)
            open_stages.append(stage)
        elif (ended := ENDS.match(line)) and open_stages:
            closed = open_stages.pop()
            closed.seconds = float(ended.group(3))
            if not open_stages:
                verb.stages.append(Stage(f"(outside stages: after {closed.label})"))
    code = process.wait()
    done.set()
    sampler.join()
    verb.seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"{' '.join(command)} exited {code}")
    return verb


def write_table(path: Path, segments: int, rows: int, seed: int = 0) -> None:
    """Segments of ``rows`` rows: y linear in x1..x3 with a per-segment offset, plus noise
    (written in slices, so the table's size is not held at once; ``seed``: another draw
    of the same world)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    step = max(1, 2_000_000 // rows)
    with pq.ParquetWriter(path, pa.schema([
            ("seg", pa.int64()), ("x1", pa.float64()), ("x2", pa.float64()),
            ("x3", pa.float64()), ("y", pa.float64())])) as writer:
        for first in range(0, segments, step):
            seg = np.repeat(np.arange(first, min(first + step, segments)), rows)
            x = rng.normal(size=(3, len(seg)))
            y = 2 * x[0] - x[1] + seg % 7 + rng.normal(size=len(seg))
            writer.write_table(pa.table({"seg": seg, "x1": x[0], "x2": x[1], "x3": x[2],
                                         "y": y}))


@dataclass
class CliJob:
    """A job config of ``bench_scale``'s table written for the CLI, the environment it
    runs in (MLflow on SQLite in ``workdir``) and the ``raybricks`` command."""

    config: Path
    env: dict[str, str]
    cli: str

    def run(self, verb: str, *args: str) -> Verb:
        """``raybricks <verb> --config <config> <args>`` (``train``, ``validate``) or
        ``raybricks <verb> <args>``, sampled by ``run_verb``."""
        config = ["--config", str(self.config)] if verb in ("train", "validate") else []
        return run_verb([self.cli, verb, *config, *args], self.env)


def cli_job(workdir: Path, table: Path, models: list[dict[str, Any]], name: str) -> CliJob:
    """The benchmarks' job over ``table`` (one model per ``seg``, y from x1..x3, holdout
    validation, mae) with ``models``, registered as ``name``."""
    config = {
        "source": {"path": str(table)}, "segment_by": ["seg"], "target": "y",
        "models": models, "ensemble": "best", "min_rows": 10,
        "validation": {"method": "holdout", "metric": "mae"},
        "registry": {"name": name}, "training": {"output_dir": str(workdir / "runs")},
    }
    path = workdir / f"{name}.json"  # JSON is YAML
    path.write_text(json.dumps(config))
    env = os.environ | {"MLFLOW_TRACKING_URI": f"sqlite:///{workdir}/mlflow.db",
                        "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return CliJob(path, env, str(Path(sys.executable).with_name("raybricks")))


def run_job(name: str, segments: int, rows: int, workdir: Path, score: bool
            ) -> dict[str, Any]:
    job = JOBS[name]
    table = workdir / f"{name}.parquet"
    write_table(table, segments, rows)
    cli = cli_job(workdir, table, job["models"], f"bench_scale_{name}")
    found: dict[str, Any] = {"segments": segments, "rows": rows,
                             "candidates": [m["name"] for m in job["models"]]}
    found["train"] = report(cli.run("train"), segments, "segments")
    if score:
        scored = cli.run("score", "--model", f"models:/bench_scale_{name}@champion",
                         "--input", str(table), "--output", str(workdir / f"{name}_out"))
        found["score"] = report(scored, segments * rows, "rows")
    return found


def report(verb: Verb, units: int, unit: str) -> dict[str, Any]:
    print(f"\nraybricks {verb.command[1]}: "
          f"{verb.seconds:.1f} s, {units / verb.seconds:,.0f} {unit}/s, driver peak "
          f"{verb.peak_gb:.2f} GB (in: {verb.peak_stage})")
    print("| stage | seconds | driver peak (GB) |\n|---|---:|---:|")
    # gaps between stages that no sample fell in are left out
    shown = [s for s in verb.stages if s.seconds is not None or s.peak_gb > 0]
    for stage in shown:
        seconds = "-" if stage.seconds is None else f"{stage.seconds:.1f}"
        print(f"| {stage.label} | {seconds} | {stage.peak_gb:.2f} |")
    return {"seconds": verb.seconds, f"{unit}_per_second": units / verb.seconds,
            "driver_peak_gb": verb.peak_gb, "peak_stage": verb.peak_stage,
            "stages": [vars(s) for s in shown]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", default="million,kinds")
    parser.add_argument("--segments", type=int, default=None)
    parser.add_argument("--no-score", action="store_true")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rb-scale-"))
    results = {}
    for name in args.jobs.split(","):
        segments = args.segments or JOBS[name]["segments"]
        results[name] = run_job(name, segments, JOBS[name]["rows"], workdir,
                                not args.no_score)
        peak = results[name]["train"]["driver_peak_gb"]
        if name == "million":
            verdict = "PASS" if peak < DRIVER_TARGET_GB else "FAIL"
            print(f"{verdict}: driver peak {peak:.2f} GB (target < {DRIVER_TARGET_GB} GB)")
    RESULTS.mkdir(exist_ok=True)
    suffix = "" if args.segments is None else f"-{args.segments}"
    (RESULTS / f"scale{suffix}.json").write_text(json.dumps({
        "meta": {"cores": os.cpu_count(), "python": platform.python_version(),
                 "memory_gb": psutil.virtual_memory().total / GB},
        "jobs": results}, indent=2))


if __name__ == "__main__":
    main()
