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
