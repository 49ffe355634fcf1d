"""Forecasting at scale: N daily series through ``raybricks train`` (writing every
series' forecasts in the same job: ``forecast.output``) as a user runs it, against
statsforecast in-process and on Spark on the same series.

The workload is statsforecast's own scale benchmark (``experiments/benchmarks_at_scale``
in Nixtla/statsforecast, ``src/experiment.py``): its nine benchmark models with its
parameters, ``CrostonClassic()``, ``SeasonalNaive(7)``, ``Naive()``, ``ADIDA()``,
``HistoricAverage()``, ``SeasonalWindowAverage(7, 4)``, ``IMAPA()``, ``WindowAverage(7)``
and ``SeasonalExponentialSmoothing(7, alpha=0.9)``, ``freq='D'``, and its
cross-validation ``h=7, test_size=13``: seven windows one day apart (step 1). It
published 1,000,000 series in 4.81 minutes on 128 CPUs (its README), 0.037 core-seconds
per series; that time is the cross-validation alone, on generated series of 20 to 100
days (``src/data.py``: ``generate_series(min_length=20, max_length=100)``).

Here the series are two years of days (``generate``: seeded, vectorized numpy, cached as
Parquet; ``--days N`` for another length): most with trend, weekly and yearly
seasonality and noise, about 15% intermittent (mostly zeros, Poisson demand), about 10%
short (60 to 200 days, at most ``--days``, ending on the same last day). Configurations
(``--config``):

* ``cheap``: the nine benchmark models;
* ``full``: the same plus ``AutoETS(season_length=7)`` and a LightGBM on lags 1, 7, 14
  and a 7-day rolling mean (raybricks only: statsforecast cannot fit a lag model; its
  side gets the ten statistical models).

Methods, in one run on the same series:

* ``raybricks``: a job YAML (task forecast, horizon 7, frequency D, season 7, seven
  backtest windows of step 1, the defaults otherwise: MASE, the weighted blend of the
  close best three; ``forecast.output``: the next 7 days of every series to Parquet)
  run with ``raybricks train --config``, a subprocess with MLflow on SQLite
  in a temporary directory and Ray on the local Spark. Each stage's wall time is read
  from the CLI's own ``> stage ...`` lines, and the time between stages (start-up,
  shut-down, what no stage line covers) from when the lines arrive; a thread samples
  every 0.1 s the resident memory of the CLI process (the Python driver), of Spark's
  JVM and of the other processes below it (Ray, Spark's Python workers), and the CPU
  seconds of that whole process tree. The run's results Parquet gives every series' status and
  ``fit_seconds`` (the core time of its backtests, selection and refit inside a task).
* ``statsforecast on Spark`` (``--spark-peer``), as a job: a process of its own starts a
  local Spark on every core and runs the same cross-validation, forecast and choice on
  Spark DataFrames (statsforecast's Fugue backend), timed from start to end.
* ``statsforecast``, in-process, as its documentation does model selection:
  ``StatsForecast(models, freq='D', n_jobs=-1).cross_validation(h=7, n_windows=7,
  step_size=1)``, ``forecast(h=7)``, per series the model of least backtest MAE (the
  same choice as by MASE: both scale a series' errors alike) and that model's forecast,
  written to Parquet; each part timed.

Usage::

    python bench/bench_forecast_scale.py --series 10000 [--config cheap|full] [--skip-peer]
    python bench/bench_forecast_scale.py --report      # the tables of the saved results

Results are kept in ``results/forecast-scale.json`` by configuration and series count
(``--label smoke``: a separate entry for a small check run); the tables end with the
per-core rate against statsforecast's published one and, from every saved size of a
configuration, what a million series would take ("on paper": seconds and the driver's
peak fitted as a + b x series).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from common import RESULTS, PeakRSS  # noqa: E402

GB = 2**30
RESULTS_FILE = RESULTS / "forecast-scale.json"
DRIVER_TARGET_GB = 1.0

# statsforecast's experiments/benchmarks_at_scale: horizon, windows, published time
HORIZON, WINDOWS, STEP, SEASON = 7, 7, 1, 7
PUBLISHED = {"series": 1_000_000, "minutes": 4.81, "cpus": 128}
PUBLISHED_CORE_SECONDS = PUBLISHED["minutes"] * 60 * PUBLISHED["cpus"] / PUBLISHED["series"]

#: The nine benchmark models: (statsforecast class, its parameters).
BENCHMARK_MODELS: list[tuple[str, dict[str, Any]]] = [
    ("CrostonClassic", {}),
    ("SeasonalNaive", {"season_length": 7}),
    ("Naive", {}),
    ("ADIDA", {}),
    ("HistoricAverage", {}),
    ("SeasonalWindowAverage", {"season_length": 7, "window_size": 4}),
    ("IMAPA", {}),
    ("WindowAverage", {"window_size": 7}),
    ("SeasonalExponentialSmoothing", {"season_length": 7, "alpha": 0.9}),
]
CONFIGS: dict[str, dict[str, Any]] = {
    "cheap": {"statistical": BENCHMARK_MODELS, "lags": None},
    "full": {"statistical": [*BENCHMARK_MODELS, ("AutoETS", {"season_length": 7})],
             "lags": {"name": "lgbm", "kind": "lightgbm",
                      "params": {"n_estimators": 50, "num_leaves": 15,
                                 "min_child_samples": 10, "learning_rate": 0.1}}},
}
LAG_FEATURES = {"lags": [1, 7, 14], "rolling": {"mean": [7]}}

# --------------------------------------------------------------------------- the series

DAYS = 730
LAST_DAY = np.datetime64("2024-12-31")
SHARE_INTERMITTENT, SHARE_SHORT = 0.15, 0.10
SHORT_DAYS = (60, 200)
CHUNK = 5_000  # series generated (and written as one row group) at a time
DATA_VERSION = 1  # part of the cached file's name: change it when ``generate`` changes


def generate(path: Path, n_series: int, seed: int = 0, n_days: int = DAYS
             ) -> dict[str, int]:
    """Write ``n_series`` daily series of ``n_days`` days (``series`` string key, ``day``
    date, ``sales`` float) ending on ``LAST_DAY`` to ``path``, CHUNK series at a time with
    numpy, each chunk from its own seeded generator (so the first N series of a larger
    table are the N-series table). Returns how many series of each kind."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    short_days = (min(SHORT_DAYS[0], n_days // 2), min(SHORT_DAYS[1], n_days))
    days = np.arange(LAST_DAY - (n_days - 1), LAST_DAY + 1, dtype="datetime64[D]")
    t = np.arange(n_days)
    weekday = (days.astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday
    year_phase = 2 * np.pi * (days - days.astype("datetime64[Y]")).astype(np.int64) / 365.25
    schema = pa.schema([("series", pa.string()), ("day", pa.date32()),
                        ("sales", pa.float64())])
    counts = {"regular": 0, "intermittent": 0, "short": 0, "rows": 0}
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, schema) as writer:
        for chunk, first in enumerate(range(0, n_series, CHUNK)):
            rng = np.random.default_rng([seed, chunk])
            m = min(CHUNK, n_series - first)
            draw = rng.random(m)
            intermittent = draw < SHARE_INTERMITTENT
            short = (draw >= SHARE_INTERMITTENT) & (draw < SHARE_INTERMITTENT + SHARE_SHORT)
            # regular: level x trend x weekly profile x yearly wave x (1 + noise)
            level = rng.lognormal(3.0, 1.0, m)[:, None]
            trend = 1 + rng.normal(0.0, 0.3, m)[:, None] * t / n_days
            weekly = 1 + rng.normal(0.0, 0.2, (m, 7))[:, weekday]
            yearly = 1 + rng.uniform(0.0, 0.4, m)[:, None] * np.sin(
                year_phase + rng.uniform(0.0, 2 * np.pi, m)[:, None])
            noise = 1 + rng.uniform(0.03, 0.2, m)[:, None] * rng.standard_normal((m, n_days))
            y = np.round(np.maximum(level * trend * weekly * yearly * noise, 0.0), 2)
            del trend, weekly, yearly, noise
            # intermittent: a demand on a share of days (5% to 30%), 1 + Poisson units
            occurs = rng.random((m, n_days)) < rng.uniform(0.05, 0.3, m)[:, None]
            demand = 1.0 + rng.poisson(rng.uniform(0.5, 4.0, m)[:, None], (m, n_days))
            y = np.where(intermittent[:, None], occurs * demand, y)
            del occurs, demand
            length = np.where(short, rng.integers(short_days[0], short_days[1] + 1, m), n_days)
            kept = t[None, :] >= n_days - length[:, None]  # row-major: series, then days
            names = pa.array([f"s{i:07d}" for i in range(first, first + m)])
            series = pa.DictionaryArray.from_arrays(
                pa.array(np.repeat(np.arange(m, dtype=np.int32), length)), names)
            writer.write_table(pa.table({
                "series": series.cast(pa.string()),
                "day": pa.array(np.broadcast_to(days, (m, n_days))[kept]),
                "sales": pa.array(y[kept])}, schema=schema))
            counts["intermittent"] += int(intermittent.sum())
            counts["short"] += int(short.sum())
            counts["regular"] += int((~intermittent & ~short).sum())
            counts["rows"] += int(length.sum())
    tmp.replace(path)
    return counts


