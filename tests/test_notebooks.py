"""Every notebook in notebooks/ runs locally, cell by cell, on real Spark, Ray and MLflow.

The code cells of a notebook run in one namespace holding the test session's ``spark``, a
stand-in ``dbutils`` (widgets only) and ``display`` / ``displayHTML`` stand-ins that
record what was shown. Notebooks 01 and 04 connect to the session's Ray on Spark by
address: one process cannot start a second Ray on Spark, and the session's own start is
the same ``start_ray(ClusterConfig(mode="spark"), spark)`` that notebook 04 calls.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from raybricks.cluster import start_ray
from raybricks.config import ClusterConfig
from tests import helpers

REPO = Path(__file__).parents[1]
NOTEBOOKS = REPO / "notebooks"
HEADER = "# Databricks notebook source"
SEPARATOR = "\n# COMMAND ----------\n"
MODEL = "tests.notebooks.model"
JOB = """
source: {table: notebook_shops}
segment_by: [store]
target: y
features: [x1, x2, color]
time_column: day
validation: {method: time, metric: mae}
models:
  - {name: ridge, kind: sklearn, estimator: sklearn.linear_model.Ridge}
  - {name: xgb, kind: xgboost, params: {n_estimators: 20, max_depth: 3}}
min_rows: 20
fallback: global
registry: {name: set.by.the.widget}
training: {progress: false}
"""


class Widgets:
    """``dbutils.widgets``: a widget must be defined before ``get``; the test's values
    win over the notebook's defaults."""

    def __init__(self, values: dict[str, str]):
        self.values = dict(values)
        self.defaults: dict[str, str] = {}

    def text(self, name: str, defaultValue: str, label: str | None = None) -> None:
        self.defaults[name] = defaultValue

    def dropdown(self, name: str, defaultValue: str, choices: list[str],
                 label: str | None = None) -> None:
        if self.values.get(name, defaultValue) not in choices or defaultValue not in choices:
            raise ValueError(f"widget {name}: value not among the choices {choices}")
        self.defaults[name] = defaultValue

    def get(self, name: str) -> str:
        if name not in self.defaults:
            raise ValueError(f"InputWidgetNotDefined: no widget named {name}")
        return self.values.get(name, self.defaults[name])

    def removeAll(self) -> None:  # noqa: N802 - the dbutils name
        self.defaults.clear()


@dataclass
class Run:
    """A notebook's namespace after its last cell, and what it displayed."""

    namespace: dict[str, Any]
    shown: list[Any] = field(default_factory=list)  # display(): Spark frames as pandas
    html: list[str] = field(default_factory=list)  # displayHTML()


def code_cells(path: Path) -> list[str]:
    """The code cells of a source-format notebook (markdown and magic cells left out)."""
    first, _, body = path.read_text().partition("\n")
    assert first == HEADER, f"{path.name} lacks the notebook header"
    cells = []
    for cell in body.split(SEPARATOR):
        magic = [line.startswith("# MAGIC") for line in cell.strip().splitlines()]
        if all(magic):
            continue
        assert not any(magic), f"{path.name}: a cell mixes code and # MAGIC lines"
        cells.append(cell)
    return cells


def run_notebook(name: str, spark, widgets: dict[str, str]) -> Run:
    """Execute a notebook's code cells in one namespace, as Databricks would."""
    run = Run({})
    dbutils = SimpleNamespace(widgets=Widgets(widgets))
    run.namespace.update(
        __name__="__main__", spark=spark, dbutils=dbutils, displayHTML=run.html.append,
        display=lambda obj: run.shown.append(obj.toPandas() if hasattr(obj, "toPandas")
                                             else obj),
    )
    for number, cell in enumerate(code_cells(NOTEBOOKS / name), 1):
        exec(compile(cell, f"{name} [cell {number}]", "exec"), run.namespace)  # noqa: S102
    unknown = set(widgets) - set(dbutils.widgets.defaults)
    assert not unknown, f"{name} has no widget(s) {unknown}"
    return run


def test_every_notebook_is_a_source_notebook_with_widgets():
    names = sorted(p.name for p in NOTEBOOKS.glob("*.py"))
    assert names == ["01_train_per_segment.py", "02_inspect_results.py",
                     "03_score_with_registered_model.py", "04_ray_on_spark.py",
                     "05_forecast_many_series.py", "06_hierarchical_forecasts.py"]
    for name in names:
        text = (NOTEBOOKS / name).read_text()
        assert text.split(SEPARATOR)[0].splitlines()[1].startswith("# MAGIC %md")
        assert "dbutils.widgets.get(" in "".join(code_cells(NOTEBOOKS / name))


