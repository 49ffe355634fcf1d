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
from typing import TYPE_CHECKING, Any

from raybricks.config import ClusterConfig
from raybricks.errors import ClusterError, SetupError
from raybricks.session import active_spark, local_spark_session, prepare_executor_environment

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


def disable_ray_token_auth() -> None:
    """Pin RAY_AUTH_MODE so a stale ``~/.ray/auth_token`` cannot lock out the driver.

    After any plain ``ray.init()`` Ray writes that file; a later head started with the
    mode unset turns token auth on and the driver is refused (``InvalidAuthToken``).
    A value the user set is kept.
    """
    if not os.environ.get("RAY_AUTH_MODE"):
        os.environ["RAY_AUTH_MODE"] = "disabled"


def shm_object_store_cap(nodes_on_this_machine: int = 1) -> int | None:
    """Largest object store (bytes) per node that fits in /dev/shm, or None if unknown."""
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        return None
    return int(free * SHM_SHARE / max(nodes_on_this_machine, 1))


def spark_capacity(spark: SparkSession) -> SparkCapacity:
    """Measure the Spark cluster: local[N] slots, or executors and their cores."""
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
    executors = _executor_count(spark)
    cores = int(conf.get("spark.executor.cores", "0")) or max(
        sc.defaultParallelism // max(executors, 1), 1
    )
    return SparkCapacity(False, executors, max(cores // task_cpus, 1), cores, task_cpus)


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
    )


def _executor_count(spark: SparkSession) -> int:
    """Executors registered now (the driver excluded), at least 1."""
    try:
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
        return max(status.size() - 1, 1)
    except Exception:  # noqa: BLE001 - py4j internals differ across runtimes
        return max(int(spark.sparkContext.getConf().get("spark.executor.instances", "1")), 1)


def ray_on_spark_arguments(config: ClusterConfig, capacity: SparkCapacity) -> dict[str, Any]:
    """Translate a ClusterConfig into ``setup_ray_cluster`` keyword arguments.

    Raises ClusterError when the request exceeds what the Spark cluster has.
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
        if max_nodes > capacity.total_slots:
            raise ClusterError(
                f"cluster.max_worker_nodes={max_nodes} asks for more Ray worker nodes than "
                f"local Spark has task slots ({capacity.total_slots}): lower it, or start Spark "
                f"with more cores (local[N])"
            )
        # Each worker node gets spark.task.cpus CPUs; the head node takes the rest, so
        # Ray sees every core while Spark keeps free slots for reading and staging.
        head_cpus = config.num_cpus_head_node
        if head_cpus is None:
            head_cpus = max(capacity.cores_per_worker - max_nodes * capacity.task_cpus, 0)
        args["num_cpus_head_node"] = head_cpus
    else:
        cpus = config.num_cpus_worker_node or capacity.cores_per_worker
        if cpus > capacity.cores_per_worker:
            raise ClusterError(
                f"cluster.num_cpus_worker_node={cpus} is more than a Spark worker has "
                f"({capacity.cores_per_worker} cores): lower it or pick a larger node type"
            )
        nodes_per_worker = max(capacity.cores_per_worker // cpus, 1)
        available = capacity.workers * nodes_per_worker
        max_nodes = config.max_worker_nodes or available
        if config.min_worker_nodes is None and max_nodes > available:
            raise ClusterError(
                f"cluster.max_worker_nodes={max_nodes} x {cpus} CPUs is more than the Spark "
                f"cluster has now ({capacity.workers} workers x {capacity.cores_per_worker} "
                f"cores): lower it, set min_worker_nodes to autoscale, or add workers"
            )
        args["num_cpus_worker_node"] = cpus
        args["num_gpus_worker_node"] = config.num_gpus_worker_node or 0
        if config.num_cpus_head_node is not None:
            args["num_cpus_head_node"] = config.num_cpus_head_node
        if config.min_worker_nodes is None and capacity.min_workers is not None:
            # an autoscaling Spark cluster: let Ray scale between the same bounds
            args["min_worker_nodes"] = min(capacity.min_workers * nodes_per_worker, max_nodes)
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
    config: ClusterConfig | None = None, spark: SparkSession | None = None
) -> RayCluster:
    """Start or connect to Ray as ``config`` says and connect this driver to it."""
    config = config or ClusterConfig()
    attached = _attach_if_connected(config)
    if attached is not None:
        return attached
    mode = resolve_mode(config)
    disable_ray_token_auth()
    _refuse_if_ray_running()
    runtime_env = {"env_vars": forwarded_env(config.forward_env)}
    if mode == "address":
        return _connect(config.address or os.environ["RAY_ADDRESS"], runtime_env)
    if mode == "local":
        return _start_local(config, runtime_env)
    return _start_on_spark(config, spark, runtime_env)


def _connect(address: str, runtime_env: dict[str, Any]) -> RayCluster:
    import ray

    try:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    except (ConnectionError, RuntimeError) as exc:
        raise ClusterError(
            f"cannot connect to Ray at {address!r} ({exc}): check the address and that the "
            "cluster is running (`ray status --address ...`)"
        ) from exc
    return RayCluster("address", address, {"address": address}, _owned=False)


def _start_local(config: ClusterConfig, runtime_env: dict[str, Any]) -> RayCluster:
    import ray

    settings: dict[str, Any] = {"num_cpus": config.num_cpus or os.cpu_count() or 1}
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
    config: ClusterConfig, spark: SparkSession | None, runtime_env: dict[str, Any]
) -> RayCluster:
    import ray
    from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

    spark = spark or active_spark()
    if spark is None:
        raise SetupError(
            "no active SparkSession: on Databricks run inside a notebook or job; locally "
            "call raybricks.session.local_spark_session() first (or pass spark=...), or "
            "use cluster.mode=local for a plain local Ray"
        )
    _check_executor_environment(spark)
    args = ray_on_spark_arguments(config, cluster_capacity(spark))
    log.info("starting Ray on Spark with %s", args)
    try:
        with head_start_polled():
            head_address, _client_address = setup_ray_cluster(**args)
    except Exception as exc:
        raise ClusterError(
            f"Ray on Spark did not start: {exc}. See the Ray logs under "
            f"{config.temp_dir or '/tmp/ray'}; check free ports and memory"
        ) from exc
    try:
        ray.init(address=head_address, runtime_env=runtime_env, log_to_driver=False)
    except BaseException:
        shutdown_ray_cluster()
        raise
    return RayCluster("spark", head_address, args)


#: Seconds between two counts of the Ray worker nodes that joined, while Ray on Spark starts.
WORKERS_POLLED = 0.25


@contextlib.contextmanager
def head_start_polled(interval: float = 0.2) -> Iterator[None]:
    """Within: Ray on Spark polls the head node's port instead of sleeping a fixed 20 s,
    and counts the worker nodes that joined every ``WORKERS_POLLED`` seconds, not 3.

    ``setup_ray_cluster`` sleeps ``_RAY_HEAD_STARTUP_TIMEOUT`` seconds, then checks the
    port once (Ray 2.37 to 2.60 alike). Here it checks at once and every ``interval``
    seconds until the port answers or as many seconds have passed: the same limit and
    the same error, as soon as the head answers (about 11 s sooner on a 2-core machine).
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
    try:
        from ray.util.spark import cluster_init
    except ImportError:  # pragma: no cover - Ray on Spark always has it
        yield
        return
    limit = getattr(cluster_init, "_RAY_HEAD_STARTUP_TIMEOUT", None)
    port_in_use = getattr(cluster_init, "is_port_in_use", None)
    if not isinstance(limit, int | float) or not callable(port_in_use):
        yield
        return

    def port_in_use_within_limit(host: str, port: int) -> bool:
        deadline = time.monotonic() + limit
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
        from ray.util.spark import shutdown_ray_cluster

        with contextlib.suppress(Exception):
            shutdown_ray_cluster()
        cluster._owned = False


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt for the block, so clean-up still runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def ray_cluster(
    config: ClusterConfig | None = None, spark: SparkSession | None = None,
    timings: dict[str, float] | None = None,
) -> Iterator[RayCluster]:
    """Start (or connect to) Ray for the block and always shut it down afterwards (a
    stage, ``cluster`` in ``timings``).

    >>> with ray_cluster(ClusterConfig(mode="local", num_cpus=2)) as cluster:
    ...     cluster.num_cpus
    2
    """
    from raybricks.console import stage

    cluster: RayCluster | None = None
    try:
        with stage("cluster", timings, "Ray: start (on Spark) or connect"):
            cluster = start_ray(config, spark)
        # installed after ray.init, which sets a SIGTERM handler of its own
        with _sigterm_as_interrupt():
            yield cluster
    finally:
        stop_ray(cluster)


def spark_session() -> SparkSession:
    """The SparkSession that reads the source: the active one, or a new local one."""
    return active_spark() or local_spark_session()
