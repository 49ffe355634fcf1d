"""Selection, ensemble and interval rules for forecasts, compared on held-out periods.

The study behind the forecasting defaults (docs/forecasting.md). Per series of
``bench_forecast``'s datasets, every candidate (the statistical ones, LightGBM and Ridge on
lags) and both naive forecasts are backtested with raybricks' own functions (the same
windows as ``raybricks train``) and refitted once on the whole training history; then each
rule below is applied to the same backtests, and its blend scored on the held-out periods
(median MASE over series, scaled as ``bench_forecast`` scales it) with its intervals'
coverage. In-process, both cores (one process per core); the backtests are cached in
``--cache`` so rules can be changed and re-scored in seconds.

Usage: ``python bench/forecast_rules.py [routes|employment|housing ...] [--cache DIR]
[--windows N] [--step N] [--holidays]`` (default: ``bench_forecast``'s windows, a horizon
apart; ``--holidays``: the routes with ``forecast.holidays: US``)
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
from bench_forecast import DATASETS, Dataset, candidates, mase_scale  # noqa: E402
from bench_forecast import WINDOWS as DEFAULT_WINDOWS  # noqa: E402

WINDOWS, STEP = DEFAULT_WINDOWS, None  # the backtest's windows; set by --windows/--step
HOLIDAYS = False  # --holidays: the dataset's holidays taken out of the histories
STATISTICAL_ONLY = "statistical"
WITH_LAGS = "+ lags"


@dataclass
class Backtested:
    """One series: every candidate's backtest (scaled as the training metric is) and
    held-out forecast, the naive forecasts' too."""

    uid: str
    actual: np.ndarray  # backtest actuals / divisor
    divisor: float
    backtests: dict[str, np.ndarray]  # candidate -> backtest forecasts / divisor
    held_out: dict[str, np.ndarray]  # candidate -> forecast of the held-out periods
    truth: np.ndarray  # the held-out actuals
    mase_scale: float  # bench_forecast's: seasonal naive MAE over the whole history


def job_config(data: Dataset):
    from raybricks.config import JobConfig

    statistical, lags = candidates(data)
    return JobConfig.from_dict({
        "source": {"path": "unused.parquet"}, "segment_by": ["unique_id"], "target": "y",
        "time_column": "ds", "task": "forecast",
        "forecast": {"horizon": data.horizon, "frequency": data.frequency,
                     "season_length": data.season, "intervals": [80, 95], **data.features,
                     **({"holidays": data.holidays} if HOLIDAYS else {})},
        "validation": {"windows": WINDOWS, "step": STEP}, "models": statistical + lags,
        "min_rows": 60,
    })


_PLAN = None
_DATA: Dataset | None = None


def _backtest_one(uid: str) -> Backtested | None:
    from raybricks import kinds
    from raybricks.kinds.forecasting import TIME, future_times
    from raybricks.training.forecast import backtest as fc
    from raybricks.training.forecast.series import clean_series, scale, windows
    from raybricks.training.plan import stable_seed
    from raybricks.training.selection import Skip

    plan, data = _PLAN, _DATA
    rows = data.train[data.train.unique_id == uid]
    try:
        series = clean_series(rows, plan)
    except Skip:
        return None
    spec, y = plan.forecast, series.y
    origins = windows(len(y), spec)
    actual = np.concatenate([y[o:o + spec.horizon] for o in origins])
    divisor = scale(y[:origins[0]], spec.season_length)
    backtests, held_out = {}, {}
    future = pd.DataFrame({TIME: future_times(spec.frequency, series.frame[TIME].iloc[-1],
                                              spec.horizon)})
    for candidate in [*plan.candidates, *fc.baselines(spec)]:
        name = candidate.name if candidate.name != "baseline" else candidate.estimator
        found = fc.backtest_candidate(series, candidate, plan, (uid,), origins,
                                      actual / divisor, divisor)
        if found.error is not None:
            continue
        kind = kinds.forecaster(candidate)
        model = kind.fit_series(found.params, series.frame,
                                stable_seed(plan.seed, (uid,), candidate.name, "fit"),
                                1, spec)
        backtests[name] = found.predictions
        held_out[name] = np.asarray(kind.forecast(model, future, spec), dtype="float64")
    truth = data.test[data.test.unique_id == uid].set_index("ds").y
    truth = truth.reindex(future[TIME]).to_numpy(dtype="float64")
    return Backtested(uid, actual / divisor, divisor, backtests, held_out, truth,
                      mase_scale(rows.y.to_numpy(), data.season))


