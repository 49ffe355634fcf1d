"""Reliability: faults survived, bad input refused clearly, every segment accounted for.

Real Spark, Ray (the session's Ray-on-Spark cluster, or a local Ray in a child process),
MLflow on SQLite; faults are real (killed workers, hung fits, failed allocations,
signals to the driver, an artifact store that disappears), never monkeypatched code.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pandas as pd
import pytest
import yaml

from raybricks import packaging, pipeline, tracking
from raybricks.config import JobConfig
from raybricks.data import segment_sizes, to_ray_dataset
from raybricks.errors import ConfigError, DataError
from raybricks.segmented_model import SegmentStore
from raybricks.training import train_segments
from tests import faults, helpers
from tests.test_training import job

FAULTY = [{"name": "faulty", "kind": "function", "function": "tests.faults.fit_with_faults"}]
RIDGE = {"name": "ridge", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge"}
REPO = Path(__file__).resolve().parents[1]


def fault_job(tmp_path: Path, **changes) -> JobConfig:
    """A job over ``faults.stores`` data with the fault-injecting user model."""
    training = {"output_dir": str(tmp_path / "runs"), "progress": False} | changes.pop(
        "training", {})
    return job(tmp_path, features=["x1", "fault"], time_column=None, models=FAULTY,
               min_rows=10, training=training, **changes)


def statuses(result) -> pd.DataFrame:
    return result.segments.set_index("store").sort_index()


def assert_faults_fail_alone(rows: pd.DataFrame, lost: str) -> None:
    """``faults.stores`` with hang, kill, memory and raise beside four regular stores,
    trained with a 5 s limit: each fault ``failed`` with its reason (``lost``: how the
    killed segment's begins), the regular stores trained."""
    assert list(rows.index) == ["hang", "kill", "memory", "raise", "s0", "s1", "s2", "s3"]
    assert (rows.loc[["s0", "s1", "s2", "s3"], "status"] == "trained").all(), rows.reason.to_dict()
    assert (rows.loc[["hang", "kill", "memory", "raise"], "status"] == "failed").all()
    assert rows.loc["hang", "reason"].startswith("timed out: still fitting after")
    assert "training.segment_timeout_s=5" in rows.loc["hang", "reason"]
    assert rows.loc["kill", "reason"].startswith(lost)
    assert "MemoryError" in rows.loc["memory", "reason"]
    assert "this segment's data breaks the model" in rows.loc["raise", "reason"]


# --------------------------------------------------------------------------- faults


@pytest.mark.heavy
def test_faulty_segments_fail_alone_and_the_rest_of_their_block_trains(
        ray_on_spark, spark, tmp_path):
    """One block holds a segment whose fit hangs, one that kills its worker every time,
    one that runs out of memory and one that raises: each ends ``failed`` with its
    reason; the regular segments of the same block train."""
    data = faults.stores({"hang": "hang", "kill": "kill", "memory": "memory",
                          "raise": "raise"})
    df = spark.createDataFrame(data)
    ds = to_ray_dataset(df, ["store"], min_blocks=1)
    assert ds.num_blocks == 1
    config = fault_job(tmp_path, training={"segment_timeout_s": 5, "max_retries": 1})
    result = train_segments(ds, config)
    assert_faults_fail_alone(statuses(result), "worker lost after retries")
    assert pipeline.reconcile(result, segment_sizes(df, ["store"]).segments) == {
        "source_segments": 8, "trained": 4, "skipped": 0, "failed": 4, "duplicates": 0}


def test_a_lost_worker_in_the_few_segments_path_fails_its_segment_not_the_job(
        ray_on_spark, spark, tmp_path):
    """Fewer segments than CPUs: candidates and settings are spread over tasks; a segment
    that kills its worker every time ends ``failed`` and the job returns."""
    ds = to_ray_dataset(spark.createDataFrame(faults.stores({"kill": "kill"}, regular=0)),
                        ["store"])
    result = train_segments(ds, fault_job(tmp_path, training={"max_retries": 0}))
    assert result.counts() == {"trained": 0, "skipped": 0, "failed": 1}
    assert result.segments.reason[0].startswith("worker lost after retries")


def run_cli(config: Path, *overrides: str, wait: bool = True, **kwargs):
    """``raybricks train`` in a fresh process (no RAY_ADDRESS / RAY_AUTH_MODE inherited)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-m", "raybricks.cli", "train", "--config", str(config)]
    for item in overrides:
        command += ["--set", item]
    if not wait:
        return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, **kwargs)
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=600, **kwargs)


def write_config(path: Path, source: Path, **sections) -> Path:
    """A YAML job config over the Parquet ``source`` with the fault-injecting model."""
    config = {"source": {"path": str(source)}, "segment_by": ["store"], "target": "y",
              "features": ["x1", "fault"], "models": FAULTY, "min_rows": 10} | sections
    path.write_text(yaml.safe_dump(config))
    return path


def wait_until(condition, what: str, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.5)


def ray_processes(marker: str) -> list[int]:
    """Processes whose command line mentions ``marker`` (a Ray temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def result_parts(run_dir: Path) -> dict[str, set[str]]:
    """Attempt id (the part name's last field) -> the stores its parts hold."""
    attempts: dict[str, set[str]] = {}
    for part in (run_dir / "results").glob("*.parquet"):
        stores = set(pd.read_parquet(part, columns=["store"]).store)
        attempts.setdefault(part.stem.rsplit("-", 1)[1], set()).update(stores)
    return attempts


@pytest.mark.heavy
def test_interrupted_driver_cleans_up_and_resume_finishes_like_an_uninterrupted_run(
        ray_on_spark, spark, tmp_path):
    data = faults.stores({f"w{i}": "ok" for i in range(8)} | {"slow": "wait"})
    source = tmp_path / "source.parquet"
    data.to_parquet(source)
    release = tmp_path / "gate" / "release"
    release.parent.mkdir()
    staging = tmp_path / "staging"
    staging.mkdir()
    ray_temp = tempfile.mkdtemp(prefix="rbt-", dir="/tmp")  # short: Ray's socket paths
    models = [FAULTY[0] | {"params": {"release": str(release)}}]
    config = write_config(
        tmp_path / "job.yml", source, models=models,
        cluster={"mode": "local", "num_cpus": 2, "temp_dir": ray_temp},
        data={"strategy": "parquet", "staging_dir": str(staging)},
        training={"output_dir": str(tmp_path / "runs"), "progress": False})
    run_dir = tmp_path / "runs" / "nightly"
    driver = run_cli(config, "training.run_id=nightly", wait=False)
    try:
        wait_until(lambda: (release.parent / "waiting").exists() and sum(
            len(stores) for stores in result_parts(run_dir).values()) >= 4,
            "finished blocks and the slow fit")
        assert ray_processes(ray_temp)  # the job's own Ray is running
        driver.send_signal(signal.SIGTERM)
        _, stderr = driver.communicate(timeout=120)
    finally:
        driver.kill()
    assert driver.returncode != 0, stderr[-2000:]
    assert "interrupted. Ray and Spark were shut down" in stderr  # no traceback
    assert stderr.rstrip().endswith("--set training.resume=true --set training.run_id=nightly")
    first = result_parts(run_dir)
    assert len(first) == 1 and "slow" not in next(iter(first.values()))  # finished kept
    assert list(staging.iterdir()) == []  # staging removed
    wait_until(lambda: not ray_processes(ray_temp), "Ray's processes to exit", 60)

    release.touch()
    ds = to_ray_dataset(spark.read.parquet(str(source)), ["store"])
    resume = ["training.resume=true", "training.run_id=nightly"]  # as --set on the CLI
    resumed = train_segments(ds, JobConfig.load(config, resume))
    source_segments = segment_sizes(spark.read.parquet(str(source)), ["store"]).segments
    assert pipeline.reconcile(resumed, source_segments)["source_segments"] == 13
    attempts = result_parts(run_dir)
    (first_attempt,) = first
    kept = attempts.pop(first_attempt)
    (retrained,) = attempts.values()
    assert kept == first[first_attempt]
    assert kept.isdisjoint(retrained) and len(kept | retrained) == 13  # each trained once
    assert "slow" in retrained

    plain = JobConfig.load(config, [f"training.output_dir={tmp_path / 'plain'}"])
    uninterrupted = train_segments(ds, plain)
    columns = ["store", "status", "metric_rmse", "chosen"]
    pd.testing.assert_frame_equal(
        resumed.segments[columns].sort_values("store").reset_index(drop=True),
        uninterrupted.segments[columns].sort_values("store").reset_index(drop=True))


@pytest.mark.heavy
@pytest.mark.extended  # ~110 s
def test_two_jobs_at_once_share_nothing_and_both_succeed(ray_on_spark, tmp_path):
    source = tmp_path / "source.parquet"
    faults.stores({"meet": "barrier"}, regular=6).to_parquet(source)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    staging = tmp_path / "staging"
    staging.mkdir()
    drivers = {}
    for party in ("a", "b"):
        models = [FAULTY[0] | {"params": {"barrier": str(barrier), "party": party,
                                          "parties": 2}}]
        config = write_config(
            tmp_path / f"{party}.yml", source, models=models,
            cluster={"mode": "address", "address": ray_on_spark.address},
            data={"strategy": "parquet", "staging_dir": str(staging)},
            training={"output_dir": str(tmp_path / "runs"), "run_id": f"job-{party}",
                      "progress": False},
            registry={"name": f"tests.reliability.concurrent_{party}"})
        drivers[party] = run_cli(config, wait=False)
    outputs = {party: driver.communicate(timeout=600) for party, driver in drivers.items()}
    for party, driver in drivers.items():
        assert driver.returncode == 0, outputs[party][1][-3000:]
        assert "7 trained, 0 skipped, 0 failed" in outputs[party][0]
        rows = pd.read_parquet(tmp_path / "runs" / f"job-{party}" / "results")
        assert sorted(rows.store) == ["meet"] + [f"s{i}" for i in range(6)]
    assert sorted(p.name for p in barrier.iterdir()) == ["a", "b"]  # they overlapped
    from mlflow import MlflowClient

    for party in ("a", "b"):  # each job logged its own accounting in its own MLflow run
        version = MlflowClient().get_model_version_by_alias(
            f"tests.reliability.concurrent_{party}", "champion")
        metrics = MlflowClient().get_run(version.run_id).data.metrics
        assert metrics["accounting_source_segments"] == metrics["segments_trained"] == 7
    assert list(staging.iterdir()) == []


def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` now: its children, theirs, and so on."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def running(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (an exited process not yet reaped does not)."""
    alive = set()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.add(pid)
        except (OSError, IndexError):
            continue
    return alive


def interrupted_on_ray_on_spark(tmp_path: Path, ready, signum: int, group: bool
                                ) -> tuple[str, str, float]:
    """``raybricks train`` with Ray on Spark (local Spark) in a session of its own, sent
    ``signum`` (``group``: to its process group, as a terminal's Ctrl-C) once ``ready(ray
    temp dir)`` holds. Checks it exits 130 within 15 s, saying how to resume, and that
    every process it started (Spark's JVM and Python workers, Ray's head and worker
    nodes) is gone within 15 s more; returns its stdout, stderr and seconds to exit."""
    source = tmp_path / "source.parquet"
    faults.stores({"slow": "wait"}, regular=2).to_parquet(source)
    ray_temp = tempfile.mkdtemp(prefix="rbt-", dir="/tmp")  # short: Ray's socket paths
    models = [FAULTY[0] | {"params": {"release": str(tmp_path / "release")}}]
    config = write_config(tmp_path / "job.yml", source, models=models,
                          cluster={"mode": "spark", "temp_dir": ray_temp},
                          training={"output_dir": str(tmp_path / "runs"), "run_id": "stop"})
    driver = run_cli(config, wait=False, start_new_session=True)
    try:
        wait_until(lambda: ready(ray_temp) or driver.poll() is not None, "the moment", 400)
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        started = descendants(driver.pid)
        assert ray_processes(ray_temp) and started  # its Ray on Spark is up, or starting
        sent = time.monotonic()
        if group:
            os.killpg(driver.pid, signum)
        else:
            driver.send_signal(signum)
        out, err = driver.communicate(timeout=120)
        seconds = time.monotonic() - sent
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 130, err[-3000:]
    assert seconds <= 15, f"{seconds:.1f} s from the signal to the exit"
    assert "raybricks train: interrupted. Ray and Spark were shut down" in err
    assert err.rstrip().endswith("--set training.resume=true --set training.run_id=stop")
    assert "Traceback" not in out + err
    wait_until(lambda: not running(started | descendants(driver.pid)),
               "the processes the run started to exit", 15)
    assert not ray_processes(ray_temp)
    print(f"exited {seconds:.1f} s after the signal")  # shown with pytest -rP
    return out, err, seconds


@pytest.mark.heavy
def test_ctrl_c_while_ray_on_spark_starts_ends_the_run_and_its_ray_within_seconds(tmp_path):
    """Ctrl-C (SIGINT to the process group) once Ray on Spark's head node is up and a
    worker node is starting: the run stops the start (head node, Spark job server, the
    worker node's Spark job) and exits 130, instead of waiting forever for Ray's threads."""

    def worker_node_starting(ray_temp: str) -> bool:
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in
                    ray_processes(ray_temp) if Path(f"/proc/{pid}/cmdline").exists()]
        return any(b"start_ray_node" in c and b"--head" not in c for c in commands)

    out, _, _ = interrupted_on_ray_on_spark(tmp_path, worker_node_starting, signal.SIGINT,
                                            group=True)
    assert "x Ray: start (on Spark) or connect: stopped after" in out


@pytest.mark.heavy
def test_sigterm_while_training_on_ray_on_spark_ends_the_run_and_its_ray_within_seconds(
        tmp_path):
    """SIGTERM to the driver while a segment's fit runs on Ray on Spark: the run stops
    training, shuts Ray on Spark down and exits 130 with the command that resumes it."""
    out, _, _ = interrupted_on_ray_on_spark(
        tmp_path, lambda _: (tmp_path / "waiting").exists(), signal.SIGTERM, group=False)
    assert "x training (run stop): stopped after" in out


# --------------------------------------------------------------------------- MLflow


@pytest.fixture(scope="module")
def small_result(ray_on_spark, spark, tmp_path_factory):
    ds = to_ray_dataset(spark.createDataFrame(faults.stores({})), ["store"])
    return train_segments(ds, fault_job(tmp_path_factory.mktemp("small")))


def stored_location(source: str) -> str:
    """Where a version's model files are: a logged model's (MLflow 3, ``models:/m-...``)
    or a run's artifacts (MLflow 2, ``runs:/...``)."""
    import mlflow
    from mlflow.store.artifact.runs_artifact_repo import RunsArtifactRepository

    if source.startswith("models:/"):
        return mlflow.get_logged_model(source.removeprefix("models:/")).artifact_location
    if source.startswith("runs:/"):
        return RunsArtifactRepository.get_underlying_uri(source)
    return source


@pytest.mark.heavy
def test_mlflow_failing_mid_registration_leaves_nothing_and_the_retry_succeeds(
        small_result, tmp_path):
    from mlflow import MlflowClient

    name = "tests.reliability.rollback"
    config = fault_job(tmp_path, registry={"name": name, "promote": "if_better"})
    first = tracking.publish(small_result, config)
    client = MlflowClient()
    location = stored_location(client.get_model_version(name, first.version).source)
    stored = Path(urlparse(location).path if "://" in location else location)
    hidden = stored.with_name(stored.name + ".unavailable")
    stored.rename(hidden)  # the champion's artifacts vanish: comparing with it fails
    try:
        with pytest.raises(tracking.RegistryError) as failure:
            pipeline.publish(small_result, config)
    finally:
        hidden.rename(stored)
    message = str(failure.value)
    assert "No version was left behind and no alias moved" in message
    versions = client.search_model_versions(f"name = '{name}'")
    assert [str(v.version) for v in versions] == [first.version]  # the challenger is gone
    for alias in ("champion", "challenger"):
        assert str(client.get_model_version_by_alias(name, alias).version) == first.version
    run_id = re.search(r"register_run\('([0-9a-f]+)', config\)", message).group(1)
    retried = tracking.register_run(run_id, config)
    assert retried.version != first.version
    assert str(client.get_model_version_by_alias(name, "challenger").version) == \
        retried.version
    assert len(client.search_model_versions(f"name = '{name}'")) == 2


def test_mlflow_unreachable_says_how_to_publish_without_retraining(
        small_result, tmp_path, monkeypatch):
    config = fault_job(tmp_path, registry={"name": "tests.reliability.unreachable"})
    with monkeypatch.context() as env:
        env.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
        env.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        env.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        with pytest.raises(tracking.RegistryError) as failure:
            pipeline.publish(small_result, config)
    message = str(failure.value)
    assert "nothing was registered and no alias moved" in message
    assert f"--set training.run_id={small_result.run_id}" in message
    assert "training.resume=true" in message
    again = pipeline.publish(small_result, config)  # MLflow is back: the retry works
    assert again.version is not None and again.champion_version == again.version


# --------------------------------------------------------------------------- accounting


def test_a_result_that_does_not_match_its_source_fails_the_job(small_result, spark):
    more = spark.createDataFrame(faults.stores({"extra": "ok"}))
    with pytest.raises(pipeline.AccountingError, match="5 distinct segments in the source "
                       "but 4 results.*Nothing was registered"):
        pipeline.reconcile(small_result, segment_sizes(more, ["store"]).segments)
    counts = pipeline.reconcile(small_result, 4)
    assert counts["trained"] == 4 and counts["source_segments"] == 4
    report = pipeline.TrainingReport(small_result, None, {}, counts)
    assert "accounting: 4 segments in the source" in report.summary()


# --------------------------------------------------------------------------- bad input


def refused(spark, tmp_path, **changes) -> str:
    """The DataError ``raybricks.train`` raises before any Ray work, as text."""
    config = job(tmp_path, **{"time_column": None} | changes)
    with pytest.raises(DataError) as error:
        pipeline.train(config, spark, register=False)
    return str(error.value)


def table(spark, name: str, frame, schema: str | None = None) -> str:
    spark.createDataFrame(frame, schema).createOrReplaceTempView(name)
    return name


def test_bad_sources_and_columns_are_refused_before_ray(spark, tmp_path):
    shops = table(spark, "shops_ok", helpers.shops().drop(columns="day"))
    assert "not found" in refused(spark, tmp_path, source={"table": "no_such_table"})
    assert "cannot read parquet at source.path" in refused(
        spark, tmp_path, source={"path": str(tmp_path / "missing.parquet")})
    assert "['sales'] not in the table" in refused(
        spark, tmp_path, source={"table": shops}, target="sales")
    assert "['price'] not in the table" in refused(
        spark, tmp_path, source={"table": shops}, features=["x1", "price"])
    assert "not numeric" in refused(
        spark, tmp_path, source={"table": shops}, target="color", features=["x1"])
    empty = table(spark, "shops_no_target", helpers.shops().assign(y=np.nan))
    assert "target 'y' is null (or NaN / infinite) in every row" in refused(
        spark, tmp_path, source={"table": empty}, time_column="day")
    assert "nothing to train on: the filter where='x1 > 1e9' matched no rows" in refused(
        spark, tmp_path, source={"table": shops, "where": "x1 > 1e9"})


def test_unsupported_feature_types_and_case_twins_are_refused_before_ray(spark, tmp_path):
    rows = [("a", 1.0, {"k": 1.0}, [1.0], bytearray(b"x"), 2.0)]
    odd = table(spark, "odd_types", rows, "store string, x1 double, tags map<string,double>, "
                "hist array<double>, blob binary, y double")
    message = refused(spark, tmp_path, source={"table": odd}, features=None)
    assert "unsupported type" in message
    assert all(name in message for name in ("tags", "hist", "blob"))
    twins = table(spark, "case_twins", [("a", 1.0, 2.0, 3.0)],
                  "store string, x1 double, X1 double, y double")
    message = refused(spark, tmp_path, source={"table": twins}, features=None)
    assert "['X1', 'x1'] differ only in case" in message
    files = tmp_path / "twins.parquet"
    pd.DataFrame({"store": ["a"], "x1": [1.0], "X1": [2.0], "y": [3.0]}).to_parquet(files)
    message = refused(spark, tmp_path, source={"path": str(files)}, features=None)
    assert "cannot read parquet" in message and "`x1` already exists" in message


def test_config_typos_are_refused_with_the_key_named(tmp_path):
    config = tmp_path / "job.yml"
    config.write_text(yaml.safe_dump({
        "source": {"table": "t"}, "segment_by": ["s"], "target": "y",
        "models": [{"name": "m", "kind": "lightgbm", "parms": {}}],
        "trainig": {"resume": True}}))
    with pytest.raises(ConfigError) as error:
        JobConfig.load(config)
    assert "models.0.parms: unknown key (did you mean params?)" in str(error.value)
    assert "trainig: unknown key (did you mean training?)" in str(error.value)
    fixed = config.read_text().replace("parms", "params").replace("trainig", "training")
    config.write_text(fixed)
    with pytest.raises(ConfigError, match=r"training.resum: unknown key \(did you mean "
                                          r"resume\?\)"):
        JobConfig.load(config, ["training.resum=false"])
    with pytest.raises(ConfigError, match=r"forecast.hierarchy.methd: unknown key \(did "
                                          r"you mean method\?\)"):
        JobConfig.load(config, ["task=forecast", "time_column=day", "forecast.horizon=7",
                                "forecast.frequency=D", "forecast.hierarchy.levels=[[a]]",
                                "forecast.hierarchy.methd=bottom_up"])
    with pytest.raises(ConfigError, match=r"bogus: unknown key \(check the spelling"):
        JobConfig.load(config, ["bogus=1"])  # nothing close: the reference


def test_awkward_keys_and_values_get_a_status_each_and_round_trip(
        ray_on_spark, spark, tmp_path):
    rng = np.random.default_rng(3)

    def store(key, rows=40, **columns):
        x1 = rng.normal(size=rows)
        frame = pd.DataFrame({"store": [key] * rows, "x1": x1,
                              "y": 2 * x1 + rng.normal(scale=0.1, size=rows)})
        return frame.assign(**columns)

    inf_x = rng.normal(size=40)
    inf_x[[1, 5]] = [np.inf, -np.inf]
    inf_y = 2 * inf_x.clip(-3, 3)
    inf_y[[2, 7, 9]] = np.inf
    data = pd.concat([
        store("plain"), store(None), store(""), store("Zürich/Nord ☃"),
        store("one_row", rows=1), store("inf_features", x1=inf_x),
        store("inf_target", y=inf_y), store("null_target", y=np.nan),
    ], ignore_index=True)
    df = spark.createDataFrame(data.astype({"store": object}))
    ds = to_ray_dataset(df, ["store"])
    config = job(tmp_path, features=["x1"], time_column=None, min_rows=10,
                 models=[RIDGE, {"name": "xgb", "kind": "xgboost",
                                 "params": {"n_estimators": 10}}])
    result = train_segments(ds, config)
    rows = result.segments.assign(store=result.segments.store.fillna("<null>"))
    rows = rows.set_index("store")
    trained = ["plain", "<null>", "", "Zürich/Nord ☃", "inf_features", "inf_target"]
    assert (rows.loc[trained, "status"] == "trained").all(), rows.reason.to_dict()
    assert rows.loc["one_row", "reason"] == "too few rows: 1 < min_rows=10"
    assert rows.loc["null_target", "reason"] == (
        "no target: the target is null or infinite in all 40 rows")
    assert rows.loc["inf_target", "n_rows"] == 37  # the infinite targets were dropped
    assert np.isfinite(rows.loc[trained, "metric_rmse"].astype(float)).all()
    assert len(rows) == segment_sizes(df, ["store"]).segments == 8

    packaging.package_result(result, tmp_path / "segments")
    frame = data.drop(columns="y").iloc[[0, 40, 80, 120, 200, 201]]
    scored = SegmentStore(tmp_path / "segments").predict(frame)
    assert list(scored.status) == ["trained"] * 6
    assert np.isfinite(np.asarray(scored.values, dtype=float)).all()


def test_single_class_segment_is_skipped(ray_on_spark, spark, tmp_path):
    data = pd.concat([helpers.classes(2),
                      helpers.classes(2).query("store == 0").assign(store=9, label="yes")])
    ds = to_ray_dataset(spark.createDataFrame(data), ["store"])
    config = job(tmp_path, target="label", features=["x1", "x2"], time_column=None,
                 task="binary", models=[{"name": "logit", "kind": "sklearn",
                                         "estimator": "sklearn.linear_model.LogisticRegression"}])
    rows = statuses(train_segments(ds, config))
    assert list(rows.status) == ["trained"] * 4 + ["skipped"]
    assert rows.loc[9, "reason"] == "single class: every target value is 'yes'"


# heavy: accounting is the same code on every runtime; ~24 s
@pytest.mark.heavy
def test_100k_tiny_segments_are_each_accounted_once(ray_on_spark, spark, tmp_path):
    rng = np.random.default_rng(5)
    sizes = np.where(rng.random(100_000) < 0.05, 3, 2)  # 5% can train (min_rows=3)
    keys = np.repeat(np.arange(100_000), sizes)
    data = pd.DataFrame({"store": keys, "x1": rng.normal(size=len(keys))})
    data["y"] = data.x1 + rng.normal(size=len(keys))
    df = spark.createDataFrame(data)
    ds = to_ray_dataset(df, ["store"])
    config = job(tmp_path, features=["x1"], time_column=None, min_rows=3,
                 models=[{"name": "mean", "kind": "sklearn",
                          "estimator": "sklearn.dummy.DummyRegressor"}])
    result = train_segments(ds, config)
    assert result.counts() == {"trained": int((sizes == 3).sum()),
                               "skipped": int((sizes == 2).sum()), "failed": 0}
    assert pipeline.reconcile(result, segment_sizes(df, ["store"]).segments)["duplicates"] == 0


def test_a_tracking_store_that_cannot_be_opened_is_refused_before_training(
        spark, tmp_path, monkeypatch, mlflow_restored):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's folder should be")
    shops = table(spark, "shops_store", helpers.shops().drop(columns="day"))
    config = job(tmp_path, time_column=None, source={"table": shops},
                 registry={"name": "tests.reliability.store"},
                 training={"output_dir": str(tmp_path / "runs"), "progress": False})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{blocker}/mlflow.db")
    with pytest.raises(ConfigError) as error:
        pipeline.train(config, spark)
    message = str(error.value)
    assert f"sqlite:///{blocker}/mlflow.db cannot be opened" in message
    assert "nothing was trained" in message and "MLFLOW_TRACKING_URI" in message
    runs = tmp_path / "runs"
    assert not runs.exists() or not list(runs.rglob("part-*"))  # no segment trained
