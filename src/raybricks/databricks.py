"""Databricks runtime detection and databricks-sdk calls.

Detection works off Databricks too: it answers "no" without raising. The SDK calls
(``workspace_client``, cluster sizing, the staging volume) each have a short,
configurable time budget (``RAYBRICKS_DATABRICKS_TIMEOUT`` seconds, default 30) and turn
the SDK's errors into one RaybricksError naming the fix: ``SetupError`` for missing or
rejected credentials, ``WorkspaceError`` for everything the workspace refuses or fails.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raybricks.errors import ConfigError, SetupError, WorkspaceError, first_line

if TYPE_CHECKING:
    from databricks.sdk import WorkspaceClient
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

CHUNK_API_MODULE = "pyspark.databricks.sql.chunk"
CHUNK_API_CONF = "spark.databricks.pyspark.dataFrameChunk.enabled"
DF_ACLS_CONF = "spark.databricks.acl.dfAclsEnabled"
#: Prefix of the Spark confs in which Databricks describes the cluster.
TAGS = "spark.databricks.clusterUsageTags"
CLUSTER_ID_CONF = "spark.databricks.clusterUsageTags.clusterId"
TIMEOUT_ENV = "RAYBRICKS_DATABRICKS_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0
#: Name prefix of the per-call Parquet staging directories (see raybricks.data).
STAGING_PREFIX = "raybricks-staging-"
CREDENTIALS_HELP = (
    "set DATABRICKS_HOST and DATABRICKS_TOKEN (a personal access token), or "
    "DATABRICKS_HOST with DATABRICKS_CLIENT_ID and DATABRICKS_CLIENT_SECRET (a service "
    "principal), or DATABRICKS_CONFIG_PROFILE naming a profile of ~/.databrickscfg "
    "(`databricks auth login` writes one)"
)


# --------------------------------------------------------------------------- runtime


def in_databricks_runtime() -> bool:
    """True inside a Databricks Runtime (notebook, job or cluster process)."""
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def chunk_api_problem(spark: SparkSession) -> str | None:
    """Why Spark cannot hand partitions to Ray as Arrow chunks here, or None if it can.

    The chunk API (``pyspark.databricks.sql.chunk``, Databricks Runtime ML 15+) needs the
    cluster conf ``spark.databricks.pyspark.dataFrameChunk.enabled=true`` and a dedicated
    (assigned) access mode cluster: not ``spark.databricks.acl.dfAclsEnabled=true``.
    """
    try:
        found = importlib.util.find_spec(CHUNK_API_MODULE) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"there is no module {CHUNK_API_MODULE}"
    if _conf(spark, CHUNK_API_CONF, "false").lower() != "true":
        return f"the cluster conf {CHUNK_API_CONF} is not true"
    if _conf(spark, DF_ACLS_CONF, "false").lower() != "false":
        return (f"{DF_ACLS_CONF}=true (a shared access mode cluster); the chunk API needs "
                "a dedicated (single user, assigned) access mode cluster")
    return None


def chunk_api_available(spark: SparkSession) -> bool:
    """True where Spark can hand partitions to Ray as Arrow chunks (see ``chunk_api_problem``)."""
    return chunk_api_problem(spark) is None


def unstable_workers(spark: SparkSession) -> str | None:
    """Why this cluster's executors may go away while it runs (autoscaling, spot or
    preemptible instances, or tags that do not say), or None for a fixed-size on-demand
    cluster. Read from the ``spark.databricks.clusterUsageTags.*`` confs."""
    scaling = _conf(spark, f"{TAGS}.clusterScalingType", "").lower()
    low = _int_conf(spark, f"{TAGS}.clusterMinWorkers")
    high = _int_conf(spark, f"{TAGS}.clusterMaxWorkers")
    if scaling == "autoscaling" or (low is not None and high is not None and low < high):
        bounds = f" ({low}-{high} workers)" if low is not None and high is not None else ""
        return f"the cluster autoscales{bounds}"
    if scaling != "fixed_size":
        return "the cluster tags do not say whether the cluster autoscales"
    availability = _conf(spark, f"{TAGS}.clusterAvailability", "").upper()
    if not availability:
        return "the cluster tags do not say whether its workers are spot instances"
    if availability.startswith("ON_DEMAND"):
        return None
    # AWS and Azure put the first `first_on_demand` nodes (the driver first) on demand
    first_on_demand = _int_conf(spark, f"{TAGS}.clusterFirstOnDemand")
    workers = _int_conf(spark, f"{TAGS}.clusterWorkers")
    if first_on_demand is not None and workers is not None and first_on_demand > workers:
        return None
    return f"the cluster's workers may be spot or preemptible instances ({availability})"


def _conf(spark: SparkSession, key: str, default: str) -> str:
    try:
        value = spark.conf.get(key, default)
    except Exception:  # noqa: BLE001 - a conf Spark refuses to show counts as unset
        return default
    return default if value is None else str(value)


def _int_conf(spark: SparkSession, key: str) -> int | None:
    try:
        return int(_conf(spark, key, ""))
    except ValueError:
        return None


# --------------------------------------------------------------------------- client


def sdk_timeout(timeout_s: float | None = None) -> float:
    """The time budget of one SDK call: the argument, ``RAYBRICKS_DATABRICKS_TIMEOUT``, or 30 s."""
    if timeout_s is None:
        raw = os.environ.get(TIMEOUT_ENV)
        if not raw:
            return DEFAULT_TIMEOUT_S
        try:
            timeout_s = float(raw)
        except ValueError:
            raise ConfigError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if not timeout_s > 0:
        raise ConfigError(f"the Databricks call timeout must be above 0 s, got {timeout_s}")
    return timeout_s


def workspace_client(
    *,
    host: str | None = None,
    token: str | None = None,
    profile: str | None = None,
    timeout_s: float | None = None,
) -> WorkspaceClient:
    """A ``WorkspaceClient`` whose calls give up after ``timeout_s`` (retries included).

    Credentials come from the arguments, else the SDK's usual chain (``DATABRICKS_*``
    variables, ``~/.databrickscfg``, the runtime's own inside Databricks). Missing ones
    raise one SetupError naming the variables to set.
    """
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.core import Config

    timeout = sdk_timeout(timeout_s)
    try:
        config = Config(
            host=host,
            token=token,
            profile=profile,
            retry_timeout_seconds=max(math.ceil(timeout), 1),
            http_timeout_seconds=timeout,
            product="raybricks",
            product_version=_version(),
        )
    except ValueError as exc:
        raise SetupError(
            f"no usable Databricks credentials ({first_line(exc).split(', please check')[0]}): "
            f"{CREDENTIALS_HELP}"
        ) from None
    return WorkspaceClient(config=config)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("raybricks")
    except PackageNotFoundError:
        return "0.0.0"



def _timeout_of(client: WorkspaceClient) -> float:
    return float(client.config.retry_timeout_seconds or DEFAULT_TIMEOUT_S)


@contextlib.contextmanager
def api_errors(action: str, client: WorkspaceClient) -> Iterator[None]:
    """Turn the SDK's errors inside the block into one RaybricksError about ``action``."""
    from databricks.sdk.errors import DatabricksError, NotFound, PermissionDenied, Unauthenticated

    host = client.config.host
    try:
        yield
    except Unauthenticated as exc:
        raise SetupError(
            f"{action}: {host} rejected the credentials (HTTP 401: {first_line(exc)}); "
            f"check or renew them: {CREDENTIALS_HELP}"
        ) from None
    except PermissionDenied as exc:
        raise WorkspaceError(
            f"{action}: permission denied on {host} ({first_line(exc)}); ask a workspace "
            "admin for the permission, or authenticate as an identity that has it"
        ) from None
    except NotFound as exc:
        raise WorkspaceError(f"{action}: not found on {host} ({first_line(exc)})") from None
    except TimeoutError as exc:
        cause = first_line(exc.__cause__) if exc.__cause__ else "no answer"
        raise WorkspaceError(
            f"{action}: {host} did not answer within {_timeout_of(client):g} s ({cause}); "
            f"check DATABRICKS_HOST and the network, or allow more time with {TIMEOUT_ENV}"
        ) from None
    except DatabricksError as exc:
        code = f"{exc.error_code}: " if exc.error_code else ""
        raise WorkspaceError(f"{action} failed on {host}: {code}{first_line(exc)}") from None


