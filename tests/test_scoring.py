"""Batch scoring from the registry with Spark, and MLflow's own spark_udf on the model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raybricks import cli, scoring
from raybricks.errors import DataError, RaybricksError
from tests import helpers
from tests.test_registry import member_prediction, shops_ds, shops_result  # noqa: F401
from tests.test_training import job

MODEL = "tests.scoring.model"


@pytest.fixture(scope="module")
def champion(shops_result, tmp_path_factory):  # noqa: F811
    from raybricks import registry
    from tests.test_registry import STRONG

    config = job(tmp_path_factory.mktemp("cfg"), models=STRONG, fallback="global",
                 registry={"name": MODEL, "promote": "always"})
    publication = registry.publish(shops_result, config)
    return f"models:/{MODEL}@champion", publication


def scoring_input() -> pd.DataFrame:
    frame = helpers.shops().sample(frac=1.0, random_state=11).reset_index(drop=True)
    frame.loc[:14, "store"] = "brand-new"
    return frame.drop(columns=["y"]).assign(row_id=np.arange(len(frame)))


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
    with pytest.raises(RaybricksError, match="cannot load model"):
        scoring.score("models:/tests.no.such.model@champion", df, spark=spark)


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
