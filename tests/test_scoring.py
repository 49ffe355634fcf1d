"""Batch scoring from the registry with Spark, and MLflow's own spark_udf on the model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
import zipfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybricks import cli, scoring
from raybricks.errors import DataError, RaybricksError
from tests import helpers
from tests.test_cli import SPARK_START
from tests.test_registry import member_prediction, shops_ds, shops_result  # noqa: F401
from tests.test_training import job

MODEL = "tests.scoring.model"


@pytest.fixture(scope="module")
def champion(shops_result, tmp_path_factory):  # noqa: F811
    from raybricks import tracking
    from tests.test_registry import STRONG

    config = job(tmp_path_factory.mktemp("cfg"), models=STRONG, fallback="global",
                 selection="local_only", registry={"name": MODEL, "promote": "always"})
    publication = tracking.publish(shops_result, config)
    return f"models:/{MODEL}@champion", publication


def scoring_input() -> pd.DataFrame:
    frame = helpers.shops().sample(frac=1.0, random_state=11).reset_index(drop=True)
    frame.loc[:14, "store"] = "brand-new"
    return frame.drop(columns=["y"]).assign(row_id=np.arange(len(frame)))


@pytest.mark.topology
def test_score_writes_input_columns_prediction_version_and_status(
        spark, champion, shops_result, tmp_path):  # noqa: F811
    uri, publication = champion
    source = tmp_path / "input.parquet"
    frame = scoring_input()
    frame.to_parquet(source)
    summary = scoring.score(uri, str(source), str(tmp_path / "scored.parquet"), spark=spark)
    assert summary.rows == len(frame) and summary.model_version == publication.version
    assert summary.status_counts == {"trained": int(frame.store.str.match(r"s\d").sum()),
                                     "skipped": int(frame.store.isin(
                                         ["few", "constant", "no_feature"]).sum()),
                                     "unknown": 15}
    assert summary.null_predictions == 0  # the fallback scores what has no own model
    out = pd.read_parquet(tmp_path / "scored.parquet").sort_values("row_id")
    assert list(out.columns) == list(frame.columns) + ["prediction", "model_version",
                                                      "segment_status"]
    assert (out.model_version == publication.version).all()
    for store in ["s2", "s6"]:
        rows = out[out.store == store]
        np.testing.assert_allclose(rows.prediction,
                                   member_prediction(shops_result, store, rows), rtol=1e-9)


@pytest.mark.topology
def test_score_matches_mlflow_spark_udf_on_the_same_model(spark, champion):
    import mlflow

    uri, _ = champion
    frame = scoring_input()
    df = spark.createDataFrame(frame)
    ours = scoring.score(uri, df, spark=spark).toPandas().sort_values("row_id")
    udf = mlflow.pyfunc.spark_udf(spark, uri, result_type="double", env_manager="local")
    columns = ["store", "x1", "x2", "color"]
    theirs = df.withColumn("prediction", udf(*columns)).toPandas().sort_values("row_id")
    np.testing.assert_allclose(ours.prediction.to_numpy(), theirs.prediction.to_numpy(),
                               rtol=1e-9)


def test_score_refuses_input_without_features_and_unknown_models(spark, champion, tmp_path):
    uri, _ = champion
    df = spark.createDataFrame(scoring_input().drop(columns=["x1"]))
    with pytest.raises(DataError, match=r"missing column\(s\) \['x1'\]"):
        scoring.score(uri, df, spark=spark)
    renamed = spark.createDataFrame(scoring_input().rename(columns={"x1": "X1"}))
    with pytest.raises(DataError, match=r"\['x1'\].*\('x1': did you mean 'X1'\? names are "
                                        r"matched exactly\)"):
        scoring.score(uri, renamed, spark=spark)
    with pytest.raises(RaybricksError, match=r"cannot load model .*tracking URI"):
        scoring.score("models:/tests.no_model_is_named_like_this@champion", df,
                      spark=spark)  # nothing close in the session's store
    # a misspelt name, alias or version: what the registry holds that it likely meant
    # (the closest first; other models of the session's store may be close too)
    misspelt = {f"models:/{MODEL[:-1]}@champion": rf"did you mean models:/{MODEL}@champion\b",
                f"models:/{MODEL}@champoin": rf"did you mean models:/{MODEL}@champion\?",
                f"models:/{MODEL}@latest_good": rf"{MODEL} has the aliases \[.*'champion'",
                f"models:/{MODEL}/999": rf"{MODEL} has the versions \[1"}
    for wrong, hint in misspelt.items():
        with pytest.raises(RaybricksError, match=rf"cannot load model '{wrong}': .*{hint}"):
            scoring.score(wrong, df, spark=spark)
    # a URI that resolves gets no hint (a download failing elsewhere names the registry)
    assert scoring.registry_hint(uri) == scoring.registry_hint(f"models:/{MODEL}/1") == ""


def test_score_command_writes_the_output(spark, champion, tmp_path, capsys):
    uri, _ = champion
    source = tmp_path / "input.parquet"
    scoring_input().to_parquet(source)
    code = cli.main(["score", "--model", uri, "--input", str(source),
                     "--output", str(tmp_path / "out.parquet")])
    assert code == 0
    assert f"scored {len(scoring_input())} rows" in capsys.readouterr().out
    assert len(pd.read_parquet(tmp_path / "out.parquet")) == len(scoring_input())
    code = cli.main(["score", "--model", "models:/tests.absent@champion", "--input",
                     str(source), "--output", str(tmp_path / "x.parquet")])
    assert code == 2


def pickled_by_sklearn(segments: Path, fake: str, monkeypatch) -> None:
    """Make a model directory as if trained with scikit-learn ``fake``: its members pickled
    by that version (sklearn warns when it unpickles them) and its manifest saying so."""
    import pickle

    import pyarrow as pa
    import pyarrow.parquet as pq
    import sklearn.base

    monkeypatch.setattr(sklearn.base, "__version__", fake)  # what pickles record
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fake version also warns here
        for path in [*segments.glob("models-*.parquet"), segments / "fallback.parquet"]:
            table = pq.read_table(path)
            payloads = [pickle.dumps(pickle.loads(data)) if kind == "sklearn" else data
                        for kind, data in zip(table.column("kind").to_pylist(),
                                              table.column("payload").to_pylist(),
                                              strict=True)]
            column = table.schema.get_field_index("payload")
            pq.write_table(table.set_column(column, "payload", pa.array(payloads, pa.binary())),
                           path)
    monkeypatch.undo()
    manifest = json.loads((segments / "manifest.json").read_text())
    manifest["libraries"]["scikit-learn"] = fake
    (segments / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.heavy  # the version report is the same code on every runtime; ~40 s
def test_score_reports_other_library_versions_once_on_the_driver(
        champion, tmp_path, monkeypatch):
    import mlflow

    uri, _ = champion
    model = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp_path / "m"))
    pickled_by_sklearn(Path(model) / "artifacts" / "segments", "1.0.2", monkeypatch)
    scoring_input().to_parquet(tmp_path / "input.parquet")
    # a fresh process: its own Spark, whose tasks' stderr is this one's to read
    done = subprocess.run(
        [sys.executable, "-m", "raybricks.cli", "score", "--model", model,
         "--input", str(tmp_path / "input.parquet"), "--output", str(tmp_path / "out.parquet")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(scoring.__file__).parents[1])},  # this one
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = str(tmp_path / "out.parquet")  # the verb's stages, as they start and end
    for stage in (f"model: {model} from the registry", f"scoring: predictions into {out}"):
        assert f"> {stage} ...\n" in done.stdout
        assert re.search(rf"^  {re.escape(stage)}: \d+\.\d s$", done.stdout, re.M)
    assert "scoring: 100%" in done.stdout  # the bar, in rows
    shown = done.stdout + done.stderr  # raybricks' warnings are shown, not only logged
    [line] = [s for s in shown.splitlines() if "segmented model was trained with" in s]
    assert f"scikit-learn 1.0.2 (installed here: {version('scikit-learn')})" in line
    assert "xgboost" not in line  # trained with the installed version
    assert f"mlflow.pyfunc.get_model_dependencies({model!r})" in line
    [log] = (tmp_path / ".raybricks" / "logs").glob("score-*.log")  # what Spark printed
    assert SPARK_START.search(log.read_text())
    assert "Trying to unpickle estimator" not in shown + log.read_text()  # tasks stay quiet
    assert len(pd.read_parquet(tmp_path / "out.parquet")) == len(scoring_input())


def test_integer_features_with_nulls_score_with_plain_mlflow_and_spark_udf(
        ray_on_spark, spark, tmp_path_factory, tmp_path):
    import mlflow
    from mlflow.types.schema import AnyType

    from raybricks import tracking
    from raybricks.data import to_ray_dataset
    from raybricks.segmented_model import SegmentModel
    from raybricks.training import train_segments
    from tests.test_registry import BLOCK_RAYBRICKS
    from tests.test_training import CANDIDATES

    data = helpers.shops().assign(units=lambda f: (3 * f.x1).round().fillna(0).astype("int64"))
    data = data[data.store.str.match(r"s\d")].reset_index(drop=True)
    name = "tests.nullable.model"
    config = job(tmp_path_factory.mktemp("runs"), features=["x1", "x2", "color", "units"],
                 models=CANDIDATES[2:], registry={"name": name, "promote": "always"})
    result = train_segments(to_ray_dataset(spark.createDataFrame(data), ["store"]), config)
    tracking.publish(result, config)
    uri = f"models:/{name}@champion"
    declared = {spec.name: spec.type for spec in
                mlflow.models.get_model_info(uri).signature.inputs.inputs}
    # an integer feature: any number or null; then every column (MLflow 2.x would align
    # an Any column and a typed one on different indexes: a filtered frame's rows doubled)
    assert all(isinstance(declared[c], AnyType) for c in ("units", "x1", "store"))
    frame = data.drop(columns=["y", "day"]).iloc[::4].reset_index(drop=True)
    missing = (frame.index % 3 == 0)
    nullable = frame.astype({"units": "Int64"})
    nullable.loc[missing, "units"] = pd.NA
    forms = {"int64": frame, "Int64": nullable, "float64": nullable.astype({"units": float}),
             "filtered": frame.set_axis(frame.index * 7 + 100)}  # an index not 0..n-1
    for form, rows in forms.items():
        rows.to_parquet(tmp_path / f"{form}.parquet")
    code = BLOCK_RAYBRICKS + f"""
