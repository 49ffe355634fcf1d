"""MLflow on SQLite: the run, the segmented pyfunc, registration and the alias gate."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from raybricks import packaging, tracking
from raybricks.data import to_ray_dataset
from raybricks.errors import ConfigError
from raybricks.segmented_model import SegmentModel, SegmentStore, library_version_problem
from raybricks.training import train_segments
from tests import helpers
from tests.test_training import CANDIDATES, job

STRONG = CANDIDATES[:1] + CANDIDATES[2:]  # ridge + xgboost
WEAK = [{"name": "ridge", "kind": "sklearn", "estimator": "sklearn.dummy.DummyRegressor"}]


@pytest.fixture(scope="module")
def shops_ds(ray_on_spark, spark):
    return to_ray_dataset(spark.createDataFrame(helpers.shops()), ["store"])


def trained(ds, tmp_path_factory, **changes):
    return train_segments(ds, job(tmp_path_factory.mktemp("runs"), **changes))


@pytest.fixture(scope="module")
def shops_result(shops_ds, tmp_path_factory):
    return trained(shops_ds, tmp_path_factory, models=STRONG, ensemble="weighted",
                   fallback="global", selection="local_only")


@pytest.fixture(scope="module")
def shops_publication(shops_result, tmp_path_factory):
    config = job(tmp_path_factory.mktemp("cfg"), models=STRONG, ensemble="weighted",
                 fallback="global", selection="local_only",
                 registry={"name": "tests.shops.model"})
    return tracking.publish(shops_result, config)


def member_prediction(result, store: str, frame: pd.DataFrame) -> np.ndarray:
    """What the training run's own serialized members predict for one segment."""
    models = result.models().to_pandas()
    rows = models[models.store == store].to_dict("records")
    return SegmentModel.from_rows(rows).predict(frame)


@pytest.mark.topology
def test_one_run_holds_params_metrics_tables_plots_and_the_model(shops_publication):
    from mlflow import MlflowClient

    client = MlflowClient()
    run = client.get_run(shops_publication.run_id)
    params, metrics = run.data.params, run.data.metrics
    assert params["target"] == "y" and params["models.1.kind"] == "xgboost"
    assert params["segment_by"] == '["store"]'
    assert metrics["segments_trained"] == 8 and metrics["segments_skipped"] == 3
    assert metrics["segments_total"] == 11
    assert 0 < metrics["rmse_median"] <= metrics["rmse_p90"]
    assert metrics["share_beats_baseline"] == 1.0
    assert metrics["seconds_train_segments"] > 0
    files = {f.path for f in client.list_artifacts(run.info.run_id, "results")}
    files |= {f.path for f in client.list_artifacts(run.info.run_id, "plots")}
    assert {"results/segments.parquet", "results/failures.parquet",
            "plots/metric_distribution.png", "plots/model_vs_baseline.png",
            "plots/chosen_candidates.png"} <= files
    failures = pd.read_parquet(client.download_artifacts(run.info.run_id,
                                                         "results/failures.parquet"))
    assert set(failures.store) == {"few", "constant", "no_feature"}
    assert failures.reason.notna().all()
    # one registered version, tagged, holding both aliases (first version: promoted)
    version = client.get_model_version_by_alias("tests.shops.model", "champion")
    assert str(version.version) == shops_publication.version
    assert client.get_model_version_by_alias("tests.shops.model", "challenger").version == \
        version.version
    assert version.tags["raybricks.segments_trained"] == "8"
    assert version.tags["raybricks.config_hash"] == run.data.tags["raybricks.config_hash"]
    assert shops_publication.decision["reason"] == "first version"


def test_model_is_stored_compactly_in_native_formats(shops_publication, tmp_path):
    import mlflow

    local = mlflow.artifacts.download_artifacts(
        artifact_uri="models:/tests.shops.model@champion", dst_path=str(tmp_path))
    segments = tmp_path / "artifacts" / "segments"
    assert local and {p.name for p in segments.iterdir()} == {
        "manifest.json", "index.parquet", "models-00000.parquet", "fallback.parquet"}
    members = pq.read_table(segments / "models-00000.parquet").to_pandas()
    # the constant store is served by its constant (a baseline member)
    assert set(members.kind) == {"sklearn", "xgboost", "baseline"}
    assert set(members.store) == {f"s{i}" for i in range(8)} | {"constant"}
    requirements = (tmp_path / "requirements.txt").read_text().split()
    names = sorted(r.split("==")[0] for r in requirements)
    assert names == ["mlflow", "numpy", "pandas", "pyarrow", "scikit-learn", "xgboost"]
    assert all("==" in r for r in requirements)


