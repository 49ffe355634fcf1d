"""The model-kind protocol: CatBoost as one module, a user's kind by import path, each
trained on real Ray and loaded from the registry with plain MLflow and no raybricks."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from raybricks import kinds, tracking
from raybricks.config import CandidateConfig
from raybricks.data import to_ray_dataset
from raybricks.errors import ConfigError
from raybricks.segmented_model import SegmentModel
from raybricks.training import train_segments
from raybricks.training.tabular.segment import train_segment
from raybricks.training.tasks import make_plan
from tests import helpers
from tests.test_registry import BLOCK_RAYBRICKS
from tests.test_training import job

CATBOOST = [{"name": "cat", "kind": "catboost", "params": {"iterations": 80, "depth": 4}}]
USER = [{"name": "ols", "kind": "tests.userkinds.LeastSquares", "params": {"ridge": 0.01}}]
SRC = Path(__file__).parents[1] / "src" / "raybricks"


@pytest.fixture(scope="module")
def shops_ds(ray_on_spark, spark):
    return to_ray_dataset(spark.createDataFrame(helpers.shops()), ["store"])


def consumer_predictions(model_uri: str, frame: pd.DataFrame, tmp_path: Path) -> np.ndarray:
    """Predictions of the registered model in a fresh interpreter where raybricks cannot
    be imported, run outside the repository (so nothing of it is on the path)."""
    frame.to_parquet(tmp_path / "input.parquet")
    code = BLOCK_RAYBRICKS + f"""
import mlflow, pandas as pd
model = mlflow.pyfunc.load_model({model_uri!r})
frame = pd.read_parquet({str(tmp_path / 'input.parquet')!r})
model.predict(frame).to_frame().to_parquet({str(tmp_path / 'out.parquet')!r})
raybricks = sys.modules.get("raybricks")
print("raybricks installed:", getattr(raybricks, "__file__", None) is not None)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "raybricks installed: False" in done.stdout
    return pd.read_parquet(tmp_path / "out.parquet")["prediction"].to_numpy()


def requirements_of(model_uri: str, tmp_path: Path) -> list[str]:
    import mlflow

    path = mlflow.pyfunc.get_model_dependencies(model_uri)
    return Path(path).read_text().split()


@pytest.mark.heavy
def test_catboost_is_a_kind_that_beats_the_baseline_and_serves_without_raybricks(
        shops_ds, tmp_path):
    config = job(tmp_path, models=CATBOOST, registry={"name": "tests.kinds.catboost"})
    result = train_segments(shops_ds, config)
    rows = result.segments.set_index("store")
    trained = rows[rows.status == "trained"]
    assert len(trained) == 8  # categorical colour and missing x2 handled by CatBoost
    assert (trained.metric_rmse < trained.baseline_rmse).all()
    # trained segments hold CatBoost members; skipped ones their baseline
    assert set(result.models().column("kind").to_pylist()) == {"catboost", "baseline"}

    publication = tracking.publish(result, config)
    uri = f"models:/tests.kinds.catboost/{publication.version}"
    assert f"catboost=={version('catboost')}" in requirements_of(uri, tmp_path)
    frame = helpers.shops().sample(frac=1.0, random_state=5).iloc[:60]
    predicted = consumer_predictions(uri, frame, tmp_path)
    models = result.models().to_pandas()
    for store in ["s1", "s6"]:
        mask = (frame.store == store).to_numpy()
        members = models[models.store == store].to_dict("records")
        expected = SegmentModel.from_rows(members).predict(frame[mask])
        np.testing.assert_allclose(predicted[mask], expected, rtol=1e-9)


