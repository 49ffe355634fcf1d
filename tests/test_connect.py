"""Spark Connect (Databricks standard access mode, serverless): a real Connect server on
127.0.0.1 and clients in their own processes (a Connect session turns pyspark in its
process to remote mode, which the suite's classic session must not meet).

Training runs on Connect with the Spark executor (``auto`` takes it there) and gives what
the Ray executor gives; the Ray executor is refused before anything is read or started;
validation, scoring and forecasting run on it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybricks import scoring, tracking
from raybricks.data import to_ray_dataset
from raybricks.training import train_segments
from tests import helpers
from tests.test_forecast import MODELS as FORECAST_MODELS
from tests.test_forecast import forecast_job, stores
from tests.test_training import CANDIDATES, job

MODEL, FORECASTS = "tests.connect.model", "tests.connect.forecasts"
#: What the refusal says (session.require_spark_context), the way out included.
REFUSED = "needs a classic Spark session with a SparkContext, and this one is Spark Connect"
CLIENT = Path(__file__).with_name("connect_client.py")


def connect_unavailable() -> str | None:
    """Why no Connect server and client can run here, or None."""
    import pyspark
    from packaging.requirements import Requirement

    home = Path(pyspark.__file__).parent
    if not list((home / "jars").glob("spark-connect_*.jar")):
        return (f"pyspark {pyspark.__version__}'s package has no Spark Connect server "
                "(pyspark 3.5 fetches it from Maven with --packages; pyspark 4 ships it)")
    for line in requires("pyspark") or []:
        need = Requirement(line)
        if need.marker is None or not need.marker.evaluate({"extra": "connect"}):
            continue
        try:
            found = version(need.name)
        except PackageNotFoundError:
            return f"pyspark's Spark Connect client needs {need} (not installed)"
        if not need.specifier.contains(found, prereleases=True):
            return f"pyspark's Spark Connect client needs {need} ({found} is installed)"
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


#: The class ``sbin/start-connect-server.sh`` submits (pyspark 4.0's package lacks the
#: script, not the class).
SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"


@contextlib.contextmanager
def serving(work: Path, python: str) -> Iterator[Callable[[], str]]:
    """Spark's own Connect server (``local[2]``; the topology run's master, e.g. two
    executor JVMs, under ``RAYBRICKS_TEST_MASTER``) in a process of its own, whose Python
    workers run ``python``: a function that waits until it answers and returns its
    ``sc://127.0.0.1:PORT`` (it starts while other fixtures run)."""
    reason = connect_unavailable()
    if reason:
        pytest.skip(reason)
    import pyspark

    home = Path(pyspark.__file__).parent
    port = free_port()
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": python,
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}
    settings = {"spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(port),
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
                "spark.pyspark.python": python,
                "spark.sql.warehouse.dir": str(work / "warehouse")}
    master = os.environ.get("RAYBRICKS_TEST_MASTER") or "local[2]"
    command = [str(home / "bin" / "spark-submit"), "--master", master, "--class", SERVER,
               "--name", "Spark Connect server"] + [
        word for key, value in settings.items() for word in ("--conf", f"{key}={value}")]
    log = work / "server.log"
    with log.open("w") as output:
        server = subprocess.Popen(command, env=env, cwd=work, stdout=output,
                                  stderr=subprocess.STDOUT)
    started = time.monotonic()

    def address() -> str:
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return f"sc://127.0.0.1:{port}"
            if server.poll() is not None or time.monotonic() > started + 120:
                pytest.fail(f"the Spark Connect server did not start on port {port}:\n"
                            f"{log.read_text()[-3000:]}")
            time.sleep(0.5)

    try:
        yield address
    finally:  # the server this function started, by its process
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """A Connect server whose Python workers run this interpreter (and so have
    raybricks)."""
    with serving(tmp_path_factory.mktemp("connect-server"), sys.executable) as address:
        yield address


@pytest.fixture(scope="module")
def models(ray_on_spark, spark, tmp_path_factory):
    """A registered regression model (with a global fallback for segments it has not
    met) and a registered forecasting model with intervals, trained on the suite's Ray."""
    shops = job(tmp_path_factory.mktemp("runs"), models=CANDIDATES[:1], fallback="global",
                registry={"name": MODEL, "promote": "always"})
    result = train_segments(to_ray_dataset(spark.createDataFrame(helpers.shops()),
                                           ["store"]), shops)
    tracking.publish(result, shops)
    on_ray = result.segments
    series = forecast_job(tmp_path_factory.mktemp("runs"), models=FORECAST_MODELS[:1],
                          registry={"name": FORECASTS, "promote": "always"},
                          forecast={"horizon": 7, "frequency": "D", "intervals": [80]})
    result = train_segments(to_ray_dataset(spark.createDataFrame(stores()), ["store"]),
                            series)
    tracking.publish(result, series)
    return f"models:/{MODEL}@champion", f"models:/{FORECASTS}@champion", on_ray