# --------------------------------------------------------------------------- cluster sizing


@dataclass(frozen=True)
class ClusterSizing:
    """A Databricks cluster's workers as its spec declares them (not as registered now)."""

    cluster_id: str
    node_type_id: str
    cores_per_worker: int
    min_workers: int
    max_workers: int

    @property
    def autoscaling(self) -> bool:
        return self.min_workers < self.max_workers


def cluster_sizing(client: WorkspaceClient, cluster_id: str) -> ClusterSizing:
    """Read workers (fixed or autoscale range) and cores per worker of a cluster.

    Cores come from the worker node type (``clusters.list_node_types``).
    """
    with api_errors(f"reading cluster {cluster_id}", client):
        cluster = client.clusters.get(cluster_id)
    if cluster.autoscale is not None:
        low = cluster.autoscale.min_workers or 0
        high = cluster.autoscale.max_workers or low
    else:
        low = high = cluster.num_workers or 0
    node_type = cluster.node_type_id
    if not node_type:
        raise WorkspaceError(
            f"cluster {cluster_id} has no node_type_id (an instance pool cluster?): set "
            "cluster.num_cpus_worker_node and cluster.max_worker_nodes in the job config"
        )
    with api_errors("listing node types", client):
        node_types = client.clusters.list_node_types().node_types or []
    match = next((t for t in node_types if t.node_type_id == node_type), None)
    if match is None or not match.num_cores:
        raise WorkspaceError(
            f"node type {node_type!r} of cluster {cluster_id} is not among the workspace's "
            "node types: set cluster.num_cpus_worker_node in the job config"
        )
    return ClusterSizing(cluster_id, node_type, int(match.num_cores), low, high)


