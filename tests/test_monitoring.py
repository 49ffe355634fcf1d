"""Monitoring a registered model on realized outcomes: profiles and drift, the verdicts,
and ``pipeline.monitor`` end to end on local Spark, Ray and MLflow on SQLite."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from raybricks import profiles
from raybricks.errors import ConfigError, DataError
from raybricks.monitoring import DEGRADED, DRIFTED, NEW, OK, SILENT, Judge, Thresholds
from tests import helpers
from tests.test_training import CANDIDATES, job

RIDGE = CANDIDATES[:1]


def test_the_same_distribution_does_not_drift_a_shifted_one_does():
    rng = np.random.default_rng(0)
    trained = rng.normal(size=200)
    stored = profiles.numeric_profile(trained)
    assert len(stored["edges"]) == profiles.MAX_BINS - 1
    assert sum(stored["shares"]) == pytest.approx(1.0)
    same = profiles.feature_drift("x", stored, 200, pd.Series(rng.normal(size=100)))
    moved = profiles.feature_drift("x", stored, 200, pd.Series(rng.normal(1.5, size=100)))
    assert same.p_value > 0.01  # PSI alone (0.28 here) would cry drift at 100 rows
    assert moved.psi > 1.0 and moved.p_value < 1e-6


def test_a_small_segment_noise_is_not_drift_but_its_psi_alone_would_say_so():
    """Few rows make PSI large by chance: the chi-square test keeps it from counting."""
    rng = np.random.default_rng(1)
    stored = profiles.numeric_profile(rng.normal(size=30))  # 3 bins
    found = [profiles.feature_drift("x", stored, 30, pd.Series(rng.normal(size=6)))
             for _ in range(200)]
    assert max(d.psi for d in found) > 0.25  # PSI alone would flag some
    assert sum(d.p_value < 0.01 for d in found) <= 4  # the test flags about 1%


def test_categories_and_missing_values_have_bins_of_their_own():
    stored = profiles.categorical_profile(pd.Series(["a"] * 50 + ["b"] * 30 + [None] * 20))
    assert stored["categories"] == ["a", "b"] and stored["shares"] == [0.5, 0.3, 0.0, 0.2]
    moved = profiles.feature_drift("c", stored, 100, pd.Series(["z"] * 40))
    assert moved.psi > 1 and moved.p_value < 1e-6  # an unseen category: the "other" bin
    numeric = profiles.numeric_profile(np.array([1.0, 2.0, np.nan, np.nan]))
    assert numeric["shares"][-1] == 0.5  # the missing values' bin


def judged(frame, validation=1.0, profile=None, metric="rmse", **limits):
    manifest = {"metric": metric, "task": "regression", "forecast": None}
    frame = frame.assign(_model_status="trained", _validation=validation,
                         _validation_baseline=2.0, _profile=json.dumps(profile or {
                             "rows": 100, "naive": [0.0], "features": {}}))
    return Judge(manifest, Thresholds(**limits), "y", ["prediction"], "1").judge(frame)


def test_realized_error_far_above_validation_is_degraded_and_close_to_it_is_not():
    rng = np.random.default_rng(2)
    y = rng.normal(5, 1, 60)
    close = judged(pd.DataFrame({"y": y, "prediction": y + rng.normal(0, 1.05, 60)}))
    assert close["status"] == OK, close["reason"]
    far = judged(pd.DataFrame({"y": y, "prediction": y + rng.normal(0, 3, 60)}))
    assert far["status"] == DEGRADED and "in validation" in far["reason"]
    assert far["realized"] == pytest.approx(far["realized"]) and far["realized"] > 2


def test_a_baseline_that_beats_the_model_on_the_new_rows_makes_it_degraded():
    rng = np.random.default_rng(3)
    y = rng.normal(0, 0.1, 80)  # the naive prediction (0) is nearly right
    found = judged(pd.DataFrame({"y": y, "prediction": y + 0.5}), validation=0.6)
    assert found["status"] == DEGRADED and "naive baseline does better" in found["reason"]
    assert found["baseline_realized"] < found["realized"]


def test_too_few_rows_are_not_judged():
    found = judged(pd.DataFrame({"y": [1.0, 2.0, 3.0], "prediction": [9.0, 9.0, 9.0]}))
    assert found["status"] == OK and "too few to judge" in found["reason"]
    assert found["scored_rows"] == 3 and found["realized"] > 5


def later_outcomes(seed: int) -> pd.DataFrame:
    """Shops' world a season later: s2's target flipped (its model is now wrong), s3's
    customers all in blue now, y as before (a drift inside what the model knows), a new
    store s9, store s4 closed."""
    data = helpers.shops(seed)
    s2, s3 = data.store == "s2", data.store == "s3"
    data.loc[s2, "y"] = -data.loc[s2, "y"]
    data.loc[s3, "y"] -= 2 * (data.loc[s3, "color"] == "red")
    data.loc[s3, "color"] = "blue"
    new = data[data.store == "s0"].assign(store="s9")
    return pd.concat([data[data.store != "s4"], new], ignore_index=True)


@pytest.mark.topology
def test_monitoring_flags_what_changed_and_the_retrain_fixes_it(ray_on_spark, spark, tmp_path,
                                                               monkeypatch, capsys):
    """Train on one season, monitor on the next (``raybricks monitor``): the flipped store
    is degraded, the moved one drifted, the new one new, the closed one silent, the
    others ok; the MLflow run has the counts and the plot; given predictions give the
    same numbers. Retraining from the monitoring run trains the degraded and the new
    store only, and monitoring the merged version finds them fixed."""
    import mlflow

    from raybricks import cli, pipeline
    from raybricks.scoring import score

    name = "tests.monitor.shops"
    helpers.shops().to_parquet(tmp_path / "shops.parquet")
    config = job(tmp_path / "runs", source={"path": str(tmp_path / "shops.parquet")},
                 models=RIDGE, registry={"name": name})
    first = pipeline.train(config, spark).publication
    later_outcomes(seed=5).to_parquet(tmp_path / "outcomes.parquet")
    monkeypatch.chdir(tmp_path)  # the CLI's log folder
    assert cli.main(["monitor", "--model", f"models:/{name}@champion", "--outcomes",
                     str(tmp_path / "outcomes.parquet"), "--output",
                     str(tmp_path / "monitoring")]) == 0
    said = capsys.readouterr().out
    run_id = re.search(r"MLflow run: (\w+)", said).group(1)
    assert re.search(r"monitored 12 segments of .* ok, \d+ degraded, \d+ drifted, 1 new, "
                     r"1 silent", said), said
    report = pipeline.MonitorReport(**{**vars(pipeline.monitor(
        f"models:/{name}@champion", str(tmp_path / "outcomes.parquet"),
        str(tmp_path / "monitoring"), spark=spark, log_run=False)), "run_id": run_id})
    table = pd.read_parquet(tmp_path / "monitoring").set_index("store")
    status = table.status.to_dict()
    assert status["s2"] == DEGRADED, table.loc["s2", "reason"]
    assert status["s3"] == DRIFTED, table.loc["s3", "reason"]
    assert status["s9"] == NEW and status["s4"] == SILENT
    others = [s for s in ["s0", "s1", "s5", "s6", "s7"] if status[s] != OK]
    assert len(others) <= 1, table.loc[others, "reason"].to_dict()
    assert table.loc["s2", "realized"] > 5 * table.loc["s2", "validation"]
    assert table.loc["s2", "baseline_realized"] < table.loc["s2", "realized"]
    assert table.loc["s3", "drift_feature"] == "color" and table.loc["s3", "drift_psi"] > 1
    every = json.loads(table.loc["s3", "feature_psi"])  # each feature's PSI
    assert set(every) == {"x1", "x2", "color"} and every["color"] == max(every.values())
    assert report.counts[DEGRADED] >= 1 and sum(report.counts.values()) == len(table)
    run = mlflow.get_run(report.run_id)
    assert run.data.metrics["segments_degraded"] == report.counts[DEGRADED]
    assert run.data.metrics["segments_silent"] == 1
    assert run.data.metrics["realized_over_validation_p90"] > 1  # s2 is far off
    assert 0 < run.data.metrics["share_realized_above_validation"] < 1
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(report.run_id,
                                                                      "monitoring")}
    assert "monitoring/segments.png" in artifacts
    # predictions already in the outcomes: the same realized numbers, no scoring
    score(f"models:/{name}@champion", str(tmp_path / "outcomes.parquet"),
          str(tmp_path / "scored"))
    again = pipeline.monitor(f"models:/{name}@champion", str(tmp_path / "scored"),
                             str(tmp_path / "monitoring-again"), spark=spark, log_run=False)
    same = pd.read_parquet(tmp_path / "monitoring-again").set_index("store")
    assert again.run_id is None
    pd.testing.assert_series_equal(same.realized.sort_index(), table.realized.sort_index())
    # retrain what monitoring found degraded or new, from its run
    retrain = job(tmp_path / "runs", source={"path": str(tmp_path / "outcomes.parquet"),
                                             "segments": run_id,
                                             "statuses": ["degraded", "new"]},
                  models=RIDGE, registry={"name": name})
    retrained = pipeline.train(retrain, spark)
    assert set(retrained.result.segments.store) == {"s2", "s9"}
    assert retrained.publication.decision["segments_from"] == {
        f"version {first.version}": 10, f"run {retrained.publication.run_id}": 2}
    description = mlflow.MlflowClient().get_model_version(
        name, retrained.publication.champion_version).description
    assert f"degraded or new in monitoring {run_id}" in description
    fixed = pipeline.monitor(f"models:/{name}@champion", str(tmp_path / "outcomes.parquet"),
                             str(tmp_path / "monitoring-fixed"), spark=spark, log_run=False)
    after = pd.read_parquet(tmp_path / "monitoring-fixed").set_index("store")
    assert after.loc["s2", "status"] == OK and after.loc["s9", "status"] == OK
    assert after.loc["s2", "realized"] < table.loc["s2", "baseline_realized"]
    assert after.loc["s3", "status"] == DRIFTED  # not asked for: the champion's, as it was
    assert fixed.counts.get(DEGRADED, 0) == 0


def test_retraining_from_monitoring_picks_the_latest_statuses_or_nothing(spark, tmp_path):
    from raybricks.sources import NothingToTrain, monitored_segments

    pd.DataFrame({"store": ["a", "b", "a", "c"], "period": ["2024-01", "2024-01", "2024-02",
                                                            "2024-02"],
                  "status": ["degraded", "degraded", "ok", "new"]}).to_parquet(
        tmp_path / "monitoring.parquet")
    found = monitored_segments(str(tmp_path / "monitoring.parquet"), ["degraded", "new"], spark)
    assert sorted(r.store for r in found.collect()) == ["c"]  # a is ok now; b is history
    with pytest.raises(NothingToTrain, match="no segment of monitoring .* is drifted in its "
                                             "latest period 2024-02: nothing to retrain"):
        monitored_segments(str(tmp_path / "monitoring.parquet"), ["drifted"], spark)
    pd.DataFrame({"store": ["a"]}).to_parquet(tmp_path / "keys.parquet")
    with pytest.raises(DataError, match="not a monitoring table"):
        monitored_segments(str(tmp_path / "keys.parquet"), ["new"], spark)


def test_the_cli_turns_segments_from_monitor_into_the_config():
    from raybricks import cli
    from raybricks.config import JobConfig, apply_overrides

    args = cli.build_parser().parse_args(["train", "--config", "job.yml",
                                          "--segments-from-monitor", "abc", "--statuses",
                                          "degraded, drifted"])
    found = cli.overrides(args)
    assert found == ["source.segments=abc", 'source.statuses=["degraded", "drifted"]']
    config = JobConfig.from_dict(apply_overrides(
        {"source": {"table": "t"}, "segment_by": ["s"], "target": "y", "models": RIDGE}, found))
    assert config.source.statuses == ["degraded", "drifted"]
    assert config.registry.promote == "replace"
    with pytest.raises(ConfigError, match="source.statuses picks segments of a monitoring"):
        JobConfig.from_dict({"source": {"table": "t", "statuses": ["new"]},
                             "segment_by": ["s"], "target": "y", "models": RIDGE})


@pytest.mark.topology
def test_forecasts_are_monitored_per_series_and_horizon_step(ray_on_spark, spark, tmp_path):
    """A forecasting model trained on 100 days, monitored on the next week's actuals
    (raybricks scores them): the series whose level jumped is degraded with its error in
    every step, the others are not; each row carries one realized MASE per step."""
    from raybricks import pipeline
    from tests.test_forecast import FAST, HORIZON, START, forecast_job, stores

    name = "tests.monitor.forecast"
    data = stores()
    cut = START + pd.Timedelta(days=100)
    micro = {"coerce_timestamps": "us", "allow_truncated_timestamps": True}
    data[data.day < cut].to_parquet(tmp_path / "history.parquet", **micro)
    config = forecast_job(tmp_path / "runs", source={"path": str(tmp_path / "history.parquet")},
                          models=FAST, registry={"name": name})
    pipeline.train(config, spark)
    week = data[(data.day >= cut) & (data.day < cut + pd.Timedelta(days=HORIZON))].copy()
    week.loc[week.store == "season0", "sales"] += 40  # a level shift after training
    week.to_parquet(tmp_path / "actuals.parquet", **micro)
    report = pipeline.monitor(f"models:/{name}@champion", str(tmp_path / "actuals.parquet"),
                              str(tmp_path / "monitoring"), spark=spark, log_run=False)
    table = pd.read_parquet(tmp_path / "monitoring").set_index("store")
    assert table.loc["season0", "status"] == DEGRADED, table.loc["season0", "reason"]
    assert table.metric.unique().tolist() == ["mase"]
    steps = np.array(table.loc["season0", "step_errors"], dtype=float)
    assert len(steps) == HORIZON and (steps > 5).all()  # every step far off
    others = table.drop(index=["season0", "early"])
    assert (others.status == OK).sum() >= len(others) - 1, others.reason.to_dict()
    assert (others.scored_rows == HORIZON).all()
    # the early series ended three weeks before: its rows are steps 22..28 of its future
    assert table.loc["early", "status"] == SILENT  # its history ended before the cut
    assert report.counts[DEGRADED] >= 1
    # two weeks of actuals, judged per week: the latest week decides the counts
    fortnight = data[(data.day >= cut) & (data.day < cut + pd.Timedelta(days=14))]
    fortnight.to_parquet(tmp_path / "fortnight.parquet", **micro)
    weekly = pipeline.monitor(f"models:/{name}@champion", str(tmp_path / "fortnight.parquet"),
                              str(tmp_path / "weekly"), spark=spark, period="week",
                              log_run=False)
    rows = pd.read_parquet(tmp_path / "weekly")
    weeks = sorted(rows.period.dropna().unique())
    assert weekly.latest_period == weeks[-1] and len(weeks) >= 2
    assert pd.Timestamp(weeks[-1]).dayofweek == 0  # weeks start on Monday (date_trunc)
    assert sum(weekly.counts.values()) == rows.store.nunique()
    assert rows.groupby("store").scored_rows.sum().drop("early").eq(14).all()


def test_the_drift_test_is_scipys_chi_square_test_of_the_two_samples():
    from scipy.stats import chi2_contingency

    rng = np.random.default_rng(4)
    for _ in range(20):
        expected, actual = rng.integers(1, 40, 6) * 1.0, rng.integers(0, 30, 6) * 1.0
        actual[actual == 0] += 1
        wanted = chi2_contingency(np.vstack([expected, actual]), correction=False)[1]
        assert profiles.same_distribution(expected, actual) == pytest.approx(wanted, rel=1e-9)


def test_a_classifier_is_judged_on_its_class_probabilities():
    """logloss on the probability columns, the class frequencies as its baseline: a
    classifier sure of the wrong class is degraded, a calibrated one is not."""
    rng = np.random.default_rng(5)
    labels = rng.choice(["no", "yes"], 200, p=[0.7, 0.3])
    sure = np.where(labels == "yes", 0.9, 0.1)
    manifest = {"metric": "logloss", "task": "binary", "classes": ["no", "yes"],
                "forecast": None}
    stored = json.dumps({"rows": 500, "validation_rows": 100, "naive": [0.7, 0.3],
                         "features": {}})

    def judge(p_yes):
        columns = {"label": labels.astype(object), "probability_no": 1 - p_yes,
                   "probability_yes": p_yes, "_model_status": np.array(["trained"] * 200),
                   "_validation": np.full(200, 0.35), "_validation_baseline": np.full(200, 0.6),
                   "_profile": np.array([stored] * 200, dtype=object)}
        return Judge(manifest, Thresholds(), "label", ["probability_no", "probability_yes"],
                     "3").judge(columns)

    good, wrong = judge(sure), judge(1 - sure)
    assert good["status"] == OK and good["realized"] < good["baseline_realized"]
    assert wrong["status"] == DEGRADED and "naive baseline does better" in wrong["reason"]
    assert wrong["baseline_realized"] == pytest.approx(
        -np.mean(np.log(np.where(labels == "yes", 0.3, 0.7))))


def test_numeric_bins_are_numpys_quantiles_and_bincounts():
    """The profile's plain-Python quantiles and counts (cheap for small segments) equal
    numpy's: np.quantile's edges (six digits, distinct), the rows of each bin."""
    rng = np.random.default_rng(6)
    for _ in range(200):
        n = int(rng.integers(1, 150))
        values = rng.normal(size=n).round(int(rng.integers(0, 3)))  # ties too
        values[rng.random(n) < 0.1] = np.nan
        found = profiles.numeric_profile(values)
        present = values[~np.isnan(values)]
        if not len(present):
            assert found == {"edges": [], "shares": [0.0, 1.0]}
            continue
        levels = np.linspace(0, 1, profiles.bins_for(len(present)) + 1)[1:-1]
        edges = np.unique([float(f"{e:.6g}") for e in np.quantile(present, levels)])
        counts = np.bincount(profiles.numeric_bins(values, edges), minlength=len(edges) + 2)
        assert found["edges"] == edges.tolist()
        assert found["shares"] == np.round(counts / n, 6).tolist()


# ------------------------------------------------- a segment's numbers never end the job

TREE = [{"name": "tree", "kind": "sklearn", "estimator": "sklearn.tree.DecisionTreeRegressor",
         "params": {"max_depth": 4}}]
#: The ``exact`` store's target: a function of its colour alone, which a tree learns
#: exactly (its validation error is 0).
BY_COLOUR = {"red": 10.0, "green": 20.0, "blue": 30.0}


def exact_store(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    color = rng.choice(list(BY_COLOUR), n)
    return pd.DataFrame({"store": "exact", "day": np.arange(n), "x1": rng.normal(size=n),
                         "x2": rng.normal(size=n), "color": color.astype(object),
                         "y": pd.Series(color).map(BY_COLOUR).to_numpy()})


@pytest.fixture(scope="module")
def perfect_model(ray_on_spark, spark, tmp_path_factory):
    """A registered model of four stores: ``exact`` fitted perfectly (validation rmse
    exactly 0), ``constant`` skipped (no validation), s0 and s1 as usual."""
    from raybricks import pipeline

    folder = tmp_path_factory.mktemp("perfect")
    data = helpers.shops()
    data = pd.concat([data[data.store.isin(["s0", "s1", "constant"])], exact_store(80, 0)],
                     ignore_index=True)
    data.to_parquet(folder / "history.parquet")
    name = "tests.monitor.perfect"
    config = job(folder / "runs", source={"path": str(folder / "history.parquet")},
                 models=TREE, ensemble={"method": "best", "shrink": 0},
                 registry={"name": name})
    pipeline.train(config, spark)
    return f"models:/{name}@champion"


def awkward_outcomes() -> pd.DataFrame:
    """Outcomes with the model's predictions, each store awkward in its own way: ``exact``
    now 5 off what it learnt perfectly (realized 5 against validation 0), ``constant``
    as trained (no validation to compare with), s0 with NaN predictions only, s1 with a
    constant target its predictions miss by 10."""
    later = helpers.shops(seed=5)
    s0 = later[later.store == "s0"].head(30).assign(prediction=np.nan)
    s1 = later[later.store == "s1"].head(30).assign(y=3.0, prediction=13.0)
    constant = later[later.store == "constant"].head(30).assign(prediction=7.0)
    exact = exact_store(30, 7)
    exact = exact.assign(prediction=exact.y, y=exact.y + 5)
    return pd.concat([s0, s1, constant, exact], ignore_index=True)


def test_a_zero_or_missing_validation_constant_targets_and_nan_predictions_are_judged(
        perfect_model, spark, tmp_path):
    """Nothing in a segment's numbers ends ``monitor``: a validation error of 0 (Spark's
    ANSI mode refuses to divide by it) is judged by the test, the worst of all; a
    missing validation is said; NaN predictions are unscored rows; the run is logged."""
    import mlflow

    from raybricks import pipeline

    output = str(tmp_path / "monitoring")
    report = pipeline.monitor(perfect_model, spark.createDataFrame(awkward_outcomes()),
                              output, spark=spark)
    table = pd.read_parquet(output).set_index("store")
    assert table.loc["exact", "validation"] == 0.0  # trained perfectly: not a made-up 0
    assert table.loc["exact", "status"] == DEGRADED, table.loc["exact", "reason"]
    assert "realized rmse 5 against 0 in validation" in table.loc["exact", "reason"]
    assert table.loc["s1", "status"] == DEGRADED, table.loc["s1", "reason"]
    assert table.loc["constant", "status"] == OK
    assert np.isnan(table.loc["constant", "validation"])
    assert "validation n/a" in table.loc["constant", "reason"]
    assert table.loc["s0", "status"] == OK and table.loc["s0", "scored_rows"] == 0
    assert table.loc["s0", "rows"] == 30 and np.isnan(table.loc["s0", "realized"])
    assert "30 row(s) without a prediction" in table.loc["s0", "reason"]
    assert report.counts == {DEGRADED: 2, OK: 2}
    assert report.worst[0].startswith("exact: ")  # infinitely worse than in validation
    run = mlflow.get_run(report.run_id)
    assert run.data.metrics["segments_degraded"] == 2
    assert run.data.tags["raybricks.output"] == output
    assert "raybricks.monitor.problems" not in run.data.tags
    worst = json.loads(mlflow.artifacts.load_text(
        f"runs:/{report.run_id}/monitoring/worst_segments.json"))
    assert [row[0] for row in worst["data"]] == ["exact", "s1"]


def no_warnings(judge_call):
    """``judge_call()`` with every warning an error (numpy's division by zero, too)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return judge_call()


def test_unscored_rows_are_counted_and_their_reason_given():
    rng = np.random.default_rng(8)
    y = rng.normal(5, 1, 40)
    frame = pd.DataFrame({"y": y, "prediction": y + rng.normal(0, 1, 40)})
    frame.loc[:4, "prediction"] = np.nan
    frame.loc[5, "prediction"] = np.inf
    frame.loc[6:8, "y"] = np.nan
    found = no_warnings(lambda: judged(frame))
    assert found["rows"] == 40 and found["scored_rows"] == 31 and found["status"] == OK
    assert found["reason"].endswith("; unscored: 6 row(s) without a prediction (missing or "
                                    "NaN), 3 row(s) without an actual (missing or NaN)")
    nothing = no_warnings(lambda: judged(frame.assign(prediction=np.nan)))
    assert nothing["scored_rows"] == 0 and nothing["realized"] is None
    assert nothing["reason"] == ("0 scored row(s): too few to judge (min_rows 10); unscored: "
                                 "40 row(s) without a prediction (missing or NaN)")


def test_a_validation_of_zero_is_judged_by_the_test_and_a_metric_without_value_said():
    y = np.full(30, 5.0)  # a constant target
    exact = no_warnings(lambda: judged(pd.DataFrame({"y": y, "prediction": y}),
                                       validation=0.0))
    assert exact["status"] == OK and exact["realized"] == 0.0
    off = no_warnings(lambda: judged(pd.DataFrame({"y": y, "prediction": y + 0.5}),
                                     validation=0.0))
    assert off["status"] == DEGRADED
    assert "realized rmse 0.5 against 0 in validation (worse than a perfect validation)" \
        in off["reason"]
    # r2 has no value on a constant target, yet the naive baseline (5) clearly does better
    r2 = no_warnings(lambda: judged(pd.DataFrame({"y": y, "prediction": y + 3.0}),
                                    validation=0.9, metric="r2",
                                    profile={"rows": 100, "naive": [5.0], "features": {}}))
    assert r2["realized"] is None and r2["baseline_realized"] is None
    assert r2["status"] == DEGRADED
    assert "naive baseline does better on these 30 rows (r2 n/a against n/a)" in r2["reason"]
    # a stored MASE scale of 0 (no in-sample error) is not divided by
    mase = no_warnings(lambda: judged(pd.DataFrame({"y": y, "prediction": y + 1.0}),
                                      validation=1.0, metric="mase", profile={
                                          "rows": 100, "naive": [5.0], "features": {},
                                          "scale": 0.0}))
    assert mase["realized"] == 1.0 and mase["status"] == DEGRADED


def test_rows_without_a_time_and_empty_periods_are_silent_not_lost(perfect_model, spark,
                                                                   tmp_path):
    """Judged per week: a store whose rows are all in an earlier week, and one whose rows
    have no time, are silent in the latest week (counted, the reason says why); a store
    whose actuals are all missing is not judged; no store is left out of the counts."""
    from raybricks import pipeline

    monday = pd.Timestamp("2024-03-04")
    later = helpers.shops(seed=6)

    def rows(store, when, **values):
        found = later[later.store == store].head(20).assign(when=when)
        return found.assign(prediction=found.y, **values)

    outcomes = pd.concat([
        rows("constant", monday), rows("constant", monday + pd.Timedelta(days=7)),
        rows("s0", monday),  # nothing in the latest week
        rows("s1", monday + pd.Timedelta(days=8), y=np.nan),  # actuals not in yet
        rows("s1", monday, y=np.nan),
        exact_store(20, 9).assign(when=pd.NaT, prediction=lambda f: f.y),  # no time
        rows("s5", monday + pd.Timedelta(days=9)).assign(store="s9"),  # a new store
    ], ignore_index=True)
    output = str(tmp_path / "weekly")
    report = pipeline.monitor(perfect_model, spark.createDataFrame(outcomes), output,
                              spark=spark, period="week", time_column="when", log_run=False)
    latest = str((monday + pd.Timedelta(days=7)).date())
    assert report.latest_period == latest
    table = pd.read_parquet(output)
    now = table[table.period == latest].set_index("store")
    assert report.counts == {OK: 2, SILENT: 2, NEW: 1} and len(now) == 5
    assert now.loc["s0", "status"] == SILENT
    assert now.loc["s0", "reason"] == (f"no rows in the latest period {latest}; last rows in "
                                       f"{monday.date()}")
    assert now.loc["exact", "status"] == SILENT
    assert now.loc["exact", "reason"] == (f"no rows in the latest period {latest}; its rows "
                                          "have no time (no period)")
    undated = table[table.period.isna()].set_index("store")  # measured all the same
    assert undated.loc["exact", "scored_rows"] == 20 and undated.loc["exact", "realized"] == 0
    assert now.loc["s1", "status"] == OK and now.loc["s1", "scored_rows"] == 0
    assert now.loc["s1", "reason"].endswith("unscored: 20 row(s) without an actual (missing "
                                            "or NaN)")
    assert now.loc["constant", "status"] == OK and now.loc["s9", "status"] == NEW


def test_empty_outcomes_make_every_segment_silent_and_the_run_is_logged(perfect_model, spark,
                                                                        tmp_path):
    import mlflow
    from pyspark.sql import functions as F

    from raybricks import pipeline

    output = str(tmp_path / "monitoring")
    nothing = spark.createDataFrame(awkward_outcomes().assign(when=pd.Timestamp("2024-03-04"))
                                    ).where(F.lit(False))
    report = pipeline.monitor(perfect_model, nothing, output, spark=spark, period="week",
                              time_column="when")
    assert report.counts == {SILENT: 4} and report.latest_period is None and not report.worst
    table = pd.read_parquet(output)
    assert (table.reason == "no rows in the outcomes").all() and len(table) == 4
    run = mlflow.get_run(report.run_id)
    assert run.data.metrics["segments_silent"] == 4 and run.info.status == "FINISHED"
    assert "raybricks.monitor.problems" not in run.data.tags and not report.problems
    with pytest.raises(DataError, match="'day', which holds bigint values: give a date"):
        pipeline.monitor(perfect_model, nothing, output, spark=spark, period="week",
                         time_column="day")  # said, not Spark's type mismatch


def test_a_failure_after_the_table_is_written_still_logs_the_run_or_says_what_to_do(
        perfect_model, spark, tmp_path, monkeypatch):
    """The table is written: a summary part or a plot that fails leaves the rest of the
    run logged, its tag and the report saying what is missing; an MLflow that cannot
    start the run gets a message naming the table and the command that retrains from
    it (a RaybricksError: the CLI prints it, not "the likely cause is the environment")."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from raybricks import monitoring, pipeline
    from raybricks.errors import RaybricksError
    from raybricks.sources import monitored_segments
    from raybricks.tracking import monitoring as tracked

    def broken(*args, **kwargs):
        raise RuntimeError("out of luck\nsecond line")

    monkeypatch.setattr(monitoring, "realized_against_validation", broken)
    monkeypatch.setattr(tracked, "draw", broken)
    outcomes = spark.createDataFrame(awkward_outcomes())
    output = str(tmp_path / "monitoring")
    report = pipeline.monitor(perfect_model, outcomes, output, spark=spark)
    assert report.counts == {DEGRADED: 2, OK: 2}
    assert report.problems == [
        "summing up realized against validation failed (RuntimeError: out of luck)",
        "logging the plot segments.png failed (RuntimeError: out of luck)"]
    assert "incomplete: summing up realized against validation failed" in report.summary()
    run = mlflow.get_run(report.run_id)
    assert run.data.tags["raybricks.monitor.problems"] == "; ".join(report.problems)
    assert run.data.metrics["segments_degraded"] == 2
    assert "realized_median" not in run.data.metrics
    found = monitored_segments(report.run_id, ["degraded"], spark)  # the retrain's input
    assert sorted(r.store for r in found.collect()) == ["exact", "s1"]

    def refused(*args, **kwargs):
        raise MlflowException("API request to http://mlflow failed: connection refused")

    monkeypatch.setattr(mlflow, "start_run", refused)
    again = str(tmp_path / "monitoring-again")
    with pytest.raises(tracked.MonitoringRunError) as raised:
        pipeline.monitor(perfect_model, outcomes, again, spark=spark)
    assert isinstance(raised.value, RaybricksError)
    assert str(raised.value) == (
        f"the monitoring table {again} is written, but its MLflow run could not be logged: "
        "starting the run failed (MlflowException: API request to http://mlflow failed: "
        "connection refused). Retrain from the table itself: raybricks train --config "
        f"<the model's job config> --segments-from-monitor {again} --statuses "
        "degraded,new; or rerun raybricks monitor once MLflow answers")
    assert len(pd.read_parquet(again)) == 4


def test_a_segment_monitoring_fails_on_is_said_in_its_row_not_the_end_of_the_job():
    """A segment whose stored numbers break the judge (a profile's naive values that are
    not numbers) gets a row saying it was not judged and why; the others are judged."""
    from raybricks.monitoring import NOT_JUDGED, measure_partitions

    judge = Judge({"metric": "rmse", "task": "regression", "forecast": None}, Thresholds(),
                  "y", ["prediction"], "1")
    good = json.dumps({"rows": 100, "naive": [0.0], "features": {}})
    broken = json.dumps({"rows": 100, "naive": "n/a", "features": {}})
    frame = pd.DataFrame({"store": ["a"] * 12 + ["b"] * 12, "y": np.arange(24.0),
                          "prediction": np.arange(24.0) + 0.1, "_model_status": "trained",
                          "_validation": 0.1, "_validation_baseline": 2.0,
                          "_profile": [good] * 12 + [broken] * 12})
    parts = measure_partitions(judge, ["store"], False)(iter([frame]))
    found = pd.DataFrame([row for part in parts for row in part.to_dict("records")])
    found = found.set_index("store")
    assert found.loc["a", "status"] == OK and found.loc["a", "scored_rows"] == 12
    assert found.loc["b", "status"] == OK and found.loc["b", "rows"] == 12
    assert found.loc["b", "reason"].startswith(f"{NOT_JUDGED} (ValueError: could not convert")
    assert found.loc["b", "validation"] == 0.1 and found.loc["b", "model_version"] == "1"


def test_a_global_model_that_went_bad_is_reported_and_the_retrain_refits_it(spark, tmp_path):
    """The global model's own health, from the segments it serves: ten served alone, one
    skipped (its fallback), one unseen key and one blend, in two periods. In the first
    they do as in validation; in the second the ten got 60% worse: degraded, and a
    retrain from that monitoring table refits the global model unless told to keep it."""
    from raybricks import pipeline
    from raybricks.monitoring import Measured, global_frame, global_health
    from raybricks.scoring import write_output
    from raybricks.sources import degraded_globals, global_table

    alone = [f"a{i}" for i in range(10)]
    index = pd.DataFrame({
        "store": [*alone, "skipped", "blend"], "global": "run-1",
        "chosen": [json.dumps(["global"])] * 10 + [None,
                                                    json.dumps(["local:ridge", "global"])]})
    rows = []
    for period, worse in (("2024-01-01", 1.0), ("2024-02-01", 1.6)):
        for i, store in enumerate([*alone, "skipped", "blend", "unseen"]):
            status = {"skipped": "skipped", "unseen": None}.get(store, "trained")
            rows.append({"store": store, "period": period, "scored_rows": 20,
                         "realized": (1.0 + 0.01 * i) * worse, "validation": 1.0 + 0.01 * i,
                         "model_status": status, "status": OK})
    written = spark.createDataFrame(pd.DataFrame(rows))
    measured = Measured(written, "2024-02-01", "3", ["store"], "mae", False,
                        spark.createDataFrame(index), "run-1", Thresholds())
    found = global_health(measured, written).set_index("period")
    assert (found.global_model == "run-1").all()
    first, second = found.loc["2024-01-01"], found.loc["2024-02-01"]
    assert (first.segments_alone, first.segments_skipped, first.segments_new,
            first.segments_blended) == (10, 1, 1, 1)
    assert first.status == OK and second.status == DEGRADED
    assert second.segments_worse == second.segments_judged == 10
    assert second.realized == pytest.approx(1.6 * first.realized)  # pooled, by rows
    assert "serves 10 segment(s) alone" in second.reason
    # the same table's global rows, written beside it: a retrain from it refits
    output = str(tmp_path / "monitoring")
    write_output(written, output)
    write_output(global_frame(spark, found.reset_index()), global_table(output))
    assert degraded_globals(output, spark) == ["run-1"]
    config = job(tmp_path, source={"table": "t", "segments": output,
                                   "statuses": ["degraded"]}, fallback="global")
    assert pipeline.global_choice(config, spark).global_model == "refit"
    kept = job(tmp_path, source={"table": "t", "segments": output,
                                 "statuses": ["degraded"]}, fallback="global",
               global_model="keep")
    assert pipeline.global_choice(kept, spark).global_model == "keep"
    # a model whose segments did as in validation: nothing to refit
    fine = global_health(measured, written.where("period = '2024-01-01'"))
    assert (fine.status == OK).all()
