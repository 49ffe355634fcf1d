"""What one series costs, per kind of forecasting candidate, on one core: the work a Ray
task does for its block of series (``ForecastTask.trainer``: clean every series, backtest
every candidate and the naive baselines, select per series, refit the choice), run
in-process on one core with no Ray, Spark or MLflow around it; and how that cost grows
with history length, backtest windows and horizon. Beside it, statsforecast in-process on
one core (``n_jobs=1``) doing the same statistical work: ``cross_validation`` over the
same windows, ``forecast``, and the best model per series by backtest MAE.

Series: daily, generated (trend, weekly and yearly seasonality, noise; every seventh
intermittent), seeded. Reported per configuration: core milliseconds per series
(raybricks and statsforecast), and the share of raybricks' time spent inside the
candidates' own backtests and refits (``ForecastKind.backtest``/``backtest_many``/
``fit_series``: the models' fits and forecasts, and for lag models mlforecast's features).

Usage: ``python bench/bench_forecast_cost.py [--series 200] [--quick]``; results in
``bench/results/forecast-cost.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS  # noqa: E402

NINE = [("croston", "CrostonClassic", {}), ("adida", "ADIDA", {}), ("imapa", "IMAPA", {}),
        ("naive", "Naive", {}), ("snaive", "SeasonalNaive", {"season_length": 7}),
        ("historic", "HistoricAverage", {}), ("window", "WindowAverage", {"window_size": 7}),
        ("swindow", "SeasonalWindowAverage", {"season_length": 7, "window_size": 4}),
        ("ses_season", "SeasonalExponentialSmoothing", {"season_length": 7, "alpha": 0.1})]
LGBM = {"name": "lgbm", "kind": "lightgbm",
        "params": {"n_estimators": 50, "num_leaves": 15, "min_child_samples": 10}}


def statistical(names: list[tuple[str, str, dict]]) -> list[dict[str, Any]]:
    return [{"name": n, "kind": "statsforecast", "estimator": e, "params": p}
            for n, e, p in names]


#: Candidate sets measured: name -> (raybricks models, statsforecast models or None).
KINDS = {
    "nine statistical": (statistical(NINE), NINE),
    "AutoETS": (statistical([("ets", "AutoETS", {"season_length": 7})]),
                [("ets", "AutoETS", {"season_length": 7})]),
    "LightGBM on lags": ([LGBM], None),
}


def generated(series: int, days: int, seed: int = 0) -> pd.DataFrame:
    """``series`` daily series of ``days`` days ending on the same day (vectorized)."""
    rng = np.random.default_rng(seed)
    t = np.arange(days)
    level = rng.uniform(5, 200, (series, 1))
    trend = rng.normal(0, 0.02, (series, 1)) * level / 100 * t
    weekly = rng.uniform(0, 0.3, (series, 1)) * level * np.sin(2 * np.pi * t / 7
                                                                 + rng.uniform(0, 6, (series, 1)))
    yearly = rng.uniform(0, 0.2, (series, 1)) * level * np.sin(2 * np.pi * t / 365.25)
    values = np.maximum(level + trend + weekly + yearly
                        + rng.normal(0, 1, (series, days)) * 0.1 * level, 0)
    sparse = np.arange(series) % 7 == 3  # intermittent: mostly zeros
    values[sparse] = rng.poisson(0.3, (int(sparse.sum()), days)) * rng.uniform(1, 5)
    end = pd.Timestamp("2025-12-31")
    return pd.DataFrame({
        "series": np.repeat([f"s{i:06d}" for i in range(series)], days),
        "day": np.tile(pd.date_range(end=end, periods=days, freq="D").to_numpy(), series),
        "sales": values.ravel()})


class Timed:
    """Seconds spent inside the candidates' own work (the kinds' backtests and fits)."""

    METHODS = ("backtest", "backtest_many", "fit_series")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.depth = 0

    def __enter__(self) -> Timed:
        from raybricks.kinds.forecasting import ForecastKind
        from raybricks.kinds.lags import LagsKind
        from raybricks.kinds.statsforecast import StatsForecastKind

        self.saved = []
        for owner in (ForecastKind, StatsForecastKind, LagsKind):
            for name in self.METHODS:
                if name in owner.__dict__:
                    original = owner.__dict__[name]
                    self.saved.append((owner, name, original))
                    setattr(owner, name, self.wrap(original))
        return self

    def wrap(self, method):
        @functools.wraps(method)
        def timed(*args, **kwargs):
            self.depth += 1
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.depth -= 1
                if not self.depth:  # the outermost call (a kind's backtest calls fit_series)
                    self.seconds += time.perf_counter() - start
        return timed

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in self.saved:
            setattr(owner, name, original)


def raybricks_block(data: pd.DataFrame, models: list[dict], horizon: int, windows: int,
                    workdir: Path) -> dict[str, float]:
    """One block of every series, trained as a Ray task trains it, on this core."""
    from raybricks.config import JobConfig
    from raybricks.data import segment_bounds
    from raybricks.training.forecast.task import FORECAST
    from raybricks.training.tasks import make_plan

    config = JobConfig.from_dict({
        "source": {"table": "generated"}, "segment_by": ["series"], "target": "sales",
        "time_column": "day", "task": "forecast", "models": models,
        "forecast": {"horizon": horizon, "frequency": "D", "season_length": 7,
                     "lags": [1, 7, 14, 28], "rolling": {"mean": [7, 28]},
                     "date_features": ["dayofweek", "month"]},
        "validation": {"windows": windows},
        "training": {"output_dir": str(workdir), "progress": False}})
    table = pa.Table.from_pandas(data, preserve_index=False)
    plan = make_plan(config, table.schema, 1)
    plan = replace(plan, forecast=replace(plan.forecast, end=str(data.day.max())))
    frame = table.select(plan.columns).to_pandas()
    todo = list(segment_bounds(table, plan.segment_by))
    warm = todo[:2]
    FORECAST.trainer(frame, warm, plan)(*warm[0])  # imports, first calls
    with Timed() as inside:
        start = time.perf_counter()
        train = FORECAST.trainer(frame, todo, plan)
        rows = [train(key, first, end)[0] for key, first, end in todo]
        seconds = time.perf_counter() - start
    statuses = pd.Series([r.status for r in rows]).value_counts().to_dict()
    return {"seconds": seconds, "inside": inside.seconds, "statuses": statuses}


def statsforecast_alone(data: pd.DataFrame, models: list[tuple], horizon: int,
                        windows: int) -> float:
    """statsforecast in-process on one core: cross-validation, forecast, best per series."""
    import statsforecast.models as sm
    from statsforecast import StatsForecast

    built = [getattr(sm, estimator)(alias=name, **params) for name, estimator, params in models]
    frame = data.rename(columns={"series": "unique_id", "day": "ds", "sales": "y"})
    start = time.perf_counter()
    forecaster = StatsForecast(models=built, freq="D", n_jobs=1)
    backtests = forecaster.cross_validation(df=frame, h=horizon, n_windows=windows,
                                            step_size=horizon)
    names = [name for name, _, _ in models]
    errors = backtests[names].sub(backtests["y"], axis=0).abs()
    best = errors.groupby(backtests["unique_id"].to_numpy()).mean().idxmin(axis=1)
    forecasts = forecaster.forecast(df=frame, h=horizon)
    chosen = forecasts.set_index("unique_id")
    chosen = [chosen.loc[[uid], name] for uid, name in best.items()]
    assert len(chosen) == frame.unique_id.nunique()
    return time.perf_counter() - start


def measure(kind: str, series: int, days: int, horizon: int, windows: int,
            workdir: Path) -> dict[str, Any]:
    models, peer = KINDS[kind]
    data = generated(series, days)
    found = raybricks_block(data, models, horizon, windows, workdir)
    row = {"kind": kind, "series": series, "days": days, "horizon": horizon,
           "windows": windows, "raybricks_ms": 1000 * found["seconds"] / series,
           "inside_share": found["inside"] / found["seconds"], "statuses": found["statuses"]}
    if peer is not None:
        row["statsforecast_ms"] = 1000 * statsforecast_alone(data, peer, horizon,
                                                             windows) / series
    peer_text = (f"statsforecast {row['statsforecast_ms']:7.1f} ms"
                 if "statsforecast_ms" in row else "")
    print(f"{kind:18s} {days:5d} days h={horizon:3d} windows={windows}: raybricks "
          f"{row['raybricks_ms']:7.1f} ms a series ({row['inside_share']:.0%} inside the "
          f"candidates) {peer_text}", flush=True)
    return row


def share(kind: str, series: int) -> int:
    """How many series a kind is measured on: all for the cheap models, fewer for the
    costly ones (a per-series cost needs no more)."""
    return series if kind == "nine statistical" else max(series // 4, 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="the default shape only")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore")
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="rb-forecast-cost-"))
    rows = []
    base = {"days": 730, "horizon": 28, "windows": 7}
    for kind in KINDS:
        rows.append(measure(kind, share(kind, args.series), workdir=workdir, **base))
    if not args.quick:
        for kind in ("nine statistical", "LightGBM on lags"):
            count = share(kind, args.series)
            for change in ({"days": 365}, {"days": 1460}, {"windows": 1}, {"windows": 3},
                           {"horizon": 7}, {"horizon": 56}):
                rows.append(measure(kind, count, workdir=workdir, **(base | change)))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "forecast-cost.json"
    path.write_text(json.dumps({"meta": {
        "machine": platform.machine(), "cores_used": 1, "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d")}, "results": rows}, indent=2, default=str))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
