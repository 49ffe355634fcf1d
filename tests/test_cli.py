"""`raybricks train` end to end in a fresh process: YAML config, Parquet source, Ray."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd

from tests import helpers


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
training: {{output_dir: "{tmp_path / 'runs'}", run_id: cli, progress: false}}
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