def series_table(cache: Path, n_series: int, seed: int, days: int = DAYS
                 ) -> tuple[Path, dict[str, Any]]:
    """The cached table of ``n_series`` series of ``days`` days (generated once), and
    what is in it."""
    cache.mkdir(parents=True, exist_ok=True)
    length = "" if days == DAYS else f"-{days}d"
    path = cache / f"series-v{DATA_VERSION}-{n_series}{length}-seed{seed}.parquet"
    info_path = path.with_suffix(".json")
    if path.exists() and info_path.exists():
        return path, json.loads(info_path.read_text()) | {"generated_seconds": None}
    start = time.perf_counter()
    info: dict[str, Any] = generate(path, n_series, seed, days)
    info["generated_seconds"] = time.perf_counter() - start
    info["bytes"] = path.stat().st_size
    info_path.write_text(json.dumps(info))
    print(f"generated {n_series:,} series ({info['rows']:,} rows) in "
          f"{info['generated_seconds']:.1f} s: {path}", flush=True)
    return path, info


# --------------------------------------------------------------------------- raybricks

STARTS = re.compile(r"^(\s*)> (.*) \.\.\.$")
ENDS = re.compile(r"^(\s*)  (.*): ([\d.]+) s$")
PROGRESS = re.compile(r"\d+%\|")
MLFLOW_RUN = re.compile(r"MLflow run ([0-9a-f]{32})")
#: the CLI's stage labels (their start), by the short names of the tables
STAGE_NAMES = {"Spark": "spark", "checks": "checks", "source": "source", "Ray": "ray_start",
               "data": "data", "training": "training", "accounting": "accounting",
               "registry": "registry", "model": "model", "scoring": "forecast",
               "summary": "summary", "forecasts": "forecasts"}


