"""Offline checks of the Databricks Asset Bundle and the job configs it runs.

The bundle is loaded the way the CLI loads it (``databricks.yml`` merged with every file
its ``include:`` globs match) and validated against the bundle JSON schema in
``../shared/schemas``; each job also loads with ``databricks-bundles``; the wheel the
bundle builds carries the entry point the jobs call; the job parameters parse with the
real ``raybricks`` CLI and their job config validates. No workspace, Spark or Ray.
"""

from __future__ import annotations

import configparser
import copy
import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml

from raybricks.cli import build_parser
from raybricks.cli import overrides as cli_overrides
from raybricks.config import JobConfig
from raybricks.monitoring import PERIODS
from raybricks.submit import (
    DEFAULT_ENVIRONMENT_VERSION,
    ENTRY_POINT,
    PACKAGE_NAME,
    RAY_SPARK_CONF,
    RAY_SPARK_ENV,
    SERVERLESS_PYTHON,
)

REPO = Path(__file__).parents[1]
SCHEMA = Path(__file__).parents[2] / "shared" / "schemas" / "databricks-bundle-config.schema.json"
SERVERLESS = REPO / "bundles" / "serverless.job.yml"
NOTEBOOK_HEADER = "# Databricks notebook source"
REFERENCE = re.compile(r"\$\{([a-z_]+)\.([A-Za-z0-9_.\-\[\]]+)\}")


# --------------------------------------------------------------------------- loading


def merge(into: dict, doc: dict, source: Path, where: str = "") -> None:
    """Merge ``doc`` into ``into`` like the CLI: maps merge, a key defined twice is an error."""
    for key, value in doc.items():
        if key in into and isinstance(into[key], dict) and isinstance(value, dict):
            merge(into[key], value, source, f"{where}{key}.")
        elif key in into:
            raise AssertionError(f"{source.name}: {where}{key} is already defined")
        else:
            into[key] = copy.deepcopy(value)


def load_bundle(root: Path = REPO) -> tuple[dict, dict[Path, dict]]:
    """The merged bundle and each of its files (``databricks.yml`` first)."""
    main = yaml.safe_load((root / "databricks.yml").read_text())
    files = {root / "databricks.yml": main}
    merged = copy.deepcopy(main)
    for pattern in main.get("include", []):
        matches = sorted(root.glob(pattern))
        assert matches, f"include {pattern!r} matches no file"
        for path in matches:
            files[path] = yaml.safe_load(path.read_text())
            assert "include" not in files[path], f"{path.name}: includes belong in databricks.yml"
            merge(merged, files[path], path)
    return merged, files


@pytest.fixture(scope="module")
def bundle() -> dict:
    return load_bundle()[0]


@pytest.fixture(scope="module")
def bundle_files() -> dict[Path, dict]:
    return load_bundle()[1]


def schema_validator():
    """Draft 7 with ``pattern`` matched by the ``regex`` package (the schema uses \\p{L})."""
    import regex
    from jsonschema import Draft7Validator, ValidationError, validators

    def pattern(validator, value, instance, schema):
        if validator.is_type(instance, "string") and not regex.search(value, instance):
            yield ValidationError(f"{instance!r} does not match {value!r}")

    if not SCHEMA.is_file():
        pytest.fail(f"bundle schema not found at {SCHEMA}: the shared/ folder must sit beside "
                    "the repository (shared/schemas/databricks-bundle-config.schema.json)")
    extended = validators.extend(Draft7Validator, {"pattern": pattern})
    return extended(json.loads(SCHEMA.read_text()))


@pytest.fixture(scope="module")
def validator():
    return schema_validator()


def problems(validator, document: dict) -> list[str]:
    """One line per place the schema rejects: the innermost errors, without the "or a
    ${...} reference" alternatives that every object of the schema also allows."""

    def leaves(error):
        if not error.context:
            yield error
        for inner in error.context:
            yield from leaves(inner)

    found = {}
    for error in validator.iter_errors(document):
        for leaf in leaves(error):
            if leaf.validator == "type" and isinstance(leaf.instance, dict | list):
                continue
            where = ".".join(map(str, leaf.absolute_path)) or "(top)"
            messages = found.setdefault(where, [])
            if len(messages) < 3:  # a scalar fails every ${...} pattern: the first few say it
                messages.append(leaf.message[:200])
    return [f"{where}: {'; '.join(messages)}" for where, messages in found.items()]


