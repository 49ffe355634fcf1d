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