def spark_cluster_sizing(
    spark: SparkSession, client: WorkspaceClient | None = None
) -> ClusterSizing | None:
    """The sizing of the Databricks cluster this Spark runs on, or None.

    None outside a Databricks runtime, without a cluster id, on a single-node cluster,
    and on any error (logged as a warning): callers then measure Spark instead.
    """
    if not in_databricks_runtime():
        return None
    try:
        cluster_id = spark.conf.get(CLUSTER_ID_CONF, None)
        if not cluster_id:
            return None
        sizing = cluster_sizing(client or workspace_client(), cluster_id)
    except Exception as exc:  # noqa: BLE001 - sizing from the spec is an optimisation only
        log.warning("sizing Ray from the cluster spec failed (%s); measuring Spark instead", exc)
        return None
    return sizing if sizing.max_workers > 0 else None


# --------------------------------------------------------------------------- staging volume


def volume_path(full_name: str) -> str:
    """``catalog.schema.volume`` -> ``/Volumes/catalog/schema/volume``."""
    parts = full_name.split(".")
    if len(parts) != 3 or not all(parts):
        raise ConfigError(
            f"volume {full_name!r} must be a three-level name catalog.schema.volume"
        )
    return "/Volumes/" + "/".join(parts)


def ensure_volume(client: WorkspaceClient, full_name: str) -> str:
    """Create the managed Unity Catalog volume ``catalog.schema.volume`` unless it exists.

    Returns its path (``/Volumes/catalog/schema/volume``), e.g. for ``data.staging_dir``.
    """
    from databricks.sdk.errors import NotFound, ResourceAlreadyExists
    from databricks.sdk.service.catalog import VolumeType

    path = volume_path(full_name)
    catalog, schema, name = full_name.split(".")
    with api_errors(f"reading volume {full_name}", client):
        try:
            client.volumes.read(full_name)
            return path
        except NotFound:
            pass
    with api_errors(f"creating volume {full_name} (the schema must exist)", client):
        try:
            client.volumes.create(
                catalog_name=catalog,
                schema_name=schema,
                name=name,
                volume_type=VolumeType.MANAGED,
                comment="raybricks: Parquet staging and run outputs",
            )
            log.info("created volume %s", full_name)
        except ResourceAlreadyExists:
            pass  # created concurrently: fine
    return path


def cleanup_staging(
    client: WorkspaceClient, root: str, *, older_than_s: float = 24 * 3600
) -> list[str]:
    """Remove leftover staging directories (of crashed runs) under ``root``.

    Only directories named ``raybricks-staging-*`` whose newest file is older than
    ``older_than_s`` are removed (a run cleans up its own on success). Returns their paths.
    """
    cutoff_ms = (time.time() - older_than_s) * 1000
    removed = []
    with api_errors(f"cleaning up staging under {root}", client):
        for entry in client.files.list_directory_contents(root):
            if not (entry.is_directory and (entry.name or "").startswith(STAGING_PREFIX)):
                continue
            files, directories = _walk(client, entry.path)
            newest = max((f.last_modified or 0 for f in files), default=0)
            if newest >= cutoff_ms:
                continue
            for item in files:
                client.files.delete(item.path)
            for directory in reversed(directories):  # deepest first
                client.files.delete_directory(directory)
            removed.append(entry.path)
    return removed


def _walk(client: WorkspaceClient, root: str) -> tuple[list, list[str]]:
    """Every file under ``root`` and every directory (``root`` first, parents before children)."""
    files, directories, pending = [], [], [root.rstrip("/")]
    while pending:
        directory = pending.pop(0)
        directories.append(directory)
        for entry in client.files.list_directory_contents(directory):
            if entry.is_directory:
                pending.append(entry.path.rstrip("/"))
            else:
                files.append(entry)
    return files, directories

