"""What a long daily history costs AutoETS and AutoARIMA, and what trimming it saves.

statsforecast in-process on one core (``n_jobs=1``; its CPU seconds, so a busy machine
slows the run, not the figures; raybricks' statistical candidates call
the same models' ``forecast`` on each series' arrays, so a series costs them the same),
on generated daily series (``bench_forecast_cost.generated``: trend, weekly and yearly
seasonality, noise, every seventh intermittent) of 2, 5 and 20 years, season 7:

* the final fit and forecast alone (what a job with no backtest window would pay), and
  ``cross_validation`` with 1 and 3 windows of the horizon (what selection adds);
* the 20-year series trimmed to their last 2 years (``source.where`` on the time column)
  against the whole history: seconds, and the MAE of the next 28 days (held out from
  both) relative to the seasonal naive forecast's.

A configuration whose estimate (its one-window time times its windows) is over
``--budget`` seconds a series is not run (each window is one more fit: linear).

Usage: ``python bench/bench_history_cost.py [--series 4] [--years 2,5,20]``; results in
``bench/results/history-cost.json``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_forecast_cost import generated  # noqa: E402
from common import RESULTS  # noqa: E402

HORIZON = 28
SEASON = 7
DAYS_A_YEAR = 365.25


def models(name: str) -> list:
    from statsforecast.models import AutoARIMA, AutoETS

    return [{"AutoETS": AutoETS, "AutoARIMA": AutoARIMA}[name](season_length=SEASON)]


def seconds_per_series(data: pd.DataFrame, name: str, windows: int) -> float:
    """statsforecast's fit and forecast of every series (``windows`` 0), or its
    ``cross_validation`` over ``windows`` windows of the horizon, per series."""
    from statsforecast import StatsForecast

    frame = data.rename(columns={"series": "unique_id", "day": "ds", "sales": "y"})
    sf = StatsForecast(models=models(name), freq="D", n_jobs=1)
    start = time.process_time()
    if windows:
        sf.cross_validation(df=frame, h=HORIZON, n_windows=windows, step_size=HORIZON)
    else:
        sf.forecast(df=frame, h=HORIZON)
    return (time.process_time() - start) / frame.unique_id.nunique()


def trimmed_against_whole(data: pd.DataFrame, name: str, keep_days: int) -> dict:
    """The last ``HORIZON`` days held out; each series forecast from its whole history
    and from its last ``keep_days``: seconds a series and MAE over seasonal naive's."""
    from statsforecast import StatsForecast
    from statsforecast.models import SeasonalNaive

    frame = data.rename(columns={"series": "unique_id", "day": "ds", "sales": "y"})
    last = frame.ds.max()
    train = frame[frame.ds <= last - pd.Timedelta(days=HORIZON)]
    actual = frame[frame.ds > last - pd.Timedelta(days=HORIZON)].set_index(["unique_id", "ds"])
    recent = train[train.ds > train.ds.max() - pd.Timedelta(days=keep_days)]
    found = {}
    for label, part in (("whole", train), ("trimmed", recent)):
        sf = StatsForecast(models=[*models(name), SeasonalNaive(season_length=SEASON)],
                           freq="D", n_jobs=1)
        start = time.process_time()
        forecast = sf.forecast(df=part, h=HORIZON).set_index(["unique_id", "ds"])
        took = (time.process_time() - start) / frame.unique_id.nunique()
        joined = forecast.join(actual)
        error = float(np.mean(np.abs(joined[name] - joined.y)))
        naive = float(np.mean(np.abs(joined.SeasonalNaive - joined.y)))
        found[label] = {"seconds_per_series": took, "mae": error,
                        "mae_over_seasonal_naive": error / naive}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=4)
    parser.add_argument("--years", default="2,5,20")
    parser.add_argument("--windows", default="0,1,3")
    parser.add_argument("--models", default="AutoETS,AutoARIMA")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="seconds a series: a configuration estimated (from its one-window "
                             "time) above it is not run")
    parser.add_argument("--output", default="history-cost.json")
    args = parser.parse_args()
    years = [float(y) for y in args.years.split(",")]
    windows = [int(w) for w in args.windows.split(",")]
    names = args.models.split(",")
    # numba compiles the models once: not part of any series' cost
    warm = generated(2, 400)
    for name in names:
        seconds_per_series(warm, name, 1)
    rows = []
    for name in names:
        for year in years:
            data = generated(args.series, int(round(year * DAYS_A_YEAR)))
            one = None
            for count in windows:
                if one is not None and count > 1 and one * count > args.budget:
                    print(f"{name} {year:g} years, {count} window(s): not run (about "
                          f"{one * count:.0f} s a series, over the budget)", flush=True)
                    rows.append({"model": name, "years": year, "windows": count,
                                 "seconds_per_series": None})
                    continue
                took = seconds_per_series(data, name, count)
                one = took if count == 1 else one
                rows.append({"model": name, "years": year, "windows": count,
                             "seconds_per_series": took})
                print(f"{name} {year:g} years, {count} window(s): {took:.3f} s a series",
                      flush=True)
    trims = {}
    longest = max(years)
    for name in names:
        data = generated(args.series, int(round(longest * DAYS_A_YEAR)))
        trims[name] = trimmed_against_whole(data, name, int(round(2 * DAYS_A_YEAR)))
        print(f"{name} {longest:g} years whole vs last 2 years: {trims[name]}", flush=True)
    import statsforecast

    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / args.output).write_text(json.dumps({
        "meta": {"python": platform.python_version(), "statsforecast": statsforecast.__version__,
                 "series": args.series, "horizon": HORIZON, "season": SEASON,
                 "load_average_at_end": os.getloadavg(),
                 "date": time.strftime("%Y-%m-%d %H:%M")},
        "rows": rows, "trimmed_to_two_years": trims}, indent=1))


if __name__ == "__main__":
    main()