def backtest_all(data: Dataset, cache: Path) -> list[Backtested]:
    """Every series' backtests and held-out forecasts (from ``cache`` when there)."""
    suffix = "" if (WINDOWS, STEP) == (DEFAULT_WINDOWS, None) else f"-{WINDOWS}x{STEP}"
    suffix += "-holidays" if HOLIDAYS else ""
    path = cache / f"rules-{data.name}{suffix}.pkl"
    if path.exists():  # plain dicts: readable whichever module ran the study
        return [Backtested(**found) for found in pickle.loads(path.read_bytes())]
    from raybricks.training.forecast.task import forecast_plan

    global _PLAN, _DATA
    schema = pa.schema([("unique_id", pa.string()), ("ds", pa.timestamp("us")),
                        ("y", pa.float64())])
    _PLAN, _DATA = forecast_plan(job_config(data), schema, 1), data
    with get_context("fork").Pool(2) as pool:
        found = pool.map(_backtest_one, sorted(data.train.unique_id.unique()), chunksize=4)
    found = [f for f in found if f is not None]
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps([asdict(f) for f in found]))
    return found


# --------------------------------------------------------------------------- rules
# A rule maps a series' backtests (candidate -> scaled forecasts) and actuals to weights.

Rule = Callable[[dict[str, np.ndarray], np.ndarray], dict[str, float]]


def ranked(backtests: dict[str, np.ndarray], actual: np.ndarray) -> list[tuple[str, float]]:
    errors = {n: float(np.mean(np.abs(p - actual))) for n, p in backtests.items()}
    return sorted(errors.items(), key=lambda item: item[1])


def inverse_error(chosen: list[tuple[str, float]], power: float = 1.0) -> dict[str, float]:
    raw = {n: 1.0 / max(e, 1e-12) ** power for n, e in chosen}
    total = sum(raw.values())
    return {n: w / total for n, w in raw.items()}


def within(share: float | None, top_k: int = 3, power: float = 1.0) -> Rule:
    """Of the best ``top_k``, those within ``share`` of the best, weighted."""
    def rule(backtests, actual):
        order = ranked(backtests, actual)[:top_k]
        best = order[0][1]
        return inverse_error([(n, e) for n, e in order
                              if share is None or e <= best * (1 + share) + 1e-12], power)
    return rule


def alone(name: str) -> Rule:
    """One candidate (or naive forecast) for every series."""
    return lambda backtests, actual: {name: 1.0}


def best() -> Rule:
    return lambda backtests, actual: {ranked(backtests, actual)[0][0]: 1.0}


def indistinct(z: float, top_k: int = 3, share: float = 0.1) -> Rule:
    """Of the best ``top_k``, those within ``share`` of the best or whose mean absolute
    error is not ``z`` standard errors above the best's (paired over the backtest's
    periods), weighted."""
    def rule(backtests, actual):
        order = ranked(backtests, actual)[:top_k]
        leader, best_error = order[0]
        lead = np.abs(backtests[leader] - actual)
        kept = []
        for name, error in order:
            gap = np.abs(backtests[name] - actual) - lead
            se = gap.std(ddof=1) / np.sqrt(len(gap)) if len(gap) > 1 else 0.0
            if error <= best_error * (1 + share) + 1e-12 or gap.mean() <= z * se:
                kept.append((name, error))
        return inverse_error(kept)
    return rule


