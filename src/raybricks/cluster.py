"""Ray lifecycle: Ray on the Spark cluster, an existing Ray, or a plain local Ray.

``ray_cluster()`` is a context manager that starts (or connects), yields a ``RayCluster``
and always shuts down, also on exceptions, Ctrl-C and SIGTERM. ``start_ray()`` /
``stop_ray()`` are the same as a function pair.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raybricks.config import ClusterConfig, SparkConfig
from raybricks.errors import ClusterError, SetupError
from raybricks.session import (
    active_spark,
    local_spark_session,
    prepare_executor_environment,
    require_spark_context,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from raybricks.databricks import ClusterSizing

log = logging.getLogger(__name__)

#: Environment variables that Ray workers need to reach MLflow and Databricks.
FORWARDED_ENV_PREFIXES = ("MLFLOW_",)
FORWARDED_ENV_NAMES = (
    "DATABRICKS_HOST",
    "DATABRICKS_TOKEN",
    "DATABRICKS_CLIENT_ID",
    "DATABRICKS_CLIENT_SECRET",
    "DATABRICKS_CONFIG_PROFILE",
)
#: The module Ray on Spark runs, with the executor's Python, to start a Ray node.
START_RAY_NODE = "ray.util.spark.start_ray_node"
#: Share of /dev/shm that Ray's object store may take on one machine.
SHM_SHARE = 0.8


@dataclass
class SparkCapacity:
    """What the Spark cluster offers Ray: worker machines, task slots and cores."""

    local_mode: bool
    workers: int
    slots_per_worker: int
    cores_per_worker: int
    task_cpus: int
    #: Fewest workers of an autoscaling cluster (None: fixed size); Ray then autoscales too.
    min_workers: int | None = None
    #: GPUs of a worker's executor (``spark.executor.resource.gpu.amount``) and of each of
    #: Spark's own tasks (``spark.task.resource.gpu.amount``).
    gpus_per_worker: int = 0
    task_gpus: float = 0.0

    @property
    def total_slots(self) -> int:
        return self.workers * self.slots_per_worker


@dataclass
class RayCluster:
    """A running Ray that the driver is connected to."""

    mode: str
    address: str
    settings: dict[str, Any] = field(default_factory=dict)
    _owned: bool = True
    #: How it authenticates (None: a Ray this process was connected to before).
    auth: RayAuth | None = None
    #: The auth variables this process had before the start, put back at the shut-down.
    _auth_before: dict[str, str | None] = field(default_factory=dict, repr=False)

    @property
    def resources(self) -> dict[str, float]:
        """Total cluster resources as Ray reports them now (CPU, GPU, memory, ...)."""
        import ray

        return ray.cluster_resources()

    @property
    def num_cpus(self) -> int:
        return int(self.resources.get("CPU", 0))


def forwarded_env(extra: list[str] | None = None) -> dict[str, str]:
    """The driver's MLflow / Databricks variables that Ray workers must see too."""
    names = set(FORWARDED_ENV_NAMES) | set(extra or [])
    return {
        key: value
        for key, value in os.environ.items()
        if key in names or key.startswith(FORWARDED_ENV_PREFIXES)
    }


#: Ray's own settings of its token authentication (in the Ray versions that have it): the mode
#: (``token`` | ``disabled``), the token, or a file that holds it.
AUTH_MODE, AUTH_TOKEN, AUTH_TOKEN_PATH = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


@dataclass(frozen=True)
class RayAuth:
    """How the Ray that raybricks starts, or the connection it makes, authenticates.

    ``says``: the run's line. ``env``: Ray's auth variables as they are for this cluster
    (its mode and, with a token, the token): set in this process while the cluster runs,
    and given to the nodes Ray on Spark starts (a Spark executor does not see the
    driver's environment). Never shown: its repr leaves it out."""

    token: bool
    says: str
    env: dict[str, str] = field(default_factory=dict, repr=False)


def token_auth_missing(mode: str) -> str | None:
    """Why the installed Ray cannot run ``mode`` (spark | local | address) with a token,
    or None where it can: Ray before token authentication (the Databricks runtimes' 2.37),
    or a Ray on Spark that gives its nodes no environment computed on the driver."""
    import ray

    try:
        from ray._raylet import AuthenticationTokenLoader, Config  # noqa: F401
    except ImportError:
        return f"Ray {ray.__version__} has none"
    if mode == "spark":
        import inspect

        from ray.autoscaler._private.spark import spark_job_server
        from ray.util.spark import cluster_init

        server = getattr(spark_job_server, "SparkJobServer", None)  # holds the nodes' env
        if not (callable(getattr(cluster_init, "_create_hook_entry", None)) and server
                and "ray_node_custom_env" in inspect.signature(server).parameters):
            return (f"Ray {ray.__version__}'s Ray on Spark gives raybricks no way to hand a "
                    "token to its worker nodes")
    return None


def given_token(environ: dict[str, str] | os._Environ) -> tuple[str, str] | None:
    """The token the environment gives (RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH
    names) and where it came from; None when it gives none. Ray's default file,
    ``~/.ray/auth_token``, is not one: any plain ``ray.init()`` writes it (a stale one
    would lock the driver out of a cluster started with another)."""
    if environ.get(AUTH_TOKEN, "").strip():
        return environ[AUTH_TOKEN].strip(), AUTH_TOKEN
    path = environ.get(AUTH_TOKEN_PATH)
    if not path:
        return None
    try:
        token = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SetupError(f"{AUTH_TOKEN_PATH}={path} cannot be read ({exc.strerror}): give "
                         f"Ray's token in a readable file, or in {AUTH_TOKEN}") from None
    if not token:
        raise SetupError(f"{AUTH_TOKEN_PATH}={path} is empty: write Ray's token into it")
    return token, AUTH_TOKEN_PATH


