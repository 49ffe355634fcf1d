"""`raybricks train` end to end in a fresh process: YAML config, Parquet source, Ray."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pandas as pd

from raybricks import cli
from tests import faults, helpers

#: A line Spark's JVM prints as it starts (log4j's default profile, Spark 3.5 and 4).
SPARK_START = re.compile(r"Using Spark's default log4j profile|Setting default log level|"
                         r"To adjust logging level use sc\.setLogLevel")


def test_train_command_trains_every_segment(ray_on_spark, tmp_path):
    source = tmp_path / "shops.parquet"
    helpers.shops().to_parquet(source)
    config = tmp_path / "job.yml"
    config.write_text(
        f"""
source: {{path: "{source}", format: parquet}}
segment_by: [store]
target: y
features: [x1, x2, color]
time_column: day
validation: {{method: time, metric: mae}}
models:
  - {{name: ridge, kind: sklearn, estimator: sklearn.linear_model.Ridge}}
min_rows: 20
cluster: {{mode: address}}
training: {{output_dir: "{tmp_path / 'runs'}", run_id: cli}}
"""
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    result = subprocess.run(
        [sys.executable, "-m", "raybricks.cli", "train", "--config", str(config),
         "--set", f"cluster.address={ray_on_spark.address}", "--set", "validation.fraction=0.25"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "8 trained, 3 skipped, 0 failed" in result.stdout
    # one line per stage as it starts and ends; the libraries' output is in the run's log
    log_file = tmp_path / "runs" / "cli" / "raybricks.log"
    assert result.stdout.startswith(f"log: {log_file}\n")
    for stage in ("checks", "Ray", "data", "training (run cli)", "accounting", "registry"):
        assert re.search(rf"^> {re.escape(stage)}.* \.\.\.$", result.stdout, re.M), stage
        assert re.search(rf"^  {re.escape(stage)}.*: \d+\.\d s$", result.stdout, re.M), stage
    logged = log_file.read_text()
    spark_line = SPARK_START.search(logged).group(0)  # the JVM's, whatever Spark's version
    for library_line in (spark_line, "Connected to Ray cluster", "mlflow"):
        assert library_line in logged
        assert library_line not in result.stdout + result.stderr
    # in raybricks' format, which ray.init (setting its own on the ray logger's handlers)
    # does not replace; Ray's own terminal handler is not writing there too
    assert " INFO raybricks.training.engine: training 11 segments" in logged
    assert " INFO mlflow." in logged
    assert logged.count("Connected to Ray cluster") == 1
    rows = pd.read_parquet(tmp_path / "runs" / "cli" / "results")
    assert set(rows.store) == set(helpers.shops().store)
    s1 = rows.set_index("store").loc["s1"]
    assert s1.n_valid == round(70 * 0.25)  # the --set override reached the engine


def test_train_command_reports_config_errors_without_starting_anything(tmp_path):
    config = tmp_path / "job.yml"
    config.write_text("source: {table: t}\nsegment_by: [s]\ntarget: y\nmodels: []\nbogus: 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "raybricks.cli", "train", "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "bogus: unknown key" in result.stderr
    assert "models:" in result.stderr


VALIDATED_JOB = """
source: {{path: "{source}", format: parquet}}
segment_by: [store]
target: y
features: [x1, x2, color]
time_column: day
models:
  - {{name: ridge, kind: sklearn, estimator: {estimator}}}
"""


def validate(tmp_path, capsys, *extra, source=None, estimator="sklearn.linear_model.Ridge"):
    from raybricks.cli import main

    config = tmp_path / "job.yml"
    config.write_text(VALIDATED_JOB.format(source=source or tmp_path / "shops.parquet",
                                           estimator=estimator))
    code = main(["validate", "--config", str(config), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_validate_checks_config_and_source_without_ray_or_a_store(
        spark, tmp_path, capsys, monkeypatch):
    import raybricks.pipeline

    def no_ray(*_, **__):
        raise AssertionError("validate started Ray")

    monkeypatch.setattr(raybricks.pipeline, "ray_cluster", no_ray)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    helpers.shops().to_parquet(tmp_path / "shops.parquet")
    code, out, _ = validate(tmp_path, capsys)
    assert code == 0
    assert "config valid: task regression" in out
    assert "source valid: 6 column(s)" in out and "color" in out
    assert not (tmp_path / "mlflow.db").exists()  # no tracking store created
    # a target of the wrong type is named, exit 2
    frame = helpers.shops()
    frame["y"] = frame["y"].astype(str) + " units"
    frame.to_parquet(tmp_path / "typed.parquet")
    code, _, err = validate(tmp_path, capsys, source=tmp_path / "typed.parquet")
    assert code == 2 and "target 'y'" in err
    # a feature missing from the source
    helpers.shops().drop(columns=["x2"]).to_parquet(tmp_path / "short.parquet")
    code, _, err = validate(tmp_path, capsys, source=tmp_path / "short.parquet")
    assert code == 2 and "x2" in err
    # pandas' nanosecond timestamps, which Spark cannot read: named, with the fix
    nanos = helpers.shops()
    nanos["day"] = pd.Series(pd.Timestamp("2024-01-01"), index=nanos.index).astype(
        "datetime64[ns]")
    nanos.to_parquet(tmp_path / "nanos.parquet", coerce_timestamps=None)
    code, _, err = validate(tmp_path, capsys, source=tmp_path / "nanos.parquet")
    assert code == 2 and "nanosecond timestamps" in err and "coerce_timestamps='us'" in err


def test_validate_reports_an_unreachable_source_and_exit_codes(spark, tmp_path, capsys):
    missing = tmp_path / "nowhere.parquet"
    code, out, _ = validate(tmp_path, capsys, source=missing)
    assert code == 0 and "source not checked: cannot read parquet" in out
    code, out, _ = validate(tmp_path, capsys, "--require-source", source=missing)
    assert code == 3
    code, out, _ = validate(tmp_path, capsys, "--no-source", source=missing)
    assert code == 0 and "source not checked: not asked to" in out
    code, _, err = validate(tmp_path, capsys, "--no-source", source=missing,
                            estimator="sklearn.linear_model.NoSuchModel")
    assert code == 2 and "NoSuchModel" in err
    code, _, err = validate(tmp_path, capsys, "--no-source", "--set", "min_rows=1",
                            source=missing)
    assert code == 2 and "min_rows=1" in err


def test_ctrl_c_shuts_down_keeps_results_and_prints_the_resume_command(ray_on_spark,
                                                                      tmp_path):
    """A segment's fit waits for a file; Ctrl-C meanwhile ends the job with 130 and the
    command that resumes it, which then finishes the run."""
    source = tmp_path / "stores.parquet"
    faults.stores({"w": "wait"}).to_parquet(source)
    release = tmp_path / "release"
    config = tmp_path / "job.yml"
    config.write_text(f"""