@pytest.fixture(scope="module")
def ray_address(ray_on_spark):
    """The session's Ray address, with the driver disconnected while this module runs
    (a notebook connects and disconnects itself); reconnected afterwards."""
    import ray

    ray.shutdown()
    yield ray_on_spark.address
    if not ray.is_initialized():
        start_ray(ClusterConfig(mode="address", address=ray_on_spark.address))
    assert ray.cluster_resources()["CPU"] == 2  # the notebooks left the session's Ray up


@pytest.fixture(scope="module")
def trained(spark, ray_address, tmp_path_factory) -> Run:
    """Notebook 01 on the shops table, against the session's Ray, registering MODEL."""
    tmp = tmp_path_factory.mktemp("notebooks")
    spark.createDataFrame(helpers.shops()).write.mode("overwrite").saveAsTable("notebook_shops")
    (tmp / "job.yml").write_text(JOB)
    overrides = ["cluster.mode=address", f"cluster.address={ray_address}",
                 f"registry.name={MODEL}", f"training.output_dir={tmp / 'runs'}"]
    return run_notebook("01_train_per_segment.py", spark,
                        {"config_path": str(tmp / "job.yml"), "overrides": " ; ".join(overrides)})


def test_01_trains_every_segment_and_registers_the_champion(trained):
    from mlflow import MlflowClient

    result, publication = trained.namespace["result"], trained.namespace["publication"]
    assert result.counts() == {"trained": 8, "skipped": 3, "failed": 0}
    assert trained.namespace["config"].registry.name == MODEL  # the overrides widget
    champion = MlflowClient().get_model_version_by_alias(MODEL, "champion")
    assert publication.version == str(champion.version) == publication.champion_version
    assert champion.run_id == publication.run_id
    assert trained.namespace["model_uri"] == f"models:/{MODEL}@champion"
    segments, timings = trained.shown
    assert sorted(segments.store) == sorted(helpers.shops().store.unique())
    assert {"cluster", "data", "training", "registry"} <= set(timings.stage)


@pytest.mark.parametrize("widget", ["run_id", "model_uri"])
def test_02_shows_statuses_reasons_metrics_and_the_run_plots(spark, trained, widget):
    publication = trained.namespace["publication"]
    value = publication.run_id if widget == "run_id" else f"models:/{MODEL}@champion"
    run = run_notebook("02_inspect_results.py", spark, {widget: value})
    assert run.namespace["run_id"] == publication.run_id
    statuses, reasons, problems, distribution, worst = run.shown
    assert statuses.set_index("status").segments.to_dict() == {"trained": 8, "skipped": 3}
    assert set(reasons.status) == {"skipped"} and reasons.segments.sum() == 3
    assert set(problems.store) == {"few", "constant", "no_feature"}
    assert problems.reason.str.len().min() > 0
    stats = distribution.set_index("column")
    assert list(stats.index) == ["metric_mae", "baseline_mae", "ridge_mae", "xgb_mae"]
    assert stats.loc["metric_mae", "count"] == 8
    assert stats.loc["metric_mae", "50%"] < stats.loc["baseline_mae", "50%"]
    assert len(worst) == 8 and worst.gain.is_monotonic_increasing
    (html,) = run.html
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", html)
    assert sorted(captions) == ["plots/chosen_candidates.png", "plots/metric_distribution.png",
                                "plots/model_vs_baseline.png"]
    for png in re.findall(r"base64,([A-Za-z0-9+/=]+)", html):
        assert base64.b64decode(png).startswith(b"\x89PNG")


@pytest.mark.heavy  # scoring on every runtime: test_scoring; ~17 s
def test_03_scores_every_row_three_ways_with_the_same_predictions(spark, trained):
    frame = helpers.shops().sample(frac=1.0, random_state=5).reset_index(drop=True)
    frame.loc[:9, "store"] = "brand-new"  # no model of its own: the fallback scores it
    frame = frame.drop(columns=["y"]).assign(row_id=np.arange(len(frame)))
    spark.createDataFrame(frame).write.mode("overwrite").saveAsTable("notebook_to_score")
    run = run_notebook("03_score_with_registered_model.py", spark, {
        "model_uri": f"models:/{MODEL}@champion", "input_table": "notebook_to_score",
        "output_table": "notebook_scored"})
    summary = run.namespace["summary"]
    assert summary.rows == len(frame) == spark.table("notebook_scored").count()
    assert summary.model_version == trained.namespace["publication"].version
    assert summary.status_counts["unknown"] == 10 and summary.null_predictions == 0
    counts, scored, with_pandas, with_udf = run.shown
    assert counts["count"].sum() == len(frame)
    assert len(scored) == 100 and len(with_pandas) == 100 and len(with_udf) == 100
    predictions = run.namespace["predictions"]
    sample = run.namespace["sample"]
    assert len(predictions) == len(sample) == len(frame)
    spark_side = spark.table("notebook_scored").toPandas().set_index("row_id").prediction
    np.testing.assert_allclose(predictions.to_numpy(),
                               spark_side.loc[sample.row_id].to_numpy(), rtol=1e-9)
    udf_side = run.namespace["with_udf"].toPandas().set_index("row_id").prediction
    np.testing.assert_allclose(udf_side.sort_index().to_numpy(),
                               spark_side.sort_index().to_numpy(), rtol=1e-9)


