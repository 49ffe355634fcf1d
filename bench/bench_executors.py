"""The two executors side by side: the same jobs trained with ``training.executor: ray``,
``spark`` and ``auto``, one run per job, to decide ``auto``'s rule (issue 49).

Training jobs (``raybricks.train(config, spark, register=False)`` in this process, on one
local Spark session started before anything is timed):

* ``demo``: the flights demo's job (``jobs/route_delay.yml``: one arrival-delay model per
  New York route, LightGBM, XGBoost and Ridge, time-ordered validation, a global
  fallback), on the demo's own table (``flights_demo.flights_with_weather``) written as
  Parquet, January to October;
* ``N`` (e.g. ``50``, ``200``, ``2000``): ``bench_training.make_data`` with N segments of
  ``--rows`` rows (default 200), the demo's three candidates with its parameters, a
  holdout and a global fallback.

Each job runs once per executor, after an untimed warm-up of every executor on a tiny
job (workers started, libraries imported). Ray's executor starts Ray on Spark itself, as
a user's job does (its ``cluster`` and ``shutdown`` stages). Reported: the wall time,
every stage (``TrainingReport.timings``), raybricks' own seconds (the wall time less a
``spark`` stage: there is none here, the session is given), the time to the first
segment's result on the driver (the first part file in the run directory, seen by a
thread polling every 0.05 s), the segments trained, the executor ``auto`` chose and why,
and the median validation metric per executor (the same job must learn the same).

Forecasting (``--forecast 3000,10000``): ``bench_forecast_scale.py``'s ``cheap`` job (its
nine statistical models, seven one-day-apart backtests, horizon 7, forecasts written by
the job, MLflow registration) through ``raybricks train --config`` in a subprocess with
each executor, against statsforecast on Spark as a job (``run_statsforecast_spark``), on
that script's cached series. Each a process of its own, so start-ups count alike.

Usage: ``python bench/bench_executors.py [--jobs demo,50,200,2000] [--executors
ray,spark,auto] [--rows 200] [--output executors.json]``;
``python bench/bench_executors.py --jobs none --forecast 3000,10000 --output
executors-forecast.json``. Results: ``results/<output>``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.dirname(os.path.abspath(__file__)), *filter(None, [os.environ.get("PYTHONPATH")])])
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from bench_training import FEATURES, TARGET, make_data  # noqa: E402
from common import RESULTS  # noqa: E402

EXECUTORS = ("ray", "spark", "auto")


def demo_job(workdir: Path, spark) -> tuple[dict[str, Any], int]:
    """The demo's job on the demo's table (written as Parquet): the config as a dict,
    and the rows it trains on."""
    from raybricks.flights_demo import CONFIG, flights_with_weather

    columns = ["origin", "dest", "carrier", "month", "day", "hour", "day_of_week",
               "dep_delay", "arr_delay", "distance", "time_hour", "temp", "humid",
               "wind_speed", "precip", "visib"]
    path = workdir / "flights"
    spark.createDataFrame(flights_with_weather()[columns]).write.parquet(str(path))
    job = yaml.safe_load(CONFIG.read_text())
    job["source"] = {"path": str(path), "where": job["source"]["where"]}
    for key in ("registry", "tracking"):
        job.pop(key, None)
    rows = spark.read.parquet(str(path)).where(job["source"]["where"]).count()
    return job, rows


def segments_job(workdir: Path, segments: int, rows: int) -> tuple[dict[str, Any], int]:
    """``segments`` synthetic segments of ``rows`` rows with the demo's candidates."""
    from raybricks.flights_demo import CONFIG

    path = workdir / f"segments-{segments}x{rows}"
    path.mkdir()
    make_data(segments, rows, seed=segments).to_parquet(path / "part-0.parquet", index=False)
    demo = yaml.safe_load(CONFIG.read_text())
    return {
        "source": {"path": str(path)}, "segment_by": ["seg"], "target": TARGET,
        "features": FEATURES, "task": "regression",
        "validation": {"method": "holdout", "fraction": 0.2, "metric": "mae"},
        "models": demo["models"], "ensemble": "best", "min_rows": 30,
        "fallback": "global",
    }, segments * rows


class FirstResult:
    """A thread that notes when the first result part appears under ``runs``."""

    def __init__(self, runs: Path) -> None:
        self.runs, self.seconds = runs, None
        self._stop = threading.Event()
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            if any(self.runs.glob("*/results/*")):
                self.seconds = time.perf_counter() - self._start
                return

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return self.seconds