def ray_auth(mode: str, environ: dict[str, str] | os._Environ | None = None) -> RayAuth:
    """How Ray authenticates in ``mode`` (spark | local | address), from the environment.

    spark and local (a Ray that raybricks starts): with a token where the installed Ray
    has token authentication (generated for the cluster with ``secrets``, or the one
    RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH gives); RAY_AUTH_MODE=disabled otherwise (Ray
    2.37 has none). address (a Ray started elsewhere): with the token the environment
    gives, else without (RAY_AUTH_MODE=disabled). A RAY_AUTH_MODE set before raybricks
    is kept in every mode.
    """
    environ = os.environ if environ is None else environ
    chosen = environ.get(AUTH_MODE, "").strip()
    missing = token_auth_missing(mode)
    if chosen and chosen.lower() != "token":
        if chosen.lower() == "disabled":
            says = f"token authentication off ({AUTH_MODE}={chosen}, set before raybricks)"
        else:
            says = f"authentication as {AUTH_MODE}={chosen} says (set before raybricks)"
        return RayAuth(False, f"Ray: {says}", {AUTH_MODE: chosen})
    if missing:
        kept = f" ({AUTH_MODE}={chosen} is ignored)" if chosen else ""
        return RayAuth(False, f"Ray: token authentication off: {missing}{kept}",
                       {AUTH_MODE: chosen or "disabled"})
    given = given_token(environ)
    if mode == "address":
        if given is None and not chosen:
            return RayAuth(False, "Ray: connecting without a token (a cluster that requires "
                           f"one: give it in {AUTH_TOKEN})", {AUTH_MODE: "disabled"})
        if given is None:  # RAY_AUTH_MODE=token: Ray finds the token (~/.ray/auth_token)
            return RayAuth(True, f"Ray: connecting with a token ({AUTH_MODE}={chosen}, set "
                           "before raybricks; the token where Ray looks for it)",
                           {AUTH_MODE: chosen})
        return RayAuth(True, f"Ray: connecting with the token in {given[1]}",
                       {AUTH_MODE: "token", AUTH_TOKEN: given[0]})
    if given is None:
        import secrets

        token, origin = secrets.token_hex(32), "a token made for this cluster"
    else:
        token, origin = given[0], f"the token in {given[1]}"
    return RayAuth(True, f"Ray: token authentication on ({origin})",
                   {AUTH_MODE: "token", AUTH_TOKEN: token})


