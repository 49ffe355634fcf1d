"""The training engine on real Ray with real LightGBM, XGBoost and scikit-learn."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from raybricks.config import JobConfig
from raybricks.data import BlockSegments, to_ray_dataset
from raybricks.errors import ConfigError, DataError
from raybricks.segmented_model import MemberModel, SegmentModel
from raybricks.training import train_segments
from raybricks.training.tabular.segment import train_segment
from raybricks.training.tasks import make_plan
from tests import faults, helpers

CANDIDATES = [
    {"name": "ridge", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge",
     "search": {"alpha": [0.1, 10.0]}},
    {"name": "lgbm", "kind": "lightgbm",
     "params": {"n_estimators": 20, "min_child_samples": 5},
     "search": {"learning_rate": {"low": 0.05, "high": 0.3, "log": True}}, "trials": 2},
    {"name": "xgb", "kind": "xgboost", "params": {"n_estimators": 20, "max_depth": 3}},
]


def job(tmp_path, **changes) -> JobConfig:
    base = {
        "source": {"table": "unused"}, "segment_by": ["store"], "target": "y",
        "features": ["x1", "x2", "color"], "time_column": "day", "models": CANDIDATES,
        "min_rows": 20, "training": {"output_dir": str(tmp_path), "progress": False},
    }
    return JobConfig.from_dict(base | changes)


@pytest.fixture(scope="module")
def shops_ds(ray_on_spark, spark):
    return to_ray_dataset(spark.createDataFrame(helpers.shops()), ["store"])


@pytest.fixture(scope="module")
def shops_result(shops_ds, tmp_path_factory):
    config = job(tmp_path_factory.mktemp("runs"), ensemble="weighted", fallback="global",
                 selection="local_only")
    return train_segments(shops_ds, config)


def by_store(result) -> pd.DataFrame:
    return result.segments.set_index("store").sort_index()


@pytest.mark.topology
def test_every_segment_ends_in_one_status_with_reasons(shops_result):
    rows = by_store(shops_result)
    assert len(rows) == 11 and rows.index.is_unique
    assert (rows.loc[[f"s{i}" for i in range(8)], "status"] == "trained").all()
    assert rows.loc["few", "status"] == "skipped"
    assert rows.loc["few", "reason"] == "too few rows: 5 < min_rows=20"
    assert rows.loc["constant", "reason"].startswith("constant target")
    assert rows.loc["no_feature", "reason"].startswith("no usable feature")
    assert shops_result.counts() == {"trained": 8, "skipped": 3, "failed": 0}
    summary = shops_result.summary()
    assert "8 trained, 3 skipped, 0 failed" in summary and "median" in summary


def test_metrics_baseline_and_weighted_ensemble(shops_result):
    rows = by_store(shops_result).loc[[f"s{i}" for i in range(8)]]
    for _, row in rows.iterrows():
        chosen, weights = json.loads(row.chosen), json.loads(row.weights)
        assert len(chosen) == 3 and abs(sum(weights) - 1) < 1e-5
        ranked = sorted(chosen, key=lambda name: row[f"{name}_rmse"])
        assert chosen == ranked and weights == sorted(weights, reverse=True)
    # the models learn a strong linear signal: far better than the naive baseline
    assert (rows.metric_rmse < rows.baseline_rmse / 3).all()
    # time-ordered holdout: the last 20% of each segment's rows
    assert (rows.n_valid == (rows.n_rows * 0.2).round()).all()


def test_models_reload_natively_and_predict_unseen_and_missing(shops_result):
    models = shops_result.models().to_pandas()
    rows = models[models.store == "s3"].to_dict("records")
    assert {r["kind"] for r in rows} == {"sklearn", "lightgbm", "xgboost"}
    model = SegmentModel.from_rows(rows)
    frame = pd.DataFrame({"x1": [0.5, 0.5, np.nan], "x2": [np.nan, 1.0, 1.0],
                          "color": ["red", "purple", None], "extra": 1})
    predictions = model.predict(frame)
    assert predictions.shape == (3,) and np.isfinite(predictions).all()
    assert shops_result.fallback and {m["candidate"] for m in shops_result.fallback} == {
        "ridge", "lgbm", "xgb"}
    fallback = SegmentModel.from_rows(shops_result.fallback)
    assert np.isfinite(fallback.predict(frame)).all()


def test_same_config_same_models_and_metrics(shops_ds, shops_result, tmp_path):
    again = train_segments(shops_ds, job(tmp_path, ensemble="weighted", fallback="global",
                                         selection="local_only"))
    columns = ["store", "status", "metric_rmse", "ridge_rmse", "lgbm_rmse", "xgb_rmse"]
    first = shops_result.segments[columns].sort_values("store").reset_index(drop=True)
    second = again.segments[columns].sort_values("store").reset_index(drop=True)
    pd.testing.assert_frame_equal(first, second)
    # the same models: each segment's stored members answer its rows alike (answers, not
    # pickled bytes, which may differ with a library's state in the process)
    data = helpers.shops()

    def answers(result) -> dict[str, np.ndarray]:
        models = result.models().to_pandas()
        return {store: SegmentModel.from_rows(rows.to_dict("records")).predict(
                    data[data.store == store]) for store, rows in models.groupby("store")}

    before, after = answers(shops_result), answers(again)
    assert before.keys() == after.keys() and len(before) >= 6
    for store, values in before.items():
        np.testing.assert_array_equal(values, after[store])


@pytest.mark.parametrize(("method", "expected_valid"), [("holdout", 14), ("kfold", 70)])
def test_holdout_and_kfold(shops_ds, tmp_path, method, expected_valid):
    config = job(tmp_path, time_column=None, validation={"method": method, "folds": 3},
                 ensemble={"method": "mean", "top_k": 2, "shrink": 0})  # the mean alone
    rows = by_store(train_segments(shops_ds, config))
    assert rows.loc["s1", "n_valid"] == expected_valid  # 70 rows
    assert rows.loc["s1", "weights"] == "[0.5, 0.5]"


def test_failing_candidate_fails_only_its_segment(ray_on_spark, spark, tmp_path):
    data = helpers.shops().query("store in ['s0', 's1']").copy()
    data.loc[data.store == "s1", "x2"] = 5000.0
    ds = to_ray_dataset(spark.createDataFrame(data), ["store"])
    config = job(tmp_path, models=[{"name": "mine", "kind": "function",
                                    "function": "tests.helpers.fit_or_explode"}])
    rows = by_store(train_segments(ds, config))
    assert rows.loc["s0", "status"] == "trained", rows.loc["s0", "reason"]
    assert rows.loc["s1", "status"] == "failed"
    assert "x2 out of range for this model" in rows.loc["s1", "reason"]


@pytest.mark.parametrize(("kinds", "metric"), [(2, "auc"), (3, "logloss")])
def test_classification(ray_on_spark, spark, tmp_path, kinds, metric):
    ds = to_ray_dataset(spark.createDataFrame(helpers.classes(kinds)), ["store"])
    config = job(tmp_path, target="label", features=["x1", "x2"], time_column=None,
                 task="binary" if kinds == 2 else "multiclass",
                 validation={"metric": metric}, ensemble="best")
    result = train_segments(ds, config)
    assert result.counts()["trained"] == 4
    rows = result.segments
    better = rows[f"metric_{metric}"] > rows[f"baseline_{metric}"] if metric == "auc" else (
        rows[f"metric_{metric}"] < rows[f"baseline_{metric}"])
    assert better.all()
    models = result.models().to_pandas()
    model = SegmentModel.from_rows(models[models.store == 0].to_dict("records"))
    rows = helpers.classes(kinds).query("store == 0")
    labels = model.predict(rows)
    assert set(labels) <= {"no", "yes", "maybe"}
    assert np.mean(labels == rows.label.to_numpy()) > 0.8  # the reloaded model is right
    assert model.predict(rows, probabilities=True).shape == (len(rows), kinds)


def test_resume_trains_only_missing_segments(shops_ds, ray_on_spark, spark, tmp_path):
    half = to_ray_dataset(
        spark.createDataFrame(helpers.shops().query("store in ['s0', 's1', 's2', 'few']")),
        ["store"])
    config = job(tmp_path, training={"output_dir": str(tmp_path), "run_id": "nightly",
                                     "progress": False})
    train_segments(half, config)  # the "interrupted" first attempt
    with pytest.raises(ConfigError, match="already has results.*training.resume=true"):
        train_segments(shops_ds, config)  # the same run again, without resume
    resumed = train_segments(shops_ds, config.model_copy(
        update={"training": config.training.model_copy(update={"resume": True})}))
    parts = list((tmp_path / "nightly" / "results").glob("*.parquet"))
    attempts = {p.stem.rsplit("-", 1)[1] for p in parts}
    assert len(attempts) == 2  # the first attempt's results were kept
    assert resumed.segments.store.is_unique and len(resumed.segments) == 11
    uninterrupted = train_segments(shops_ds, job(tmp_path / "full"))
    columns = ["store", "status", "metric_rmse"]
    pd.testing.assert_frame_equal(
        resumed.segments[columns].sort_values("store").reset_index(drop=True),
        uninterrupted.segments[columns].sort_values("store").reset_index(drop=True))


@pytest.mark.topology
def test_few_segments_spread_over_tasks_match_in_process_fit(ray_on_spark, spark, tmp_path):
    data = helpers.shops().query("store == 's4'")
    ds = to_ray_dataset(spark.createDataFrame(data), ["store"])
    config = job(tmp_path)
    spread = train_segments(ds, config).segments.iloc[0]
    plan = make_plan(config, ds.schema)
    local, _ = train_segment(data.reset_index(drop=True), ("s4",), plan)
    local = local.as_row(plan)
    assert spread["status"] == local["status"] == "trained"
    for column in ("metric_rmse", "ridge_rmse", "lgbm_rmse", "xgb_rmse", "chosen"):
        assert spread[column] == pytest.approx(local[column])


def test_bayes_search_spread_over_tasks_matches_in_process_fit(ray_on_spark, spark, tmp_path):
    # few segments: a bayes candidate's whole sequential search runs on one Ray task,
    # beside the grid candidate's settings, each on its own; the same seeded draws
    data = helpers.shops().query("store == 's4'")
    ds = to_ray_dataset(spark.createDataFrame(data), ["store"])
    config = job(tmp_path, models=[CANDIDATES[0], CANDIDATES[1] | {
        "search_method": "bayes", "trials": 4,
        "search": {"learning_rate": {"low": 0.05, "high": 0.3, "log": True},
                   "num_leaves": {"low": 4, "high": 31, "int": True}}}])
    result = train_segments(ds, config)
    spread = result.segments.iloc[0]
    plan = make_plan(config, ds.schema)
    local, members = train_segment(data.reset_index(drop=True), ("s4",), plan)
    local = local.as_row(plan)
    assert spread["status"] == local["status"] == "trained"
    for column in ("metric_rmse", "ridge_rmse", "lgbm_rmse", "chosen"):
        assert spread[column] == pytest.approx(local[column])


@pytest.mark.heavy
@pytest.mark.extended  # ~85 s; bayes search itself: tests/test_search.py
def test_large_segment_bayes_search_uses_optuna_with_asha(ray_on_spark, spark, tmp_path):
    rng = np.random.default_rng(1)
    n = 1500
    big = pd.DataFrame({"store": "big", "x1": rng.normal(size=n), "x2": rng.normal(size=n)})
    big["y"] = 2 * big.x1 + rng.normal(scale=0.1, size=n)
    ds = to_ray_dataset(spark.createDataFrame(big), ["store"])
    config = job(tmp_path, time_column=None, refit=False, features=["x1", "x2"], models=[
        {"name": "xgb", "kind": "xgboost", "params": {"n_estimators": 30},
         "search": {"max_depth": [1, 3], "learning_rate": {"low": 0.01, "high": 0.5,
                                                            "log": True}},
         "search_method": "bayes", "trials": 5}],
        training={"output_dir": str(tmp_path), "large_segment_rows": 1000, "progress": False})
    result = train_segments(ds, config)
    assert result.segments.status.tolist() == ["trained"]
    # one Ray Tune experiment of `trials` trials, suggested by OptunaSearch (its state is
    # saved beside them); the setting fitted is one of them
    (experiment,) = (result.run_dir / "ray_tune").glob("tune-xgb-*")
    trials = [json.loads(path.read_text().splitlines()[-1])["config"]["setting"]
              for path in experiment.glob("*/result.json")]
    assert len(trials) == 5
    assert list(experiment.glob("searcher-state-*"))
    member = result.models().to_pandas().iloc[0]
    assert json.loads(member.params)["learning_rate"] in [t["learning_rate"] for t in trials]
    assert all(0.01 <= t["learning_rate"] <= 0.5 and t["max_depth"] in (1, 3)
               for t in trials)


def big_and_small_stores(spark, n: int = 1500):
    """Store ``big`` (``n`` rows) beside two small shops, as a Ray Dataset."""
    rng = np.random.default_rng(1)
    big = pd.DataFrame({"store": "big", "x1": rng.normal(size=n), "x2": rng.normal(size=n),
                        "color": rng.choice(["red", "blue"], n)})
    big["y"] = 2 * big.x1 + (big.color == "red") + rng.normal(scale=0.1, size=n)
    small = helpers.shops().query("store in ['s0', 's1']").drop(columns="day")
    return to_ray_dataset(spark.createDataFrame(pd.concat([big, small])), ["store"])


@pytest.mark.topology
def test_large_segment_goes_through_ray_train(ray_on_spark, spark, tmp_path):
    ds = big_and_small_stores(spark)
    config = job(tmp_path, time_column=None, refit=False, models=[
        {"name": "xgb", "kind": "xgboost", "params": {"n_estimators": 30},
         "search": {"max_depth": [1, 3], "learning_rate": [0.02, 0.3]}},
        {"name": "ridge", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge"}],
        training={"output_dir": str(tmp_path), "large_segment_rows": 1000, "progress": False})
    result = train_segments(ds, config)
    rows = by_store(result)
    assert (rows.status == "trained").all()
    assert "not data-parallel" in rows.loc["big", "reason"]
    assert np.isnan(rows.loc["big", "ridge_rmse"]) and rows.loc["big", "xgb_rmse"] < 0.5
    # what monitoring compares with, made where the segment was split: its training rows
    profile = json.loads(rows.loc["big", "profile"])
    assert profile["rows"] == rows.loc["big", "n_rows"]
    assert set(profile["features"]) == {"x1", "x2", "color"}
    assert profile["validation_rows"] == rows.loc["big", "n_valid"]
    # the search ran as one Ray Tune experiment (ASHA), a trial per grid setting, and the
    # best setting is what was fitted: the slow learning rate cannot win in 30 rounds
    (experiment,) = (result.run_dir / "ray_tune").glob("tune-xgb-*")
    assert len(list(experiment.glob("*/result.json"))) == 4
    models = result.models().to_pandas()
    member = models[models.store == "big"].iloc[0]
    assert json.loads(member.params)["learning_rate"] == 0.3
    model = MemberModel(member.kind, member.payload, json.loads(member.meta))
    prediction = model.predict(pd.DataFrame({"x1": [1.0], "x2": [0.0], "color": ["red"]}))
    assert abs(prediction[0] - 3.0) < 0.5


@pytest.mark.heavy
@pytest.mark.parametrize("kind, lost", [
    # XGBoost on the multi-executor Spark only (Ray on Spark's cluster path), LightGBM in
    # local mode: ~80 s a run
    pytest.param("xgboost", "tests.wrappedkinds.LostWorkerXGBoost",
                 marks=[pytest.mark.topology, pytest.mark.cluster_only,
                        pytest.mark.extended]),  # ~120 s
    ("lightgbm", "tests.wrappedkinds.LostWorkerLightGBM")])
def test_large_segment_resumes_from_its_checkpoint_when_a_ray_train_worker_dies(
    ray_on_spark, spark, tmp_path, caplog, kind, lost
):
    ds = big_and_small_stores(spark)
    pid_file, resumed_file = tmp_path / "pid", tmp_path / "resumed"
    params = {"n_estimators": 60, "max_depth": 3}

    def run(kind: str, checkpoint_rounds: int, **own) -> pd.DataFrame:
        training = {"output_dir": str(tmp_path), "large_segment_rows": 1000,
                    "large_segment_checkpoint_rounds": checkpoint_rounds, "progress": False}
        config = job(tmp_path, time_column=None, refit=False, training=training, models=[
            {"name": "xgb", "kind": kind, "params": params | own}])
        return by_store(train_segments(ds, config))

    def kill_the_waiting_worker() -> None:
        faults._wait_for(pid_file.exists)  # rank 0 after round 30 (a checkpoint)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)

    killer = threading.Thread(target=kill_the_waiting_worker, daemon=True)
    killer.start()
    with caplog.at_level(logging.WARNING, logger="raybricks"):
        killed = run(lost, 10, stop_after=30,
                     pid_file=str(pid_file), resumed_file=str(resumed_file))
    killer.join()
    assert (killed.status == "trained").all()
    # Ray Train restarted the workers, which continued from a checkpoint: round 30's, or
    # 20's when the worker died before Ray Train took in its last report (Ray >= 2.4x
    # takes reports in every couple of seconds, one waiting at most)
    start = 60 - int(resumed_file.read_text())  # rounds fitted after the restart, of 60
    assert start in (20, 30)
    assert f"resumed from its checkpoint at round {start} of 60" in caplog.text
    # ... into the model an uninterrupted fit makes (without checkpoints, as before them)
    uninterrupted = run(kind, 0)
    assert killed.loc["big", "xgb_rmse"] == pytest.approx(
        uninterrupted.loc["big", "xgb_rmse"], rel=1e-6)


def test_bad_columns_are_refused_before_training(shops_ds, tmp_path):
    with pytest.raises(DataError, match=r"column\(s\) \['price'\] not in the data"):
        train_segments(shops_ds, job(tmp_path, features=["x1", "price"]))
    with pytest.raises(DataError, match=r"\['X1', 'x_2'\] not in the data; it has .*"
                                        r"'X1': did you mean 'x1'\?; 'x_2': did you mean "
                                        r"'x2'\? names are matched exactly"):
        train_segments(shops_ds, job(tmp_path, features=["X1", "x_2"]))
    with pytest.raises(DataError, match="not numeric"):
        train_segments(shops_ds, job(tmp_path, target="color", features=["x1"]))


def test_lost_worker_is_retried_and_every_segment_accounted(ray_on_spark, spark, tmp_path):
    data = helpers.shops().query("store in ['s0', 's1', 's2', 's3']")
    ds = to_ray_dataset(spark.createDataFrame(data), ["store"], min_blocks=1)
    marker = tmp_path / "died"
    config = job(tmp_path, features=["x1"], models=[{
        "name": "fragile", "kind": "function", "function": "tests.helpers.fit_or_die_once",
        "params": {"marker": str(marker)}}])
    result = train_segments(ds, config)
    assert marker.read_text() == "died once"  # a worker really died mid-training
    assert result.counts() == {"trained": 4, "skipped": 0, "failed": 0}


def test_large_segment_without_boosting_candidates_trains_in_one_task(
    ray_on_spark, spark, tmp_path
):
    data = helpers.shops().query("store in ['s0', 's5', 'few']")
    ds = to_ray_dataset(spark.createDataFrame(data), ["store"], min_blocks=1)
    config = job(tmp_path, models=[CANDIDATES[0]],
                 training={"output_dir": str(tmp_path), "large_segment_rows": 100,
                           "progress": False})
    rows = by_store(train_segments(ds, config))
    assert list(rows.status) == ["skipped", "trained", "trained"]  # few, s0, s5 (110 rows)
    assert rows.loc["s5", "n_rows"] == 110
    assert json.loads(rows.loc["s5", "chosen"])[0] == "local:ridge"


def block_listing(keys: list[int], rows: list[int]):
    """A block's segments as the readers report them: integer keys, their row counts."""
    return BlockSegments(pa.table({"k": pa.array(keys, pa.int64())}), np.array(rows))