@dataclass
class Stage:
    label: str
    seconds: float | None = None
    driver_peak_gb: float = 0.0
    outside: bool = False  # time between the CLI's stages (start-up, shut-down, ...)

    @property
    def name(self) -> str:
        if self.outside:
            return self.label
        head = self.label.split(":")[0].split(" ")[0]
        return STAGE_NAMES.get(head, self.label)


@dataclass
class Verb:
    """One CLI verb's run: its wall time, stages (and the time between them), output and
    the memory and CPU of its process tree."""

    command: list[str]
    seconds: float = 0.0
    stages: list[Stage] = field(default_factory=list)
    output: list[str] = field(default_factory=list)
    driver_peak_gb: float = 0.0
    jvm_peak_gb: float = 0.0
    others_peak_gb: float = 0.0  # Ray's processes and Spark's Python workers, together
    cpu_seconds: dict[int, float] = field(default_factory=dict)  # pid -> last seen

    def timings(self, outside: bool = False) -> dict[str, float]:
        return {s.name: s.seconds for s in self.stages
                if s.seconds is not None and s.outside == outside}

    def summary(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "stages": self.timings(),
                "timeline": [[s.name, s.seconds] for s in self.stages
                             if s.seconds is not None],
                "outside_stages": self.timings(outside=True),
                "stage_driver_peak_gb": {s.name: s.driver_peak_gb for s in self.stages
                                         if s.driver_peak_gb},
                "driver_peak_gb": self.driver_peak_gb, "jvm_peak_gb": self.jvm_peak_gb,
                "others_peak_gb": self.others_peak_gb,
                "cpu_seconds": sum(self.cpu_seconds.values())}


def cpu_of(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def run_verb(command: list[str], env: dict[str, str], cwd: Path) -> Verb:
    """Run a raybricks verb, echoing its output (progress bars at their end only),
    timing its stages and the gaps between them (by when the CLI's lines arrive), and
    sampling its process tree's memory and CPU."""
    verb = Verb(command)
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, cwd=cwd, bufsize=1)
    driver = psutil.Process(process.pid)
    open_stages: list[Stage] = []
    gap = Stage("outside: before the first stage (start-up)", outside=True)
    gap_start = 0.0
    verb.stages.append(gap)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                rss = driver.memory_info().rss / GB
                verb.cpu_seconds[driver.pid] = cpu_of(driver)
                jvm = others = 0
                for child in driver.children(recursive=True):
                    try:
                        memory = child.memory_info().rss
                        verb.cpu_seconds[child.pid] = cpu_of(child)
                        if child.name() == "java":
                            jvm += memory
                        else:
                            others += memory
                    except psutil.Error:
                        continue
            except psutil.Error:
                return
            verb.driver_peak_gb = max(verb.driver_peak_gb, rss)
            verb.jvm_peak_gb = max(verb.jvm_peak_gb, jvm / GB)
            verb.others_peak_gb = max(verb.others_peak_gb, others / GB)
            current = open_stages[-1] if open_stages else verb.stages[-1]
            current.driver_peak_gb = max(current.driver_peak_gb, rss)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert process.stdout is not None
    for line in process.stdout:  # tqdm's carriage returns end lines here too
        now = time.perf_counter() - start
        line = line.rstrip("\n")
        verb.output.append(line)
        if not PROGRESS.search(line) or "100%|" in line:
            print(line, flush=True)
        if started := STARTS.match(line):
            if not open_stages:
                gap.seconds = now - gap_start
            stage = Stage(started.group(2))
            verb.stages.append(stage)
            open_stages.append(stage)
        elif (ended := ENDS.match(line)) and open_stages:
            closed = open_stages.pop()
            closed.seconds = float(ended.group(3))
            if not open_stages:
                gap, gap_start = Stage(f"outside: after {closed.name}", outside=True), now
                verb.stages.append(gap)
    code = process.wait()
    done.set()
    sampler.join()
    verb.seconds = time.perf_counter() - start
    gap.seconds = verb.seconds - gap_start
    if code != 0:
        raise SystemExit(f"{' '.join(command)} exited {code}")
    return verb