source: {{path: "{source}", format: parquet}}
segment_by: [store]
target: y
features: [x1, fault]
models:
  - {{name: f, kind: function, function: tests.faults.fit_with_faults,
     params: {{release: "{release}"}}}}
min_rows: 10
cluster: {{mode: address, address: "{ray_on_spark.address}"}}
registry: {{name: tests.cli.interrupted}}
training: {{output_dir: "{tmp_path / 'runs'}", run_id: stopped}}
""")
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    command = [sys.executable, "-m", "raybricks.cli", "train", "--config", str(config)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    deadline = time.monotonic() + 300
    while not (tmp_path / "waiting").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == cli.INTERRUPTED, err[-3000:]
    assert "interrupted. Ray and Spark were shut down; the results of the segments that " \
           f"finished are kept in {tmp_path / 'runs' / 'stopped'}" in err
    assert "Traceback" not in err
    resume = re.search(r"To continue where it stopped: (.*)$", err, re.M).group(1)
    assert resume == (f"raybricks train --config {config} --set training.resume=true "
                      "--set training.run_id=stopped")
    release.touch()
    again = subprocess.run([sys.executable, "-m", "raybricks.cli", *resume.split()[1:]],
                           capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "5 trained, 0 skipped, 0 failed" in again.stdout


def test_an_unexpected_failure_is_one_paragraph_and_the_log_has_the_traceback(
        tmp_path, monkeypatch, capsys):
    def breaks(args):
        with cli.logged(args, tmp_path / "verb.log"):
            raise OSError("No space left on device")

    help_text, add_arguments, _ = cli.VERBS["validate"]
    monkeypatch.setitem(cli.VERBS, "validate", (help_text, add_arguments, breaks))
    argv = ["validate", "--config", "unused.yml"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("raybricks validate failed: OSError: No space left on device\n")
    assert f"The log {tmp_path / 'verb.log'} has the traceback" in err
    assert "rerun with --verbose" in err and "Traceback" not in err
    assert "Traceback" in (tmp_path / "verb.log").read_text()
    assert cli.main([*argv, "--verbose"]) == 1
    err = capsys.readouterr().err
    assert "the traceback is above" in err and "Traceback" in err


def test_the_python_api_shows_its_stages_and_keeps_library_logs_in_the_run_log(
        ray_on_spark, tmp_path, capsys):
    import raybricks

    source = tmp_path / "shops.parquet"
    helpers.shops().to_parquet(source)
    config = raybricks.JobConfig.from_dict({
        "source": {"path": str(source)}, "segment_by": ["store"], "target": "y",
        "features": ["x1", "x2"], "models": [{"name": "ridge", "kind": "sklearn",
                                              "estimator": "sklearn.linear_model.Ridge"}],
        "min_rows": 20, "registry": {"name": "tests.cli.api"},
        "training": {"output_dir": str(tmp_path / "runs"), "run_id": "api"}})
    raybricks.train(config)
    shown = capsys.readouterr()
    assert "> training (run api) ...\n" in shown.out
    assert re.search(r"^  registry: .*: \d+\.\d s$", shown.out, re.M)
    logged = (tmp_path / "runs" / "api" / "raybricks.log").read_text()
    # what MLflow logs and warns while the model is logged is in the log, not shown
    assert re.search(r"^\S+ \S+ (INFO|WARNING) (mlflow\.|py\.warnings: \S*mlflow)",
                     logged, re.M), logged
    assert "mlflow." not in shown.out + shown.err
    assert "INFO raybricks.training.engine: training 11 segments" in logged