def test_packed_tasks_cover_every_segment_to_train_once_in_shrinking_runs():
    from raybricks.training.engine import MIN_SEGMENTS_PER_TASK, make_chunks, run_size

    # two blocks: 300 segments of 1 to 5 rows, then 500 of 2 rows; some are done already
    bounds = [block_listing(list(range(300)), [1 + i % 5 for i in range(300)]),
              block_listing(list(range(300, 800)), [2] * 500)]
    done = {(i,) for i in range(0, 800, 7)}
    todo = [np.array([k not in done for k, _ in block]) for block in bounds]
    chunks = make_chunks(todo, bounds, cpus=2)
    keys = [k for c in chunks for k in c.keys(bounds)]
    assert sorted(keys) == sorted({(i,) for i in range(800)} - done)  # each once, none done
    sizes = [len(c.keys(bounds)) for c in chunks]
    # guided sizes: the first run takes its share of everything, the last ones are small
    assert max(sizes) == run_size(len(keys), len(keys), cpus=2) > 2 * MIN_SEGMENTS_PER_TASK
    assert min(sizes) <= MIN_SEGMENTS_PER_TASK
    assert 4 <= len(chunks) < len(keys) / MIN_SEGMENTS_PER_TASK + len(bounds)
    rows = [c.end - c.start for c in chunks]
    assert rows == sorted(rows, reverse=True)  # the largest are submitted first
    # a job of few (slow) segments on many CPUs still gives every CPU work
    few = [block_listing(list(range(100)), [10] * 100)]
    assert len(make_chunks([np.ones(100, dtype=bool)], few, cpus=16)) >= 16
    for chunk in chunks:  # the row range holds exactly the chunk's segments, in order
        offsets, at = {}, 0
        for key, rows in bounds[chunk.block]:
            offsets[key] = (at, at + rows)
            at += rows
        inside = [k for k, (s, e) in offsets.items() if chunk.start <= s and e <= chunk.end]
        assert chunk.start == offsets[inside[0]][0] and chunk.end == offsets[inside[-1]][1]
        assert set(chunk.keys(bounds)) == set(inside) - done
        # a run without done segments in it trains its whole row range: no key set sent
        assert (chunk.only is None) == (not set(inside) & done)