import mlflow, pandas as pd
model = mlflow.pyfunc.load_model({uri!r})
for form in {list(forms)!r}:
    rows = pd.read_parquet(f"{tmp_path}/{{form}}.parquet")
    assert str(rows.units.dtype) == form.replace("filtered", "int64"), rows.units.dtype
    predicted = pd.Series(model.predict(rows), name="prediction")
    assert len(predicted) == len(rows), (form, len(predicted), len(rows))
    predicted.reset_index(drop=True).to_frame().to_parquet(
        f"{tmp_path}/out_{{form}}.parquet")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = {form: pd.read_parquet(tmp_path / f"out_{form}.parquet").prediction.to_numpy()
           for form in forms}
    models = result.models().to_pandas()
    for store, rows in frame.groupby("store"):  # int64 rows: what the members predict
        member = SegmentModel.from_rows(models[models.store == store].to_dict("records"))
        np.testing.assert_allclose(out["int64"][rows.index], member.predict(rows), rtol=1e-9)
    np.testing.assert_array_equal(out["filtered"], out["int64"])  # one per row, in order
    np.testing.assert_array_equal(out["Int64"], out["float64"])  # a null is NaN either way
    np.testing.assert_allclose(out["Int64"][~missing], out["int64"][~missing], rtol=1e-12)
    assert np.isfinite(out["Int64"]).all()
    # spark_udf: a LongType column with nulls
    df = spark.read.parquet(str(tmp_path / "Int64.parquet"))
    assert df.schema["units"].dataType.simpleString() == "bigint"
    udf = mlflow.pyfunc.spark_udf(spark, uri, result_type="double", env_manager="local")
    scored = df.withColumn("prediction", udf("store", "x1", "x2", "color", "units"))
    np.testing.assert_allclose(scored.toPandas().prediction.to_numpy(), out["Int64"],
                               rtol=1e-9)