def job_yaml(path: Path, source: Path, name: str = "tests.connect.trained") -> Path:
    """The job ``models`` trains on Ray (tests.test_training.job with its first
    candidate, fallback global), as YAML over ``source``."""
    path.write_text(f"""
source: {{path: "{source}", format: parquet}}
segment_by: [store]
target: y
features: [x1, x2, color]
time_column: day
min_rows: 20
fallback: global
models:
  - {{name: ridge, kind: sklearn, estimator: sklearn.linear_model.Ridge,
      search: {{alpha: [0.1, 10.0]}}}}
training: {{output_dir: "{path.parent / 'runs'}", progress: false}}
registry: {{name: {name}, promote: always}}
""")
    return path


def run_together(commands: dict[str, list[str]], cwd: Path, env: dict[str, dict[str, str]]
                 ) -> dict[str, subprocess.CompletedProcess]:
    """Run the commands at the same time (each a client process of its own); their ends."""
    started = {name: subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
        env={**os.environ, **env.get(name, {}),
             "PYTHONPATH": str(Path(scoring.__file__).parents[1])})
        for name, command in commands.items()}
    ended = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=300)
        ended[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return ended


@pytest.mark.heavy
@pytest.mark.topology
def test_on_spark_connect_training_scoring_and_forecasting_run(
        connect_server, models, spark, tmp_path):
    import mlflow

    uri, forecasts, on_ray = models
    server = connect_server()
    frame = helpers.shops().sample(frac=1.0, random_state=5).drop(columns=["y"])
    frame = frame.assign(row_id=np.arange(len(frame)))
    frame.loc[frame.index[:12], "store"] = "brand-new"
    frame.to_parquet(tmp_path / "input.parquet")
    helpers.shops().to_parquet(tmp_path / "shops.parquet")
    job_yaml(tmp_path / "job.yml", tmp_path / "shops.parquet")
    pd.DataFrame({"store": ["s1", "s2"]}).to_parquet(tmp_path / "listed.parquet")
    job_yaml(tmp_path / "missing.yml", tmp_path / "no-such-source.parquet")

    output = tmp_path / "cli.parquet"
    remote = {"SPARK_REMOTE": server}  # the commands find the server by it
    ended = run_together({
        "api": [sys.executable, str(CLIENT), server, str(tmp_path), uri, forecasts],
        "train": [sys.executable, "-m", "raybricks.cli", "train", "--config",
                  str(tmp_path / "missing.yml"), "--executor", "ray"],
        "score": [sys.executable, "-m", "raybricks.cli", "score", "--model", uri, "--input",
                  str(tmp_path / "input.parquet"), "--output", str(output)],
    }, tmp_path, {"train": remote, "score": remote})
    done = ended["api"]
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["session"] == "pyspark.sql.connect.session" and found["remote"]
    # the Ray executor: refused at its checks, before it reads the (missing) source
    assert REFUSED in found["refused"] and "--executor spark" in found["refused"]
    # training on Spark's tasks: what the Ray executor trained on the same job, registered
    assert not found["ray"] and "cluster" not in found["train"]["stages"]
    assert found["train"]["counts"] == {"trained": 8, "skipped": 3, "failed": 0}
    on_connect = pd.read_parquet(Path(found["train"]["run_dir"]) / "results").sort_values(
        "store").set_index("store")
    on_ray = on_ray.sort_values("store").set_index("store")
    pd.testing.assert_series_equal(on_connect.status, on_ray.status)
    assert on_connect.chosen.astype(str).tolist() == on_ray.chosen.astype(str).tolist()
    np.testing.assert_allclose(on_connect.metric_rmse.to_numpy(float),
                               on_ray.metric_rmse.to_numpy(float), rtol=1e-6, equal_nan=True)
    # monitoring on the training rows: every segment judged; a retrain of two segments
    # registers a version merged into the champion, on Spark's tasks too
    assert sum(found["monitor"].values()) == 11
    assert found["retrain"]["counts"] == {"trained": 2, "skipped": 0, "failed": 0}
    assert int(found["retrain"]["version"]) == 2
    # validation reads the source over Connect
    assert found["validate"] == ["store", "x1", "x2", "color", "y", "day"]
    # scoring: what the classic path and MLflow's pyfunc predict
    expected = np.asarray(mlflow.pyfunc.load_model(uri).predict(frame))
    trained = pd.read_parquet(tmp_path / "trained.parquet").sort_values("row_id")
    np.testing.assert_allclose(trained.prediction.to_numpy(), expected, rtol=1e-6)
    scored = pd.read_parquet(tmp_path / "lazy.parquet").sort_values("row_id")
    np.testing.assert_allclose(scored.prediction.to_numpy(), expected, rtol=1e-9)
    assert (scored.segment_status == "unknown").sum() == 12
    assert found["summary"]["rows"] == len(frame) and found["summary"]["nulls"] == 0
    assert found["summary"]["counts"]["unknown"] == 12
    written = pd.read_parquet(tmp_path / "scored.parquet").sort_values("row_id")
    np.testing.assert_allclose(written.prediction.to_numpy(), expected, rtol=1e-9)
    # forecasting: every series' next 7 days with their bounds, as on the classic session
    on_connect = pd.read_parquet(tmp_path / "forecast.parquet").sort_values(["store", "day"])
    classic = scoring.forecast(forecasts, spark=spark, intervals=True).toPandas().sort_values(
        ["store", "day"])
    assert len(on_connect) == 7 * stores().store.nunique() == len(classic)
    for column in ("prediction", "lo_80", "hi_80"):
        np.testing.assert_allclose(on_connect[column].to_numpy(), classic[column].to_numpy(),
                                   rtol=1e-9)

    # the commands, with SPARK_REMOTE naming the server: the Ray executor refused, scoring runs
    refused = ended["train"]
    assert refused.returncode == 2, refused.stderr[-3000:]
    [message] = [line for line in refused.stderr.splitlines() if line.strip()
                 and not line.startswith("log: ")]
    assert message.startswith("raybricks train: training.executor: ray") and REFUSED in message
    assert "Ray: start" not in refused.stdout  # the cluster stage never began
    scored = ended["score"]
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert f"scored {len(frame)} rows" in scored.stdout
    np.testing.assert_allclose(
        pd.read_parquet(output).sort_values("row_id").prediction.to_numpy(), expected,
        rtol=1e-9)


#: What a Python worker runs first (``sitecustomize``): sys.path without raybricks' source
#: folder, as a serverless environment without the wheel has it.
WITHOUT_RAYBRICKS = """
import os, sys
sys.path[:] = [p for p in sys.path
               if not os.path.isfile(os.path.join(p or ".", "raybricks", "__init__.py"))]
"""


@pytest.mark.heavy
@pytest.mark.topology
def test_workers_without_raybricks_get_the_drivers_copy(tmp_path):
    """A Connect server whose Python workers cannot import raybricks (as a serverless
    environment without the wheel): ``raybricks train`` ships the driver's copy with
    addArtifacts, says so, trains on Spark's tasks and registers; ``raybricks score`` over
    the same server predicts what MLflow's pyfunc predicts."""
    import mlflow

    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text(WITHOUT_RAYBRICKS)
    worker = tmp_path / "python"
    worker.write_text(f"#!/bin/sh\nPYTHONPATH={hidden} exec {sys.executable} \"$@\"\n")
    worker.chmod(0o755)
    check = subprocess.run([str(worker), "-c", "import raybricks.config"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert "No module named 'raybricks" in check.stderr  # the workers' Python lacks it
    helpers.shops().to_parquet(tmp_path / "shops.parquet")
    job_yaml(tmp_path / "job.yml", tmp_path / "shops.parquet", "tests.connect.shipped")
    frame = helpers.shops().drop(columns=["y"]).assign(row_id=lambda f: np.arange(len(f)))
    frame.to_parquet(tmp_path / "input.parquet")
    with serving(tmp_path, str(worker)) as address:
        remote = {"SPARK_REMOTE": address()}
        trained = run_together({"train": [sys.executable, "-m", "raybricks.cli", "train",
                                          "--config", str(tmp_path / "job.yml")]},
                               tmp_path, {"train": remote})["train"]
        assert trained.returncode == 0, trained.stderr[-3000:]
        assert "cannot import raybricks: shipped the driver's copy" in trained.stdout
        assert "executor: spark" in trained.stdout
        uri = "models:/tests.connect.shipped@champion"
        scored = run_together({"score": [
            sys.executable, "-m", "raybricks.cli", "score", "--model", uri, "--input",
            str(tmp_path / "input.parquet"), "--output", str(tmp_path / "scored.parquet")]},
            tmp_path, {"score": remote})["score"]
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "shipped the driver's copy" in scored.stdout
    expected = np.asarray(mlflow.pyfunc.load_model(uri).predict(frame))
    found = pd.read_parquet(tmp_path / "scored.parquet").sort_values("row_id")
    np.testing.assert_allclose(found.prediction.to_numpy(), expected, rtol=1e-9)