def job_config(config: str, table: Path, workdir: Path, registry: str) -> dict[str, Any]:
    """The job YAML's content (as a dict) for a configuration."""
    spec = CONFIGS[config]
    models = [{"name": name.lower(), "kind": "statsforecast", "estimator": name,
               "params": params} for name, params in spec["statistical"]]
    forecast: dict[str, Any] = {"horizon": HORIZON, "frequency": "D",
                                "season_length": SEASON,
                                "output": str(workdir / "forecasts")}  # in the same job
    if spec["lags"]:
        models.append(spec["lags"])
        forecast |= LAG_FEATURES
    return {
        "source": {"path": str(table)}, "segment_by": ["series"], "target": "sales",
        "time_column": "day", "task": "forecast", "forecast": forecast,
        "validation": {"method": "backtest", "windows": WINDOWS, "step": STEP},
        "models": models,
        "registry": {"name": registry}, "tracking": {"experiment": "bench_forecast_scale"},
        "training": {"output_dir": str(workdir / "runs")},
    }


def run_raybricks(config: str, table: Path, n_series: int, workdir: Path
                  ) -> dict[str, Any]:
    import yaml

    registry = f"bench_forecast_scale_{config}_{n_series}"
    job = job_config(config, table, workdir, registry)
    job_path = workdir / "job.yml"
    job_path.write_text(yaml.safe_dump(job, sort_keys=False))
    env = os.environ | {"MLFLOW_TRACKING_URI": f"sqlite:///{workdir}/mlflow.db",
                        "RAY_AUTH_MODE": "disabled"}
    cli = str(Path(sys.executable).with_name("raybricks"))
    print(f"\n$ raybricks train --config {job_path}", flush=True)
    train = run_verb([cli, "train", "--config", str(job_path)], env, workdir)
    found = {"job": job, "train": train.summary(), "forecast": None}
    found["results"] = run_results(workdir / "runs", train.output)
    found["forecast_rows"], found["forecast_series"] = forecast_counts(
        Path(job["forecast"]["output"]))
    found["mlflow_metrics"] = mlflow_metrics(env["MLFLOW_TRACKING_URI"], train.output)
    return found


def job_seconds(rb: dict[str, Any]) -> float:
    """The raybricks job's wall seconds: ``raybricks train`` writing the forecasts
    (``forecast.output``), or (runs saved before it had that) train, then forecast."""
    return rb["train"]["seconds"] + (rb["forecast"]["seconds"] if rb.get("forecast") else 0)


def job_name(rb: dict[str, Any]) -> str:
    return ("train + forecast CLIs" if rb.get("forecast")
            else "train CLI with forecast.output")


def run_results(runs: Path, output: list[str]) -> dict[str, Any]:
    """From the run's results Parquet: statuses, the winners' counts, skip reasons, the
    sum and quantiles of per-series ``fit_seconds``."""
    import pyarrow.parquet as pq

    (run_dir,) = [p for p in runs.iterdir() if (p / "results").is_dir()]
    table = pq.read_table(run_dir / "results", columns=[
        "status", "reason", "n_rows", "chosen", "fit_seconds"]).to_pandas()
    fit = table.fit_seconds.dropna()
    chosen = table.chosen.dropna().map(
        lambda c: json.loads(c) if c.startswith("[") else [c]).explode()
    reasons = table[table.status != "trained"].reason.fillna("").str.split(":").str[0]
    return {"run_dir": str(run_dir), "series": int(len(table)),
            "status": table.status.value_counts().to_dict(),
            "not_trained_reasons": reasons.value_counts().to_dict(),
            "chosen_members": chosen.value_counts().to_dict(),
            "fit_seconds_sum": float(fit.sum()),
            "fit_seconds_quantiles": {f"p{round(q * 100)}": float(fit.quantile(q))
                                      for q in (0.5, 0.9, 0.99)}
            if len(fit) else {},
            "fit_seconds_max": float(fit.max()) if len(fit) else None}


def forecast_counts(output: Path) -> tuple[int, int]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(output, columns=["series", "prediction"])
    served = table.filter(pc.is_valid(table["prediction"]))
    return table.num_rows, len(pc.unique(served["series"]))


def mlflow_metrics(uri: str, output: list[str]) -> dict[str, float]:
    """The run's timing and count metrics as raybricks logged them to MLflow."""
    found = [m.group(1) for line in output if (m := MLFLOW_RUN.search(line))]
    if not found:
        return {}
    from mlflow.tracking import MlflowClient

    metrics = MlflowClient(uri).get_run(found[-1]).data.metrics
    return {k: v for k, v in sorted(metrics.items())
            if k.startswith(("seconds_", "segments_", "accounting_"))}


# --------------------------------------------------------------------------- statsforecast