def _ray_auth_reloaded() -> None:
    """Ray keeps its auth mode and token per process, read once: read them again from
    this process' environment (before a ``ray.init``, after a ``ray.shutdown``)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # a Ray without token authentication
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def auth_env_set(env: dict[str, str]) -> dict[str, str | None]:
    """Set ``env`` in this process (what Ray reads there too); the values it replaced
    (None: unset), for ``auth_env_restored``."""
    before = {name: os.environ.get(name) for name, value in env.items()
              if os.environ.get(name) != value}
    os.environ.update(env)
    if before:
        _ray_auth_reloaded()
    return before


def auth_env_restored(before: dict[str, str | None]) -> None:
    """Put back the variables ``auth_env_set`` replaced."""
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if before:
        _ray_auth_reloaded()


@contextlib.contextmanager
def ray_nodes_given(env: dict[str, str]) -> Iterator[None]:
    """Within: the nodes ``setup_ray_cluster`` starts (its head and the worker nodes in
    Spark tasks, which do not see the driver's environment) get ``env`` too, through
    its start hook's ``custom_environment_variables``, which Ray on Spark computes on the
    driver and hands to every node it starts."""
    from ray.util.spark import cluster_init

    create = cluster_init._create_hook_entry

    def with_env(*args: Any, **kwargs: Any) -> Any:
        hook = create(*args, **kwargs)
        own = hook.custom_environment_variables
        hook.custom_environment_variables = lambda: {**own(), **env}
        return hook

    cluster_init._create_hook_entry = with_env
    try:
        yield
    finally:
        cluster_init._create_hook_entry = create


def _say(line: str) -> None:
    """A line of the run's output, within the open stage."""
    from raybricks import console

    if not getattr(console, "_quiet", False):
        console.say("  " * getattr(console, "_depth", 0) + line)


def shm_object_store_cap(nodes_on_this_machine: int = 1) -> int | None:
    """Largest object store (bytes) per node that fits in /dev/shm, or None if unknown."""
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        return None
    return int(free * SHM_SHARE / max(nodes_on_this_machine, 1))


#: Longest wait, seconds, for a cluster's executors to register before Ray is sized.
EXECUTOR_WAIT_S = 60.0
#: How long the count of registered executors must hold still when Spark does not say
#: how many to expect (standalone without ``spark.executor.instances``).
EXECUTORS_SETTLED_S = 3.0
#: Databricks' cluster tags (Spark confs) that give the cluster's size.
DATABRICKS_TAGS = "spark.databricks.clusterUsageTags."


@dataclass(frozen=True)
class Executor:
    """A Spark executor as it registered: its id, host and cores."""

    id: str
    host: str
    cores: int


def registered_executors(spark: SparkSession) -> list[Executor] | None:
    """The executors registered now (the driver left out), from Spark's status store;
    None where the JVM's internals cannot be read (py4j differs across runtimes)."""
    try:
        found = spark.sparkContext._jsc.sc().statusStore().executorList(True)
        summaries = [found.apply(i) for i in range(found.size())]
        return [Executor(str(e.id()), str(e.hostPort()).rsplit(":", 1)[0], int(e.totalCores()))
                for e in summaries if str(e.id()) != "driver"]
    except Exception:  # noqa: BLE001 - private API: fall back to the confs
        return None


def conf_int(conf: Any, key: str) -> int | None:
    """An integer Spark conf, or None when unset or not a number."""
    try:
        return int(conf.get(key, None))
    except (TypeError, ValueError):
        return None


def expected_executors(conf: Any) -> tuple[int | None, int | None, int | None]:
    """What Spark's confs say of the executors: (how many to wait for, fewest, most).

    Databricks' cluster tags (``clusterTargetWorkers``; ``clusterMinWorkers`` and
    ``clusterMaxWorkers`` with ``clusterScalingType: autoscaling``), dynamic allocation
    (``min/initial/maxExecutors``), else ``spark.executor.instances``. None: not said.
    """
    if conf.get(DATABRICKS_TAGS + "clusterScalingType", None) == "autoscaling":
        low = conf_int(conf, DATABRICKS_TAGS + "clusterMinWorkers")
        high = conf_int(conf, DATABRICKS_TAGS + "clusterMaxWorkers")
        return low, low, high
    target = conf_int(conf, DATABRICKS_TAGS + "clusterTargetWorkers")
    if target is not None:
        return target, None, None
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        low = conf_int(conf, "spark.dynamicAllocation.minExecutors") or 0
        initial = conf_int(conf, "spark.dynamicAllocation.initialExecutors")
        return max(initial or low, 1), low, conf_int(conf, "spark.dynamicAllocation.maxExecutors")
    local_cluster = re.fullmatch(r"local-cluster\[(\d+),.*\]", conf.get("spark.master", ""))
    if local_cluster:
        return int(local_cluster.group(1)), None, None
    return conf_int(conf, "spark.executor.instances"), None, None


def wait_for_executors(spark: SparkSession, expected: int | None,
                       timeout: float = EXECUTOR_WAIT_S, poll: float = 0.25
                       ) -> list[Executor] | None:
    """The executors, once ``expected`` of them registered (unknown: once their count
    held still for ``EXECUTORS_SETTLED_S``), within ``timeout`` seconds; None when the
    status store is out of reach. Right after a session starts, 0 or 1 of 2 executors
    may have registered."""
    deadline = time.monotonic() + timeout
    last: list[Executor] = []
    since = time.monotonic()
    while True:
        found = registered_executors(spark)
        if found is None:
            return None
        if len(found) != len(last):
            last, since = found, time.monotonic()
        settled = time.monotonic() - since >= EXECUTORS_SETTLED_S
        if (len(found) >= expected if expected else found and settled) \
                or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    if not found:
        raise ClusterError(
            f"no Spark executor registered within {timeout:.0f} s (master "
            f"{spark.sparkContext.master}): Ray on Spark starts its worker nodes in "
            "executors. Check that the cluster's workers are up (the Spark UI's Executors "
            "tab), or use cluster.mode=local to run Ray on this machine alone")
    if expected and len(found) < expected:
        log.warning("%d of %d expected Spark executors registered within %.0f s: sizing Ray "
                    "on those", len(found), expected, timeout)
    return found


def spark_capacity(spark: SparkSession, wait: float = EXECUTOR_WAIT_S) -> SparkCapacity:
    """Measure the Spark cluster: local[N] slots, or the executors once registered (at
    most ``wait`` seconds) with the cores they report."""
    sc = spark.sparkContext
    conf = sc.getConf()
    task_cpus = int(conf.get("spark.task.cpus", "1"))
    master = sc.master
    local = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if local:
        raw = local.group(1)
        machine = os.cpu_count() or 1
        slots = 1 if raw is None else machine if raw == "*" else int(raw)
        # local[N] may have more slots than the machine has cores; Ray gets the cores.
        return SparkCapacity(True, 1, max(slots // task_cpus, 1), min(slots, machine), task_cpus)
    to_wait, low, high = expected_executors(conf)
    executors = wait_for_executors(spark, to_wait, wait)
    if executors:
        count, cores = len(executors), min(e.cores for e in executors)
    else:  # the status store is out of reach: the confs, then Spark's parallelism
        count = max(to_wait or 1, 1)
        cores = conf_int(conf, "spark.executor.cores") or max(sc.defaultParallelism // count, 1)
    return SparkCapacity(False, max(high or 0, count), max(cores // task_cpus, 1), cores,
                         task_cpus, min_workers=low if high else None,
                         **spark_gpus(conf))


def spark_gpus(conf: Any) -> dict[str, Any]:
    """The GPUs Spark's confs give an executor and each task (0 when unset)."""
    try:
        task = float(conf.get("spark.task.resource.gpu.amount", "0") or 0)
    except ValueError:
        task = 0.0
    return {"gpus_per_worker": conf_int(conf, "spark.executor.resource.gpu.amount") or 0,
            "task_gpus": task}


def cluster_capacity(spark: SparkSession) -> SparkCapacity:
    """What Ray may use: on Databricks the cluster spec (all workers, also those an
    autoscaling or starting cluster has not registered yet), else Spark measured now."""
    measured = spark_capacity(spark)
    if measured.local_mode:
        return measured
    from raybricks.databricks import spark_cluster_sizing

    sizing = spark_cluster_sizing(spark)  # None off Databricks or on any error
    return measured if sizing is None else capacity_from_cluster_spec(measured, sizing)


def capacity_from_cluster_spec(measured: SparkCapacity, sizing: ClusterSizing) -> SparkCapacity:
    """The capacity a Databricks cluster spec declares, with Spark's ``task.cpus``."""
    return SparkCapacity(
        local_mode=False,
        workers=sizing.max_workers,
        slots_per_worker=max(sizing.cores_per_worker // measured.task_cpus, 1),
        cores_per_worker=sizing.cores_per_worker,
        task_cpus=measured.task_cpus,
        min_workers=sizing.min_workers if sizing.autoscaling else None,
        gpus_per_worker=measured.gpus_per_worker,
        task_gpus=measured.task_gpus,
    )


def spark_slots_left(capacity: SparkCapacity, cpus: int, nodes: int, gpus: int = 0) -> int:
    """Spark's task slots left while ``nodes`` Ray worker nodes of ``cpus`` CPUs (and
    ``gpus`` GPUs) hold theirs, placed as tightly as Spark may place them (filling one
    worker, then the next). Where Spark's tasks need GPUs, a slot needs them free too."""
    cores, task = capacity.cores_per_worker, capacity.task_cpus
    per_worker = max(cores // cpus, 1)
    full, rest = divmod(nodes, per_worker)
    if full + (1 if rest else 0) > capacity.workers:
        return 0

    def slots(ray_nodes: int) -> int:
        """Spark's slots on a worker that holds this many Ray worker nodes."""
        free = (cores - ray_nodes * cpus) // task
        if capacity.task_gpus > 0:
            gpus_left = capacity.gpus_per_worker - ray_nodes * gpus
            free = min(free, int(gpus_left // capacity.task_gpus))
        return max(free, 0)

    untouched = capacity.workers - full - (1 if rest else 0)
    return untouched * slots(0) + full * slots(per_worker) + (slots(rest) if rest else 0)


def ray_gpus(config: ClusterConfig, capacity: SparkCapacity, cpus: int, nodes: int) -> int:
    """GPUs per Ray worker node: ``cluster.num_gpus_worker_node``, else a Spark worker's
    GPUs (``spark.executor.resource.gpu.amount``) shared by the Ray worker nodes on it,
    less what Spark's own tasks need to keep a slot (``spark.task.resource.gpu.amount``
    above 0: one task's GPUs stay with Spark)."""
    have = capacity.gpus_per_worker
    per_worker = max(capacity.cores_per_worker // cpus, 1)
    if config.num_gpus_worker_node is not None:
        gpus = config.num_gpus_worker_node
        if gpus and have and gpus * min(per_worker, nodes) > have:
            raise ClusterError(
                f"cluster.num_gpus_worker_node={gpus} is more than a Spark worker's GPUs "
                f"(spark.executor.resource.gpu.amount={have}) for its Ray worker node(s): "
                "lower it, or leave it unset to use the workers' GPUs")
        if gpus and spark_slots_left(capacity, cpus, nodes, gpus) < 1:
            raise ClusterError(
                f"cluster.num_gpus_worker_node={gpus} takes the GPUs Spark's own tasks need "
                f"(spark.task.resource.gpu.amount={capacity.task_gpus:g} of the workers' "
                f"{have}), so Spark could not read or stage the data while Ray runs: set "
                "spark.task.resource.gpu.amount 0 in the cluster's Spark config, or lower it")
        return gpus
    gpus = have // min(per_worker, max(nodes, 1))
    while gpus > 0 and spark_slots_left(capacity, cpus, nodes, gpus) < 1:
        gpus -= 1
    return gpus


def ray_share(config: ClusterConfig, capacity: SparkCapacity) -> tuple[int, int]:
    """(CPUs per Ray worker node, most Ray worker nodes) on a Spark cluster.

    The rule: Ray on Spark's worker nodes are Spark tasks that run for as long as Ray
    does, so Spark keeps at least one task slot for its own jobs while Ray is up
    (reading, staging the data by segment, counting segments). By default Ray takes one
    worker node per Spark worker with every core but one Spark task's; workers of a
    single slot: every worker but one. A request that would leave Spark no slot is an
    error here, before anything starts.
    """
    cores, task = capacity.cores_per_worker, capacity.task_cpus
    cluster = f"{capacity.workers} Spark worker(s) x {cores} core(s), spark.task.cpus={task}"
    cpus = config.num_cpus_worker_node or (cores - task if cores >= 2 * task else cores)
    if cpus > cores:
        raise ClusterError(
            f"cluster.num_cpus_worker_node={cpus} is more than a Spark worker has "
            f"({cores} cores): lower it or pick a larger node type")
    available = capacity.workers * max(cores // cpus, 1)
    if config.max_worker_nodes is None:
        nodes = min(capacity.workers, available)
        while nodes > 0 and spark_slots_left(capacity, cpus, nodes) < 1:
            nodes -= 1
        if nodes == 0:
            raise ClusterError(
                f"the Spark cluster has a single task slot ({cluster}): a Ray worker node "
                "would hold it for as long as Ray runs, and Spark's own jobs (reading the "
                "source, staging it by segment) would wait forever. Add a worker or cores, "
                "or run Ray on this machine alone with cluster.mode=local")
        return cpus, nodes
    nodes = config.max_worker_nodes
    if config.min_worker_nodes is None and nodes > available:
        raise ClusterError(
            f"cluster.max_worker_nodes={nodes} x {cpus} CPUs is more than the Spark cluster "
            f"has now ({cluster}): lower it, set min_worker_nodes to autoscale, or add "
            "workers")
    if spark_slots_left(capacity, cpus, min(nodes, available)) < 1:
        raise ClusterError(
            f"cluster.max_worker_nodes={nodes} x num_cpus_worker_node={cpus} would take "
            f"every Spark task slot ({cluster}); Ray's worker nodes hold theirs for as long "
            "as Ray runs, so Spark's own jobs (reading the source, staging it by segment) "
            "would wait forever. Leave Spark one slot: lower max_worker_nodes or "
            "num_cpus_worker_node, or leave both unset for raybricks' default")
    return cpus, nodes


def ray_on_spark_arguments(config: ClusterConfig, capacity: SparkCapacity) -> dict[str, Any]:
    """Translate a ClusterConfig into ``setup_ray_cluster`` keyword arguments.

    Raises ClusterError when the request exceeds what the Spark cluster has, or would
    leave Spark no task slot while Ray runs.
    """
    args: dict[str, Any] = {}
    if capacity.local_mode:
        if config.num_cpus_worker_node is not None or config.num_gpus_worker_node is not None:
            raise ClusterError(
                "cluster.num_cpus_worker_node / num_gpus_worker_node cannot be set with Spark "
                "in local mode (Spark has no stage scheduling there; each Ray worker node gets "
                "spark.task.cpus CPUs): leave them unset, or use num_cpus_head_node"
            )
        max_nodes = config.max_worker_nodes or 1
        if max_nodes >= capacity.total_slots:
            raise ClusterError(
                f"cluster.max_worker_nodes={max_nodes} Ray worker node(s) would take every "
                f"task slot local Spark has ({capacity.total_slots}), and Spark's own jobs "
                "would wait forever: lower it, or start Spark with more slots (local[N])"
            )
        # Each worker node gets spark.task.cpus CPUs; the head node takes the rest, so
        # Ray sees every core while Spark keeps free slots for reading and staging.
        head_cpus = config.num_cpus_head_node
        if head_cpus is None:
            head_cpus = max(capacity.cores_per_worker - max_nodes * capacity.task_cpus, 0)
        args["num_cpus_head_node"] = head_cpus
    else:
        cpus, max_nodes = ray_share(config, capacity)
        args["num_cpus_worker_node"] = cpus
        args["num_gpus_worker_node"] = ray_gpus(config, capacity, cpus, max_nodes)
        if config.num_cpus_head_node is not None:
            args["num_cpus_head_node"] = config.num_cpus_head_node
        if config.min_worker_nodes is None and capacity.min_workers is not None:
            # an autoscaling Spark cluster: let Ray scale between the same bounds
            args["min_worker_nodes"] = min(capacity.min_workers, max_nodes)
    args["max_worker_nodes"] = max_nodes
    if config.min_worker_nodes is not None:
        args["min_worker_nodes"] = config.min_worker_nodes
    optional = {
        "num_gpus_head_node": config.num_gpus_head_node,
        "memory_worker_node": config.memory_worker_node,
        "object_store_memory_worker_node": config.object_store_memory_worker_node,
        "memory_head_node": config.memory_head_node,
        "object_store_memory_head_node": config.object_store_memory_head_node,
        "ray_temp_root_dir": config.temp_dir,
        "collect_log_to_path": config.log_dir,
    }
    args.update({key: value for key, value in optional.items() if value is not None})
    if capacity.local_mode and "object_store_memory_head_node" not in args:
        cap = shm_object_store_cap(nodes_on_this_machine=max_nodes + 1)
        if cap is not None:
            args["object_store_memory_head_node"] = min(cap, 2 * 1024**3)
    return args


def require_gpus(gpus: dict[str, float], node_gpus: float, where: str) -> None:
    """Refuse a job whose candidates ask for more GPUs per task (``gpus``: candidate ->
    ``resources.num_gpus``) than a Ray node has (``node_gpus``: the most of any node)."""
    if not gpus or max(gpus.values()) <= node_gpus:
        return
    asked = ", ".join(f"{name}: {amount:g}" for name, amount in gpus.items())
    raise ClusterError(
        f"candidate(s) ask for GPUs (resources.num_gpus: {asked}) but {where} has "
        f"{node_gpus:g} GPU(s) per node, so their tasks would wait forever. Run on a GPU "
        "cluster (a GPU node type: Databricks sets spark.executor.resource.gpu.amount, "
        "which raybricks gives Ray), set cluster.num_gpus_worker_node (or "
        "num_gpus_head_node), or drop resources.num_gpus from those candidates")


def planned_gpus(args: dict[str, Any]) -> float:
    """The most GPUs a Ray node started with ``setup_ray_cluster(**args)`` will have."""
    return max(args.get("num_gpus_worker_node") or 0, args.get("num_gpus_head_node") or 0)


def ray_node_gpus() -> float:
    """The most GPUs any live node of the connected Ray has."""
    import ray

    return max((node["Resources"].get("GPU", 0) for node in ray.nodes() if node["Alive"]),
               default=0)


def resolve_mode(config: ClusterConfig) -> str:
    """The concrete mode for ``auto``: an address if one is known, else Ray on Spark."""
    if config.mode != "auto":
        return config.mode
    return "address" if (config.address or os.environ.get("RAY_ADDRESS")) else "spark"


def _refuse_if_ray_running() -> None:
    import ray

    if ray.is_initialized():
        raise ClusterError(
            "Ray is already initialised in this process (a ray.init() elsewhere): call "
            "ray.shutdown() first, or use cluster.mode=auto (or address) to run on it"
        )


def _attach_if_connected(config: ClusterConfig) -> RayCluster | None:
    """The Ray this process is already connected to (a notebook that started Ray on
    Spark, say), when the config lets raybricks use it: mode auto, or address with no
    other address. It stays connected afterwards: not ours to stop."""
    import ray

    if not ray.is_initialized() or config.mode not in ("auto", "address"):
        return None
    address = ray.get_runtime_context().gcs_address
    if config.mode == "address" and config.address and config.address not in (
            address, f"ray://{address}"):
        raise ClusterError(
            f"this process is connected to Ray at {address}, not cluster.address="
            f"{config.address!r}: call ray.shutdown() first, or drop cluster.address"
        )
    return RayCluster("attached", address, {"address": address}, _owned=False)


def start_ray(
    config: ClusterConfig | None = None, spark: SparkSession | None = None,
    gpus: dict[str, float] | None = None,
) -> RayCluster:
    """Start or connect to Ray as ``config`` says and connect this driver to it.
    ``gpus``: the GPUs a task of each GPU candidate asks for; a Ray without them is
    refused (before it starts where the config or Spark's confs say so)."""
    config = config or ClusterConfig()
    gpus = gpus or {}
    attached = _attach_if_connected(config)
    if attached is None:
        mode = resolve_mode(config)
        _refuse_if_ray_running()
        if mode == "local":
            require_gpus(gpus, config.num_gpus_head_node or 0,
                         "a local Ray (cluster.num_gpus_head_node)")
        auth = ray_auth(mode)
        log.info(auth.says)
        before = auth_env_set(auth.env)  # the driver's Ray reads it, and the head's
        try:
            runtime_env = {"env_vars": forwarded_env(config.forward_env)}
            if mode == "address":
                cluster = _connect(config.address or os.environ["RAY_ADDRESS"], runtime_env)
            elif mode == "local":
                cluster = _start_local(config, runtime_env)
            else:
                cluster = _start_on_spark(config, spark, runtime_env, gpus, auth)
        except BaseException:
            auth_env_restored(before)
            raise
        cluster.auth, cluster._auth_before = auth, before
    else:
        cluster = attached
    if gpus and not autoscales(cluster):  # an autoscaling Ray adds its GPU nodes on demand
        try:
            require_gpus(gpus, ray_node_gpus(), f"the Ray cluster at {cluster.address}")
        except ClusterError:
            stop_ray(cluster)
            raise
    return cluster


def autoscales(cluster: RayCluster) -> bool:
    """Whether Ray on Spark was started to scale between fewer and more worker nodes."""
    low = cluster.settings.get("min_worker_nodes")
    return cluster.mode == "spark" and low is not None and low < cluster.settings.get(
        "max_worker_nodes", low)


def _connect(address: str, runtime_env: dict[str, Any]) -> RayCluster:
    import ray

    try:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    except (ConnectionError, RuntimeError) as exc:
        refused = _refused_for_its_token(exc)
        raise ClusterError(
            f"cannot connect to Ray at {address!r} ({exc}): " + (
                "the cluster requires a token this driver did not send, or another one: "
                f"give the cluster's token in {AUTH_TOKEN} (or a file named by "
                f"{AUTH_TOKEN_PATH})" if refused else
                "check the address and that the cluster is running (`ray status --address "
                f"...`); a cluster that requires a token: give it in {AUTH_TOKEN}")
        ) from exc
    return RayCluster("address", address, {"address": address}, _owned=False)


def _refused_for_its_token(exc: BaseException) -> bool:
    """Whether Ray refused the connection for a missing or wrong token (what Ray says
    of each attempt, in the error it chains)."""
    seen: BaseException | None = exc
    while seen is not None:
        if re.search(r"InvalidAuthToken|Unauthenticated|AuthenticationError", str(seen)) \
                or type(seen).__name__ == "AuthenticationError":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _start_local(config: ClusterConfig, runtime_env: dict[str, Any]) -> RayCluster:
    import ray

    settings: dict[str, Any] = {"num_cpus": config.num_cpus or os.cpu_count() or 1}
    if config.num_gpus_head_node is not None:
        settings["num_gpus"] = config.num_gpus_head_node
    store = config.object_store_memory_head_node or shm_object_store_cap()
    if store:
        settings["object_store_memory"] = int(min(store, 2 * 1024**3))
    if config.temp_dir:
        settings["_temp_dir"] = config.temp_dir
    prepare_executor_environment()
    context = ray.init(
        address="local",  # never RAY_ADDRESS: this mode always starts its own Ray
        include_dashboard=False,
        runtime_env=runtime_env,
        log_to_driver=False,
        **settings,
    )
    return RayCluster("local", context.address_info["address"], settings)


def _start_on_spark(
    config: ClusterConfig, spark: SparkSession | None, runtime_env: dict[str, Any],
    gpus: dict[str, float], auth: RayAuth | None = None,
) -> RayCluster:
    import ray
    from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

    spark = spark or active_spark()
    require_spark_context(spark, "Ray on Spark")
    if spark is None:
        raise SetupError(
            "no active SparkSession: on Databricks run inside a notebook or job; locally "
            "call raybricks.session.local_spark_session() first (or pass spark=...), or "
            "use cluster.mode=local for a plain local Ray"
        )
    capacity = cluster_capacity(spark)
    args = ray_on_spark_arguments(config, capacity)
    require_gpus(gpus, planned_gpus(args),
                 f"Ray on this Spark cluster (spark.executor.resource.gpu.amount="
                 f"{capacity.gpus_per_worker}, spark.task.resource.gpu.amount="
                 f"{capacity.task_gpus:g}; Spark keeps one task's GPUs)")
    _check_executor_environment(spark)
    log.info("starting Ray on Spark with %s (Spark: %s)", args, capacity)
    try:
        # the nodes' auth as the driver's (the worker nodes' Spark tasks see none of its
        # environment): also "disabled", where a later Ray would turn a token on itself
        nodes = (ray_nodes_given(auth.env) if auth and auth.env and not
                 token_auth_missing("spark") else contextlib.nullcontext())
        with head_start_polled(), dashboard_bound(config.dashboard_host), nodes:
            head_address, _client_address = setup_ray_cluster(**args)
    except Exception as exc:
        raise ClusterError(
            f"Ray on Spark did not start: {type(exc).__name__}: {exc}. It was asked for "
            f"{args.get('max_worker_nodes')} worker node(s) of "
            f"{args.get('num_cpus_worker_node', capacity.task_cpus)} CPU(s) on {capacity.workers} "
            f"Spark worker(s) of {capacity.cores_per_worker} core(s); the Ray logs are under "
            f"{config.temp_dir or '/tmp/ray'} (Ray on Spark's session folder)"
        ) from exc
    try:
        ray.init(address=head_address, runtime_env=runtime_env, log_to_driver=False)
    except BaseException:
        shutdown_ray_cluster()
        raise
    return RayCluster("spark", head_address, args)


@contextlib.contextmanager
def dashboard_bound(host: str) -> Iterator[None]:
    """Within: Ray on Spark binds the Ray dashboard to ``host`` instead of every
    interface (``0.0.0.0``, which it does not let a caller change). Ray versions that
    write the address literally (2.37) keep binding every interface."""
    from ray.util.spark import cluster_init

    every_interface = getattr(cluster_init, "get_all_interfaces_ip", None)
    wait_service_up = getattr(cluster_init, "_wait_service_up", None)
    if every_interface is None or wait_service_up is None:
        yield
        return

    def dashboard_up(address: str, port: int, timeout: float) -> bool:
        """Ray waits for the dashboard at the head's address: where it listens instead."""
        return wait_service_up(address if host in ("0.0.0.0", "::") else host, port, timeout)

    cluster_init.get_all_interfaces_ip = lambda: host
    cluster_init._wait_service_up = dashboard_up  # Ray on Spark's only use: the dashboard
    try:
        yield
    finally:
        cluster_init.get_all_interfaces_ip = every_interface
        cluster_init._wait_service_up = wait_service_up


#: Longest wait, seconds, for the Ray head node to answer while Ray on Spark starts.
HEAD_START_LIMIT_S = 60.0
#: Seconds between two counts of the Ray worker nodes that joined, while Ray on Spark starts.
WORKERS_POLLED = 0.25


@contextlib.contextmanager
def head_start_polled(interval: float = 0.2) -> Iterator[None]:
    """Within: Ray on Spark polls the head node's port instead of sleeping a fixed 20 s,
    and counts the worker nodes that joined every ``WORKERS_POLLED`` seconds, not 3.

    ``setup_ray_cluster`` sleeps ``_RAY_HEAD_STARTUP_TIMEOUT`` seconds, then checks the
    port once (Ray 2.37 to 2.60 alike). Here it checks at once and every ``interval``
    seconds until the port answers or ``HEAD_START_LIMIT_S`` have passed (Ray's 20 s is
    too short for a busy 2-core machine that also runs the executors' JVMs): the same
    error, as soon as the head answers (about 11 s sooner on a 2-core machine).
    Then it waits for the worker nodes, looking every
    ``_RAY_CLUSTER_STARTUP_PROGRESS_CHECKING_INTERVAL`` seconds (3; 1.5 s of waiting on
    average after the last one joined). And the head does not hold the machine's
    worker-start lock for ``_RAY_WORKER_NODE_STARTUP_INTERVAL`` (10 s) after taking its
    worker ports: a worker node on the same machine (local Spark, a single-node cluster)
    asking for the lock within those 10 s waited 10 s more, in about one start in three
    here. Only the head, which starts before any worker node can be asked for, is
    affected: worker nodes, started by Spark in other processes, keep the hold between
    them. Ray versions without these names are left alone.
    """
    from ray.util.spark import cluster_init

    limit = getattr(cluster_init, "_RAY_HEAD_STARTUP_TIMEOUT", None)
    port_in_use = getattr(cluster_init, "is_port_in_use", None)
    if not isinstance(limit, int | float) or not callable(port_in_use):
        yield
        return

    def port_in_use_within_limit(host: str, port: int) -> bool:
        deadline = time.monotonic() + max(limit, HEAD_START_LIMIT_S)
        while not port_in_use(host, port):
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)
        return True

    changed = {name: value for name, value in {
        "_RAY_CLUSTER_STARTUP_PROGRESS_CHECKING_INTERVAL": WORKERS_POLLED,
        "_RAY_WORKER_NODE_STARTUP_INTERVAL": 0,
    }.items() if isinstance(getattr(cluster_init, name, None), int | float)}
    kept = {name: getattr(cluster_init, name) for name in changed}
    cluster_init._RAY_HEAD_STARTUP_TIMEOUT = 0
    cluster_init.is_port_in_use = port_in_use_within_limit
    for name, value in changed.items():
        setattr(cluster_init, name, value)
    try:
        yield
    finally:
        cluster_init._RAY_HEAD_STARTUP_TIMEOUT = limit
        cluster_init.is_port_in_use = port_in_use
        for name, value in kept.items():
            setattr(cluster_init, name, value)


def _executor_probe() -> Callable[[Iterable[Any]], list[dict[str, str | None]]]:
    """What Ray on Spark needs on an executor, as a local function: cloudpickle ships it
    by value, so it runs in any executor Python, also one without raybricks."""

    def probe(_: Iterable[Any]) -> list[dict[str, str | None]]:
        import importlib.util
        import shutil
        import sys

        found: dict[str, str | None] = {"python": sys.executable, "error": None}
        try:  # imports ray and ray.util.spark with it
            if importlib.util.find_spec(START_RAY_NODE) is None:
                found["error"] = f"no module {START_RAY_NODE}"
        except Exception as exc:  # noqa: BLE001 - ray missing or broken: report either
            found["error"] = f"{type(exc).__name__}: {exc}"
        found["ray"] = getattr(sys.modules.get("ray"), "__version__", None)
        found["ray_cli"] = shutil.which("ray")
        return [found]

    return probe


def executor_problem(found: dict[str, str | None], driver_ray: str) -> str | None:
    """What keeps Ray on Spark from starting worker nodes on an executor, or None.

    Ray on Spark runs ``<executor python> -m ray.util.spark.start_ray_node``, which runs
    ``<executor python> $(which ray) start``: both and the driver's Ray version are needed.
    """
    python = found["python"]
    fix = (f"install raybricks (or ray=={driver_ray}) in the executors' Python environment, "
           "or set PYSPARK_PYTHON (spark.pyspark.python) to the driver's environment before "
           "Spark starts (raybricks.session.local_spark_session() does this)")
    if found["error"]:
        return (f"Spark executors run {python}, which cannot import {START_RAY_NODE} "
                f"({found['error']}); Ray on Spark starts its worker nodes with "
                f"`{python} -m {START_RAY_NODE}`: {fix}")
    if found["ray"] != driver_ray:
        return (f"Spark executors run Ray {found['ray']} ({python}) but the driver runs Ray "
                f"{driver_ray}; Ray nodes of other versions cannot join the driver's Ray: "
                f"{fix}")
    if found["ray_cli"] is None:
        return (f"Spark executors find no `ray` command on their PATH; Ray on Spark's "
                f"{START_RAY_NODE} runs `{python} $(which ray) start`: put the bin directory "
                "of the executors' Python environment on their PATH (spark.executorEnv.PATH) "
                "before Spark starts (raybricks.session.local_spark_session() does this)")
    return None


def _check_executor_environment(spark: SparkSession) -> None:
    """Fail fast, before the slow start-up, when executors cannot run Ray worker nodes."""
    import ray

    found = spark.sparkContext.parallelize([0], 1).mapPartitions(
        _executor_probe()
    ).collect()[0]
    problem = executor_problem(found, ray.__version__)
    if problem:
        raise SetupError(problem)


def stop_ray(cluster: RayCluster | None) -> None:
    """Disconnect the driver and shut down whatever ``start_ray`` started. Idempotent.
    A Ray the process was connected to before (mode ``attached``) is left as it was."""
    import ray

    if cluster is not None and cluster.mode == "attached":
        return
    if ray.is_initialized():
        ray.shutdown()
    if cluster is not None and cluster.mode == "spark" and cluster._owned:
        stop_ray_on_spark()
        cluster._owned = False
    if cluster is not None:
        auth_env_restored(cluster._auth_before)
        cluster._auth_before = {}


@contextlib.contextmanager
def ray_cluster(
    config: ClusterConfig | None = None, spark: SparkSession | None = None,
    timings: dict[str, float] | None = None, gpus: dict[str, float] | None = None,
) -> Iterator[RayCluster]:
    """Start (or connect to) Ray for the block and always shut it down afterwards (two
    stages, ``cluster`` and ``shutdown`` in ``timings``; ``gpus``: as ``start_ray``).

    >>> with ray_cluster(ClusterConfig(mode="local", num_cpus=2)) as cluster:
    ...     cluster.num_cpus
    2
    """
    from raybricks.console import sigterm_as_interrupt, stage

    cluster: RayCluster | None = None
    started = RayOnSparkStart()
    # SIGTERM stops the block as Ctrl-C does, from the start of Ray on: what an interrupted
    # start launched is stopped too (a head node, the Spark job server and its threads)
    with sigterm_as_interrupt() as install_again:
        try:
            with (stage("cluster", timings, "Ray: start (on Spark) or connect"),
                  ray_on_spark_output_logged(started), sigterm_kept_by_ray_init(install_again)):
                cluster = start_ray(config, spark, gpus)
                _say(cluster.auth.says if cluster.auth else
                     "Ray: connected before; its authentication is left as it is")
            yield cluster
        finally:
            with stage("shutdown", timings, "Ray: shut down"):
                stop_ray(cluster)
                stop_ray_on_spark(started)


def spark_session(config: SparkConfig | None = None) -> SparkSession:
    """The SparkSession that reads the source: the active one, or a new one on the
    master ``config`` (or the environment) names, else local."""
    config = config or SparkConfig()
    return active_spark() or local_spark_session(master=config.master, conf=config.conf)


# ------------------------------------------- Ray on Spark's output, and stopping what it started

#: The loggers of what Ray on Spark prints as it starts (the run's log keeps them, as the
#: ``ray`` logger's children): its head node's output (``ray start``, the head's lines
#: until it stops) and what the driver prints while it waits for the worker nodes (the
#: autoscaler's events, "Adding 1 node(s) of type ray.worker.").
HEAD_NODE_LOG = "ray.util.spark.head"
DRIVER_LOG = "ray.util.spark.driver"
#: Seconds Ray on Spark's head node has to exit once told to stop (``ray start`` stops its
#: processes, then ``start_ray_node`` removes its temp dir); then what is left is killed.
HEAD_EXIT_S = 10.0
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class RayOnSparkStart:
    """What ``setup_ray_cluster`` launched in this process, kept to stop it after an
    interrupted start: the head node's process (a process group of its own), the thread
    that logs its output, and the Spark job server (which starts the worker nodes)."""

    head: Any = None  # subprocess.Popen
    reader: threading.Thread | None = None
    job_server: Any = None


class _LinesToLog:
    """A text stream whose lines go to a logger (INFO), without terminal colours."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger, self._pending = logger, ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            if line.strip():
                self._logger.info(_COLOURS.sub("", line.rstrip()))
        return len(text)

    def flush(self) -> None:
        """Log a last line without its newline."""
        if self._pending:
            self.write("\n")


@contextlib.contextmanager
def ray_on_spark_output_logged(started: RayOnSparkStart | None = None
                               ) -> Iterator[RayOnSparkStart]:
    """Within: Ray on Spark's head node writes its output into a pipe, whose lines a
    daemon thread logs to HEAD_NODE_LOG, not to this process' stdout (``ray start``'s
    lines, then the head's until it stops); what Ray prints on the driver while it waits
    for the worker nodes (the autoscaler's events) goes to DRIVER_LOG. So a run's log
    keeps them in the Python API (a notebook's output is no file descriptor to redirect)
    as in the CLI. What is launched is recorded in ``started`` (yielded), for
    ``stop_ray_on_spark``. A Ray without these functions is left as it is."""
    started = started if started is not None else RayOnSparkStart()
    try:
        from ray._private import worker
        from ray.autoscaler._private.spark import spark_job_server
        from ray.util.spark import cluster_init
    except ImportError:  # pragma: no cover - Ray on Spark always has them
        yield started
        return
    start_head = getattr(cluster_init, "_start_ray_head_node", None)
    start_server = getattr(spark_job_server, "_start_spark_job_server", None)
    print_logs = getattr(worker, "print_worker_logs", None)
    driver = _LinesToLog(logging.getLogger(DRIVER_LOG))

    def head_logged(command: list[str], synchronous: bool, extra_env: dict[str, str]):
        if synchronous:
            return start_head(command, synchronous, extra_env)
        started.head, tail, started.reader = _start_head_logged(command, extra_env)
        return started.head, tail

    def server_kept(*args: Any, **kwargs: Any) -> Any:
        started.job_server = start_server(*args, **kwargs)
        return started.job_server

    def printed_to_log(data: dict, print_file: Any, *args: Any, **kwargs: Any) -> None:
        print_logs(data, driver, *args, **kwargs)

    patched = [(module, name, old, new) for module, name, old, new in (
        (cluster_init, "_start_ray_head_node", start_head, head_logged),
        (spark_job_server, "_start_spark_job_server", start_server, server_kept),
        (worker, "print_worker_logs", print_logs, printed_to_log),
    ) if callable(old)]
    for module, name, _, new in patched:
        setattr(module, name, new)
    try:
        yield started
    finally:
        for module, name, old, _ in patched:
            setattr(module, name, old)
        driver.flush()


def _start_head_logged(command: list[str], extra_env: dict[str, str]
                       ) -> tuple[Any, Any, threading.Thread]:
    """Ray on Spark's ``_start_ray_head_node`` (its own process group, which a notebook's
    interrupt does not reach), its output read by a daemon thread into HEAD_NODE_LOG: the
    process, its last 100 lines (Ray's error message quotes them) and the thread."""
    import collections
    import subprocess

    process = subprocess.Popen(command, env={**os.environ, **extra_env}, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               process_group=0)
    tail: collections.deque[str] = collections.deque(maxlen=100)
    logged = _LinesToLog(logging.getLogger(HEAD_NODE_LOG))

    def read() -> None:
        for line in process.stdout:
            tail.append(line)
            logged.write(line)
        logged.flush()  # a last line without its newline

    reader = threading.Thread(target=read, name="raybricks-ray-head-output", daemon=True)
    reader.start()
    return process, tail, reader


def stop_ray_on_spark(started: RayOnSparkStart | None = None, wait: float = HEAD_EXIT_S
                      ) -> None:
    """Shut Ray on Spark down as this process started it: the active cluster
    (``shutdown_ray_cluster``) or, given ``started``, what that start launched: the
    active cluster if it is that one, else what the interrupted start left, its Spark job
    server (whose shut-down cancels the worker nodes' Spark jobs: their slots come back
    and their ``start_ray_node`` stops them) and its head node. Then wait up to ``wait``
    seconds for the head node to exit, kill what is left of its process group, and let
    its last lines be logged. Idempotent."""
    if started is not None and started.head is None and started.job_server is None:
        return  # nothing launched (another mode, or a start that failed before)
    from ray.util.spark import cluster_init

    active = getattr(cluster_init, "_active_ray_cluster", None)
    if started is None:
        started, head = RayOnSparkStart(), getattr(active, "head_proc", None)
    else:
        head = started.head
    if active is not None and head is not None and active.head_proc is head:
        with contextlib.suppress(Exception):
            cluster_init.shutdown_ray_cluster()
    else:
        server = started.job_server
        stopped = getattr(server, "_BaseServer__is_shut_down", None)  # socketserver's
        if server is not None and not (stopped is not None and stopped.is_set()):
            with contextlib.suppress(Exception):
                server.shutdown()
        if head is not None and head.poll() is None:
            head.terminate()
    if head is not None:
        _head_exited(head, wait)
    if started.reader is not None:  # its last lines, read once the head has exited
        started.reader.join(timeout=2.0)


def _head_exited(head: Any, wait: float) -> None:
    """Wait for the head node's process to exit, then kill what is left of its process
    group (Ray processes that ``ray start`` left behind); after ``wait`` seconds, kill
    them all. A head reaped before is left alone (its pid may name another process)."""
    import subprocess

    if head.returncode is not None:
        return
    try:
        group = os.getpgid(head.pid)  # an exited process not yet reaped has one too
    except ProcessLookupError:
        group = None
    try:
        head.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        log.warning("Ray on Spark's head node was still running %.0f s after it was told "
                    "to stop: killed", wait)
    if group == head.pid and group != os.getpgrp():  # its own group, not this process'
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=wait)


@contextlib.contextmanager
def sigterm_kept_by_ray_init(install: Callable[[], None]) -> Iterator[None]:
    """Within: each ``ray.init`` on the main thread (also Ray on Spark's own, while it
    waits for its worker nodes) is followed by ``install``, which sets the SIGTERM handler
    again: ``ray.init`` sets one of its own (SystemExit), and its core worker another,
    below Python's (it prints a stack trace and aborts the process, clean-up skipped)."""
    import functools

    import ray

    init = ray.init

    @functools.wraps(init)
    def init_then_install(*args: Any, **kwargs: Any) -> Any:
        context = init(*args, **kwargs)
        if threading.current_thread() is threading.main_thread():
            install()
        return context

    ray.init = init_then_install
    try:
        yield
    finally:
        ray.init = init