def jobs_of(document: dict) -> dict[str, dict]:
    return (document.get("resources") or {}).get("jobs") or {}


def tasks_of(document: dict) -> Iterator[tuple[str, dict]]:
    for name, job in jobs_of(document).items():
        for task in job.get("tasks", []):
            yield name, task


def serverless_jobs(files: dict[Path, dict]) -> dict[str, dict]:
    """The jobs of bundles/serverless.job.yml, by name."""
    return jobs_of(files[SERVERLESS])


def classic_twin(name: str) -> str:
    """``training_serverless`` -> ``training``: the cluster job a serverless one varies."""
    assert name.endswith("_serverless"), name
    return name.removesuffix("_serverless")


def strings(node: object) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


# --------------------------------------------------------------------------- schema


def test_merged_bundle_validates_against_the_bundle_schema(bundle, validator):
    assert {"training", "scoring", "train_and_score"} <= set(jobs_of(bundle))
    assert problems(validator, bundle) == []


def test_the_schema_check_catches_mistakes(bundle, validator):
    broken = copy.deepcopy(bundle)
    training = broken["resources"]["jobs"]["training"]
    training["timeout_seconds"] = "four hours"  # neither an int nor a ${...} reference
    training["tasks"][0]["python_wheel_task"]["entrypoint"] = "raybricks"  # misspelt key
    serverless = broken["resources"]["jobs"]["training_serverless"]
    serverless["environments"][0]["spec"]["environment_verison"] = "4"  # misspelt key
    found = problems(validator, broken)
    assert any("timeout_seconds" in p for p in found)
    assert any("entrypoint" in p for p in found)
    assert any("environment_verison" in p for p in found)
    (problem,) = problems(validator, {"bundle": {"nme": "x"}})
    assert "'name' is a required property" in problem and "'nme' was unexpected" in problem


def test_every_job_loads_with_databricks_bundles(bundle):
    from databricks.bundles.jobs import Job

    for name, spec in jobs_of(bundle).items():
        job = Job.from_dict(spec)
        assert job.tasks, name


def test_targets_dev_by_default_and_prod_with_root_path_and_permissions(bundle):
    targets = bundle["targets"]
    assert targets["dev"]["mode"] == "development" and targets["dev"]["default"] is True
    prod = targets["prod"]
    assert prod["mode"] == "production"
    assert prod["workspace"]["root_path"].startswith("/Workspace/")
    assert {p["level"] for p in prod["permissions"]} >= {"CAN_MANAGE", "CAN_VIEW"}


# --------------------------------------------------------------------------- references


def test_every_variable_used_is_declared_and_every_declared_one_used(bundle, bundle_files):
    declared = set(bundle["variables"])
    used = {m.group(2).split(".")[0] for doc in bundle_files.values() for text in strings(doc)
            for m in REFERENCE.finditer(text) if m.group(1) == "var"}
    assert used - declared == set(), "used but not declared"
    assert declared - used == set(), "declared but never used"
    for target in bundle["targets"].values():
        assert set(target.get("variables") or {}) <= declared


def test_resource_references_and_task_dependencies_resolve(bundle):
    for text in strings(bundle):
        for kind, path in REFERENCE.findall(text):
            if kind == "resources":
                group, name, *_ = path.split(".")
                assert name in bundle["resources"][group], text
    for name, job in jobs_of(bundle).items():
        keys = {task["task_key"] for task in job["tasks"]}
        clusters = {c["job_cluster_key"] for c in job.get("job_clusters", [])}
        environments = {e["environment_key"] for e in job.get("environments", [])}
        for task in job["tasks"]:
            assert {d["task_key"] for d in task.get("depends_on", [])} <= keys - {task["task_key"]}
            if "job_cluster_key" in task:
                assert task["job_cluster_key"] in clusters, (name, task["task_key"])
            if "environment_key" in task:
                assert task["environment_key"] in environments, (name, task["task_key"])
    score = {t["task_key"]: t for t in bundle["resources"]["jobs"]["train_and_score"]["tasks"]}
    assert score["score"]["depends_on"] == [{"task_key": "train"}]