def train_once(job: dict[str, Any], executor: str, spark, runs: Path) -> dict[str, Any]:
    """One timed ``raybricks.train`` of ``job`` with ``executor``."""
    from raybricks import train
    from raybricks.config import JobConfig

    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    config = JobConfig.from_dict(job | {"training": {
        "output_dir": str(runs), "progress": False, "executor": executor}})
    load = os.getloadavg()[0]
    watch = FirstResult(runs)
    start = time.perf_counter()
    report = train(config, spark, register=False)
    seconds = time.perf_counter() - start
    first = watch.stop()
    segments = report.result.segments
    metric = report.result.metric
    trained = segments[segments.status == "trained"]
    found = {
        "seconds": seconds, "stages": dict(report.timings),
        "own_seconds": seconds - report.timings.get("spark", 0.0),
        "first_result_seconds": first, "counts": report.result.counts(),
        "median_metric": float(trained[f"metric_{metric}"].astype(float).median())
        if len(trained) else None, "metric": metric,
        "chosen": trained["chosen"].value_counts().head(5).to_dict(),
        "load_average_1m_at_start": load,
    }
    print(f"  {executor}: {seconds:.1f} s (first result {first or float('nan'):.1f} s); "
          + ", ".join(f"{k} {v:.1f}" for k, v in report.timings.items()), flush=True)
    shutil.rmtree(runs, ignore_errors=True)
    return found


def auto_choice(job: dict[str, Any], spark, rows: int) -> tuple[str, str]:
    from raybricks.config import JobConfig
    from raybricks.data import segment_sizes
    from raybricks.pipeline import choose_executor
    from raybricks.sources import read_source

    config = JobConfig.from_dict(job)
    return choose_executor(config, spark, rows, lambda: segment_sizes(
        read_source(config.source, spark), config.segment_by))


def training_jobs(names: list[str], executors: list[str], rows: int, workdir: Path,
                  auto_jobs: set[str]) -> dict[str, Any]:
    from raybricks.session import local_spark_session

    spark = local_spark_session(driver_memory="6g")
    warm, _ = segments_job(workdir, 10, 100)
    print("warm-up (untimed)", flush=True)
    for executor in ("spark", "ray"):
        train_once(warm, executor, spark, workdir / "runs")
    found: dict[str, Any] = {}
    for name in names:
        job, n_rows = demo_job(workdir, spark) if name == "demo" else \
            segments_job(workdir, int(name), rows)
        chosen, why = auto_choice(job, spark, n_rows)
        print(f"\njob {name}: {n_rows:,} rows; auto: {chosen} ({why})", flush=True)
        entry: dict[str, Any] = {"rows": n_rows, "auto_chooses": chosen, "auto_why": why,
                                 "job": job, "executors": {}}
        for executor in executors:
            if executor == "auto" and name not in auto_jobs:
                continue  # its choice is said above: the run is the chosen one's again
            entry["executors"][executor] = train_once(job, executor, spark,
                                                      workdir / "runs")
        entry["segments"] = sum(next(iter(entry["executors"].values()))["counts"].values())
        found[name] = entry
    spark.stop()
    return found


# --------------------------------------------------------------------------- forecasting


def top_stages(output: list[str]) -> dict[str, float]:
    """The CLI's top-level stages and their seconds, from its ``  label: N s`` lines (the
    forecasting script's ``Verb.timings`` keys stages by their first word, so Ray's start
    and shut-down, or the job's and the forecast's ``source``, share a key)."""
    import re

    found: dict[str, float] = {}
    for line in output:
        if (ended := re.match(r"^  (\S.*): ([\d.]+) s$", line)):
            label = ended.group(1)
            name = ("ray start" if label.startswith("Ray: start") else
                    "ray shutdown" if label.startswith("Ray: shut") else
                    label.split(":")[0].split(" (")[0].split(" ")[0].lower())
            found[name] = found.get(name, 0.0) + float(ended.group(2))
    return found


def forecast_jobs(sizes: list[int], executors: list[str], workdir: Path, cache: Path
                  ) -> dict[str, Any]:
    from bench_forecast_scale import job_config, run_statsforecast_spark, run_verb, series_table

    found: dict[str, Any] = {}
    for n_series in sizes:
        table, info = series_table(cache, n_series, 0)
        entry: dict[str, Any] = {"series": n_series, "data": info, "executors": {}}
        for executor in executors:
            run_dir = workdir / f"forecast-{n_series}-{executor}"
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            job = job_config("cheap", table, run_dir, f"bench_executors_{n_series}")
            job["training"]["executor"] = executor
            job_path = run_dir / "job.yml"
            job_path.write_text(yaml.safe_dump(job, sort_keys=False))
            env = os.environ | {"MLFLOW_TRACKING_URI": f"sqlite:///{run_dir}/mlflow.db",
                                "RAY_AUTH_MODE": "disabled"}
            cli = str(Path(sys.executable).with_name("raybricks"))
            print(f"\n$ raybricks train --config {job_path}  # {n_series} series, "
                  f"executor {executor}", flush=True)
            load = os.getloadavg()[0]
            verb = run_verb([cli, "train", "--config", str(job_path)], env, run_dir)
            said = [line for line in verb.output if line.startswith("executor:")]
            entry["executors"][executor] = verb.summary() | {
                "top_stages": top_stages(verb.output),
                "executor_line": said[0] if said else None,
                "load_average_1m_at_start": load}
            shutil.rmtree(run_dir, ignore_errors=True)
        load = os.getloadavg()[0]
        peer_dir = workdir / f"statsforecast-{n_series}"
        peer_dir.mkdir(parents=True, exist_ok=True)
        entry["statsforecast_spark"] = run_statsforecast_spark("cheap", table, peer_dir) | {
            "load_average_1m_at_start": load}
        found[str(n_series)] = entry
        report_forecast({str(n_series): entry})
    return found


