"""raybricks.databricks and `raybricks submit`: the real databricks-sdk over real HTTP.

A small Databricks REST server runs in a thread on 127.0.0.1 (port 0) and answers the
endpoints raybricks calls from scripted replies, errors included (401, 404, 429 with
Retry-After, 500). No Spark, no Ray.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from raybricks import cli
from raybricks.cluster import capacity_from_cluster_spec, ray_on_spark_arguments
from raybricks.config import ClusterConfig
from raybricks.databricks import (
    CLUSTER_ID_CONF,
    TIMEOUT_ENV,
    ClusterSizing,
    cleanup_staging,
    cluster_sizing,
    ensure_volume,
    spark_cluster_sizing,
    workspace_client,
)
from raybricks.errors import ConfigError, SetupError, WorkspaceError
from raybricks.submit import (
    DEFAULT_ENVIRONMENT_VERSION,
    ENTRY_POINT,
    PACKAGE_NAME,
    RAY_SPARK_CONF,
)

REPO = Path(__file__).parents[1]
TOKEN = "dapi-test-token"
USER = "ada@example.com"


@dataclass
class Request:
    method: str
    path: str
    query: dict
    body: bytes
    headers: dict

    def json(self) -> dict:
        return json.loads(self.body)


def endpoint(path: str) -> str:
    """A REST path without its API version: ``/api/2.1/jobs/get`` -> ``/api/jobs/get``."""
    return re.sub(r"^/api/\d+\.\d+/", "/api/", path)


@dataclass
class FakeWorkspace:
    """Routes ``(method, path)`` to scripted replies ``(status, body[, headers])``.

    Replies are used in order; the last one repeats. A reply may be a function of the
    request. Every request is recorded; a wrong bearer token gets 401. As the workspace
    does, an endpoint answers under each API version (SDK releases differ: 0.20 calls
    ``/api/2.0/clusters/get``, newer ones ``/api/2.1/...``; jobs 2.1 and 2.2).
    """

    url: str = ""
    routes: dict = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on(self, method: str, path: str, *replies) -> None:
        self.routes[(method, endpoint(path))] = list(replies)

    def calls(self, method: str, path: str) -> list[Request]:
        return [r for r in self.requests
                if (r.method, endpoint(r.path)) == (method, endpoint(path))]

    def api_calls(self) -> list[Request]:
        return [r for r in self.requests if r.path.startswith("/api/")]

    def answer(self, request: Request) -> tuple:
        if request.path == "/.well-known/databricks-config":
            return 200, {"workspace_id": "1234567890"}
        with self.lock:
            self.requests.append(request)
            if request.headers.get("Authorization") != f"Bearer {TOKEN}":
                return 401, {"error_code": "UNAUTHENTICATED", "message": "Invalid access token."}
            replies = self.routes.get((request.method, endpoint(request.path)))
            if not replies:
                return 404, {"error_code": "ENDPOINT_NOT_FOUND",
                             "message": f"no route {request.method} {request.path}"}
            reply = replies.pop(0) if len(replies) > 1 else replies[0]
        return reply(request) if callable(reply) else reply


def _handler(fake: FakeWorkspace) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            request = Request(self.command, parts.path, parse_qs(parts.query),
                              self.rfile.read(length), dict(self.headers))
            status, body, *rest = fake.answer(request)
            data = json.dumps(body).encode()
            self.send_response(status)
            for key, value in (rest[0] if rest else {}).items():
                self.send_header(key, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

        def log_message(self, *args) -> None:
            pass

    return Handler


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No Databricks settings from the machine: no variables, no ~/.databrickscfg."""
    for name in list(os.environ):
        if name.startswith(("DATABRICKS_", "ARM_", "GOOGLE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "absent.databrickscfg"))
    monkeypatch.setenv(TIMEOUT_ENV, "10")


@pytest.fixture
def workspace(clean_env, monkeypatch):
    fake = FakeWorkspace()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("DATABRICKS_HOST", fake.url)
    monkeypatch.setenv("DATABRICKS_TOKEN", TOKEN)
    yield fake
    server.shutdown()
    server.server_close()


def node_types(*types: tuple[str, float]) -> tuple:
    return 200, {"node_types": [
        {"node_type_id": name, "num_cores": cores, "memory_mb": 30500,
         "description": name, "spark_version": "", "instance_type_id": name}
        for name, cores in types
    ]}


# --------------------------------------------------------------------------- credentials


def test_missing_credentials_give_one_setup_error_naming_the_variables(clean_env):
    started = time.monotonic()
    with pytest.raises(SetupError) as caught:
        workspace_client()
    message = str(caught.value)
    for name in ("DATABRICKS_HOST", "DATABRICKS_TOKEN", "DATABRICKS_CLIENT_ID",
                 "DATABRICKS_CLIENT_SECRET", "DATABRICKS_CONFIG_PROFILE"):
        assert name in message
    assert time.monotonic() - started < 5


def test_unknown_profile_is_a_setup_error(clean_env, monkeypatch):
    monkeypatch.setenv("DATABRICKS_CONFIG_PROFILE", "nope")
    with pytest.raises(SetupError, match="DATABRICKS_CONFIG_PROFILE"):
        workspace_client()


def test_rejected_token_is_a_setup_error_and_the_token_was_sent(workspace, monkeypatch):
    workspace.on("GET", "/api/2.1/clusters/get", (200, {"cluster_id": "c1"}))
    client = workspace_client(host=workspace.url, token="dapi-wrong")
    with pytest.raises(SetupError) as caught:
        cluster_sizing(client, "c1")
    assert "401" in str(caught.value) and "DATABRICKS_TOKEN" in str(caught.value)
    assert workspace.requests[-1].headers["Authorization"] == "Bearer dapi-wrong"
    assert len(workspace.calls("GET", "/api/2.1/clusters/get")) == 1  # 401 is not retried


def test_unreachable_host_fails_within_the_timeout(clean_env):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = workspace_client(host=f"http://127.0.0.1:{port}", token=TOKEN, timeout_s=1)
    started = time.monotonic()
    with pytest.raises(WorkspaceError, match=rf"did not answer within 1 s.*{TIMEOUT_ENV}"):
        cluster_sizing(client, "c1")
    assert time.monotonic() - started < 6


def test_timeout_must_be_positive(clean_env, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(ConfigError, match=TIMEOUT_ENV):
        workspace_client(host="http://127.0.0.1:9", token=TOKEN)


# --------------------------------------------------------------------------- cluster sizing


def test_cluster_sizing_reads_the_autoscale_range_and_node_cores(workspace):
    workspace.on("GET", "/api/2.1/clusters/get", (200, {
        "cluster_id": "0101-abc", "node_type_id": "i3.xlarge", "driver_node_type_id": "i3.2xlarge",
        "autoscale": {"min_workers": 2, "max_workers": 8}, "state": "RUNNING"}))
    workspace.on("GET", "/api/2.1/clusters/list-node-types",
                 node_types(("i3.2xlarge", 8.0), ("i3.xlarge", 4.0)))
    sizing = cluster_sizing(workspace_client(), "0101-abc")
    assert sizing == ClusterSizing("0101-abc", "i3.xlarge", 4, 2, 8)
    assert sizing.autoscaling
    assert workspace.calls("GET", "/api/2.1/clusters/get")[0].query == {"cluster_id": ["0101-abc"]}


def test_throttled_call_is_retried_after_retry_after(workspace):
    workspace.on(
        "GET", "/api/2.1/clusters/get",
        (429, {"error_code": "REQUEST_LIMIT_EXCEEDED", "message": "slow down"},
         {"Retry-After": "0"}),
        (200, {"cluster_id": "c1", "node_type_id": "m5.large", "num_workers": 3}),
    )
    workspace.on("GET", "/api/2.1/clusters/list-node-types", node_types(("m5.large", 2.0)))
    sizing = cluster_sizing(workspace_client(), "c1")
    assert (sizing.min_workers, sizing.max_workers, sizing.cores_per_worker) == (3, 3, 2)
    assert not sizing.autoscaling
    assert len(workspace.calls("GET", "/api/2.1/clusters/get")) == 2


def test_server_error_is_one_workspace_error_with_its_message(workspace):
    workspace.on("GET", "/api/2.1/clusters/get",
                 (500, {"error_code": "INTERNAL_ERROR", "message": "metastore is down"}))
    with pytest.raises(WorkspaceError, match="reading cluster c1 failed.*metastore is down"):
        cluster_sizing(workspace_client(), "c1")


def test_missing_cluster_and_unknown_node_type(workspace):
    workspace.on("GET", "/api/2.1/clusters/get", (
        400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "Cluster c9 does not exist"}),
        (200, {"cluster_id": "c1", "node_type_id": "x9.huge", "num_workers": 1}))
    with pytest.raises(WorkspaceError, match="Cluster c9 does not exist"):
        cluster_sizing(workspace_client(), "c9")
    workspace.on("GET", "/api/2.1/clusters/list-node-types", node_types(("m5.large", 2.0)))
    with pytest.raises(WorkspaceError, match="x9.huge.*num_cpus_worker_node"):
        cluster_sizing(workspace_client(), "c1")


class SparkConf:
    """Stands in for ``spark.conf`` (no Spark in these tests)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class SparkStandIn:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = SparkConf(values)


def test_spark_cluster_sizing_uses_the_cluster_id_and_falls_back_on_errors(
    workspace, monkeypatch, caplog
):
    spark = SparkStandIn({CLUSTER_ID_CONF: "0101-abc"})
    assert spark_cluster_sizing(spark) is None  # not in a Databricks runtime: no call
    assert workspace.api_calls() == []

    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "16.4")
    workspace.on("GET", "/api/2.1/clusters/get",
                 (200, {"cluster_id": "0101-abc", "node_type_id": "i3.xlarge",
                        "autoscale": {"min_workers": 1, "max_workers": 4}}),
                 (500, {"error_code": "INTERNAL_ERROR", "message": "boom"}))
    workspace.on("GET", "/api/2.1/clusters/list-node-types", node_types(("i3.xlarge", 4.0)))
    assert spark_cluster_sizing(spark) == ClusterSizing("0101-abc", "i3.xlarge", 4, 1, 4)

    with caplog.at_level(logging.WARNING, logger="raybricks.databricks"):
        assert spark_cluster_sizing(spark) is None
    assert "boom" in caplog.text and "measuring Spark instead" in caplog.text
    assert spark_cluster_sizing(SparkStandIn({})) is None  # no cluster id


def test_cluster_spec_sizes_ray_and_autoscales_it():
    from raybricks.cluster import SparkCapacity

    measured = SparkCapacity(False, workers=1, slots_per_worker=4, cores_per_worker=4, task_cpus=1)
    sizing = ClusterSizing("c1", "i3.xlarge", cores_per_worker=4, min_workers=2, max_workers=8)
    capacity = capacity_from_cluster_spec(measured, sizing)
    assert (capacity.workers, capacity.cores_per_worker, capacity.min_workers) == (8, 4, 2)
    args = ray_on_spark_arguments(ClusterConfig(), capacity)
    assert args["max_worker_nodes"] == 8 and args["min_worker_nodes"] == 2
    assert args["num_cpus_worker_node"] == 3  # a worker's cores but one Spark task's
    # an explicit config wins; a fixed-size cluster gives a fixed-size Ray
    assert ray_on_spark_arguments(ClusterConfig(min_worker_nodes=4), capacity)[
        "min_worker_nodes"] == 4
    fixed = capacity_from_cluster_spec(measured, ClusterSizing("c1", "i3.xlarge", 4, 3, 3))
    assert "min_worker_nodes" not in ray_on_spark_arguments(ClusterConfig(), fixed)


# --------------------------------------------------------------------------- staging volume


def test_ensure_volume_creates_a_missing_volume_once(workspace):
    path = "/api/2.1/unity-catalog/volumes/main.ml.staging"
    workspace.on("GET", path,
                 (404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no volume"}),
                 (200, {"full_name": "main.ml.staging"}))
    workspace.on("POST", "/api/2.1/unity-catalog/volumes", (200, {"full_name": "main.ml.staging"}))
    client = workspace_client()
    assert ensure_volume(client, "main.ml.staging") == "/Volumes/main/ml/staging"
    created = workspace.calls("POST", "/api/2.1/unity-catalog/volumes")
    assert [c.json() for c in created] == [{
        "catalog_name": "main", "schema_name": "ml", "name": "staging",
        "volume_type": "MANAGED", "comment": "raybricks: Parquet staging and run outputs"}]
    assert ensure_volume(client, "main.ml.staging") == "/Volumes/main/ml/staging"
    assert len(workspace.calls("POST", "/api/2.1/unity-catalog/volumes")) == 1


def test_ensure_volume_in_a_missing_schema_says_so(workspace):
    workspace.on("GET", "/api/2.1/unity-catalog/volumes/main.nope.v",
                 (404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no volume"}))
    workspace.on("POST", "/api/2.1/unity-catalog/volumes",
                 (404, {"error_code": "SCHEMA_DOES_NOT_EXIST", "message": "Schema 'main.nope'"}))
    with pytest.raises(WorkspaceError, match="schema must exist.*main.nope"):
        ensure_volume(workspace_client(), "main.nope.v")
    with pytest.raises(ConfigError, match="catalog.schema.volume"):
        ensure_volume(workspace_client(), "main.v")


def test_cleanup_removes_only_stale_staging_directories(workspace):
    now_ms = int(time.time() * 1000)
    old, new = now_ms - 3 * 86400_000, now_ms - 60_000
    root = "/Volumes/main/ml/staging"
    tree = {  # directory -> entries
        root: [("raybricks-staging-aaa", None), ("raybricks-staging-bbb", None),
               ("keep-me", None), ("notes.txt", old)],
        f"{root}/raybricks-staging-aaa": [("part-0.parquet", old), ("sub", None)],
        f"{root}/raybricks-staging-aaa/sub": [("part-1.parquet", old)],
        f"{root}/raybricks-staging-bbb": [("part-0.parquet", new)],
    }

    def listing(request):
        directory = request.path.removeprefix("/api/2.0/fs/directories").rstrip("/")
        return 200, {"contents": [
            {"path": f"{directory}/{name}" + ("/" if modified is None else ""), "name": name,
             "is_directory": modified is None, "last_modified": modified, "file_size": 10}
            for name, modified in tree[directory]]}

    for directory in tree:
        workspace.on("GET", f"/api/2.0/fs/directories{directory}", listing)
        workspace.on("DELETE", f"/api/2.0/fs/directories{directory}", (200, {}))
    for name in ("part-0.parquet", "sub/part-1.parquet"):
        workspace.on("DELETE", f"/api/2.0/fs/files{root}/raybricks-staging-aaa/{name}", (200, {}))

    removed = cleanup_staging(workspace_client(), root, older_than_s=86400)
    assert [p.rstrip("/") for p in removed] == [f"{root}/raybricks-staging-aaa"]
    stale = f"{root}/raybricks-staging-aaa"
    assert [r.path for r in workspace.requests if r.method == "DELETE"] == [
        f"/api/2.0/fs/files{stale}/part-0.parquet",
        f"/api/2.0/fs/files{stale}/sub/part-1.parquet",
        f"/api/2.0/fs/directories{stale}/sub",  # deepest first
        f"/api/2.0/fs/directories{stale}",
    ]


# --------------------------------------------------------------------------- submit


def run_state(life: str, result: str | None = None, message: str = "", tasks=None) -> tuple:
    state = {"life_cycle_state": life, "state_message": message}
    if result:
        state["result_state"] = result
    body = {"run_id": 42, "run_page_url": "https://dbc.example/#job/1/run/42", "state": state}
    if tasks is not None:
        body["tasks"] = tasks
    return 200, body


@pytest.fixture
def wheel(tmp_path) -> Path:
    path = tmp_path / "raybricks-0.1.0-py3-none-any.whl"
    path.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip: only uploaded here
    return path


def workspace_for_submit(workspace, *runs: tuple) -> None:
    workspace.on("GET", "/api/2.0/preview/scim/v2/Me", (200, {"userName": USER, "id": "7"}))
    workspace.on("POST", "/api/2.0/workspace/mkdirs", (200, {}))
    workspace.on("POST", "/api/2.0/workspace/import", (200, {}))
    workspace.on("POST", "/api/2.2/jobs/runs/submit", (200, {"run_id": 42}))
    workspace.on("GET", "/api/2.2/jobs/runs/get", *runs)


def submit(*extra: str) -> list[str]:
    return ["submit", "--config", str(REPO / "jobs" / "sales_regression.yml"),
            "--poll-interval", "0.01", *extra]


def test_submit_uploads_submits_and_follows_the_run_to_success(workspace, wheel, capsys):
    workspace_for_submit(workspace, run_state("PENDING", message="Waiting for cluster"),
                         run_state("RUNNING"), run_state("RUNNING"),
                         run_state("TERMINATED", "SUCCESS"))
    code = cli.main(submit("--cluster-id", "0101-abc", "--wheel", str(wheel),
                           "--set", "validation.fraction=0.25"))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "https://dbc.example/#job/1/run/42" in out
    states = re.findall(r"^\s+\d+s\s+(\w+)", out, flags=re.M)
    assert states == ["PENDING", "RUNNING", "TERMINATED"]  # one line per change
    assert "SUCCESS" in out

    uploads = workspace.calls("POST", "/api/2.0/workspace/import")
    config_text = (REPO / "jobs" / "sales_regression.yml").read_bytes()
    assert any(config_text in u.body for u in uploads) and any(b"PK\x05\x06" in u.body
                                                              for u in uploads)
    (request,) = workspace.calls("POST", "/api/2.2/jobs/runs/submit")
    (task,) = request.json()["tasks"]
    folder = f"/Workspace/Users/{USER}/.raybricks/submit/"
    params = task["python_wheel_task"]["parameters"]
    assert params[:2] == ["train", "--config"]
    assert params[3:] == ["--set", "validation.fraction=0.25"]
    assert params[2].startswith(folder) and params[2].endswith("/sales_regression.yml")
    assert task["python_wheel_task"]["package_name"] == PACKAGE_NAME
    assert task["existing_cluster_id"] == "0101-abc" and "new_cluster" not in task
    assert task["libraries"] == [{"whl": params[2].rsplit("/", 1)[0] + "/" + wheel.name}]
    assert request.json()["timeout_seconds"] == 4 * 3600


def test_submit_of_a_failed_run_exits_non_zero_with_the_task_error(workspace, wheel, capsys):
    failed_task = [{"task_key": "train", "run_id": 43,
                    "state": {"life_cycle_state": "TERMINATED", "result_state": "FAILED"}}]
    workspace_for_submit(workspace, run_state("RUNNING"),
                         run_state("TERMINATED", "FAILED", "Task train failed", failed_task))
    workspace.on("GET", "/api/2.2/jobs/runs/get-output", (200, {
        "error": "DataError: table main.retail.daily_sales not found",
        "error_trace": "Traceback (most recent call last):\n  ...\nDataError: not found"}))
    code = cli.main(submit("--cluster-id", "0101-abc", "--wheel", str(wheel)))
    captured = capsys.readouterr()
    assert code == 1
    assert "FAILED" in captured.err
    assert "table main.retail.daily_sales not found" in captured.err
    assert workspace.calls("GET", "/api/2.2/jobs/runs/get-output")[0].query == {"run_id": ["43"]}


def test_submit_on_a_new_cluster_with_a_staging_volume(workspace, wheel, capsys):
    workspace_for_submit(workspace, run_state("TERMINATED", "SUCCESS"))
    workspace.on("GET", "/api/2.1/unity-catalog/volumes/main.ml.rb",
                 (404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no volume"}))
    workspace.on("POST", "/api/2.1/unity-catalog/volumes", (200, {"full_name": "main.ml.rb"}))
    code = cli.main(submit("--new-cluster", "--node-type", "i3.xlarge", "--workers", "1-4",
                           "--staging-volume", "main.ml.rb", "--wheel", str(wheel),
                           "--workspace-dir", "/Workspace/Shared/rb"))
    assert code == 0, capsys.readouterr()
    (task,) = workspace.calls("POST", "/api/2.2/jobs/runs/submit")[0].json()["tasks"]
    cluster = task["new_cluster"]
    assert cluster["autoscale"] == {"min_workers": 1, "max_workers": 4}
    assert cluster["spark_conf"] == RAY_SPARK_CONF
    assert cluster["data_security_mode"] == "SINGLE_USER"
    assert "-ml-" in cluster["spark_version"]
    params = task["python_wheel_task"]["parameters"]
    assert params[2].startswith("/Workspace/Shared/rb/")
    assert "data.staging_dir=/Volumes/main/ml/rb/staging" in params
    assert "training.output_dir=/Volumes/main/ml/rb/runs" in params
    assert workspace.calls("GET", "/api/2.0/preview/scim/v2/Me") == []
    assert all(r.json()["path"].startswith("/Shared/rb/")
               for r in workspace.calls("POST", "/api/2.0/workspace/mkdirs"))


def test_throttled_submit_is_retried_with_the_same_idempotency_token(workspace, wheel, capsys):
    workspace_for_submit(workspace, run_state("TERMINATED", "SUCCESS"))
    workspace.on("POST", "/api/2.2/jobs/runs/submit",
                 (429, {"error_code": "REQUEST_LIMIT_EXCEEDED", "message": "too many"},
                  {"Retry-After": "0"}),
                 (200, {"run_id": 42}))
    assert cli.main(submit("--cluster-id", "c1", "--wheel", str(wheel))) == 0
    tokens = [r.json()["idempotency_token"]
              for r in workspace.calls("POST", "/api/2.2/jobs/runs/submit")]
    assert len(tokens) == 2 and tokens[0] == tokens[1]


def test_submit_checks_everything_it_can_before_calling_the_workspace(
    workspace, wheel, tmp_path, capsys
):
    bad = tmp_path / "bad.yml"
    bad.write_text("source: {table: t}\nsegment_by: [s]\ntarget: y\nmodels: []\n")
    assert cli.main(["submit", "--config", str(bad), "--cluster-id", "c1"]) == 2
    assert "models" in capsys.readouterr().err
    good = str(REPO / "jobs" / "sales_regression.yml")
    assert cli.main(["submit", "--config", good, "--wheel", str(wheel)]) == 2
    assert "--node-type" in capsys.readouterr().err
    assert cli.main(["submit", "--config", good, "--cluster-id", "c1",
                     "--wheel", str(tmp_path / "missing.whl")]) == 2
    assert "uv build --wheel" in capsys.readouterr().err
    assert workspace.requests == []


def test_submit_with_rejected_credentials_exits_2_naming_the_variables(
    workspace, wheel, monkeypatch, capsys
):
    monkeypatch.setenv("DATABRICKS_TOKEN", "dapi-expired")
    workspace_for_submit(workspace, run_state("TERMINATED", "SUCCESS"))
    assert cli.main(submit("--cluster-id", "c1", "--wheel", str(wheel))) == 2
    err = capsys.readouterr().err
    assert "401" in err and "DATABRICKS_HOST" in err and "DATABRICKS_CONFIG_PROFILE" in err
    assert workspace.calls("POST", "/api/2.2/jobs/runs/submit") == []


# --------------------------------------------------------------------------- submit: serverless


def submitted_run(workspace) -> dict:
    (request,) = workspace.calls("POST", "/api/2.2/jobs/runs/submit")
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    return request.json()


def trained_config(params: list[str], local_config: Path):
    """What ``raybricks train`` makes of the task's parameters: the CLI's own parser and
    overrides, with the uploaded config read from its local original."""
    from raybricks.config import JobConfig

    args = cli.build_parser().parse_args(params)
    assert args.verb == "train"
    return args, JobConfig.load(local_config, cli.overrides(args))


def requirement(text: str) -> tuple:
    from packaging.requirements import Requirement

    parsed = Requirement(text)
    return parsed.name, parsed.specifier, frozenset(parsed.extras)


def test_submit_on_serverless_sends_an_environment_and_no_cluster(workspace, wheel, capsys):
    """--serverless: one environment (the uploaded wheel) and one wheel task using it,
    nothing of a cluster; the task trains on the Spark executor with its run directory
    in the staging volume, as the CLI parses the parameters sent."""
    workspace_for_submit(workspace, run_state("PENDING"), run_state("TERMINATED", "SUCCESS"))
    workspace.on("GET", "/api/2.1/unity-catalog/volumes/main.ml.rb",
                 (200, {"full_name": "main.ml.rb"}))
    local = REPO / "jobs" / "sales_regression.yml"
    code = cli.main(submit("--serverless", "--staging-volume", "main.ml.rb",
                           "--wheel", str(wheel), "--set", "min_rows=50"))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "SUCCESS" in out and "staging in volume /Volumes/main/ml/rb" in out
    body = submitted_run(workspace)
    assert not {"job_clusters", "new_cluster", "existing_cluster_id"} & set(body)
    (task,) = body["tasks"]
    assert not {"new_cluster", "existing_cluster_id", "job_cluster_key", "libraries"} & set(task)
    (environment,) = body["environments"]
    assert task["environment_key"] == environment["environment_key"]
    params = task["python_wheel_task"]["parameters"]
    uploaded = params[2].rsplit("/", 1)[0] + "/" + wheel.name
    assert environment["spec"] == {"environment_version": DEFAULT_ENVIRONMENT_VERSION,
                                   "dependencies": [uploaded]}  # the regression job: no extra
    assert task["python_wheel_task"]["package_name"] == PACKAGE_NAME
    assert task["python_wheel_task"]["entry_point"] == ENTRY_POINT
    assert params[:2] == ["train", "--config"] and params[3:5] == ["--executor", "spark"]
    args, config = trained_config(params, local)
    assert args.executor == "spark" and config.training.executor == "spark"
    assert config.training.output_dir == "/Volumes/main/ml/rb/runs"
    assert config.data.staging_dir == "/Volumes/main/ml/rb/staging"
    assert config.min_rows == 50
    assert body["timeout_seconds"] == 4 * 3600 and body["idempotency_token"]
    assert body["run_name"] == "raybricks train sales_regression"
    assert workspace.calls("POST", "/api/2.1/unity-catalog/volumes") == []  # it existed


def test_serverless_environment_installs_the_extras_the_config_needs(workspace, wheel, capsys):
    """A hierarchical forecast config needs the forecast and hierarchy extras, which no
    serverless environment has: their requirements (the wheel's own metadata) follow
    the wheel, then --dependency; --environment-version is passed on."""
    import tomllib

    workspace_for_submit(workspace, run_state("TERMINATED", "SUCCESS"))
    config = REPO / "jobs" / "prison_hierarchy.yml"
    code = cli.main(["submit", "--config", str(config), "--poll-interval", "0.01",
                     "--serverless", "--environment-version", "3", "--wheel", str(wheel),
                     "--dependency", "my-features==1.2",
                     "--set", "training.output_dir=/Volumes/main/ml/rb/runs"])
    assert code == 0, capsys.readouterr()
    body = submitted_run(workspace)
    (environment,) = body["environments"]
    assert environment["spec"]["environment_version"] == "3"
    wheel_path, *dependencies = environment["spec"]["dependencies"]
    assert wheel_path.startswith(f"/Workspace/Users/{USER}/") and wheel_path.endswith(wheel.name)
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    wanted = {requirement(r) for r in extras["forecast"] + extras["hierarchy"]}
    assert {requirement(r) for r in dependencies[:-1]} == wanted
    assert len(dependencies[:-1]) == len(wanted) and dependencies[-1] == "my-features==1.2"
    (task,) = body["tasks"]
    _, trained = trained_config(task["python_wheel_task"]["parameters"], config)
    assert trained.training.executor == "spark"
    assert trained.training.output_dir == "/Volumes/main/ml/rb/runs"


@pytest.mark.parametrize(("extra", "wanted"), [
    (["--set", "training.output_dir=/Volumes/c/s/v/runs"], None),
    ([], "is not in a Unity Catalog volume"),  # the default run directory: the driver's disk
    (["--staging-volume", "c.s.v", "--set", "training.executor=ray"],
     "Ray on Spark cannot start on serverless"),
    (["--staging-volume", "c.s.v", "--node-type", "i3.xlarge"], "serverless compute has none"),
    (["--staging-volume", "c.s.v", "--environment-version", "1"], "Python is 3.11 or later"),
    (["--staging-volume", "c.s"], "three-level name"),
])
def test_serverless_submit_checks_before_calling_the_workspace(
        workspace, wheel, capsys, extra, wanted):
    workspace_for_submit(workspace, run_state("TERMINATED", "SUCCESS"))
    code = cli.main(submit("--serverless", "--wheel", str(wheel), *extra))
    err = capsys.readouterr().err
    if wanted is None:  # the check passes this one: it is submitted
        assert code == 0, err
        assert workspace.calls("POST", "/api/2.2/jobs/runs/submit")
        return
    assert code == 2 and wanted in err, err
    assert workspace.requests == []


def test_environment_options_without_serverless_are_refused(workspace, wheel, capsys):
    for extra in (["--dependency", "x"], ["--environment-version", "4"]):
        code = cli.main(submit("--cluster-id", "c1", "--wheel", str(wheel), *extra))
        assert code == 2 and "--serverless" in capsys.readouterr().err
    assert workspace.requests == []


def test_throttled_serverless_submit_is_retried_with_the_same_body(workspace, wheel, capsys):
    workspace_for_submit(workspace, run_state("TERMINATED", "SUCCESS"))
    workspace.on("POST", "/api/2.2/jobs/runs/submit",
                 (429, {"error_code": "REQUEST_LIMIT_EXCEEDED", "message": "too many"},
                  {"Retry-After": "0"}),
                 (200, {"run_id": 42}))
    assert cli.main(submit("--serverless", "--wheel", str(wheel),
                           "--set", "training.output_dir=/Volumes/c/s/v/runs")) == 0
    first, second = (r.json() for r in workspace.calls("POST", "/api/2.2/jobs/runs/submit"))
    assert first == second and first["idempotency_token"]
