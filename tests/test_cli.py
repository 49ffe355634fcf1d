"""`raybricks train` end to end in a fresh process: YAML config, Parquet source, Ray."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from raybricks import cli
from tests import faults, helpers

#: A line Spark's JVM prints as it starts (log4j's default profile, Spark 3.5 and 4).
SPARK_START = re.compile(r"Using Spark's default log4j profile|Setting default log level|"
                         r"To adjust logging level use sc\.setLogLevel")


# heavy: the CLI's train on every runtime is covered by the interrupt and error tests' runs; ~78 s
@pytest.mark.heavy
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
    assert re.search(r" (INFO|WARNING) mlflow\.", logged)  # INFO: only on a new store
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


def test_a_misspelt_verb_is_named_with_the_likely_one(capsys):
    from raybricks.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["valdate", "--config", "job.yml"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.replace("\n", " ")
    assert "invalid choice: 'valdate'" in error and error.rstrip().endswith(
        "did you mean validate?")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["frobnicate"])
    assert "did you mean" not in capsys.readouterr().err  # nothing close


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
    # pandas' nanosecond timestamps, which Spark reads only as integers: read as times
    nanos = helpers.shops()
    nanos["day"] = pd.Series(pd.Timestamp("2024-01-01"), index=nanos.index).astype(
        "datetime64[ns]")
    nanos.to_parquet(tmp_path / "nanos.parquet", coerce_timestamps=None)
    code, out, err = validate(tmp_path, capsys, source=tmp_path / "nanos.parquet")
    assert code == 0 and "source valid" in out, err
    # --segments reaches validate as source.segments: a list without the segment column,
    # a list of no segment of the source, and a promotion that would drop the others
    pd.DataFrame({"shop": ["s1"]}).to_parquet(tmp_path / "wrong.parquet")
    code, _, err = validate(tmp_path, capsys, "--segments", str(tmp_path / "wrong.parquet"))
    assert code == 2 and "has no column(s) ['store']" in err
    pd.DataFrame({"store": ["nowhere"]}).to_parquet(tmp_path / "none.parquet")
    code, _, err = validate(tmp_path, capsys, "--segments", str(tmp_path / "none.parquet"))
    assert code == 2 and "none of the segments listed in source.segments" in err
    code, _, err = validate(tmp_path, capsys, "--no-source", "--segments", "keys",
                            "--set", "registry.promote=always")
    assert code == 2 and "would make a version of those alone the champion" in err


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


@pytest.mark.heavy
@pytest.mark.extended  # ~50 s; interrupts: test_reliability's run in CI
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


INTERRUPTED_MID_CALL = """
import sys
from pathlib import Path

from raybricks import cli


def interrupted_mid_call(args):
    args.resume = "raybricks train --config job.yml --set training.resume=true"
    with cli.logged(args, Path(sys.argv[1])):
        try:
            raise KeyboardInterrupt("signal 15")
        finally:
            raise ConnectionError("Answer from Java side is empty")