def chosen_across_series(options: dict[str, Rule], series: list[Backtested],
                         names: set[str], horizon: int) -> tuple[str, Rule]:
    """Of ``options``, the rule whose blends (chosen on all windows but the last) score
    best on the last backtest window, median over series: one choice for the job."""
    cut = len(series[0].actual) - horizon if series else 0
    scores = {}
    for label, rule in options.items():
        values = []
        for s in series:
            backtests = {n: p for n, p in s.backtests.items() if n in names}
            if not backtests:
                continue
            weights = rule({n: p[:cut] for n, p in backtests.items()}, s.actual[:cut])
            last = sum(backtests[n][cut:] * w for n, w in weights.items())
            values.append(np.mean(np.abs(last - s.actual[cut:])))
        scores[label] = float(np.median(values))
    label = min(scores, key=scores.get)
    return label, options[label]


def naive_competes(rule: Rule) -> Rule:
    """``rule`` over the candidates and the naive forecasts (``selection: all``)."""
    rule.naive = True
    return rule


def naive_replaces(rule: Rule) -> Rule:
    """``rule``'s blend, replaced by the better naive forecast where that backtests
    better."""
    def replaced(backtests, actual):
        local = {n: p for n, p in backtests.items() if n not in NAIVE_NAMES}
        weights = rule(local, actual)
        blend = sum(local[n] * w for n, w in weights.items())
        naive = ranked({n: p for n, p in backtests.items() if n in NAIVE_NAMES}, actual)[0]
        return {naive[0]: 1.0} if naive[1] < np.mean(np.abs(blend - actual)) else weights
    replaced.naive = True
    return replaced


def noise_rule(rule: Rule, margin: float = 1.0, shrink: float = 0.0) -> Rule:
    """``selection: all`` as raybricks applies it (``ensemble.margin``,
    ``ensemble.shrink``): ``rule``'s blend of the candidates serves only where it beats
    the better naive forecast by more than ``margin`` standard errors of their paired
    errors over the backtest's periods (else the naive forecast), with ``shrink`` of the
    weight moved to the naive forecast."""
    def guarded(backtests, actual):
        local = {n: p for n, p in backtests.items() if n not in NAIVE_NAMES}
        weights = rule(local, actual)
        blend = sum(local[n] * w for n, w in weights.items())
        naive = ranked({n: p for n, p in backtests.items() if n in NAIVE_NAMES}, actual)[0]
        gap = np.abs(blend - actual) - np.abs(backtests[naive[0]] - actual)
        error = gap.std(ddof=1) / np.sqrt(len(gap))
        clearly = gap.mean() < 0 and -gap.mean() > margin * error
        if not clearly:
            return {naive[0]: 1.0}
        return {n: w * (1 - shrink) for n, w in weights.items()} | (
            {naive[0]: shrink} if shrink else {})
    guarded.naive = True
    return guarded


NAIVE_NAMES = {"SeasonalNaive", "Naive"}  # the baselines' names in ``Backtested``


def rules() -> dict[str, Rule]:
    return {
        "within 10%, weighted (default)": within(0.1),
        "best 3, weighted": within(None),
        "within 50%, weighted": within(0.5),
        "best 3, weights 1/error^2": within(None, power=2.0),
        "best": best(),
        "within 10% or within 1 se": indistinct(1.0),
        "within 10% or within 2 se": indistinct(2.0),
        "within 0% or within 1 se": indistinct(1.0, share=0.0),
        "within 0% or within 2 se": indistinct(2.0, share=0.0),
        "all (the naive forecasts compete), best": naive_competes(best()),
        "all, within 10%, weighted": naive_competes(within(0.1)),
        "within 10%, replaced by a better naive": naive_replaces(within(0.1)),
        "all, within 10%, noise rule (margin 1, shrink 0.5)": noise_rule(within(0.1),
                                                                         shrink=0.5),
        "all, within 10%, noise rule (margin 1, no shrink)": noise_rule(within(0.1)),
        "all, within 10%, noise rule (margin 2, no shrink)": noise_rule(within(0.1), 2.0),
        "AutoETS alone": alone("autoets"),
        "the seasonal naive alone": naive_competes(alone("SeasonalNaive")),
    }


