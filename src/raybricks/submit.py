"""``raybricks submit``: a one-time run of the training entry point on a workspace.

The job config is validated here first. Then it (and a local wheel) is uploaded to a
workspace folder, ``jobs.submit`` starts a one-time run of ``raybricks train`` as a
``python_wheel_task`` on an existing cluster, a new job cluster, or serverless jobs
compute (``--serverless``: an environment instead of a cluster, the Spark executor, the
run directory in a Unity Catalog volume), and the run is followed to its end: the run
URL, a state line while it runs, and the result. Exit 0 on success, 1 with the run's
error otherwise (2 for problems found before submitting).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from raybricks import kinds
from raybricks.config import JobConfig
from raybricks.databricks import (
    CHUNK_API_CONF,
    TIMEOUT_ENV,
    api_errors,
    ensure_volume,
    volume_path,
    workspace_client,
)
from raybricks.errors import ConfigError

if TYPE_CHECKING:
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.service import compute, jobs

#: The wheel's package and its console script (``[project.scripts]`` in pyproject.toml).
PACKAGE_NAME = "raybricks"
ENTRY_POINT = "raybricks"
#: A Databricks Runtime ML version with Ray on Spark and the Spark -> Ray chunk API.
DEFAULT_SPARK_VERSION = "16.4.x-cpu-ml-scala2.12"
#: Spark conf and environment of a training cluster (bundles/training.job.yml sets the same).
RAY_SPARK_CONF = {CHUNK_API_CONF: "true", "spark.task.cpus": "1"}
#: (none: raybricks turns Ray's token authentication on where the cluster's Ray has it
#: and off, saying so, where not: see docs/cluster.md)
RAY_SPARK_ENV: dict[str, str] = {}
DEFAULT_RUN_TIMEOUT_S = 4 * 3600
#: Serverless jobs compute: the environment version a run gets unless told (its Python
#: is 3.12, and its Databricks Connect is Spark 4's client: Databricks' release notes).
DEFAULT_ENVIRONMENT_VERSION = "4"
#: The Python of each serverless environment version (Databricks' release notes);
#: raybricks needs 3.11 or later. Versions not listed are newer ones, taken as they are.
SERVERLESS_PYTHON = {"1": (3, 10), "2": (3, 11), "3": (3, 12), "4": (3, 12)}
#: The key of the run's one environment (bundles/serverless.job.yml uses the same).
ENVIRONMENT_KEY = "raybricks"
REMOTE_WHEEL_PREFIXES = ("/Workspace/", "/Volumes/", "dbfs:/", "s3://", "abfss://", "gs://")
FINAL_STATES = {"TERMINATED", "SKIPPED", "INTERNAL_ERROR"}


def worker_range(text: str) -> tuple[int, int]:
    """``"2"`` -> (2, 2) (fixed size); ``"1-4"`` -> (1, 4) (autoscaling)."""
    try:
        low, _, high = text.partition("-")
        bounds = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give N or MIN-MAX, e.g. 2 or 1-4") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: need 1 <= MIN <= MAX (Ray needs workers)")
    return bounds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="job config YAML (validated locally first)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, passed on to `raybricks train`")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--cluster-id", help="run on this existing cluster (needs a DBR ML runtime)")
    where.add_argument("--new-cluster", action="store_true",
                       help="run on a new job cluster (the default without --cluster-id)")
    where.add_argument("--serverless", action="store_true",
                       help="run on serverless jobs compute: Spark Connect, training on the "
                       "Spark executor (no Ray), the run directory in --staging-volume")
    parser.add_argument("--node-type", help="node type of a new cluster, e.g. i3.xlarge (AWS), "
                        "Standard_D4ds_v5 (Azure), n2-standard-4 (GCP)")
    parser.add_argument("--workers", type=worker_range, metavar="N|MIN-MAX",
                        help="workers of a new cluster: N, or MIN-MAX to autoscale (default 2)")
    parser.add_argument("--spark-version", default=DEFAULT_SPARK_VERSION,
                        help=f"runtime of a new cluster (default {DEFAULT_SPARK_VERSION})")
    parser.add_argument("--environment-version", metavar="N",
                        help="serverless environment version of a --serverless run "
                        f"(default {DEFAULT_ENVIRONMENT_VERSION})")
    parser.add_argument("--dependency", action="append", default=[], metavar="REQUIREMENT",
                        help="a pip requirement the --serverless environment installs beside "
                        "the wheel (the extras the config needs are added by themselves)")
    parser.add_argument("--wheel", help="a local raybricks .whl to upload, or a /Workspace, "
                        "/Volumes or dbfs:/ path of one (default: the newest dist/*.whl)")
    parser.add_argument("--workspace-dir", help="workspace folder for the uploads (default "
                        "/Workspace/Users/<you>/.raybricks/submit)")
    parser.add_argument("--staging-volume", metavar="CATALOG.SCHEMA.VOLUME",
                        help="create this UC volume if missing and stage data and runs in it")
    parser.add_argument("--run-name", help="name of the run (default from the config file)")
    parser.add_argument("--profile", help="profile of ~/.databrickscfg to authenticate with")
    parser.add_argument("--timeout", type=float, help="seconds per API call, retries included "
                        f"(default ${TIMEOUT_ENV} or 30)")
    parser.add_argument("--run-timeout", type=int, default=DEFAULT_RUN_TIMEOUT_S,
                        help=f"seconds the run may take, 0 for no limit "
                        f"(default {DEFAULT_RUN_TIMEOUT_S})")
    parser.add_argument("--poll-interval", type=float, default=10.0,
                        help="seconds between state checks (default 10)")
    parser.add_argument("--no-wait", action="store_true",
                        help="print the run URL and return without following the run")


def run(args: argparse.Namespace) -> int:
    """Validate, upload, submit and follow; the exit code of the ``submit`` verb."""
    config = JobConfig.load(args.config, args.set)
    compute = _compute_choice(args, config)
    wheel = _local_or_remote_wheel(args.wheel)
    overrides = list(args.set)
    if args.staging_volume:
        overrides = volume_overrides(config, volume_path(args.staging_volume)) + overrides
    if isinstance(compute, Serverless):
        check_serverless(args.config, overrides)
    client = workspace_client(profile=args.profile, timeout_s=args.timeout)
    if args.staging_volume:
        print(f"staging in volume {ensure_volume(client, args.staging_volume)}")
    folder = _upload_folder(client, args.workspace_dir)
    tag = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    config_path = upload(client, f"{folder}/{tag}/{Path(args.config).name}",
                         Path(args.config).read_bytes())
    wheel_path = wheel if isinstance(wheel, str) else upload(
        client, f"{folder}/{tag}/{wheel.name}", wheel.read_bytes()
    )
    print(f"uploaded {args.config} to {config_path}")
    run_name = args.run_name or f"raybricks train {Path(args.config).stem}"
    timeout_s = args.run_timeout or None
    with api_errors("submitting the run (jobs/runs/submit)", client):
        if isinstance(compute, Serverless):
            run_id = submit_serverless(
                client, serverless_run(run_name, config_path, overrides, wheel_path, compute,
                                       timeout_s=timeout_s, idempotency_token=tag))
        else:
            run_id = client.jobs.submit(
                run_name=run_name,
                tasks=[training_task(config_path, overrides, wheel_path, compute)],
                timeout_seconds=timeout_s,
                idempotency_token=tag,  # a retried submit never starts a second run
            ).run_id
    return follow(client, run_id, poll_interval=args.poll_interval, wait=not args.no_wait)


# --------------------------------------------------------------------------- the task


@dataclass(frozen=True)
class ClusterChoice:
    """An existing cluster id, or the shape of a new job cluster."""

    cluster_id: str | None = None
    spark_version: str = DEFAULT_SPARK_VERSION
    node_type: str | None = None
    workers: tuple[int, int] = (2, 2)


@dataclass(frozen=True)
class Serverless:
    """Serverless jobs compute: the environment's version and what it installs beside the
    wheel (pip requirements)."""

    environment_version: str = DEFAULT_ENVIRONMENT_VERSION
    dependencies: tuple[str, ...] = ()


def _compute_choice(args: argparse.Namespace, config: JobConfig) -> ClusterChoice | Serverless:
    if args.serverless:
        return _serverless_choice(args, config)
    if args.environment_version or args.dependency:
        raise ConfigError("--environment-version and --dependency shape a serverless "
                          "environment: add --serverless, or drop them")
    return _cluster_choice(args)


def _serverless_choice(args: argparse.Namespace, config: JobConfig) -> Serverless:
    if args.node_type or args.workers or args.spark_version != DEFAULT_SPARK_VERSION:
        raise ConfigError("--node-type, --workers and --spark-version shape a cluster; "
                          "serverless compute has none: drop them with --serverless")
    version = args.environment_version or DEFAULT_ENVIRONMENT_VERSION
    python = SERVERLESS_PYTHON.get(version)
    if not version.isdigit() or (python is not None and python < (3, 11)):
        raise ConfigError(f"--environment-version {version!r}: give a serverless "
                          "environment version whose Python is 3.11 or later (2 or later; "
                          f"default {DEFAULT_ENVIRONMENT_VERSION})")
    return Serverless(environment_version=version,
                      dependencies=(*extra_requirements(extras_for(config)), *args.dependency))


def _cluster_choice(args: argparse.Namespace) -> ClusterChoice:
    if args.cluster_id:
        if args.node_type or args.workers:
            raise ConfigError("--node-type and --workers shape a new cluster: drop them with "
                              "--cluster-id, or use --new-cluster")
        return ClusterChoice(cluster_id=args.cluster_id)
    if not args.node_type:
        raise ConfigError("a new cluster needs --node-type (e.g. i3.xlarge on AWS, "
                          "Standard_D4ds_v5 on Azure, n2-standard-4 on GCP), or pass "
                          "--cluster-id of an existing DBR ML cluster, or --serverless")
    return ClusterChoice(spark_version=args.spark_version, node_type=args.node_type,
                         workers=args.workers or (2, 2))


def new_cluster_spec(choice: ClusterChoice) -> compute.ClusterSpec:
    """A single-user job cluster on a DBR ML runtime, set up for Ray on Spark."""
    from databricks.sdk.service import compute

    low, high = choice.workers
    return compute.ClusterSpec(
        spark_version=choice.spark_version,
        node_type_id=choice.node_type,
        data_security_mode=compute.DataSecurityMode.SINGLE_USER,
        spark_conf=dict(RAY_SPARK_CONF),
        spark_env_vars=dict(RAY_SPARK_ENV) or None,
        num_workers=low if low == high else None,
        autoscale=compute.AutoScale(min_workers=low, max_workers=high) if low < high else None,
    )


def training_task(
    config_path: str, overrides: list[str], wheel_path: str, cluster: ClusterChoice
) -> jobs.SubmitTask:
    """The ``raybricks train --config ... --set ...`` wheel task of the run."""
    from databricks.sdk.service import compute, jobs

    parameters = ["train", "--config", config_path]
    for item in overrides:
        parameters += ["--set", item]
    return jobs.SubmitTask(
        task_key="train",
        python_wheel_task=jobs.PythonWheelTask(
            package_name=PACKAGE_NAME, entry_point=ENTRY_POINT, parameters=parameters
        ),
        libraries=[compute.Library(whl=wheel_path)],
        existing_cluster_id=cluster.cluster_id,
        new_cluster=None if cluster.cluster_id else new_cluster_spec(cluster),
    )


# --------------------------------------------------------------------------- serverless


def extras_for(config: JobConfig) -> list[str]:
    """The wheel's extras the config needs: forecast (task forecast), hierarchy
    (forecast.hierarchy), bayes (a candidate's search_method bayes), catboost, prophet."""
    extras = set()
    if config.task == "forecast":
        extras.add("forecast")
    if config.forecast is not None and config.forecast.hierarchy is not None:
        extras.add("hierarchy")
    for candidate in config.models:
        kind = kinds.resolve(candidate.kind)
        kind = getattr(kind, "regressor", kind)  # lags:<kind>: the table kind's library
        if kind.extra:  # serverless environments lack these libraries
            extras.add(kind.extra)
        if candidate.search_method == "bayes":
            extras.add("bayes")
    return sorted(extras)


def extra_requirements(extras: list[str]) -> list[str]:
    """The pip requirements of the wheel's ``extras``, as the installed raybricks declares
    them (its metadata: the same pyproject.toml the wheel is built from)."""
    if not extras:
        return []
    from importlib.metadata import PackageNotFoundError, requires

    try:
        declared = requires(PACKAGE_NAME) or []
    except PackageNotFoundError:
        raise ConfigError(f"the job config needs the extras {extras}, but raybricks' own "
                          "metadata is not installed here to say what they require: pass "
                          "each requirement with --dependency") from None
    found = []
    for line in declared:
        requirement, _, marker = line.partition(";")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if extra and extra.group(1) in extras and requirement.strip() not in found:
            found.append(requirement.strip())
    return found


def check_serverless(config_file: str, overrides: list[str]) -> JobConfig:
    """The config as the serverless run trains it (overrides, then the Spark executor):
    its run directory must be a Unity Catalog volume, and it must not ask for Ray."""
    asked = JobConfig.load(config_file, overrides)
    if asked.training.executor == "ray":
        raise ConfigError("training.executor=ray: Ray on Spark cannot start on serverless "
                          "compute (Spark Connect, no SparkContext); --serverless trains on "
                          "the Spark executor: drop training.executor=ray, or run on a "
                          "cluster (--cluster-id or --new-cluster)")
    config = JobConfig.load(config_file, [*overrides, "training.executor=spark"])
    if not config.training.output_dir.startswith("/Volumes/"):
        raise ConfigError(
            f"training.output_dir={config.training.output_dir!r} is not in a Unity Catalog "
            "volume, and serverless compute has no driver disk that outlives the run: give "
            "--staging-volume CATALOG.SCHEMA.VOLUME (its runs/ folder, unless the config "
            "sets training.output_dir itself) or --set "
            "training.output_dir=/Volumes/<catalog>/<schema>/<volume>/runs")
    return config


def serverless_run(
    run_name: str, config_path: str, overrides: list[str], wheel_path: str,
    compute: Serverless, *, timeout_s: int | None = None, idempotency_token: str | None = None,
) -> dict:
    """The ``jobs/runs/submit`` request of a serverless run: one environment (the wheel,
    then the extras' and the user's requirements) and one wheel task using it, which runs
    ``raybricks train ... --executor spark``; no cluster anywhere."""
    parameters = ["train", "--config", config_path, "--executor", "spark"]
    for item in overrides:
        parameters += ["--set", item]
    body = {
        "run_name": run_name,
        "environments": [{
            "environment_key": ENVIRONMENT_KEY,
            "spec": {"environment_version": compute.environment_version,
                     "dependencies": [wheel_path, *compute.dependencies]},
        }],
        "tasks": [{
            "task_key": "train",
            "environment_key": ENVIRONMENT_KEY,
            "python_wheel_task": {"package_name": PACKAGE_NAME, "entry_point": ENTRY_POINT,
                                  "parameters": parameters},
        }],
    }
    if timeout_s:
        body["timeout_seconds"] = timeout_s
    if idempotency_token:
        body["idempotency_token"] = idempotency_token  # a retried submit starts no second run
    return body


def submit_serverless(client: WorkspaceClient, body: dict) -> int:
    """POST the request to ``jobs/runs/submit``; the run id. Plain JSON through the SDK's
    API client (retries and errors as every call), so that SDK releases without the
    ``environments`` field (databricks-sdk 0.20 of DBR 15.4) submit it too."""
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    workspace_id = getattr(client.config, "workspace_id", None)
    if workspace_id:
        headers["X-Databricks-Workspace-Id"] = str(workspace_id)
    answer = client.api_client.do("POST", "/api/2.2/jobs/runs/submit", body=body,
                                  headers=headers)
    return int(answer["run_id"])


def volume_overrides(config: JobConfig, root: str) -> list[str]:
    """Stage data and keep runs in the volume, unless the config chose places itself."""
    overrides = []
    if "staging_dir" not in config.data.model_fields_set:
        overrides.append(f"data.staging_dir={root}/staging")
    if "output_dir" not in config.training.model_fields_set:
        overrides.append(f"training.output_dir={root}/runs")
    return overrides


# --------------------------------------------------------------------------- uploads


def _local_or_remote_wheel(wheel: str | None) -> Path | str:
    """A remote wheel path as given, or a local wheel file (default: newest in dist/)."""
    if wheel and wheel.startswith(REMOTE_WHEEL_PREFIXES):
        return wheel
    if wheel:
        path = Path(wheel)
    else:
        built = sorted(Path("dist").glob(f"{PACKAGE_NAME}-*.whl"), key=lambda p: p.stat().st_mtime)
        if not built:
            raise ConfigError("no wheel in dist/: build it with `uv build --wheel`, or pass "
                              "--wheel (a local .whl, or a /Workspace or /Volumes path)")
        path = built[-1]
    if path.suffix != ".whl" or not path.is_file():
        raise ConfigError(f"--wheel {wheel!r} is not a .whl file: build one with "
                          "`uv build --wheel`")
    return path


def _upload_folder(client: WorkspaceClient, folder: str | None) -> str:
    """The workspace folder for uploads, as a ``/Workspace/...`` path."""
    if folder is None:
        with api_errors("finding the current user (scim/v2/Me)", client):
            user = client.current_user.me().user_name
        return f"/Workspace/Users/{user}/.raybricks/submit"
    if not folder.startswith("/"):
        raise ConfigError(f"--workspace-dir {folder!r} must be an absolute workspace path, "
                          "e.g. /Workspace/Users/you@example.com/raybricks")
    return "/Workspace" + folder.removeprefix("/Workspace").rstrip("/")


def upload(client: WorkspaceClient, path: str, content: bytes) -> str:
    """Write a workspace file (its folder created first); return its ``/Workspace`` path."""
    from databricks.sdk.service.workspace import ImportFormat

    api_path = path.removeprefix("/Workspace")
    with api_errors(f"uploading {path}", client):
        client.workspace.mkdirs(api_path.rsplit("/", 1)[0])
        client.workspace.upload(api_path, content, format=ImportFormat.AUTO, overwrite=True)
    return "/Workspace" + api_path


# --------------------------------------------------------------------------- following


class StateLine:
    """The run's state: rewritten in place on a terminal, one line per change otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.last: str | None = None

    def show(self, state: str, elapsed_s: float) -> None:
        if self.tty:
            self.out.write(f"\r  {state:<70} {elapsed_s:6.0f}s")
            self.out.flush()
        elif state != self.last:
            print(f"  {elapsed_s:6.0f}s  {state}", file=self.out, flush=True)
        self.last = state

    def close(self) -> None:
        if self.tty and self.last is not None:
            self.out.write("\n")


def follow(
    client: WorkspaceClient, run_id: int, *, poll_interval: float = 10.0, wait: bool = True
) -> int:
    """Print the run URL, then its state until it ends; 0 on success, else 1 with the error."""
    started = time.monotonic()
    line = StateLine(sys.stdout)
    url = None
    try:
        while True:
            with api_errors(f"reading run {run_id} (jobs/runs/get)", client):
                current = client.jobs.get_run(run_id)
            if url is None:
                url = current.run_page_url or f"run {run_id}"
                print(f"run {run_id}: {url}", flush=True)
                if not wait:
                    return 0
            state = current.state
            life = state.life_cycle_state.value if state and state.life_cycle_state else "UNKNOWN"
            message = f" - {state.state_message}" if state and state.state_message else ""
            line.show(f"{life}{message}", time.monotonic() - started)
            if life in FINAL_STATES:
                break
            time.sleep(poll_interval)
    except KeyboardInterrupt:
        line.close()
        print(f"stopped following; run {run_id} goes on: {url} (cancel it there or with "
              f"`databricks jobs cancel-run {run_id}`)", file=sys.stderr)
        return 130
    line.close()
    result = state.result_state.value if state and state.result_state else life
    took = f"{time.monotonic() - started:.0f} s"
    if result == "SUCCESS":
        print(f"run {run_id} SUCCESS after {took}: {url}")
        return 0
    print(f"run {run_id} {result} after {took}: {run_error(client, current)}\n{url}",
          file=sys.stderr)
    return 1


def run_error(client: WorkspaceClient, run: jobs.Run) -> str:
    """The error of the run's failed task (``get_run_output``), else the state message."""
    messages = []
    for task in run.tasks or []:
        result = task.state.result_state.value if task.state and task.state.result_state else None
        if result == "SUCCESS" or task.run_id is None:
            continue
        with api_errors(f"reading the output of task {task.task_key} (jobs/runs/get-output)",
                        client):
            output = client.jobs.get_run_output(task.run_id)
        text = output.error or ""
        if output.error_trace:
            tail = "\n".join(output.error_trace.strip().splitlines()[-10:])
            text = f"{text}\n{tail}" if text else tail
        if text:
            messages.append(f"task {task.task_key}: {text}")
    if messages:
        return "\n".join(messages)
    state = run.state
    return (state.state_message if state and state.state_message else None) or "no error given"