#: statsforecast on Spark as a job: its own process starts a local Spark with every core,
#: and runs the same cross-validation, forecast and choice with Spark DataFrames (its
#: Fugue backend), the backtests and forecasts collected for the choice.
SPARK_JOB = """
import json, sys, time
start = time.perf_counter()
import numpy as np, pandas as pd
sys.path.insert(0, {bench!r})
from bench_forecast_scale import HORIZON, WINDOWS, STEP, statsforecast_models
from raybricks.session import local_spark_session
from statsforecast import StatsForecast
parts = {{}}
spark = local_spark_session(cores={cores})
parts["spark start"] = time.perf_counter() - start
t = time.perf_counter()
from pyspark.sql import functions as F
frame = spark.read.parquet({table!r}).toDF("unique_id", "ds", "y").select(
    F.col("unique_id").cast("string"), F.col("ds").cast("timestamp"),
    F.col("y").cast("double"))
models = statsforecast_models({config!r})
names = [repr(m) for m in models]
sf = StatsForecast(models=models, freq="D")
cv = sf.cross_validation(df=frame, h=HORIZON, n_windows=WINDOWS, step_size=STEP).toPandas()
parts["cross_validation"] = time.perf_counter() - t
t = time.perf_counter()
forecasts = sf.forecast(df=frame, h=HORIZON).toPandas()
parts["forecast"] = time.perf_counter() - t
t = time.perf_counter()
errors = cv[names].sub(cv["y"], axis=0).abs()
errors["unique_id"] = cv["unique_id"].to_numpy()
best = errors.groupby("unique_id")[names].mean().idxmin(axis=1)
column = forecasts["unique_id"].map(best).astype(str)
values = forecasts[names].to_numpy()
picked = values[np.arange(len(values)), pd.Index(names).get_indexer(column)]
pd.DataFrame({{"series": forecasts["unique_id"].astype(str), "day": forecasts["ds"],
              "prediction": picked}}).to_parquet({out!r}, index=False)
parts["selection and write"] = time.perf_counter() - t
print("PARTS " + json.dumps({{"parts": parts, "series": int(len(best))}}), flush=True)
"""


def run_statsforecast_spark(config: str, table: Path, workdir: Path) -> dict[str, Any]:
    """statsforecast on Spark as a job (``SPARK_JOB`` in a process of its own), timed
    from the process's start to its end."""
    code = SPARK_JOB.format(bench=str(Path(__file__).parent), cores=os.cpu_count(),
                            table=str(table), config=config,
                            out=str(workdir / "statsforecast-spark.parquet"))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=workdir)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"statsforecast on Spark failed: {done.stderr[-3000:]}")
    found = json.loads(next(line for line in done.stdout.splitlines()
                            if line.startswith("PARTS "))[6:])
    print(f"statsforecast on Spark (a job): {seconds:.1f} s {found['parts']}", flush=True)
    return found | {"seconds": seconds}


def statsforecast_models(config: str) -> list:
    import statsforecast.models as sm

    return [getattr(sm, name)(**params) for name, params in CONFIGS[config]["statistical"]]


def run_statsforecast(config: str, table: Path, workdir: Path) -> dict[str, Any]:
    """statsforecast's model selection in this process, each part timed."""
    import pandas as pd
    import pyarrow.parquet as pq
    from statsforecast import StatsForecast

    parts: dict[str, float] = {}
    cpu = CpuTree()

    def timed(name: str):
        class Timer:
            def __enter__(self) -> None:
                self.start = time.perf_counter()

            def __exit__(self, *exc: object) -> None:
                parts[name] = time.perf_counter() - self.start
                print(f"statsforecast {name}: {parts[name]:.1f} s", flush=True)
        return Timer()

    with PeakRSS(interval=0.1) as rss, cpu:
        with timed("read"):
            frame = pq.read_table(table).rename_columns(["unique_id", "ds", "y"]).to_pandas(
                strings_to_categorical=True)
            frame["ds"] = frame["ds"].astype("datetime64[ns]")
        models = statsforecast_models(config)
        names = [repr(m) for m in models]
        sf = StatsForecast(models=models, freq="D", n_jobs=-1)
        with timed("cross_validation"):
            cv = sf.cross_validation(df=frame, h=HORIZON, n_windows=WINDOWS, step_size=STEP)
        with timed("forecast"):
            forecasts = sf.forecast(df=frame, h=HORIZON)
        with timed("selection"):
            errors = cv[names].sub(cv["y"], axis=0).abs()
            errors["unique_id"] = cv["unique_id"].to_numpy()
            best = errors.groupby("unique_id", observed=True)[names].mean().idxmin(axis=1)
            if "unique_id" not in forecasts.columns:  # older statsforecast: the index
                forecasts = forecasts.reset_index()
            column = forecasts["unique_id"].map(best).astype(str)
            values = forecasts[names].to_numpy()
            picked = values[np.arange(len(values)), pd.Index(names).get_indexer(column)]
            chosen = pd.DataFrame({"series": forecasts["unique_id"].astype(str),
                                   "day": forecasts["ds"], "prediction": picked,
                                   "model": column})
        with timed("write"):
            chosen.to_parquet(workdir / "statsforecast.parquet", index=False)
    total = sum(parts.values())
    print(f"statsforecast in-process: {total:.1f} s", flush=True)
    return {"models": names, "parts": parts, "seconds": total,
            "peak_growth_gb": rss.growth_mb / 1024, "cpu_seconds": cpu.seconds,
            "chosen": best.value_counts().to_dict(), "series": int(len(best)),
            "forecast_rows": int(len(chosen))}