def apply(rule: Rule, series: list[Backtested], names: set[str]) -> pd.DataFrame:
    """Per series, the rule's held-out MASE and its blend's backtest errors: on the
    windows it was chosen on (``errors``), and each window's of the blend chosen on the
    other windows (``cross_errors``, as ``raybricks train`` calibrates intervals)."""
    rows = []
    if getattr(rule, "naive", False):
        names = names | NAIVE_NAMES
    for s in series:
        backtests = {n: p for n, p in s.backtests.items() if n in names}
        if not backtests:
            continue
        weights = rule(backtests, s.actual)
        forecast = sum(s.held_out[n] * w for n, w in weights.items())
        blend = sum(s.backtests[n] * w for n, w in weights.items())
        known = ~np.isnan(s.truth)
        scored = np.abs(forecast - s.truth)[known]
        rows.append({"uid": s.uid, "members": len(weights),
                     "mae": scored.mean() if known.any() else np.nan,
                     "mase": scored.mean() / s.mase_scale
                     if s.mase_scale > 0 and known.any() else np.nan,
                     "forecast": forecast, "truth": s.truth,
                     "errors": (np.abs(blend - s.actual) * s.divisor).reshape(WINDOWS, -1),
                     "cross_errors": cross_selected(rule, backtests, s.actual) * s.divisor})
    return pd.DataFrame(rows)


def cross_selected(rule: Rule, backtests: dict[str, np.ndarray], actual: np.ndarray
                   ) -> np.ndarray:
    """Windows x horizon absolute errors, each window's of the blend ``rule`` chooses on
    the other windows."""
    window = np.arange(len(actual)) // (len(actual) // WINDOWS)
    errors = []
    for left_out in range(WINDOWS):
        others = window != left_out
        weights = rule({n: p[others] for n, p in backtests.items()}, actual[others])
        blend = sum(backtests[n] * w for n, w in weights.items())
        errors.append(np.abs(blend - actual)[~others])
    return np.stack(errors)


# --------------------------------------------------------------------------- intervals


def coverage(scored: pd.DataFrame, offsets: Callable, errors: str) -> dict[int, float]:
    """Share of held-out actuals inside the 80% and 95% intervals ``offsets`` gives from
    the ``errors`` column."""
    inside = {80: [], 95: []}
    for _, row in scored.iterrows():
        bounds = np.asarray(offsets(row[errors], [80, 95]))  # lo95, lo80, hi80, hi95 x horizon
        known = ~np.isnan(row.truth)
        for level, (lo, hi) in {80: (1, 2), 95: (0, 3)}.items():
            ok = ((row.truth >= row.forecast + bounds[lo])
                  & (row.truth <= row.forecast + bounds[hi]))[known]
            inside[level].extend(ok.tolist())
    return {level: float(np.mean(v)) for level, v in inside.items()}