def test_04_connects_by_address_and_runs_tasks_on_the_session_ray(spark, ray_address):
    import ray

    run = run_notebook("04_ray_on_spark.py", spark, {
        "mode": "address", "address": ray_address, "max_worker_nodes": "1",
        "num_cpus_head_node": "1"})
    assert run.namespace["cluster_config"].max_worker_nodes == 1
    assert run.namespace["cluster"].mode == "address"
    assert run.namespace["resources"]["CPU"] == 2  # local[2]: the head and one worker node
    resources, nodes, tasks = run.shown
    assert nodes.alive.sum() == 2 and set(tasks.node_id) <= set(nodes.node_id)
    assert run.namespace["squares"] == [i * i for i in range(16)] and tasks.tasks.sum() == 16
    assert not ray.is_initialized()


FORECAST_JOB = """
source: {table: notebook_series}
segment_by: [store]
target: sales
time_column: day
task: forecast
forecast: {horizon: 7, frequency: D, rolling: {mean: [7]}}
validation: {method: backtest, windows: 2}
models:
  - {name: ridge, kind: sklearn, estimator: sklearn.linear_model.Ridge}
  - {name: theta, kind: statsforecast, estimator: AutoTheta, params: {season_length: 7}}
min_rows: 20
registry: {name: set.by.the.widget}
training: {progress: false}
"""


@pytest.mark.heavy
def test_05_trains_forecasters_and_writes_every_series_forecast(spark, ray_address,
                                                                  tmp_path):
    import mlflow

    from tests.test_forecast import stores

    data = stores()
    spark.createDataFrame(data).write.mode("overwrite").saveAsTable("notebook_series")
    (tmp_path / "job.yml").write_text(FORECAST_JOB)
    overrides = ["cluster.mode=address", f"cluster.address={ray_address}",
                 "registry.name=tests.notebooks.forecast",
                 f"training.output_dir={tmp_path / 'runs'}"]
    run = run_notebook("05_forecast_many_series.py", spark, {
        "config_path": str(tmp_path / "job.yml"), "overrides": " ; ".join(overrides),
        "output_table": str(tmp_path / "forecasts"), "horizon": "3"})
    series, forecasts, one = run.shown
    assert (series.status == "trained").all() and len(series) == data.store.nunique()
    assert run.namespace["summary"].rows == 3 * data.store.nunique()
    written = spark.read.parquet(str(tmp_path / "forecasts")).toPandas()
    model = mlflow.pyfunc.load_model("models:/tests.notebooks.forecast@champion")
    np.testing.assert_allclose(model.predict(written[["store", "day"]]).to_numpy(),
                               written.prediction.to_numpy(), rtol=1e-9)
    assert list(one.kind.unique()) == ["history", "forecast"]
    assert (one.kind == "forecast").sum() == 3


@pytest.mark.heavy
def test_06_trains_every_level_and_its_forecasts_add_up(spark, ray_address, tmp_path):
    pytest.importorskip("hierarchicalforecast")
    overrides = ["source.table=notebook_prison",
                 "source.where=t < DATE'2015-03-01' AND state IN ('ACT', 'NT', 'TAS')",
                 "cluster.mode=address",
                 f"cluster.address={ray_address}", "registry.name=tests.notebooks.hierarchy",
                 f"training.output_dir={tmp_path / 'runs'}", "training.progress=false",
                 "validation.windows=2", "models=[{name: ets, kind: statsforecast, "
                 "estimator: AutoETS, params: {season_length: 4}}]"]
    run = run_notebook("06_hierarchical_forecasts.py", spark, {
        "config_path": str(NOTEBOOKS.parent / "jobs" / "prison_hierarchy.yml"),
        "overrides": " ; ".join(overrides), "output_table": str(tmp_path / "forecasts"),
        "write_example": "yes"})
    statuses, added, total = run.shown
    assert statuses.sum(axis=1).to_dict() == {
        "total": 1, "state": 3, "gender": 2, "legal": 2, "state/gender": 6,
        "state/legal": 6, "gender/legal": 4, "state/gender/legal": 12}
    assert len(added) == 7 and (added["largest difference"] < 1e-6).all()
    assert (total.kind == "forecast").sum() == 8
    assert run.namespace["summary"].rows == 36 * 8