class CpuTree:
    """CPU seconds used by this process and its children (statsforecast's pool) while
    the block runs, sampled every 0.2 s for children that come and go."""

    def __enter__(self) -> CpuTree:
        self.me = psutil.Process()
        self.before = cpu_of(self.me)
        self.children: dict[int, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def run(self) -> None:
        while not self.done.wait(0.2):
            for child in self.me.children(recursive=True):
                try:
                    self.children[child.pid] = cpu_of(child)
                except psutil.Error:
                    continue

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.seconds = cpu_of(self.me) - self.before + sum(self.children.values())


# --------------------------------------------------------------------------- report


def key_of(config: str, n_series: int, label: str | None) -> str:
    return f"{config}/{n_series}" + (f"/{label}" if label else "")


def core_seconds(seconds: float, cores: int, n_series: int) -> float:
    return seconds * cores / n_series


def report(key: str, run: dict[str, Any]) -> None:
    """One run's tables: stages of the raybricks job, statsforecast's parts, ratios."""
    n, cores = run["series"], run["machine"]["cores"]
    print(f"\n## {key}: {n:,} series x {run.get('days', DAYS)} days "
          f"(short: {run['data']['short']:,}, "
          f"intermittent: {run['data']['intermittent']:,}), {cores} cores, "
          f"{run['config']}" + (f" [{run['label']}]" if run.get("label") else ""))
    print(f"models: {', '.join(run['models'])}; horizon {HORIZON}, {WINDOWS} windows, "
          f"step {STEP}")
    rb = run.get("raybricks")
    if rb:
        train, fc = rb["train"], rb.get("forecast")
        print("\n| raybricks stage | seconds | series/s | core-s/series | driver peak (GB) |")
        print("|---|---:|---:|---:|---:|")
        for verb_name, verb in (("train", train), ("forecast", fc)):
            if verb is None:
                continue
            for name, seconds in verb["timeline"]:
                if name.startswith("outside") and seconds < 0.5:
                    continue  # the moment between two stages
                rate = f"{n / seconds:,.1f}" if seconds else "-"
                print(f"| {verb_name}: {name} | {seconds:.1f} | {rate} | "
                      f"{core_seconds(seconds, cores, n):.4f} | "
                      f"{verb['stage_driver_peak_gb'].get(name, 0):.2f} |")
            print(f"| **{verb_name}: whole CLI** | {verb['seconds']:.1f} | "
                  f"{n / verb['seconds']:,.1f} | "
                  f"{core_seconds(verb['seconds'], cores, n):.4f} | "
                  f"{verb['driver_peak_gb']:.2f} |")
        res = rb["results"]
        training = train["stages"].get("training")
        print(f"\nstatus: {res['status']}; not trained: {res['not_trained_reasons']}")
        print(f"chosen (blend members): {res['chosen_members']}")
        if training:
            print(f"per-series fit_seconds: sum {res['fit_seconds_sum']:.1f} core-s "
                  f"({res['fit_seconds_sum'] / n:.4f} per series; median "
                  f"{res['fit_seconds_quantiles'].get('p50', float('nan')):.4f}, "
                  f"p99 {res['fit_seconds_quantiles'].get('p99', float('nan')):.4f}), "
                  f"against the training stage's wall x cores {training * cores:.1f} "
                  f"core-s: {res['fit_seconds_sum'] / (training * cores):.0%} of it "
                  "fitting series")
        verbs = [("train", train)] + ([("forecast", fc)] if fc else [])
        print("driver peak: " + ", ".join(f"{name} {v['driver_peak_gb']:.2f} GB"
                                          for name, v in verbs)
              + f" (goal < {DRIVER_TARGET_GB} GB); Spark JVM " + " / ".join(
                  f"{v['jvm_peak_gb']:.2f}" for _, v in verbs) + " GB; Ray and Python "
              "workers together " + " / ".join(f"{v['others_peak_gb']:.2f}" for _, v in verbs)
              + " GB. CPU seconds of the process tree: " + ", ".join(
                  f"{name} {v['cpu_seconds']:.0f}" for name, v in verbs))
        print(f"forecast: {rb['forecast_rows']:,} rows, {rb['forecast_series']:,} series "
              "with a prediction")
        verdict = "PASS" if train["driver_peak_gb"] < DRIVER_TARGET_GB else "FAIL"
        print(f"{verdict}: train's driver peak {train['driver_peak_gb']:.2f} GB (goal < "
              f"{DRIVER_TARGET_GB} GB)")
    sf = run.get("statsforecast")
    if sf:
        print("\n| statsforecast in-process | seconds | series/s | core-s/series |")
        print("|---|---:|---:|---:|")
        for name, seconds in {**sf["parts"], "**total**": sf["seconds"]}.items():
            print(f"| {name} | {seconds:.1f} | {n / seconds:,.1f} | "
                  f"{core_seconds(seconds, cores, n):.4f} |")
        print(f"its peak memory growth: {sf['peak_growth_gb']:.2f} GB (this process); "
              f"CPU seconds {sf['cpu_seconds']:.0f}; chosen: {sf['chosen']}")
        if run["config"] == "full":
            print("(statsforecast fits no lag model: its side has the ten statistical "
                  "models, raybricks' also the LightGBM on lags)")
    print(f"\n| per-core rate (core-s/series; published statsforecast: "
          f"{PUBLISHED_CORE_SECONDS:.4f}, cross-validation only, 1M series of 20-100 days, "
          "128 CPUs) | core-s/series | vs published |")
    print("|---|---:|---:|")
    if run["config"] != "cheap":
        print("(the published rate is for the nine benchmark models alone)")
    rows: dict[str, float] = {}
    if rb:
        # core time inside the tasks, as if wall x cores: the sum of fit_seconds / cores
        rows["raybricks per-series fit_seconds (core time in tasks)"] = (
            rb["results"]["fit_seconds_sum"] / cores)
        if "training" in rb["train"]["stages"]:
            rows["raybricks training stage"] = rb["train"]["stages"]["training"]
        rows["raybricks train, whole CLI"] = rb["train"]["seconds"]
        if rb.get("forecast"):
            rows["raybricks train + forecast, whole CLI"] = job_seconds(rb)
    if sf:
        rows["statsforecast cross_validation"] = sf["parts"]["cross_validation"]
        rows["statsforecast selection, all parts"] = sf["seconds"]
    for name, seconds in rows.items():
        per = core_seconds(seconds, cores, n)
        print(f"| {name} | {per:.4f} | {PUBLISHED_CORE_SECONDS / per:.3g}x |")
    if rb and sf:
        whole = job_seconds(rb)
        fitting = sf["parts"]["cross_validation"] + sf["parts"]["forecast"]
        training = rb["train"]["stages"].get("training", float("nan"))
        print(f"\nraybricks vs statsforecast in-process (ratio of series/s): whole job "
              f"({job_name(rb)} vs every part) {sf['seconds'] / whole:.2f}x; training "
              f"stage vs cross_validation + forecast {fitting / training:.2f}x")
    spark_peer = run.get("statsforecast_spark")
    if spark_peer:
        print("\n| statsforecast on Spark, a job | seconds | series/s |")
        print("|---|---:|---:|")
        for name, seconds in {**spark_peer["parts"], "**whole job**": spark_peer["seconds"]
                              }.items():
            print(f"| {name} | {seconds:.1f} | {n / seconds:,.1f} |")
        if rb:
            whole = job_seconds(rb)
            print(f"raybricks as a job ({job_name(rb)}) vs statsforecast on Spark as "
                  f"a job: {spark_peer['seconds'] / whole:.2f}x (goal: 2x)")


def on_paper(runs: dict[str, Any], target: int = 1_000_000) -> None:
    """Per configuration and label, over the saved sizes (two or more), each stage's
    seconds and the driver's peak fitted as a + b x series, at ``target`` series: what
    grows with the series and what does not."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs.values():
        if run.get("raybricks"):
            groups.setdefault((run["config"], run.get("label") or ""), []).append(run)
    for (config, label), found in sorted(groups.items()):
        found.sort(key=lambda r: r["series"])
        sizes = np.array([r["series"] for r in found], float)
        shown = ", ".join(f"{int(s):,}" for s in sizes)
        if len(sizes) < 2:
            print(f"\n{config}{f' [{label}]' if label else ''}: {target:,} series on paper "
                  f"needs two sizes or more (saved: {shown})")
            continue
        cores = found[-1]["machine"]["cores"]
        print(f"\n## {config}{f' [{label}]' if label else ''}: {target:,} series on paper, "
              f"fitted as a + b x series on {shown} series, {cores} cores")
        print(f"| what | b: per 1,000 series | a: fixed | at {target:,} | "
              f"core-s/series at {target:,} | at {target:,} |")
        print("|---|---:|---:|---:|---:|---|")
        if sizes.max() < 5_000:
            print("(sizes under 5,000 series: start-up and noise rule every stage; the "
                  "fit checks the arithmetic, it predicts nothing)")
        measures: dict[str, list[float]] = {}
        for r in found:
            rb = r["raybricks"]
            for verb in ("train", "forecast"):
                if not rb.get(verb):  # forecast.output: the train job forecast too
                    continue
                for stage, seconds in rb[verb]["timeline"]:
                    measures.setdefault(f"{verb}: {stage} (s)", []).append(seconds)
                measures.setdefault(f"{verb}: whole CLI (s)", []).append(rb[verb]["seconds"])
                measures.setdefault(f"{verb}: driver peak (GB)", []).append(
                    rb[verb]["driver_peak_gb"])
                measures.setdefault(f"{verb}: Spark JVM peak (GB)", []).append(
                    rb[verb]["jvm_peak_gb"])
            if r.get("statsforecast"):
                measures.setdefault("statsforecast: all parts (s)", []).append(
                    r["statsforecast"]["seconds"])
                measures.setdefault("statsforecast: memory growth (GB)", []).append(
                    r["statsforecast"]["peak_growth_gb"])
        for name, values in measures.items():
            if len(values) != len(sizes) or max(values) < 0.5 and name.endswith("(s)"):
                continue  # a stage some run did not have, or moments between stages
            a, b = linear_fit(sizes, np.array(values, float))
            at = a + b * target
            per = (f"{core_seconds(at, cores, target):.4f}" if name.endswith("(s)")
                   else "-")
            grows = "grows" if b * target > a else "fixed"
            print(f"| {name} | {b * 1000:.3f} | {a:.2f} | {at:,.1f} | {per} | {grows} |")


def linear_fit(sizes: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """a, b of values = a + b x sizes by least squares, neither below zero (a stage does
    not get faster with more series, nor take less than no time)."""
    b, a = np.polyfit(sizes, values, 1)
    if b < 0:
        return float(values.mean()), 0.0
    if a < 0:
        return 0.0, float(values @ sizes / (sizes @ sizes))
    return float(a), float(b)


def machine() -> dict[str, Any]:
    import importlib.metadata as md

    import raybricks

    versions = {}
    for package in ("raybricks", "statsforecast", "mlforecast", "ray", "pyspark", "mlflow",
                    "lightgbm", "numpy", "pandas"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = None
    source = Path(raybricks.__file__).parent
    revision = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--", "."],
                           capture_output=True, text=True).stdout.strip()
    return {"cores": os.cpu_count(), "memory_gb": psutil.virtual_memory().total / GB,
            "python": platform.python_version(), "platform": platform.platform(),
            "load_average_at_start": os.getloadavg(), "versions": versions,
            "raybricks_source": str(source),
            "raybricks_revision": revision + ("+changes" if dirty else ""),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def load_saved() -> dict[str, Any]:
    if RESULTS_FILE.exists():
        return json.loads(RESULTS_FILE.read_text())
    return {"meta": {"published_statsforecast": PUBLISHED | {
        "core_seconds_per_series": PUBLISHED_CORE_SECONDS,
        "source": "Nixtla/statsforecast experiments/benchmarks_at_scale (README, "
                  "src/experiment.py, src/data.py)"}}, "runs": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="cheap")
    parser.add_argument("--skip-peer", action="store_true",
                        help="raybricks only (no statsforecast in-process)")
    parser.add_argument("--spark-peer", action="store_true",
                        help="also statsforecast on Spark, as a job of its own")
    parser.add_argument("--skip-raybricks", action="store_true",
                        help="statsforecast in-process only")
    parser.add_argument("--label", default=None,
                        help="saved apart from the unlabelled runs (e.g. smoke)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--days", type=int, default=DAYS,
                        help="each series' length in days (statsforecast's scale benchmark: "
                        "20 to 100); label the run (--label) when not the default")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "rb-bench",
                                                        "forecast-scale"),
                        help="where the generated series are kept between runs")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run's directory (MLflow store, run, forecasts)")
    parser.add_argument("--report", action="store_true",
                        help="print the tables of the saved results and exit")
    args = parser.parse_args()
    saved = load_saved()
    if args.report:
        for key, run in saved["runs"].items():
            report(key, run)
        on_paper(saved["runs"])
        return

    table, data = series_table(Path(args.cache), args.series, args.seed, args.days)
    models = [name for name, _ in CONFIGS[args.config]["statistical"]]
    if CONFIGS[args.config]["lags"]:
        models.append("LightGBM on lags (raybricks only)")
    run: dict[str, Any] = {"config": args.config, "series": args.series,
                           "label": args.label, "seed": args.seed, "days": args.days,
                           "horizon": HORIZON, "windows": WINDOWS, "step": STEP,
                           "models": models, "data": data | {"path": str(table)},
                           "machine": machine()}
    workdir = Path(tempfile.mkdtemp(prefix="rb-forecast-scale-", dir=args.cache))
    try:
        if not args.skip_raybricks:
            run["raybricks"] = run_raybricks(args.config, table, args.series, workdir)
        if not args.skip_peer:
            run["statsforecast"] = run_statsforecast(args.config, table, workdir)
        if args.spark_peer:
            run["statsforecast_spark"] = run_statsforecast_spark(args.config, table, workdir)
    except BaseException:
        print(f"kept {workdir} (the run's log is under runs/ and .raybricks/logs/)")
        raise
    if args.keep:
        print(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    run["machine"]["load_average_at_end"] = os.getloadavg()
    key = key_of(args.config, args.series, args.label)
    saved = load_saved()  # another run may have saved meanwhile
    saved["runs"][key] = run
    RESULTS.mkdir(exist_ok=True)
    RESULTS_FILE.write_text(json.dumps(saved, indent=2, default=str))
    report(key, run)
    on_paper({k: r for k, r in saved["runs"].items()
              if r["config"] == args.config and r.get("label") == args.label})
    print(f"\nsaved {RESULTS_FILE} [{key}]")


if __name__ == "__main__":
    main()