help_text, add_arguments, _ = cli.VERBS["validate"]
cli.VERBS["validate"] = (help_text, add_arguments, interrupted_mid_call)
sys.exit(cli.main(["validate", "--config", "unused.yml"]))
"""


def test_a_clean_up_that_fails_after_an_interrupt_still_ends_as_interrupted(tmp_path):
    """Ctrl-C or SIGTERM during a Spark call leaves py4j's connection broken, so the next
    call, in a ``finally`` (``stage_as_parquet`` resetting a conf), fails: the run still
    ends as interrupted (130, how to resume), not as an environment failure. (In a
    process of its own: an interrupted verb stops the active Spark session.)"""
    log_file = tmp_path / "verb.log"
    run = subprocess.run([sys.executable, "-c", INTERRUPTED_MID_CALL, str(log_file)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == cli.INTERRUPTED, run.stderr[-3000:]
    assert run.stderr == ("raybricks validate: interrupted. Ray and Spark were shut down.\n"
                          "To continue where it stopped: raybricks train --config job.yml "
                          "--set training.resume=true\n")
    assert "Traceback" not in run.stdout and "Answer from Java" not in run.stdout
    assert "Answer from Java side is empty" in log_file.read_text()


@pytest.mark.heavy  # console output, the same on every runtime: the newest versions only
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
    start = time.perf_counter()
    report = raybricks.train(config)
    wall = time.perf_counter() - start
    shown = capsys.readouterr()
    assert "> training (run api) ...\n" in shown.out
    assert re.search(r"^  registry: .*: \d+\.\d s$", shown.out, re.M)
    # the source's reading is a stage of its own, Spark's start none (the session is
    # active); with the time between them, the stages add up to the job's wall time
    # a small job: Spark's tasks (auto), no Ray started or shut down
    assert "executor: spark: " in shown.out and "Ray: start" not in shown.out
    assert list(report.timings) == ["checks", "source", "data", "training", "accounting",
                                    "registry", "other"]
    assert sum(report.timings.values()) == pytest.approx(report.seconds)
    assert report.seconds <= wall < report.seconds + 1.5  # slack: a busy machine pauses
    assert re.search(r"^  checks: config, estimators, registry name: \d+\.\d s$",
                     shown.out, re.M)
    assert f"> source: {source}: columns, types, target ...\n" in shown.out
    logged = (tmp_path / "runs" / "api" / "raybricks.log").read_text()
    # what MLflow logs and warns while the model is logged is in the log, not shown
    assert re.search(r"^\S+ \S+ (INFO|WARNING) (mlflow\.|py\.warnings: \S*mlflow)",
                     logged, re.M), logged
    assert "mlflow." not in shown.out + shown.err
    assert "INFO raybricks.training.on_spark: training 11 segments" in logged


USER_ERROR_JOB = """
source: {{path: "{source}"}}
segment_by: [store]
target: y
features: [x1, {feature}]
models:
  - {{name: ridge, kind: sklearn, estimator: sklearn.linear_model.Ridge}}
training: {{output_dir: "{runs}", run_id: {run_id}}}
"""


def run_verb(argv: list[str], cwd, tty: bool = False) -> tuple[int, str, str]:
    """``raybricks ARGV`` in a fresh process: its exit code, stdout and stderr (``tty``:
    both on one pseudo-terminal, returned as stdout)."""
    import pty

    command = [sys.executable, "-m", "raybricks.cli", *argv]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    if not tty:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd,
                              env=env)
        return done.returncode, done.stdout, done.stderr
    leader, terminal = pty.openpty()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=terminal,
                               stderr=terminal, cwd=cwd, env=env)
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return process.wait(timeout=60), shown.decode().replace("\r\n", "\n"), ""


@pytest.mark.heavy
def test_user_errors_are_one_message_and_the_log_path_without_a_traceback(tmp_path):
    """A column the table lacks, a source path that does not exist, a model nobody
    registered: each verb (on a terminal or not) prints the message and its log's path,
    exits 2, and keeps the traceback in the log, not on the terminal."""
    from concurrent.futures import ThreadPoolExecutor

    source = tmp_path / "shops.parquet"
    helpers.shops().to_parquet(source)

    def config(name: str, **fields: str) -> str:
        path = tmp_path / f"{name}.yml"
        path.write_text(USER_ERROR_JOB.format(**{
            "source": source, "feature": "x2", "runs": tmp_path / "runs", "run_id": name,
        } | fields))
        return str(path)

    runs = tmp_path / "runs"
    cases = {  # argv, on a terminal, the message, the log
        "train-column": (["train", "--config", config("column", feature="price")], True,
                         "['price'] not in the table", runs / "column" / "raybricks.log"),
        "train-path": (["train", "--config", config("path", source=tmp_path / "no.parquet")],
                       False, "cannot read parquet at source.path",
                       runs / "path" / "raybricks.log"),
        "validate": (["validate", "--config", config("valid", feature="price")], False,
                     "['price'] not in the table", None),
        "score": (["score", "--model", "models:/tests.cli.never_registered@champion",
                   "--input", str(source), "--output", str(tmp_path / "scored")], False,
                  "cannot load model 'models:/tests.cli.never_registered@champion'", None),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        done = {name: pool.submit(run_verb, argv, tmp_path, tty)
                for name, (argv, tty, _, _) in cases.items()}
        results = {name: future.result() for name, future in done.items()}
    for name, (argv, _, message, log_file) in cases.items():
        code, out, err = results[name]
        shown = out + err
        assert code == 2, (name, shown[-3000:])
        assert message in shown, (name, shown[-3000:])
        assert "Traceback" not in shown and "ERROR: raybricks" not in shown, (name, shown)
        printed = re.search(r"^log: (\S+)$", out, re.M).group(1)  # said first
        assert log_file is None or printed == str(log_file), name
        assert f"raybricks {argv[0]}: " in shown and f"\nlog: {printed}\n" in shown, name
        logged = Path(tmp_path, printed).read_text()
        assert "Traceback" in logged and message in logged, name


API_RUN = """
import sys

