"""Every verb's stages add up to its wall time: Spark's start (when raybricks starts it)
and the reading of the source are stages of their own, the time outside the stages is
said (``other``), and the total is measured from the verb's start (the CLI's: from the
command's, ``start-up`` being what it does before the verb)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from raybricks import cli, console, pipeline, scoring
from raybricks.config import JobConfig
from tests import helpers
from tests.test_registered_formats import FIXTURES, fixture_manifest

NAME = "tests.stages.model"
MODEL = f"models:/{NAME}@champion"
#: The line each verb ends with: its stages' seconds and the total, to a tenth.
WALL_TIME = re.compile(r"^wall time per stage \(s\): (.*); total (\d+\.\d)$", re.M)
#: Seconds a verb may spend outside its stages (plain Python between them).
OUTSIDE = 1.0


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A registered version (alias champion) of the format-2 fixture model of
    tests/fixtures/registered, logged as ``raybricks train`` logs its model: no
    training, no Ray. Returns the folder of its input and outcomes."""
    import mlflow
    from mlflow import MlflowClient

    from raybricks.packaging import Packaged
    from raybricks.tracking import configure_tracking
    from raybricks.tracking.model import log_segmented_model
    from raybricks.tracking.registration import register

    here = tmp_path_factory.mktemp("stages")
    fixture = FIXTURES / "merged"
    manifest = fixture_manifest("merged")
    shutil.copytree(fixture / "model", here / "segments")
    example = pd.read_parquet(fixture / "input.parquet")
    configure_tracking()
    mlflow.set_experiment("tests.stages")
    with mlflow.start_run() as run:
        info = log_segmented_model(Packaged(here / "segments", manifest, 0, 0), example,
                                   "model")
    version = register(info.model_uri, NAME, run.info.run_id, {}, "champion")
    MlflowClient().set_registered_model_alias(NAME, "champion", version.version)
    example.to_parquet(here / "input.parquet")
    helpers.shops(seed=1).to_parquet(here / "outcomes.parquet")
    return here


def shown_wall_time(out: str) -> tuple[dict[str, float], float]:
    """The stages and total of a verb's last line."""
    parts, total = WALL_TIME.findall(out)[-1]
    return {name: float(value) for name, value in
            (part.rsplit(" ", 1) for part in parts.split(", "))}, float(total)


def test_the_wall_time_line_adds_up_to_the_total_it_shows():
    timings = {"spark": 1.04, "model": 1.04, "source": 1.04, "other": 0.0}
    shown, total = shown_wall_time(console.wall_time(timings, 3.12))
    assert total == 3.1 and sum(shown.values()) == pytest.approx(3.1)
    shown, total = shown_wall_time(console.wall_time({"a": 1.06, "b": 1.06, "other": 1.06},
                                                     3.18))
    assert total == 3.2 and sum(shown.values()) == pytest.approx(3.2)
    assert list(shown) == ["a", "b", "other"]


def assert_adds_up(report, wall: float, stages: list[str]) -> None:
    """The report's stages, in order, then ``other`` (little): they add up to its
    seconds, which are the wall time of the call."""
    assert list(report.timings) == [*stages, "other"], report.timings
    assert sum(report.timings.values()) == pytest.approx(report.seconds)
    assert report.seconds <= wall < report.seconds + 1.5  # slack: a busy machine pauses
    assert report.timings["other"] < OUTSIDE, report.timings