def interval_methods(horizon: int) -> dict[str, Callable]:
    from raybricks.kinds.forecasting import conformal_offsets, interval_neighbours

    return {
        "half of the horizon each side (default)":
            lambda e, levels: conformal_offsets(e, levels, interval_neighbours(horizon)),
        "quarter of the horizon each side":
            lambda e, levels: conformal_offsets(e, levels, horizon // 4),
        "every step": lambda e, levels: conformal_offsets(e, levels, horizon),
        "own step only": lambda e, levels: conformal_offsets(e, levels, 0),
        "conformal_distribution, quarter each side (before)":
            lambda e, levels: distribution(e, levels, horizon // 4),
        "conformal_distribution, own step (statsforecast)":
            lambda e, levels: distribution(e, levels, 0),
    }


def distribution(errors: np.ndarray, levels: list[float], neighbours: int) -> np.ndarray:
    """statsforecast's and mlforecast's ``conformal_distribution`` bounds (interpolated
    quantiles of the forecast plus and minus each error), on the pooled errors."""
    cuts = [(100 - level) / 200 for level in reversed(levels)]
    cuts += [1 - (100 - level) / 200 for level in levels]
    pooled = [errors[:, max(step - neighbours, 0):step + neighbours + 1].ravel()
              for step in range(errors.shape[1])]
    return np.stack([np.quantile(np.concatenate([-e, e]), cuts) for e in pooled], axis=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("datasets", nargs="*", default=["routes", "employment"])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/raybricks-forecast-rules"))
    parser.add_argument("--windows", type=int, default=DEFAULT_WINDOWS)
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--holidays", action="store_true",
                        help="take the dataset's holidays (forecast.holidays) out of the "
                             "histories")
    args = parser.parse_args()
    global WINDOWS, STEP, HOLIDAYS
    WINDOWS, STEP, HOLIDAYS = args.windows, args.step, args.holidays
    for name in args.datasets:
        data = DATASETS[name]()
        series = backtest_all(data, args.cache)
        statistical = {c.lower() for c in data.statistical}
        sets = {STATISTICAL_ONLY: statistical,
                WITH_LAGS: statistical | {"lgbm", "ridge"}}
        print(f"\n{name}: {len(series)} series; held-out MASE (median), MAE (median), "
              "members (mean)")
        for label, rule in rules().items():
            cells = []
            for names in sets.values():
                scored = apply(rule, series, names)
                cells.append(f"{scored.mase.median():.3f} {scored.mae.median():.4g} "
                             f"({scored.members.mean():.2f})")
            print(f"  {label:40s} " + "  ".join(cells))
        options = {"within 10%": within(0.1), "within 50%": within(0.5),
                   "best 3": within(None), "best": best()}
        cells = []
        for names in sets.values():
            label, rule = chosen_across_series(options, series, names, data.horizon)
            scored = apply(rule, series, names)
            cells.append(f"{scored.mase.median():.3f} ({label})")
        print(f"  {'rule chosen on the last window':40s} " + "  ".join(cells))
        print(f"{name}: the default against one model for every series, paired per series")
        naive = apply(alone("SeasonalNaive"), series, {"SeasonalNaive"})
        defaults = [apply(within(0.1), series, names) for names in sets.values()]
        for model in sorted(statistical):
            single = apply(alone(model), series, {model})
            cells = [paired(default, single, naive) for default in defaults]
            print(f"  {model:16s} " + "  |  ".join(cells))
        scored = defaults[list(sets).index(WITH_LAGS)]
        print(f"{name}: interval coverage of the default blend (+ lags), at 80% / 95%, "
              "calibrated on the errors of the blend chosen without each window "
              "(default) | on the windows it was chosen on")
        for label, method in interval_methods(data.horizon).items():
            cells = [coverage(scored, method, errors) for errors in ("cross_errors", "errors")]
            print(f"  {label:52s} " + "  |  ".join(f"{c[80]:.0%} / {c[95]:.0%}" for c in cells))


def paired(ours: pd.DataFrame, theirs: pd.DataFrame, naive: pd.DataFrame) -> str:
    """Held-out MASE of ``ours`` against ``theirs`` over the series all three (with the
    seasonal ``naive``) forecast with some error: medians, each one's MAE relative to the
    seasonal naive's (geometric mean over series, AvgRelMAE: below 1, better than it),
    and the shares of series where ours is better and worse."""
    both = pd.concat({name: frame.set_index("uid").mase for name, frame in
                      {"ours": ours, "theirs": theirs, "naive": naive}.items()},
                     axis=1, join="inner")
    both = both[(both > 1e-6).all(axis=1) & np.isfinite(both).all(axis=1)]

    def relative(column: str) -> float:
        return float(np.exp(np.log(both[column] / both.naive).mean()))

    maes = pd.concat({name: frame.set_index("uid").mae for name, frame in
                      {"ours": ours, "theirs": theirs}.items()}, axis=1, join="inner")
    return (f"median MAE {maes.ours.median():.4g} vs {maes.theirs.median():.4g} "
            f"({len(maes)} series), MASE {both.ours.median():.3f} vs "
            f"{both.theirs.median():.3f}, relative to "
            f"the seasonal naive {relative('ours'):.3f} vs {relative('theirs'):.3f}, better "
            f"on {(both.ours < both.theirs - 1e-9).mean():.0%}, worse on "
            f"{(both.ours > both.theirs + 1e-9).mean():.0%} ({len(both)} series)")


if __name__ == "__main__":
    main()