def file_problems(files: dict[Path, dict]) -> list[str]:
    """Notebook tasks must point at notebooks, spark_python_task files at plain scripts.

    Paths are relative to the file that defines the task, as the CLI resolves them.
    """
    found = []
    for source, document in files.items():
        for job, task in tasks_of(document):
            notebook = (task.get("notebook_task") or {}).get("notebook_path")
            script = (task.get("spark_python_task") or {}).get("python_file")
            for path, want_notebook in ((notebook, True), (script, False)):
                if not path or "${" in path or path.startswith("/"):
                    continue
                resolved = (source.parent / path).resolve()
                if not resolved.is_file():
                    found.append(f"{job}.{task['task_key']}: {path} does not exist")
                    continue
                lines = resolved.read_text().splitlines()
                is_notebook = bool(lines) and lines[0].strip() == NOTEBOOK_HEADER
                if is_notebook != want_notebook:
                    found.append(f"{job}.{task['task_key']}: {path} "
                                 f"{'is not' if want_notebook else 'is'} a notebook")
    return found


def test_task_files_exist_and_are_of_the_right_kind(bundle_files, tmp_path):
    assert file_problems(bundle_files) == []
    # the check itself catches a missing notebook and a notebook run as a script
    (tmp_path / "nb.py").write_text(f"{NOTEBOOK_HEADER}\nprint(1)\n")
    fake = {tmp_path / "x.yml": {"resources": {"jobs": {"j": {"tasks": [
        {"task_key": "a", "notebook_task": {"notebook_path": "missing.py"}},
        {"task_key": "b", "spark_python_task": {"python_file": "nb.py"}},
        {"task_key": "c", "notebook_task": {"notebook_path": "nb.py"}},
    ]}}}}}
    assert file_problems(fake) == ["j.a: missing.py does not exist", "j.b: nb.py is a notebook"]


# --------------------------------------------------------------------------- the wheel