def test_the_model_ships_as_one_archive_that_each_python_worker_opens_once(
        spark, champion, tmp_path):
    """What the tasks see: one archive of the model's segments only (a file: Spark ships
    no local directory on any master but local[N]), unpacked once beside the executor's
    copy, and one store per Python worker however many of its tasks use it."""
    from pyspark import SparkFiles

    uri, _ = champion
    local, _ = scoring.fetch_model(uri)
    segments = local / "artifacts" / "segments"
    files = sorted(p.relative_to(segments).as_posix() for p in segments.rglob("*")
                   if p.is_file())
    name = scoring.ship_segments(spark, segments)
    assert re.fullmatch(r"raybricks-segments-[0-9a-f]{24}\.zip", name)
    assert scoring.ship_segments(spark, segments) == name  # again: the same, added once
    assert [f.removeprefix("file:") for f in spark.sparkContext.listFiles
            if f.endswith(name)] == [str(scoring.shipping_directory() / name)]  # one path
    shipped = Path(SparkFiles.get(name)).resolve()
    with zipfile.ZipFile(shipped) as packed:
        assert packed.namelist() == files  # not MLmodel, the environment files, ...
    again = scoring.pack_segments(segments, tmp_path)  # the same model: name and bytes
    assert again.name == name and again.read_bytes() == shipped.read_bytes()

    def task(batches):
        import os

        from raybricks import scoring as tasks_scoring  # the workers' module

        for batch in batches:
            store = tasks_scoring.segment_store(name, 64)
            directory = store.directory
            yield pd.DataFrame({
                "pid": [os.getpid()] * len(batch), "store": [id(store)] * len(batch),
                "segments": [len(store)] * len(batch),
                "directory": [str(directory)] * len(batch),
                "files": [json.dumps(sorted(p.name for p in directory.iterdir()))] * len(batch),
                "manifest": [(directory / "manifest.json").read_text()] * len(batch),
                "staging": [len(list(directory.parent.glob(f".{directory.name}-*")))]
                * len(batch)})

    seen = spark.range(8, numPartitions=8).mapInPandas(
        task, "pid long, store long, segments long, directory string, files string, "
              "manifest string, staging long").toPandas()
    assert len(seen) == 8
    [directory] = seen.directory.unique()  # unpacked once, beside the shipped archive
    assert Path(directory) == shipped.with_suffix("") and local not in Path(directory).parents
    assert json.loads(seen.files.iloc[0]) == files
    assert set(seen.manifest) == {(segments / "manifest.json").read_text()}
    assert (seen.staging == 0).all()  # no worker's unpacking left behind
    from raybricks.segmented_model import SegmentStore

    assert (seen.segments == len(SegmentStore(segments))).all()
    per_worker = seen.groupby("pid").store.nunique()
    assert (per_worker == 1).all()  # one store per Python worker ...
    assert seen.pid.nunique() < len(seen)  # ... that served several tasks