import raybricks

raybricks.train(raybricks.JobConfig.from_dict({{
    "source": {{"path": "{source}"}}, "segment_by": ["store"], "target": "y",
    "features": ["x1", "x2"], "min_rows": 20,
    "models": [{{"name": "ridge", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge"}}],
    "cluster": {{"mode": "spark", "temp_dir": "{ray_temp}"}},
    "training": {{"output_dir": "{runs}", "run_id": "api"}}}}), register=False)
print("TRAINED", flush=True)
"""


@pytest.mark.heavy
@pytest.mark.extended  # ~45 s; the API's stage display runs in CI
def test_the_python_api_keeps_ray_on_sparks_start_up_lines_in_the_run_log(tmp_path):
    """``raybricks.train`` in a script starts Ray on Spark for the run: what its head
    node's ``ray start`` prints and the autoscaler's events, which Ray prints on the
    driver while the worker nodes start, are in the run's log and not on the terminal."""
    import tempfile

    from tests.test_reliability import ray_processes

    source = tmp_path / "shops.parquet"
    helpers.shops().to_parquet(source)
    ray_temp = tempfile.mkdtemp(prefix="rbt-", dir="/tmp")  # short: Ray's socket paths
    script = tmp_path / "api.py"
    script.write_text(API_RUN.format(source=source, ray_temp=ray_temp, runs=tmp_path / "runs"))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0 and "TRAINED" in run.stdout, run.stderr[-3000:]
    assert "> Ray: start (on Spark) or connect ...\n" in run.stdout
    logged = (tmp_path / "runs" / "api" / "raybricks.log").read_text()
    head, driver = " INFO ray.util.spark.head: ", " INFO ray.util.spark.driver: "
    assert re.search(rf"{head}.*Ray runtime started\.$", logged, re.M), logged[-5000:]
    assert re.search(rf"{head}.*To connect to this Ray cluster:$", logged, re.M)
    assert re.search(rf"{driver}\(autoscaler \+\S+\) Adding 1 node\(s\) of type ray\.worker",
                     logged)
    assert not [line for line in logged.splitlines()  # without the terminal's colours
                if (head in line or driver in line) and "\x1b[" in line]
    # nothing of the head's or the autoscaler's on the terminal; the worker node's own
    # `ray start` runs in a Spark executor, whose output the Spark JVM relays to its own
    # stderr as every executor's (on a cluster: the executors' logs)
    for line in ("To connect to this Ray cluster", "Next steps", "(autoscaler", "Adding 1 node"):
        assert line not in run.stdout + run.stderr, line
    assert "Ray runtime started" not in run.stdout
    deadline = time.monotonic() + 15  # the run stopped its Ray: nothing of it is left
    while ray_processes(ray_temp) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ray_processes(ray_temp)