def test_a_resumed_run_trains_only_the_segments_without_results():
    from raybricks.training.engine import segment_masks

    keys = pa.table({"store": pa.array(["a", None, "c", "d"]), "day": pa.array([1, 2, None, 4])})
    block = BlockSegments(keys, np.array([5, 50, 5, 5]))
    plan = SimpleNamespace(segment_by=["store", "day"], large_segment_rows=20)
    previous = pa.table({"store": pa.array([None, "c", "x"]), "day": pa.array([2, None, 1]),
                         "status": pa.array(["trained"] * 3)})
    todo, large, done = segment_masks([block], plan, previous)
    # null keys match null keys; the large segment was done before, so it is not redone
    assert done == 2 and todo[0].tolist() == [True, False, False, True]
    assert large[0].tolist() == [False] * 4
    todo, large, done = segment_masks([block], plan, pa.table({}))
    assert done == 0 and todo[0].tolist() == [True, False, True, True]
    assert large[0].tolist() == [False, True, False, False]
    assert ("a", 1) in block and (None, 2) in block and ("c", None) in block
    assert ("a", 2) not in block and (None, None) not in block


def test_tasks_cap_every_thread_pool_of_the_candidates_libraries():
    from threadpoolctl import threadpool_info

    from raybricks.training.packed import limit_threads
    from raybricks.training.tasks import task_of

    config = JobConfig.from_dict({
        "source": {"table": "t"}, "segment_by": ["store"], "target": "y", "models": CANDIDATES,
    })
    plan = make_plan(config, pa.Table.from_pandas(helpers.shops()).schema)
    for _ in range(2):  # the second task reuses the first one's scan of the libraries
        with limit_threads(task_of(config), plan):
            pools = threadpool_info()
            assert {p["internal_api"] for p in pools} >= {"openblas", "openmp"}
            assert all(p["num_threads"] == plan.threads == 1 for p in pools)