def unpack_together(barrier, archive: Path, results) -> None:
    """One racing Python worker: waits for the others, then unpacks."""
    barrier.wait()
    first_look = (archive.parent / archive.stem).is_dir()
    results.put((first_look, str(scoring.unpacked(archive))))


def test_python_workers_racing_to_unpack_the_model_get_one_whole_copy(tmp_path,
                                                                       monkeypatch):
    import multiprocessing
    import zipfile

    segments = tmp_path / "segments"
    segments.mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        (segments / f"models-{i:05d}.parquet").write_bytes(rng.bytes(2 * 2**20))
    archive = scoring.pack_segments(segments, tmp_path)
    context = multiprocessing.get_context("fork")  # the workers start as Spark's do
    barrier, results = context.Barrier(4), context.Queue()
    # every worker unpacks only once all four found no copy: they surely race
    extracting, extract = context.Barrier(4), zipfile.ZipFile.extractall
    monkeypatch.setattr(zipfile.ZipFile, "extractall", lambda self, *args, **kwargs: (
        extracting.wait(timeout=60), extract(self, *args, **kwargs))[1])
    workers = [context.Process(target=unpack_together, args=(barrier, archive, results))
               for _ in range(4)]
    for worker in workers:
        worker.start()
    found = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert sum(not looked for looked, _ in found) == 4  # they did race
    [directory] = {Path(d) for _, d in found}
    assert directory == tmp_path / archive.stem
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        p.name for p in segments.iterdir())
    for part in segments.iterdir():
        assert (directory / part.name).read_bytes() == part.read_bytes()
    assert not list(tmp_path.glob(f".{archive.stem}-*"))  # the losers' copies are gone
    assert scoring.unpacked(archive) == directory  # later: found, not unpacked again