def test_each_verbs_stages_add_up_to_its_wall_time(spark, registered, tmp_path, capsys,
                                                   monkeypatch):
    """On the session's Spark (given or active: no spark stage), through the API."""
    job = {"source": {"path": str(registered / "outcomes.parquet")}, "segment_by": ["store"],
           "target": "y", "features": ["x1", "x2", "color"],
           "models": [{"name": "ridge", "kind": "sklearn",
                       "estimator": "sklearn.linear_model.Ridge"}]}
    config = JobConfig.from_dict(job)
    start = time.perf_counter()
    found = pipeline.validate(config, spark)
    assert_adds_up(found, time.perf_counter() - start, ["checks", "source"])
    assert found.source_columns is not None
    start = time.perf_counter()
    summary = scoring.score(MODEL, str(registered / "input.parquet"),
                            str(tmp_path / "scored"), spark=spark)
    assert_adds_up(summary, time.perf_counter() - start,
                   ["model", "source", "scoring", "summary"])
    assert summary.rows == len(pd.read_parquet(registered / "input.parquet"))
    start = time.perf_counter()
    report = pipeline.monitor(MODEL, str(registered / "outcomes.parquet"),
                              str(tmp_path / "monitoring"), log_run=False)  # the active one
    assert_adds_up(report, time.perf_counter() - start,
                   ["source", "preparation", "monitoring", "summary", "global models"])
    said = capsys.readouterr().out
    for label in ("checks: config, estimators, registry name",
                  f"source: {registered / 'outcomes.parquet'}: columns, types, target",
                  f"source: {registered / 'input.parquet'}, its rows counted",
                  "summary: rows by status, the segments not served",
                  f"source: the outcomes {registered / 'outcomes.parquet'}"):
        assert f"> {label} ...\n" in said, label
    assert "Spark: start" not in said
    assert "wall time per stage" not in said  # the API's reports say it when asked
    shown, total = shown_wall_time(report.wall_time())
    assert total == round(report.seconds, 1) and sum(shown.values()) == pytest.approx(total)
    # the CLI ends with that line, counted from the command's start
    monkeypatch.chdir(tmp_path)  # its log folder
    (tmp_path / "job.yml").write_text(json.dumps(job))  # YAML holds JSON
    start = time.perf_counter()
    assert cli.main(["validate", "--config", str(tmp_path / "job.yml")]) == 0
    wall = time.perf_counter() - start
    shown, total = shown_wall_time(capsys.readouterr().out)
    assert list(shown) == ["start-up", "checks", "source", "other"]
    assert sum(shown.values()) == pytest.approx(total) and total <= wall + 0.05


@pytest.mark.heavy  # its own Spark in a fresh process; ~30 s
def test_a_fresh_commands_stages_include_sparks_start_and_add_up_to_its_total(
        registered, tmp_path):
    """``raybricks score`` in a fresh process: Spark's start and the input's reading are
    stages, and its last line adds its stages up to its total, from the command's start
    (which the summary says too)."""
    argv = ["score", "--model", MODEL, "--input", str(registered / "input.parquet"),
            "--output", str(tmp_path / "scored")]
    script = ("import time\nfrom raybricks.cli import main\nstart = time.perf_counter()\n"
              f"code = main({argv!r})\n"
              "print(f'exit {code} in {time.perf_counter() - start:.3f}')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env={  # this raybricks
                              **os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1])})
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    wall = float(re.search(r"^exit 0 in ([\d.]+)$", out, re.M).group(1))
    shown, total = shown_wall_time(out)
    assert list(shown) == ["start-up", "spark", "model", "source", "scoring", "summary",
                           "other"], out
    assert sum(shown.values()) == pytest.approx(total), out
    assert total <= wall + 0.05 and shown["other"] <= OUTSIDE, out
    for name, seconds in shown.items():  # each stage as its own lines said it
        if name not in ("start-up", "other"):
            label = "Spark" if name == "spark" else name
            assert re.search(rf"^> {label}: .* \.\.\.$", out, re.M), (name, out)
            [said] = re.findall(rf"^  {label}: .*: (\d+\.\d) s$", out, re.M)
            assert abs(float(said) - seconds) <= 0.15, (name, out)
    assert "> Spark: start a session ...\n" in out
    assert f"> source: {registered / 'input.parquet'}, its rows counted ...\n" in out
    scored_in = float(re.search(r" in (\d+\.\d)s: ", out).group(1))  # the summary's
    assert abs(scored_in - total) <= 0.1, out