BLOCK_RAYBRICKS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "raybricks" or name.startswith("raybricks."):
            raise ImportError("raybricks is not installed here")
sys.meta_path.insert(0, Block())
"""


def run_without_raybricks(code: str) -> None:
    """Run ``code`` in a fresh interpreter that cannot import raybricks; fail if it fails
    or imported raybricks after all."""
    code = BLOCK_RAYBRICKS + code + """
print("raybricks imported:", any(m == "raybricks" or m.startswith("raybricks.")
                                 for m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "raybricks imported: False" in done.stdout


@pytest.mark.topology
def test_model_loads_and_predicts_where_raybricks_cannot_be_imported(
        shops_publication, shops_result, tmp_path):
    frame = helpers.shops().sample(frac=1.0, random_state=3).iloc[:40]
    frame.to_parquet(tmp_path / "input.parquet")
    run_without_raybricks(f"""
import mlflow, pandas as pd
model = mlflow.pyfunc.load_model("models:/tests.shops.model@champion")
frame = pd.read_parquet({str(tmp_path / 'input.parquet')!r})
model.predict(frame).to_frame().to_parquet({str(tmp_path / 'out.parquet')!r})
try:  # a column in another case: refused, naming it (MLflow's schema check, or ours)
    model.predict(frame.rename(columns={{"x1": "X1"}}))
except Exception as exc:
    open({str(tmp_path / 'refused.txt')!r}, "w").write(type(exc).__name__ + ": " + str(exc))
""")
    refused = (tmp_path / "refused.txt").read_text()
    assert "x1" in refused and "ModuleNotFoundError" not in refused, refused
    predicted = pd.read_parquet(tmp_path / "out.parquet")["prediction"].to_numpy()
    for store in ["s0", "s5"]:
        rows = (frame.store == store).to_numpy()
        expected = member_prediction(shops_result, store, frame[rows])
        np.testing.assert_allclose(predicted[rows], expected, rtol=1e-9)


def test_predict_mixed_segments_in_input_order_with_fallback_and_errors(
        shops_publication, shops_result):
    import mlflow

    model = mlflow.pyfunc.load_model("models:/tests.shops.model@champion")
    data = helpers.shops()
    frame = data.sample(frac=1.0, random_state=7).reset_index(drop=True)
    frame.loc[:9, "store"] = "never-seen"
    frame["extra"] = "ignored"
    frame = frame[["extra", "color", "x2", "store", "x1", "day", "y"]]  # any column order
    predicted = model.predict(frame).to_numpy()
    assert len(predicted) == len(frame)
    for store in ["s1", "s7"]:
        rows = (frame.store == store).to_numpy()
        np.testing.assert_allclose(predicted[rows],
                                   member_prediction(shops_result, store, frame[rows]))
    fallback = SegmentModel.from_rows(shops_result.fallback)
    for store in ["never-seen", "few"]:  # unknown, and skipped in training
        rows = (frame.store == store).to_numpy()
        np.testing.assert_allclose(predicted[rows], fallback.predict(frame[rows]))
    with pytest.raises(Exception, match="x2"):
        model.predict(frame.drop(columns=["x2"]))


def test_unknown_segments_without_fallback_get_null_and_a_counted_warning(
        shops_result, tmp_path):
    packaged = packaging.package_result(shops_result, tmp_path / "segments")
    (tmp_path / "segments" / "fallback.parquet").unlink()
    store = SegmentStore(tmp_path / "segments")
    frame = helpers.shops().iloc[:30].assign(store=["s0"] * 10 + ["nowhere"] * 20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = store.predict(frame)
    assert packaged.with_model == 9  # 8 trained, the constant store by its constant
    assert result.values.iloc[10:].isna().all() and result.values.iloc[:10].notna().all()
    assert list(result.status[:10]) == ["trained"] * 10
    assert set(result.status[10:]) == {"unknown"}
    assert any("20 row(s)" in str(w.message) for w in caught)


def test_packaging_streams_the_parts_and_leaves_out_a_models_part_without_results(
        shops_result, tmp_path, monkeypatch):
    """One models part at a time into shards (row groups filled across parts), and a
    models part whose task stopped before its results part was written is not packaged
    (its segments were trained again, so they would otherwise have their members twice)."""
    import dataclasses
    import shutil

    import pyarrow as pa
    import pyarrow.compute as pc

    run_dir = tmp_path / "run"
    shutil.copytree(shops_result.run_dir, run_dir)
    members = pq.read_table([str(p) for p in sorted((run_dir / "models").glob("*.parquet"))])
    for part in (run_dir / "models").glob("*.parquet"):  # one part per segment, renamed
        part.unlink()
    for part in (run_dir / "results").glob("*.parquet"):
        part.unlink()
    results = shops_result.columns(list(shops_result.segments.columns))
    stores = sorted(set(members.column("store").to_pylist()))
    for i, store in enumerate(stores):
        pq.write_table(members.filter(pc.equal(members.column("store"), store)),
                       run_dir / "models" / f"part-{i}.parquet")
        pq.write_table(results.filter(pc.equal(results.column("store"), store)),
                       run_dir / "results" / f"part-{i}.parquet")
    rest = results.filter(pc.invert(pc.is_in(results.column("store"), pa.array(stores))))
    pq.write_table(rest, run_dir / "results" / "part-rest.parquet")
    pq.write_table(members, run_dir / "models" / "part-orphan.parquet")  # no results part
    result = dataclasses.replace(shops_result, run_dir=run_dir)
    monkeypatch.setattr(packaging, "SEGMENTS_PER_ROW_GROUP", 3)
    monkeypatch.setattr(packaging, "SEGMENTS_PER_SHARD", 5)
    packaged = packaging.package_result(result, tmp_path / "segments")

    stored = packaging.read_members(tmp_path / "segments")
    assert stored.num_rows == members.num_rows  # the orphan's copies were left out
    index = pq.read_table(tmp_path / "segments" / "index.parquet").to_pandas()
    assert packaged.with_model == len(stores) == (index.shard >= 0).sum()
    assert sorted(index.store) == sorted(results.column("store").to_pylist())
    for shard in sorted(set(index.shard[index.shard >= 0])):  # full row groups, then shards
        groups = index[index.shard == shard].groupby("row_group").size().tolist()
        assert groups == [3, 2] or shard == index.shard.max()
    frame = helpers.shops()
    predicted = SegmentStore(tmp_path / "segments").predict(frame).values
    expected = SegmentStore(packaging.package_result(
        shops_result, tmp_path / "whole").directory).predict(frame).values
    np.testing.assert_allclose(np.asarray(predicted, float), np.asarray(expected, float))


def test_segment_store_reads_only_needed_row_groups_and_bounds_its_cache(
        shops_result, tmp_path, monkeypatch):
    monkeypatch.setattr(packaging, "SEGMENTS_PER_ROW_GROUP", 3)
    monkeypatch.setattr(packaging, "SEGMENTS_PER_SHARD", 5)
    packaging.package_result(shops_result, tmp_path / "segments")
    index = pq.read_table(tmp_path / "segments" / "index.parquet").to_pandas()
    located = index[index.shard >= 0]
    assert sorted(set(located.shard)) == [0, 1]  # 8 segments, 5 per shard
    for _, row in located.iterrows():  # each segment whole inside its row group
        group = pq.ParquetFile(tmp_path / "segments" / f"models-{row.shard:05d}.parquet")
        stores = set(group.read_row_group(row.row_group).column("store").to_pylist())
        assert row.store in stores
    members = pq.read_table(tmp_path / "segments" / "models-00000.parquet")
    # 5 segments, one the constant store (1 member), the rest 2 members: none split off
    assert members.num_rows == 4 * 2 + 1
    store = SegmentStore(tmp_path / "segments", cache_segments=2)
    frame = helpers.shops()
    first = store.predict(frame[frame.store.isin(["s0", "s1", "s6"])])
    assert len(store._cache) == 2
    again = store.predict(frame[frame.store.isin(["s0", "s1", "s6"])])
    np.testing.assert_array_equal(first.values, again.values)


def test_classification_returns_classes_or_probabilities(ray_on_spark, spark,
                                                         tmp_path_factory):
    import mlflow

    data = helpers.classes(3)
    ds = to_ray_dataset(spark.createDataFrame(data), ["store"])
    config = job(tmp_path_factory.mktemp("runs"), target="label", features=["x1", "x2"],
                 time_column=None, task="multiclass", models=STRONG,
                 validation={"method": "holdout", "metric": "logloss"},
                 registry={"name": "tests.classes.model"})
    result = train_segments(ds, config)
    publication = tracking.publish(result, config)
    model = mlflow.pyfunc.load_model(f"models:/tests.classes.model/{publication.version}")
    labels = model.predict(data)
    assert set(labels) <= {"maybe", "no", "yes"} and len(labels) == len(data)
    assert (labels == data.label).mean() > 0.7
    probabilities = model.predict(data, params={"probabilities": True})
    assert list(probabilities.columns) == ["maybe", "no", "yes"]
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    assert (probabilities.idxmax(axis=1).to_numpy() == labels.to_numpy()).all()
    signature = model.metadata.signature
    assert signature.outputs.input_names() == ["prediction"]
    assert {"store", "x1", "x2"} == set(signature.inputs.input_names())


def published_champion(result, tmp_path_factory, name: str, rule: str):
    """The strong candidates' config under ``name`` and ``rule``, published first."""
    config = job(tmp_path_factory.mktemp("cfg"), models=STRONG,
                 registry={"name": name, "promote": rule})
    return config, tracking.publish(result, config)


def test_promotion_if_better_keeps_a_worse_champion_and_always_replaces_it(
        shops_ds, shops_result, tmp_path_factory):
    from mlflow import MlflowClient

    name = "tests.gate.if_better"
    _, first = published_champion(shops_result, tmp_path_factory, name, "if_better")
    weak_result = trained(shops_ds, tmp_path_factory, models=WEAK)
    weak = job(tmp_path_factory.mktemp("cfg"), models=WEAK,
               registry={"name": name, "promote": "if_better"})
    second = tracking.publish(weak_result, weak)
    assert second.decision["decision"] == "kept"
    comparison = second.decision["comparison"]
    assert comparison["common_segments"] == 8
    assert comparison["challenger_mean"] > comparison["champion_mean"]
    client = MlflowClient()
    assert str(client.get_model_version_by_alias(name, "champion").version) == first.version
    assert str(client.get_model_version_by_alias(name, "challenger").version) == \
        second.version
    run = client.get_run(second.run_id)
    assert run.data.tags["raybricks.promotion"] == "kept"
    assert run.data.metrics["promotion_common_segments"] == 8
    always = weak.model_copy(update={"registry": weak.registry.model_copy(
        update={"promote": "always"})})
    third = tracking.publish(weak_result, always)
    assert third.champion_version == third.version != first.version


def test_promotion_merge_takes_the_better_model_per_segment(
        spark, shops_result, tmp_path_factory, monkeypatch):
    import mlflow
    from mlflow.tracking import fluent

    name = "tests.gate.merge"
    strong, first = published_champion(shops_result, tmp_path_factory, name, "merge")
    # the challenger trains only four stores, weakly: the merge keeps the champion's
    # models for all eight, and records where each came from
    data = helpers.shops()
    weak_ds = to_ray_dataset(
        spark.createDataFrame(data[data.store.isin(["s0", "s1", "s2", "s3", "few"])]),
        ["store"])
    weak_result = trained(weak_ds, tmp_path_factory, models=WEAK)
    second = tracking.publish(weak_result, strong)
    assert second.decision["decision"] == "merged"
    merged = second.champion_version
    assert merged not in (first.version, second.version)
    # the champion's eight stores, and its two skipped segments the challenger never saw
    assert second.decision["segments_from"] == {f"version {first.version}": 10,
                                                f"version {second.version}": 1}
    model = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    rows = data[data.store == "s2"]
    np.testing.assert_allclose(model.predict(rows), member_prediction(shops_result, "s2", rows))
    # re-registering the same run is idempotent: the same versions come back, also
    # where the caller (a notebook) made another experiment active, which MLflow alone
    # refuses to resume the run under; that experiment stays active
    monkeypatch.setattr(fluent, "_active_experiment_id", fluent._active_experiment_id)
    elsewhere = mlflow.set_experiment("tests.gate.elsewhere").experiment_id
    assert elsewhere != second.experiment_id
    with pytest.raises(mlflow.exceptions.MlflowException, match="does not match"), \
            mlflow.start_run(run_id=second.run_id):
        pass
    again = tracking.register_run(second.run_id, strong)
    assert again.version == second.version and again.champion_version == merged
    with mlflow.start_run() as run:
        assert run.info.experiment_id == elsewhere


def members_by_store(directory: Path) -> dict[str, list[tuple]]:
    """Each segment's stored members (candidate, weight, payload bytes, meta) as stored."""
    found: dict[str, list[tuple]] = {}
    for row in packaging.read_members(directory).to_pylist():
        found.setdefault(row["store"], []).append(
            (row["candidate"], row["weight"], row["payload"], row["meta"]))
    return found


@pytest.mark.topology
def test_retraining_listed_segments_replaces_only_those(ray_on_spark, spark, tmp_path):
    """``source.segments`` (``raybricks train --segments``): only the listed segments
    train, a new one among them too; the registered version takes them from the run
    and every other segment's members byte for byte from the champion."""
    import mlflow
    from mlflow import MlflowClient

    from raybricks import pipeline

    name = "tests.gate.retrain"
    data = helpers.shops()
    data.to_parquet(tmp_path / "shops.parquet")
    config = job(tmp_path / "runs", source={"path": str(tmp_path / "shops.parquet")},
                 models=STRONG, registry={"name": name})
    first = pipeline.train(config, spark).publication
    # later: store s2's world changed, and a new store s9 opened
    later = data.copy()
    later.loc[later.store == "s2", "y"] *= -1
    new_store = data[data.store == "s0"].assign(store="s9")
    pd.concat([later, new_store]).to_parquet(tmp_path / "later.parquet")
    pd.DataFrame({"store": ["s2", "s9", "gone"]}).to_parquet(tmp_path / "retrain.parquet")
    retrain = job(tmp_path / "runs", source={"path": str(tmp_path / "later.parquet"),
                                             "segments": str(tmp_path / "retrain.parquet")},
                  models=STRONG, registry={"name": name})
    assert retrain.registry.promote == "replace"  # the default with source.segments
    report = pipeline.train(retrain, spark)
    assert set(report.result.segments.store) == {"s2", "s9"}  # "gone" has no rows
    second = report.publication
    assert second.decision["decision"] == "merged" and second.decision["rule"] == "replace"
    # one version: the merged one (the run's own model of two stores stays in its run)
    assert second.version == second.champion_version
    assert second.decision["segments_from"] == {f"version {first.version}": 10,
                                                f"run {second.run_id}": 2}
    champion = mlflow.artifacts.download_artifacts(f"models:/{name}/{first.version}",
                                                   dst_path=str(tmp_path / "old"))
    merged = mlflow.artifacts.download_artifacts(f"models:/{name}@champion",
                                                 dst_path=str(tmp_path / "new"))
    run = mlflow.artifacts.download_artifacts(second.model_uri,
                                              dst_path=str(tmp_path / "run"))
    old, new, ran = (members_by_store(Path(d) / "artifacts" / "segments")
                     for d in (champion, merged, run))
    assert set(new) == set(old) | {"s9"}
    for store in set(old) - {"s2"}:
        assert new[store] == old[store], store  # byte for byte
    assert new["s2"] == ran["s2"] != old["s2"] and new["s9"] == ran["s9"]
    rows = later[later.store == "s2"]
    model = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    fit = np.corrcoef(model.predict(rows), rows.y)[0, 1]
    assert fit > 0.9  # the retrained store follows its new world
    description = MlflowClient().get_model_version(name, second.champion_version).description
    assert "replace" in description and "retrain.parquet" in description
    assert "store='s2'" in description and "2 of 12 segments" in description


def test_a_retrain_of_listed_segments_never_becomes_the_whole_champion(tmp_path):
    with pytest.raises(ConfigError, match="would make a version of those alone"):
        job(tmp_path, source={"table": "t", "segments": "keys"},
            registry={"name": "m", "promote": "always"})
    assert job(tmp_path, source={"table": "t", "segments": "keys"},
               registry={"name": "m", "promote": "merge"}).registry.promote == "merge"


def test_unity_catalog_names_are_checked_before_work(tmp_path):
    config = job(tmp_path, registry={"name": "just_a_name"})
    with pytest.raises(ConfigError, match="catalog.schema.model"):
        tracking.check_registry_name(config, "databricks-uc")
    tracking.check_registry_name(config, "sqlite:///x.db")  # any name elsewhere


def test_flattened_params_stay_within_mlflow_limits():
    flat = tracking.run.flatten({"models": [{"name": "a", "params": {"x": "y" * 9000}}],
                             "segment_by": ["s", "t"]})
    assert flat["segment_by"] == '["s", "t"]'
    assert len(flat["models.0.params.x"]) == tracking.run.PARAM_VALUE_LIMIT
    assert json.loads(flat["segment_by"]) == ["s", "t"]


# heavy: the model format on every runtime: test_registered_formats; ~24 s
@pytest.mark.heavy
def test_ten_thousand_segment_model_round_trip(shops_result, tmp_path, capsys):
    """10,000 segments through log, register and load (time and size reported, not
    asserted): a real Ridge member of the training run stands in for every segment."""
    import time

    import mlflow
    import pyarrow as pa
    import pyarrow.compute as pc

    members = shops_result.models()
    ridge = members.filter(pc.and_(pc.equal(members.column("store"), "s3"),
                                   pc.equal(members.column("kind"), "sklearn")))
    keys = [f"k{i:05d}" for i in range(10_000)]
    many = pa.concat_tables([ridge] * len(keys)).set_column(
        0, "store", pa.array(keys, pa.string()))
    index = pa.table({"store": keys, "status": ["trained"] * len(keys),
                      "reason": pa.nulls(len(keys), pa.string()),
                      "metric": [1.0] * len(keys), "baseline": [2.0] * len(keys),
                      "chosen": ['["ridge"]'] * len(keys), "source": [""] * len(keys)})
    manifest = {"format_version": 1, "segment_by": ["store"], "features": ["x1", "x2", "color"],
                "task": "regression", "metric": "rmse", "classes": None}
    start = time.perf_counter()
    packaged = packaging.write_segments(tmp_path / "segments", manifest, [(index, many)], None)
    with mlflow.start_run():
        info = tracking.model.log_segmented_model(packaged, helpers.shops().head(5).assign(
            store="k00000"), "segmented_model")
    version = tracking.registration.register(info.model_uri, "tests.many.model", info.run_id,
                                             {}, "x")
    logged = time.perf_counter() - start
    model = mlflow.pyfunc.load_model(f"models:/tests.many.model/{version.version}")
    frame = helpers.shops().sample(3000, replace=True, random_state=0).reset_index(
        drop=True).assign(store=np.random.default_rng(0).choice(keys, 3000))
    predicted = model.predict(frame)
    loaded = time.perf_counter() - start - logged
    expected = SegmentModel.from_rows(ridge.to_pylist()).predict(frame)
    np.testing.assert_allclose(predicted, expected)
    assert packaged.with_model == 10_000 and len(list(packaged.directory.glob("models-*"))) == 1
    with capsys.disabled():
        print(f"\n10,000-segment model: {packaged.size_bytes / 2**20:.1f} MiB, package+log+"
              f"register {logged:.1f}s, load+predict 3,000 rows of ~2,600 segments "
              f"{loaded:.1f}s")


def test_tracking_defaults_local_sqlite_databricks_and_env(monkeypatch, tmp_path,
                                                          mlflow_restored):
    import mlflow

    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "DATABRICKS_RUNTIME_VERSION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    local = tracking.configure_tracking()
    assert local.tracking_uri == local.registry_uri == f"sqlite:///{tmp_path}/mlflow.db"
    config = job(tmp_path, tracking={"experiment": "defaults"})
    with mlflow.start_run(experiment_id=tracking.experiment_id(config, local)):
        mlflow.log_dict({"a": 1}, "a.json")
    assert (tmp_path / "mlflow.db").exists()
    assert list((tmp_path / "mlruns").rglob("a.json"))  # artifacts in ./mlruns
    # another tracking store later in the process (a notebook's next job): its
    # registry follows it, though MLflow copied the first one into the environment
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/moved.db")
    moved = tracking.configure_tracking()
    assert moved.registry_uri == mlflow.get_registry_uri() == \
        f"sqlite:///{tmp_path}/moved.db"
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # mlflow sets them too
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")
    workspace = tracking.configure_tracking()
    assert (workspace.tracking_uri, workspace.registry_uri) == ("databricks",
                                                                "databricks-uc")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/other.db")
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", f"sqlite:///{tmp_path}/registry.db")
    chosen = tracking.configure_tracking()
    assert chosen.tracking_uri.endswith("other.db")
    assert mlflow.get_registry_uri().endswith("registry.db")


def copy_with_library_version(uri: str, directory, library: str, version: str):
    """A local copy of a logged model whose manifest says ``library`` was ``version``
    (as if trained elsewhere); returns the model directory."""
    import mlflow

    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(directory)))
    manifest_path = local / "artifacts" / "segments" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["libraries"][library] = version
    manifest_path.write_text(json.dumps(manifest))
    return local


def version_warnings(caught) -> list[warnings.WarningMessage]:
    return [w for w in caught if w.category.__name__ == "LibraryVersionWarning"]


def test_model_library_of_another_version_warns_once_per_load(shops_publication, tmp_path):
    import mlflow

    uri = "models:/tests.shops.model@champion"
    frame = helpers.shops()  # every segment, and the fallback's
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri,
                                                     dst_path=str(tmp_path / "same")))
    manifest = json.loads((local / "artifacts" / "segments" / "manifest.json").read_text())
    # only the libraries the members use, at the versions they were trained with
    assert manifest["libraries"] == {"scikit-learn": version("scikit-learn"),
                                     "xgboost": version("xgboost")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mlflow.pyfunc.load_model(uri).predict(frame)
    assert version_warnings(caught) == []
    other = copy_with_library_version(uri, tmp_path / "other", "scikit-learn", "1.0.2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # a repeat would show
        model = mlflow.pyfunc.load_model(str(other))
        for _ in range(3):
            model.predict(frame)
    [found] = version_warnings(caught)
    assert issubclass(found.category, UserWarning)
    message = str(found.message)
    assert f"scikit-learn 1.0.2 (installed here: {version('scikit-learn')})" in message
    assert "xgboost" not in message  # trained with the installed version
    assert "mlflow.pyfunc.get_model_dependencies(" in message


def test_merged_model_keeps_the_library_versions_of_both_models(shops_result, tmp_path):
    import pyarrow as pa

    challenger = packaging.package_result(shops_result, tmp_path / "new", "new").directory
    champion = packaging.package_result(shops_result, tmp_path / "old", "old").directory
    manifest = json.loads((champion / "manifest.json").read_text())
    manifest["libraries"]["scikit-learn"] = "1.0.2"  # the champion trained elsewhere
    (champion / "manifest.json").write_text(json.dumps(manifest))
    installed = {"scikit-learn": version("scikit-learn"), "xgboost": version("xgboost")}
    ties = packaging.merge_segments(challenger, champion, tmp_path / "ties", ("new", "old"))
    assert ties.manifest["libraries"] == installed  # every segment from the challenger
    index = pq.read_table(champion / "index.parquet")
    metric = index.schema.get_field_index("metric")
    pq.write_table(index.set_column(metric, "metric", pa.array([0.0] * index.num_rows)),
                   champion / "index.parquet")  # the champion now wins every segment
    merged = packaging.merge_segments(challenger, champion, tmp_path / "merged",
                                      ("new", "old")).manifest
    both = sorted(["1.0.2", installed["scikit-learn"]])
    assert merged["libraries"] == installed | {"scikit-learn": both}
    problem = library_version_problem(merged, "models:/m/1")
    assert f"scikit-learn {' and '.join(both)} (installed here: " in problem
    assert "get_model_dependencies('models:/m/1')" in problem


def answers(model_uri: str, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """What a registered version answers for each store's rows of ``frame`` (plain MLflow)."""
    import mlflow

    predicted = np.asarray(mlflow.pyfunc.load_model(model_uri).predict(frame), dtype=float)
    return {store: predicted[(frame.store == store).to_numpy()]
            for store in frame.store.unique()}


def globals_of(model_uri: str, tmp_path: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """A registered version's manifest, index and global models."""
    import mlflow

    here = Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=str(tmp_path)))
    segments = here / "artifacts" / "segments"
    return (json.loads((segments / "manifest.json").read_text()),
            pd.read_parquet(segments / "index.parquet"),
            pd.read_parquet(segments / "fallback.parquet"))


@pytest.mark.topology
def test_a_retrain_with_the_global_model_keeps_every_untouched_answer(
        ray_on_spark, spark, tmp_path):
    """The demo's settings (``fallback: global``, the default shrink and selection): a
    retrain of two stores keeps the champion's global model (``global_model: keep``),
    so every other store, the skipped ones and a never-seen key answer exactly as
    before; with ``global_model: refit`` the new global model, fitted on the whole
    source, serves the retrained stores and unseen keys, and the champion's stores still
    answer with theirs. A retrain registers one version, the merged one."""
    from mlflow import MlflowClient

    from raybricks import pipeline

    name = "tests.gate.global_retrain"
    data = helpers.shops()
    data.to_parquet(tmp_path / "shops.parquet")
    settings = {"models": STRONG, "fallback": "global", "registry": {"name": name}}
    first = pipeline.train(job(tmp_path / "runs", source={
        "path": str(tmp_path / "shops.parquet")}, **settings), spark).publication
    _, index, _ = globals_of(f"models:/{name}/{first.version}", tmp_path / "first")
    chosen = index.set_index("store").chosen
    # the champion's stores depend on its global model: blended (the default shrink)
    # or served by it (skipped)
    assert chosen.str.contains("global").sum() >= 6, chosen
    assert (index.status == "skipped").sum() >= 1
    frame = pd.concat([data.drop(columns="y"),
                       data[data.store == "s0"].drop(columns="y").head(5).assign(
                           store="never-seen")], ignore_index=True)
    before = answers(f"models:/{name}@champion", frame)
    # later: store s2's world changed, and a new store s9 opened
    later = data.copy()
    later.loc[later.store == "s2", "y"] *= -1
    later = pd.concat([later, data[data.store == "s0"].assign(store="s9")])
    later.to_parquet(tmp_path / "later.parquet")
    pd.DataFrame({"store": ["s2", "s9"]}).to_parquet(tmp_path / "retrain.parquet")
    retrain = {"source": {"path": str(tmp_path / "later.parquet"),
                          "segments": str(tmp_path / "retrain.parquet")}} | settings
    versions = len(MlflowClient().search_model_versions(f"name = '{name}'"))
    kept = pipeline.train(job(tmp_path / "runs", **retrain), spark).publication
    assert kept.decision["decision"] == "merged"
    # one version users see: the merged one, both aliases on it
    assert len(MlflowClient().search_model_versions(f"name = '{name}'")) == versions + 1
    assert kept.version == kept.champion_version
    after = answers(f"models:/{name}@champion", frame)
    for store in set(before) - {"s2"}:
        np.testing.assert_array_equal(after[store], before[store], err_msg=store)
    rows = later[later.store == "s2"]
    assert np.corrcoef(answers(f"models:/{name}@champion", rows.drop(columns="y"))["s2"],
                       rows.y)[0, 1] > 0.9  # the retrained store follows its new world
    manifest, index, globals_ = globals_of(f"models:/{name}@champion", tmp_path / "kept")
    assert manifest["format_version"] == 2
    assert set(globals_["global"]) == set(index["global"]) == {manifest["global_model"]}
    description = MlflowClient().get_model_version(name, kept.version).description
    assert "global_model: keep" in description

    refit = job(tmp_path / "runs", **retrain, global_model="refit")
    again = pipeline.train(refit, spark).publication
    refitted = answers(f"models:/{name}@champion", frame)
    for store in set(before) - {"s2", "s9", "never-seen"}:
        np.testing.assert_array_equal(refitted[store], before[store], err_msg=store)
    manifest, index, globals_ = globals_of(f"models:/{name}@champion", tmp_path / "refit")
    new_global = manifest["global_model"]
    assert len(set(globals_["global"])) == 2 and new_global in set(globals_["global"])
    served = index.set_index("store")["global"]
    assert served["s2"] == served["s9"] == new_global != served["s0"]
    assert not np.allclose(refitted["never-seen"], before["never-seen"])
    description = MlflowClient().get_model_version(name, again.version).description
    assert "global_model: refit" in description


def test_a_merge_into_a_format_1_champion_keeps_its_answers(spark, shops_ds,
                                                            tmp_path_factory):
    """A champion registered before format 2 (one global model, no ``global`` column:
    tests/fixtures/registered) merged with a run of two stores that fitted its own global
    model: the champion's other stores, blended with its global model, and its skipped
    stores answer as before; the retrained ones and unseen keys with the run's."""
    from tests.test_registered_formats import FIXTURES, fixture_manifest

    here = tmp_path_factory.mktemp("format1")
    champion = FIXTURES / "tabular" / "model"
    manifest = fixture_manifest("tabular")
    frame = pd.read_parquet(FIXTURES / "tabular" / "input.parquet")
    before = SegmentStore(champion).predict(frame).values.to_numpy()
    data = helpers.shops()
    data.loc[data.store == "s2", "y"] *= -1
    run = trained(to_ray_dataset(spark.createDataFrame(data[data.store.isin(["s2", "s3"])]),
                                 ["store"]),
                  tmp_path_factory, models=STRONG, fallback="global")
    challenger = packaging.package_result(run, here / "run", "run")
    merged = packaging.merge_segments(challenger.directory, champion, here / "merged",
                                      ("run", "champion"), replace=True)
    assert merged.manifest["global_model"] == run.run_id
    store = SegmentStore(merged.directory)
    assert set(store.global_names) == {run.run_id, manifest["training_run"]}
    after = store.predict(frame).values.to_numpy()
    untouched = ~frame.store.isin(["s2", "s3", "never-seen"]).to_numpy()
    np.testing.assert_array_equal(after[untouched], before[untouched])
    retrained = frame.store.eq("s2").to_numpy()
    assert not np.allclose(after[retrained], before[retrained])
    unseen = frame.store.eq("never-seen").to_numpy()
    np.testing.assert_allclose(after[unseen],
                               store.global_model(run.run_id).predict(frame[unseen]))