def test_catboost_classifies_with_probabilities_over_every_class(tmp_path):
    frame = helpers.classes(3)
    frame = frame[frame.store == 0].drop(columns="store").assign(store=0)
    config = job(tmp_path, models=CATBOOST, target="label", task="multiclass",
                 features=["x1", "x2"], time_column=None)
    plan = make_plan(config, pa.Schema.from_pandas(frame, preserve_index=False))
    row, members = train_segment(frame, (0,), plan)
    row = row.as_row(plan)
    assert row["status"] == "trained", row["reason"]
    assert row["metric_logloss"] < row["baseline_logloss"]
    model = SegmentModel.from_rows(members)
    probabilities = model.predict(frame, probabilities=True)
    assert probabilities.shape == (len(frame), 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    assert (model.predict(frame) == frame.label.to_numpy()).mean() > 0.8


def test_a_users_kind_by_import_path_is_checked_before_any_cluster():
    ok = CandidateConfig(**USER[0])
    assert type(kinds.of(ok)).__name__ == "LeastSquares"
    with pytest.raises(ConfigError, match=r"unknown params \{'alpha'\}"):
        kinds.of(CandidateConfig(**USER[0] | {"params": {"alpha": 1}})).check()
    with pytest.raises(ValueError, match=r"models\[x\]\.kind='tests.userkinds.Nope': cannot "
                                         "import"):
        CandidateConfig(name="x", kind="tests.userkinds.Nope")
    with pytest.raises(ValueError, match="is not a ModelKind subclass"):
        CandidateConfig(name="x", kind="tests.helpers.shops")
    with pytest.raises(ValueError, match=r"did you mean tests.userkinds.LeastSquares\?"):
        CandidateConfig(name="x", kind="tests.userkinds.LeastSquare")
    with pytest.raises(ConfigError, match=r"did you mean sklearn.linear_model.Ridge\b"):
        kinds.of(CandidateConfig(name="r", kind="sklearn",
                                 estimator="sklearn.linear_model.Ridg")).check()


def test_a_users_kind_without_a_name_is_stored_under_its_import_path(tmp_path):
    """The README's kind sets no ``name``: its members (here a lag model forecasting a
    series) are stored under its import path, and load from the stored rows."""
    from raybricks.training.forecast.backtest import train_series
    from tests.test_forecast import HORIZON, plan_for, series

    path = "tests.userkinds.Unnamed"
    assert kinds.resolve(path).name == path
    data = series("a", 30 + np.sin(np.arange(60.0)))
    plan = plan_for(data, tmp_path, models=[{"name": "ols", "kind": path}],
                    forecast={"horizon": HORIZON, "frequency": "D", "lags": [1, 7]})
    row, members = train_series(data, ("a",), plan)
    assert row.as_row(plan)["status"] == "trained"
    stored = [m for m in members if m["candidate"] == "ols"]
    assert stored and {m["kind"] for m in stored} == {f"lags:{path}"}
    model = SegmentModel.from_rows(stored)
    future = pd.DataFrame({"store": "a", "day": pd.date_range(
        data.day.max() + pd.Timedelta(days=1), periods=HORIZON)})
    assert np.isfinite(model.predict(future)).all()


@pytest.mark.parametrize(("kind", "params", "search", "message"), [
    ("lightgbm", {"n_estimator": 50}, {},
     r"LightGBM has no parameter n_estimator \(did you mean n_estimators\?\)"),
    ("lightgbm", {}, {"num_leave": [7, 15]},
     r"num_leave \(did you mean num_leaves or num_leaf\?\)"),
    ("lightgbm", {}, {"num_leaves": [1, 15]},
     r"\{.*'num_leaves': 1.*\} is not a valid setting of LightGBM: .*num_leaves"),
    ("lightgbm", {"boosting_type": "gbdtt"}, {},
     r"is not a valid setting of LightGBM: Unknown boosting type gbdtt"),
    ("xgboost", {"max_dept": 3}, {},
     r"XGBoost has no parameter max_dept \(did you mean max_depth\?\)"),
    ("xgboost", {}, {"max_depth": [3, -3]},
     r"is not a valid setting of XGBoost: value -3 for Parameter max_depth"),
    ("catboost", {"iteration": 50}, {},
     r"CatBoost has no parameter iteration \(did you mean iterations\?\)"),
])
def test_a_misspelt_or_invalid_booster_parameter_is_refused_before_any_cluster(
        tmp_path, kind, params, search, message):
    """LightGBM and XGBoost only warn of a parameter they do not know, and training
    silences their warnings: the job's checks refuse it, for a table job and a
    forecasting one (the lag models), naming the closest names. Their own aliases pass;
    so do settings that name the data's features. A value the library refuses is refused
    before any cluster starts too."""
    from raybricks.pipeline import check_job
    from tests.test_forecast import forecast_job

    pytest.importorskip(kind)
    valid = {"lightgbm": {"n_estimators": 20, "num_leaves": 7, "min_data_in_leaf": 5,
                          "subsample": 0.8, "lambda_l2": 1.0, "device_type": "cpu",
                          "monotone_constraints": [1, 0, 0, 0, 0, 0, 0]},  # per feature
             "xgboost": {"n_estimators": 20, "eta": 0.1, "max_depth": 3, "device": "cpu",
                         "min_child_weight": 2, "tree_method": "hist",
                         "monotone_constraints": {"x1": 1}},  # names the data's columns
             "catboost": {"iterations": 20, "depth": 4, "l2_leaf_reg": 3}}[kind]
    good = {"name": "m", "kind": kind, "params": valid,
            "search": {next(iter(valid)): [10, 30]}}
    for config in (job(tmp_path, models=[good]), forecast_job(tmp_path, models=[good])):
        check_job(config, register=False)
    bad = {"name": "m", "kind": kind, "params": valid | params, "search": search}
    for config in (job(tmp_path, models=[bad]), forecast_job(tmp_path, models=[bad])):
        with pytest.raises(ConfigError, match=r"models\[m\]: .*" + message):
            check_job(config, register=False)


def test_a_users_kind_trains_registers_and_serves_without_raybricks(shops_ds, tmp_path):
    config = job(tmp_path, models=USER, features=["x1", "x2"],
                 registry={"name": "tests.kinds.user"},
                 ensemble={"shrink": 0})  # a winner alone: the kind's own predictions
    result = train_segments(shops_ds, config)
    assert result.counts()["trained"] == 8
    publication = tracking.publish(result, config)
    uri = f"models:/tests.kinds.user/{publication.version}"
    frame = helpers.shops().sample(frac=1.0, random_state=7).iloc[:80]
    predicted = consumer_predictions(uri, frame, tmp_path)
    # the same least squares, computed here: refitted on all the store's rows, missing
    # x2 filled with the store's median, as the kind's filled_input does
    data = helpers.shops()
    for store in ["s0", "s3"]:
        rows = data[data.store == store]
        x = rows[["x1", "x2"]].to_numpy()
        x[np.isnan(x)] = np.take(np.nanmedian(x, axis=0), np.nonzero(np.isnan(x))[1])
        design = np.column_stack([np.ones(len(x)), x])
        penalty = 0.01 * np.diag([0.0, 1.0, 1.0])
        coef = np.linalg.solve(design.T @ design + penalty, design.T @ rows.y.to_numpy())
        mask = (frame.store == store).to_numpy()
        mine = frame.loc[mask, ["x1", "x2"]].to_numpy()
        mine[np.isnan(mine)] = np.take(np.nanmedian(rows[["x1", "x2"]].to_numpy(), axis=0),
                                       np.nonzero(np.isnan(mine))[1])
        np.testing.assert_allclose(predicted[mask], coef[0] + mine @ coef[1:], rtol=1e-8)


def test_nothing_outside_kinds_compares_or_tabulates_kind_names():
    """Kind names are looked up in raybricks.kinds only: no other module of raybricks
    compares a ``.kind`` with a string, or keeps a table (dict, set, tuple, list) of
    built-in kind names."""
    found = []
    for path in SRC.rglob("*.py"):
        if "kinds" in path.relative_to(SRC).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(SRC)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                names_kind = any(  # candidate.kind, member.kind (not numpy's dtype.kind)
                    isinstance(side, ast.Attribute) and side.attr == "kind"
                    and getattr(side.value, "attr", None) != "dtype" for side in sides)
                strings = any(isinstance(side, ast.Constant) and isinstance(side.value, str)
                              for side in ast.walk(node))
                if names_kind and strings:
                    found.append(f"{where} compares a kind with a string")
            elif isinstance(node, ast.Dict | ast.Set | ast.Tuple | ast.List):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                named = {i.value for i in items if isinstance(i, ast.Constant)} & set(
                    kinds.BUILTIN) - {"baseline", "global"}  # also the selection's labels
                if len(named) >= 2:
                    found.append(f"{where} tabulates kinds {sorted(named)}")
    assert not found, found


def test_scikit_learns_dataframe_sniffing_answers_arrays_and_asks_for_the_rest():
    from sklearn.linear_model import LinearRegression
    from sklearn.utils import validation

    from raybricks.kinds.sklearn import answer_array_sniffing

    original = getattr(validation, "_nw_into_df_or_series", None)
    original_names = validation._get_feature_names
    answer_array_sniffing()
    answer_array_sniffing()  # once per process, however often workers warm up
    if original is None:  # scikit-learn before 1.9: nothing to answer, nothing added
        assert not hasattr(validation, "_nw_into_df_or_series")
        assert validation._get_feature_names is original_names
        return
    narwhals = getattr(original, "__wrapped__", original)  # a warm-up may have run here
    names = getattr(original_names, "__wrapped__", original_names)
    try:
        sniff, named = validation._nw_into_df_or_series, validation._get_feature_names
        assert sniff is not narwhals and sniff.__wrapped__ is narwhals  # wrapped once
        assert named is not names and named.__wrapped__ is names
        frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [0.0, 1.0, 0.0]})
        for value in (frame, frame["a"], pa.table(frame), np.ones((3, 2)), [[1.0]]):
            assert sniff(value) == narwhals(value), type(value)
        assert sniff(frame) and not sniff(np.ones((3, 2)))
        assert named(np.ones((3, 2))) is None and list(named(frame)) == ["a", "b"]
        # a dataframe still reaches narwhals: its column names are kept
        model = LinearRegression().fit(frame, [1.0, 2.0, 3.0])
        assert list(model.feature_names_in_) == ["a", "b"]
        with pytest.warns(UserWarning, match="feature names"):  # and still checked
            model.predict(np.ones((2, 2)))
    finally:
        validation._nw_into_df_or_series = original
        validation._get_feature_names = original_names