@pytest.fixture(scope="module")
def built_wheel(bundle, tmp_path_factory) -> Path:
    """The wheel, built with the bundle's own artifact command."""
    (artifact,) = bundle["artifacts"].values()
    command = shlex.split(artifact["build"])
    assert command[:3] == ["uv", "build", "--wheel"]
    uv = shutil.which("uv") or str(REPO / ".tools" / "bin" / "uv")
    if not Path(uv).exists():
        pytest.fail("uv not found on PATH or at .tools/bin/uv: run `make setup`")
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([uv, *command[1:], "--out-dir", str(out)], cwd=REPO / artifact["path"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


def wheel_entry_points(wheel: Path) -> tuple[str, dict[str, str]]:
    """The wheel's distribution name and its console scripts."""
    with zipfile.ZipFile(wheel) as archive:
        info = next(n.split("/")[0] for n in archive.namelist() if ".dist-info/" in n)
        metadata = archive.read(f"{info}/METADATA").decode()
        parser = configparser.ConfigParser()
        parser.read_string(archive.read(f"{info}/entry_points.txt").decode())
    name = re.search(r"^Name: (.+)$", metadata, re.M).group(1).strip()
    return name, dict(parser["console_scripts"])


def test_wheel_tasks_call_entry_points_of_the_built_wheel(bundle, built_wheel):
    import importlib

    name, scripts = wheel_entry_points(built_wheel)
    assert ENTRY_POINT in scripts and name == PACKAGE_NAME  # what `raybricks submit` runs
    wheel_tasks = [t["python_wheel_task"] for _, t in tasks_of(bundle) if "python_wheel_task" in t]
    # training, scoring, forecasting (2), monitoring (2); each again on serverless
    assert len(wheel_tasks) == 12
    for task in wheel_tasks:
        assert task["package_name"] == name
        assert task["entry_point"] in scripts
        module, _, function = scripts[task["entry_point"]].partition(":")
        assert callable(getattr(importlib.import_module(module), function))


def test_wheel_leaves_spark_to_the_runtime_and_carries_the_demo_job(built_wheel):
    with zipfile.ZipFile(built_wheel) as archive:
        info = next(n.split("/")[0] for n in archive.namelist() if ".dist-info/" in n)
        metadata = archive.read(f"{info}/METADATA").decode()
        names = archive.namelist()
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    spark = [r for r in requires if r.startswith("pyspark")]
    assert spark and all("extra ==" in r for r in spark)  # never installed unasked
    assert "raybricks/route_delay.yml" in names  # `raybricks demo` from the wheel
    assert "raybricks/route_flights_forecast.yml" in names  # and `demo --forecast`


def local_wheels(source: Path, document: dict) -> Iterator[str]:
    """The wheel paths of a bundle file: task libraries and serverless environments'
    dependencies that are local wheels (the CLI uploads both and rewrites the path)."""
    for _, task in tasks_of(document):
        yield from (library["whl"] for library in task.get("libraries", []) if "whl" in library)
    for job in jobs_of(document).values():
        for environment in job.get("environments", []):
            yield from (d for d in environment["spec"].get("dependencies", [])
                        if d.endswith(".whl") and not d.startswith("/"))


def test_wheel_libraries_point_at_the_built_wheel(bundle_files, built_wheel):
    (artifact,) = bundle_files[REPO / "databricks.yml"]["artifacts"].values()
    assert artifact["type"] == "whl"
    dist = (REPO / artifact["path"] / "dist").resolve()  # where `uv build` writes
    count = 0
    for source, document in bundle_files.items():
        for wheel in local_wheels(source, document):
            pattern = (source.parent / wheel).resolve()
            assert pattern.parent == dist, wheel
            assert fnmatch.fnmatch(built_wheel.name, pattern.name), wheel
            count += 1
    assert count == 6 + 4  # cluster task libraries; serverless environments


# --------------------------------------------------------------------------- what the jobs run


def resolve(text: str, bundle: dict) -> str:
    """Substitute bundle references as a dev deployment would (files synced to the root)."""
    values = {f"var.{k}": str(v["default"]) for k, v in bundle["variables"].items()}
    values.update({"workspace.file_path": str(REPO), "bundle.target": "dev",
                   "bundle.name": bundle["bundle"]["name"]})
    return REFERENCE.sub(lambda m: values[f"{m.group(1)}.{m.group(2)}"], text)


def test_job_parameters_parse_with_the_cli_and_the_training_config_validates(bundle):
    commands = {}
    for job, task in tasks_of(bundle):
        if "python_wheel_task" in task and job in ("training", "scoring"):
            params = [resolve(p, bundle) for p in task["python_wheel_task"]["parameters"]]
            args = build_parser().parse_args(params)
            commands[args.verb] = args
    train, score = commands["train"], commands["score"]
    config = JobConfig.load(train.config, train.set)
    model = bundle["variables"]["model_name"]["default"]
    assert config.registry.name.endswith(f".{model}")
    assert config.data.staging_dir.startswith("/Volumes/")
    assert config.training.output_dir.startswith("/Volumes/")
    assert score.model == f"models:/{config.registry.name}@champion"
    assert score.input and score.output


def test_forecasting_job_trains_a_forecast_config_then_forecasts_with_its_champion(bundle):
    import tomllib

    tasks = {t["task_key"]: t for t in bundle["resources"]["jobs"]["forecasting"]["tasks"]}
    train, forecast = (build_parser().parse_args(
        [resolve(p, bundle) for p in tasks[key]["python_wheel_task"]["parameters"]])
        for key in ("train", "forecast"))
    config = JobConfig.load(train.config, train.set)
    assert config.task == "forecast"
    assert config.registry.name.endswith(
        "." + bundle["variables"]["forecast_model_name"]["default"])
    assert forecast.verb == "forecast" and forecast.output
    assert forecast.model == f"models:/{config.registry.name}@champion"
    assert tasks["forecast"]["depends_on"] == [{"task_key": "train"}]
    # both tasks install the forecast extra's requirements, exactly
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["forecast"]
    for task in tasks.values():
        assert [lib["pypi"]["package"] for lib in task["libraries"] if "pypi" in lib] == extra


def test_monitoring_job_monitors_the_champion_then_retrains_what_it_found(bundle):
    """monitor -> retrain: the retrain reads the monitor's output table, trains the
    degraded and new segments of the training job's config, registers into the same
    model (promote replace: the merge becomes the champion), on a schedule."""
    job = bundle["resources"]["jobs"]["monitoring"]
    tasks = {t["task_key"]: t for t in job["tasks"]}
    monitor, retrain = (build_parser().parse_args(
        [resolve(p, bundle) for p in tasks[key]["python_wheel_task"]["parameters"]])
        for key in ("monitor", "retrain"))
    assert tasks["retrain"]["depends_on"] == [{"task_key": "monitor"}]
    assert monitor.verb == "monitor" and retrain.verb == "train"
    assert retrain.segments_from_monitor == monitor.output
    assert retrain.statuses == "degraded,new" and monitor.period in PERIODS
    config = JobConfig.load(retrain.config, cli_overrides(retrain))
    assert config.source.segments == monitor.output
    assert config.source.statuses == ["degraded", "new"]
    assert config.registry.promote == "replace" and config.global_model == "keep"
    assert monitor.model == f"models:/{config.registry.name}@champion"
    training = {t["task_key"]: t for t in bundle["resources"]["jobs"]["training"]["tasks"]}
    assert retrain.config == resolve(
        training["train"]["python_wheel_task"]["parameters"][2], bundle)
    assert job["schedule"]["quartz_cron_expression"]


@pytest.mark.parametrize("job", ["training", "forecasting", "monitoring"])
def test_training_cluster_runs_ray_on_spark_like_submit(bundle, job):
    training = bundle["resources"]["jobs"][job]
    (cluster,) = [c["new_cluster"] for c in training["job_clusters"]]
    version = resolve(cluster["spark_version"], bundle)
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)\.x-", version).groups())
    assert "-ml-" in version and (major, minor) >= (15, 4)  # Ray on Spark + chunk API
    assert cluster["data_security_mode"] == "SINGLE_USER"
    assert set(cluster["autoscale"]) == {"min_workers", "max_workers"}
    assert cluster["spark_conf"] == RAY_SPARK_CONF  # the same as `raybricks submit`
    assert cluster.get("spark_env_vars", {}) == RAY_SPARK_ENV
    for name, job in jobs_of(bundle).items():
        assert job["timeout_seconds"] > 0, name
        assert job["email_notifications"]["on_failure"], name


# --------------------------------------------------------------------------- serverless

#: What puts a task on a cluster (or gives it cluster libraries, which serverless refuses).
CLUSTER_KEYS = ("existing_cluster_id", "job_cluster_key", "libraries", "new_cluster")


def serverless_problems(name: str, job: dict) -> list[str]:
    """What keeps a job off serverless jobs compute, or raybricks out of its environment:
    a cluster anywhere, a task without an environment of its job (wheel tasks need one),
    an environment without a version (``client`` is the deprecated name) or without the
    wheel as its first dependency, an environment no task uses."""
    found = [f"{name}: job_clusters"] if "job_clusters" in job else []
    keys = [e["environment_key"] for e in job.get("environments", [])]
    if len(set(keys)) != len(keys):
        found.append(f"{name}: an environment_key twice")
    for environment in job.get("environments", []):
        spec, where = environment.get("spec", {}), f"{name}.{environment['environment_key']}"
        if "environment_version" not in spec:
            found.append(f"{where}: no environment_version")
        if not spec.get("dependencies", [""])[0].endswith(".whl"):
            found.append(f"{where}: the wheel is not its first dependency")
    used = set()
    for task in job.get("tasks", []):
        where = f"{name}.{task['task_key']}"
        found += [f"{where}: {key}" for key in CLUSTER_KEYS if key in task]
        if task.get("environment_key") not in keys:
            found.append(f"{where}: no environment_key of the job")
        used.add(task.get("environment_key"))
    return found + [f"{name}.{key}: no task uses it" for key in keys if key not in used]


def test_serverless_jobs_have_no_cluster_and_every_task_an_environment(bundle_files):
    jobs = serverless_jobs(bundle_files)
    assert {classic_twin(name) for name in jobs} == {
        "training", "scoring", "forecasting", "monitoring"}
    for name, job in jobs.items():
        assert serverless_problems(name, job) == []
    # the check itself catches each way a job falls back onto a cluster or no environment
    job = copy.deepcopy(jobs["forecasting_serverless"])
    job["job_clusters"] = [{"job_cluster_key": "c", "new_cluster": {"num_workers": 1}}]
    train, forecast = job["tasks"]
    train["job_cluster_key"] = "c"
    train["libraries"] = [{"whl": "../dist/*.whl"}]
    del forecast["environment_key"]
    spec = job["environments"][0]["spec"]
    spec["client"] = spec.pop("environment_version")
    spec["dependencies"] = spec["dependencies"][1:]
    assert serverless_problems("j", job) == [
        "j: job_clusters",
        "j.raybricks_forecast: no environment_version",
        "j.raybricks_forecast: the wheel is not its first dependency",
        "j.train: job_cluster_key", "j.train: libraries",
        "j.forecast: no environment_key of the job"]
    del train["environment_key"]
    assert serverless_problems("j", {"tasks": [train], "environments": job["environments"]})[-2:] \
        == ["j.train: no environment_key of the job", "j.raybricks_forecast: no task uses it"]


def test_serverless_tasks_run_what_their_cluster_twins_run_training_on_spark(
        bundle, bundle_files):
    """Each serverless task runs its cluster twin's command (same job name without
    ``_serverless``, same task key and order); a training one adds ``--executor spark``,
    and its config, as the CLI loads it, trains on the Spark executor with staging and
    run directories in the bundle's volume."""
    volume = resolve("/Volumes/${var.catalog}/${var.schema}/${var.volume}/", bundle)
    trained = 0
    for name, job in serverless_jobs(bundle_files).items():
        twin = bundle["resources"]["jobs"][classic_twin(name)]
        assert [t["task_key"] for t in job["tasks"]] == [t["task_key"] for t in twin["tasks"]]
        for key in ("timeout_seconds", "max_concurrent_runs", "email_notifications"):
            assert job[key] == twin[key], (name, key)
        for task, classic in zip(job["tasks"], twin["tasks"], strict=True):
            assert task.get("depends_on") == classic.get("depends_on")
            params = task["python_wheel_task"]["parameters"]
            expected = classic["python_wheel_task"]["parameters"]
            if params[0] != "train":
                assert params == expected, (name, task["task_key"])
                continue
            at = params.index("--executor")
            assert params[at + 1] == "spark" and params[:at] + params[at + 2:] == expected
            args = build_parser().parse_args([resolve(p, bundle) for p in params])
            config = JobConfig.load(args.config, cli_overrides(args))
            assert config.training.executor == "spark", name
            assert config.training.output_dir.startswith(volume), name
            assert config.data.staging_dir.startswith(volume), name
            trained += 1
    assert trained == 3  # training, forecasting's train, monitoring's retrain


def test_serverless_environments_install_the_wheel_and_the_extras_their_configs_need(
        bundle, bundle_files):
    """Every environment: the version `raybricks submit --serverless` uses, a Python that
    raybricks supports, the wheel, then exactly the requirements of the extras its
    training configs need (as submit works them out), in pyproject.toml's words."""
    import tomllib

    from packaging.specifiers import SpecifierSet

    from raybricks.submit import extras_for

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    version = resolve("${var.serverless_environment_version}", bundle)
    assert version == DEFAULT_ENVIRONMENT_VERSION
    python = ".".join(map(str, SERVERLESS_PYTHON[version]))
    assert python in SpecifierSet(project["requires-python"]), python
    needed = {}
    for name, job in serverless_jobs(bundle_files).items():
        for task in job["tasks"]:
            params = [resolve(p, bundle) for p in task["python_wheel_task"]["parameters"]]
            extras = needed.setdefault((name, task["environment_key"]), [])
            if params[0] == "train":
                args = build_parser().parse_args(params)
                config = JobConfig.load(args.config, cli_overrides(args))
                extras += [e for e in extras_for(config) if e not in extras]
        for environment in job["environments"]:
            spec = environment["spec"]
            assert spec["environment_version"] == "${var.serverless_environment_version}"
            wheel, *rest = spec["dependencies"]
            assert wheel == "../dist/*.whl"
            wanted = [r for extra in needed[name, environment["environment_key"]]
                      for r in project["optional-dependencies"][extra]]
            assert rest == wanted, name
    assert needed["forecasting_serverless", "raybricks_forecast"] == ["forecast"]


def test_one_monitoring_schedule_runs_the_serverless_one_paused(bundle):
    jobs = bundle["resources"]["jobs"]
    schedules = {name: jobs[name]["schedule"] for name in ("monitoring", "monitoring_serverless")}
    assert schedules["monitoring_serverless"] == {**schedules["monitoring"],
                                                  "pause_status": "PAUSED"}
    assert schedules["monitoring"]["pause_status"] == "UNPAUSED"


# --------------------------------------------------------------------------- job configs


def test_every_job_config_loads_and_the_task_types_are_covered(capsys):
    from raybricks.cli import main

    tasks = {}
    for path in sorted((REPO / "jobs").glob("*.yml")):
        config = JobConfig.load(path)
        tasks.setdefault(config.task, []).append(path.name)
        # as a bundle's CI would check it: the config and its estimators, no source
        assert main(["validate", "--config", str(path), "--no-source"]) == 0, path
        assert "config valid" in capsys.readouterr().out
    assert set(tasks) == {"regression", "binary", "multiclass", "forecast"}, tasks


#: Timestamps Spark reads (pandas writes nanoseconds by default).
MICROSECONDS = {"coerce_timestamps": "us", "allow_truncated_timestamps": True}


def test_the_monitoring_loop_with_the_demo_config_keeps_every_untouched_answer(
        ray_on_spark, spark, bundle, tmp_path):
    """The bundle's monitor and retrain tasks, their parameters as deployed (only the
    paths made local), on the demo job's config (jobs/route_delay.yml: three candidates,
    ``fallback: global``, the default shrink) over ten public routes: the routes whose
    October delays moved are retrained, and every other route answers November's
    flights exactly as the champion did."""
    import mlflow
    import numpy as np

    from raybricks import cli, pipeline
    from raybricks.flights_demo import flights_with_weather

    flights = flights_with_weather()
    flights["route"] = flights.origin + "-" + flights.dest
    counts = flights.route.value_counts()
    routes = sorted(counts[(counts > 1200) & (counts < 2500)].index)[:10]
    flights = flights[flights.route.isin(routes)].drop(columns="route")
    moved = flights.origin + "-" + flights.dest == routes[0]
    flights.loc[moved & (flights.month == 10), "arr_delay"] += 90  # a new regime
    flights[flights.month <= 9].to_parquet(tmp_path / "until-september.parquet", **MICROSECONDS)
    flights[flights.month <= 10].to_parquet(tmp_path / "until-october.parquet", **MICROSECONDS)
    flights[flights.month == 10].to_parquet(tmp_path / "october.parquet", **MICROSECONDS)
    demo = yaml.safe_load((REPO / "jobs" / "route_delay.yml").read_text())
    tasks = {t["task_key"]: t for t in bundle["resources"]["jobs"]["monitoring"]["tasks"]}
    params = {key: [resolve(p, bundle) for p in tasks[key]["python_wheel_task"]["parameters"]]
              for key in ("monitor", "retrain")}
    model = params["monitor"][params["monitor"].index("--model") + 1]
    name = model.removeprefix("models:/").split("@")[0]

    def config_file(source: str) -> str:
        path = tmp_path / "route_delay.yml"
        path.write_text(yaml.safe_dump(demo | {
            "source": {"path": str(tmp_path / source), "where": "month <= 10"},
            "registry": demo["registry"] | {"name": name},
            "training": {"output_dir": str(tmp_path / "runs"), "progress": False}}))
        return str(path)

    champion = pipeline.train(JobConfig.load(config_file("until-september.parquet")),
                              spark).publication

    def local(argv: list[str], values: dict[str, str]) -> list[str]:
        return [values.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]

    assert cli.main(local(params["monitor"], {
        "--outcomes": str(tmp_path / "october.parquet"),
        "--output": str(tmp_path / "monitoring")})) == 0
    health = pd.read_parquet(tmp_path / "monitoring_global")  # the global model's rows
    assert health.global_model.nunique() == 1 and health.segments_alone.notna().all()
    assert cli.main([*local(params["retrain"], {
        "--config": config_file("until-october.parquet"),
        "--segments-from-monitor": str(tmp_path / "monitoring")}),
        "--set", f"data.staging_dir={tmp_path / 'staging'}",
        "--set", f"training.output_dir={tmp_path / 'runs'}"]) == 0
    merged = mlflow.MlflowClient().get_model_version_by_alias(name, "champion")
    assert merged.version != champion.version
    index = pd.read_parquet(Path(mlflow.artifacts.download_artifacts(
        f"models:/{name}/{merged.version}", dst_path=str(tmp_path / "merged")))
        / "artifacts" / "segments" / "index.parquet")
    index["route"] = index.origin + "-" + index.dest
    retrained = set(index.route[index.source != f"version {champion.version}"])
    assert routes[0] in retrained and len(retrained) < len(routes)
    assert index.chosen.fillna("global").str.contains("global").mean() >= 0.5  # shared
    november = flights[flights.month == 11]
    untouched = ~(november.origin + "-" + november.dest).isin(retrained).to_numpy()
    before, after = (np.asarray(mlflow.pyfunc.load_model(f"models:/{name}/{v}").predict(
        november), dtype=float) for v in (champion.version, merged.version))
    assert untouched.sum() > 500
    np.testing.assert_array_equal(after[untouched], before[untouched])