def test_a_segments_gaps_are_filled_with_its_training_medians_and_checked_per_split():
    """One sort per segment gives each feature's range, median and profile: the fill
    values are numpy's nan-medians of the segment's rows (an empty feature: 0), the
    profile is the one its own values give, and a feature that varies only in the
    validation rows is no feature."""
    from raybricks import profiles
    from raybricks.training.selection import Skip
    from raybricks.training.tabular.segment import prepare

    rng = np.random.default_rng(3)
    config = JobConfig.from_dict({
        "source": {"path": "unused"}, "segment_by": ["s"], "target": "y",
        "features": ["a", "b", "c"], "min_rows": 2,
        "models": [{"name": "lr", "kind": "sklearn",
                    "estimator": "sklearn.linear_model.LinearRegression"}]})
    schema = pa.schema([("s", pa.int64()), ("y", pa.float64()), ("a", pa.float64()),
                        ("b", pa.float64()), ("c", pa.float64())])
    plan = make_plan(config, schema)
    for rows in (7, 8, 16, 51):
        frame = pd.DataFrame(rng.normal(size=(rows, 4)), columns=["y", "a", "b", "c"])
        frame.loc[(rng.random(rows) < 0.3) & (frame.index > 3), "a"] = np.nan
        frame["c"] = np.nan  # a feature without a value
        frame.loc[0, "b"] = np.nan
        prep = prepare(frame, plan, (rows,))
        values = frame[["a", "b", "c"]].to_numpy()
        with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
            expected = np.nan_to_num(np.nanmedian(values, axis=0), nan=0.0)
        assert list(prep.meta["fill"].values()) == expected.tolist()
        assert prep.meta["fill"]["c"] == 0.0
        found = profiles.profile(prep.values, ["a", "b", "c"], None, [], [0.0], 1,
                                 prep.ordered)
        assert found == profiles.profile(values, ["a", "b", "c"], None, [], [0.0], 1)
    # a feature that varies only in the validation rows: skipped with that reason
    frame = pd.DataFrame({"y": np.arange(10.0), "a": 1.0, "b": np.nan, "c": np.nan})
    train, valid = prepare(frame.assign(a=np.arange(10.0)), plan, (0,)).splits[0]
    frame.loc[valid, "a"] = np.arange(len(valid)) + 5.0
    with pytest.raises(Skip, match="varies only in the validation rows"):
        prepare(frame, plan, (0,))