# --------------------------------------------------------------------------- tables


def report_training(found: dict[str, Any]) -> None:
    executors = sorted({e for entry in found.values() for e in entry["executors"]},
                       key=EXECUTORS.index)
    print("\n| job | segments | rows | " + " | ".join(f"{e} (s)" for e in executors)
          + " | ray / spark | auto picks |")
    print("|---|---:|---:|" + "---:|" * len(executors) + "---:|---|")
    for name, entry in found.items():
        runs = entry["executors"]
        ratio = (f"{runs['ray']['seconds'] / runs['spark']['seconds']:.2f}x faster"
                 if "ray" in runs and "spark" in runs else "-")
        print(f"| {name} | {entry['segments']:,} | {entry['rows']:,} | "
              + " | ".join(f"{runs[e]['seconds']:.1f}" if e in runs else "-"
                           for e in executors)
              + f" | {ratio} | {entry['auto_chooses']} |")
    for name, entry in found.items():
        print(f"\n{name}: stages (s), first result (s), median metric")
        for executor, run in entry["executors"].items():
            print(f"  {executor}: " + ", ".join(f"{k} {v:.1f}" for k, v in run["stages"].items())
                  + f"; first result {run['first_result_seconds'] or float('nan'):.1f}; "
                  f"median {run['metric']} {run['median_metric']}")


def report_forecast(found: dict[str, Any]) -> None:
    print("\n| series | executor | job (s) | stages (s) | vs statsforecast on Spark |")
    print("|---:|---|---:|---|---:|")
    for n_series, entry in found.items():
        peer = entry["statsforecast_spark"]["seconds"]
        for executor, run in entry["executors"].items():
            stages = run.get("top_stages") or run["stages"]
            print(f"| {n_series} | raybricks ({executor}) | {run['seconds']:.1f} | "
                  + ", ".join(f"{k} {v:.1f}" for k, v in stages.items())
                  + f" | {peer / run['seconds']:.2f}x |")
        print(f"| {n_series} | statsforecast on Spark | {peer:.1f} | "
              + ", ".join(f"{k} {v:.1f}" for k, v in entry["statsforecast_spark"]["parts"].items())
              + " | 1.00x |")


def package_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in ("raybricks", "pyspark", "ray", "pyarrow", "lightgbm", "xgboost",
                 "scikit-learn", "statsforecast"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="demo,50,200,2000",
                        help="demo and/or segment counts; none for no training job")
    parser.add_argument("--executors", default=",".join(EXECUTORS))
    parser.add_argument("--rows", type=int, default=200, help="rows per synthetic segment")
    parser.add_argument("--auto-jobs", default="demo,50,200",
                        help="the jobs also run with auto (elsewhere only its choice)")
    parser.add_argument("--forecast", default="", help="series counts, e.g. 3000,10000")
    parser.add_argument("--forecast-executors", default="ray,spark")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "rb-bench",
                                                        "forecast-scale"))
    parser.add_argument("--output", default="executors.json")
    args = parser.parse_args()
    names = [n for n in args.jobs.split(",") if n and n != "none"]
    executors = [e for e in args.executors.split(",") if e]
    workdir = Path(tempfile.mkdtemp(prefix="rb-executors-"))
    meta = {"cores": os.cpu_count(), "python": platform.python_version(),
            "packages": package_versions(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "load_average_at_start": os.getloadavg(), "rows_per_segment": args.rows,
            "order": "per job: the executors in --executors order (ray first: the Spark "
                     "runs after it start new Python workers, as a fresh session's first "
                     "job does; auto then runs on warm ones)"}
    results: dict[str, Any] = {"meta": meta}
    try:
        if names:
            results["training"] = training_jobs(names, executors, args.rows, workdir,
                                                set(args.auto_jobs.split(",")))
            report_training(results["training"])
        if args.forecast:
            sizes = [int(n) for n in args.forecast.split(",")]
            results["forecast"] = forecast_jobs(
                sizes, [e for e in args.forecast_executors.split(",") if e], workdir,
                Path(args.cache))
            report_forecast(results["forecast"])
    finally:
        meta["load_average_at_end"] = os.getloadavg()
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / args.output).write_text(json.dumps(results, indent=2, default=str))
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
