"""The Spark session: the active one, a given master, or local[N]; Java check and the
executors' environment.

On Databricks the SparkSession already exists; elsewhere raybricks builds one that is
ready for Ray on Spark (executors run this interpreter and find the ``ray`` CLI), on the
master the user names (``--master``, ``spark.master``, ``SPARK_MASTER``,
``PYSPARK_SUBMIT_ARGS``, spark-defaults.conf) or ``local[N]``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from raybricks.errors import SetupError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MIN_JAVA = 17
JAVA_HINT = (
    f"install a Java {MIN_JAVA}+ runtime (e.g. `apt-get install openjdk-{MIN_JAVA}-jre-headless` "
    f"or `brew install openjdk@{MIN_JAVA}`) and put it on PATH or set JAVA_HOME"
)


def java_version() -> int | None:
    """The major version of the Java that Spark will use, or None when there is none."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        return None
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30
        ).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def check_java() -> int:
    """Raise a one-line error when Java is missing or older than Spark needs."""
    version = java_version()
    if version is None:
        raise SetupError(f"Java not found: {JAVA_HINT}.")
    if version < MIN_JAVA:
        raise SetupError(f"Java {version} is too old for Spark 4: {JAVA_HINT}.")
    return version


def prepare_executor_environment() -> dict[str, str]:
    """Make Spark's Python workers run this interpreter with its ``bin`` first on PATH.

    Ray on Spark starts ``ray`` processes from inside Spark tasks; they must use the same
    virtual environment as the driver. Only effective before the Spark JVM starts.
    """
    venv_bin = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if venv_bin not in path.split(os.pathsep):
        os.environ["PATH"] = venv_bin + os.pathsep + path
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return {"PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"], "PATH": os.environ["PATH"]}


def active_spark() -> SparkSession | None:
    """The active SparkSession, if any (a notebook's ``spark``, or one made here)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise SetupError(
            "pyspark is not installed: pip install 'raybricks[local]' for local Spark "
            "(Databricks runtimes ship their own Spark)"
        ) from exc

    return SparkSession.getActiveSession()


def is_spark_connect(spark: object) -> bool:
    """True for a Spark Connect session (Databricks standard access mode, serverless
    compute, ``SPARK_REMOTE``): it has no SparkContext, so Ray on Spark cannot start."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def require_spark_context(spark: object, what: str, otherwise: str = "") -> None:
    """Refuse a Spark Connect session for ``what`` with the reason and the way out
    (``otherwise``: another way, said last)."""
    if is_spark_connect(spark):
        raise SetupError(
            f"{what} needs a classic Spark session with a SparkContext, and this one is "
            "Spark Connect (Databricks standard access mode, serverless compute, or "
            "SPARK_REMOTE): Ray on Spark starts its nodes through the SparkContext. Run on "
            "a cluster in dedicated (single user) access mode, or unset SPARK_REMOTE"
            + (f", {otherwise}" if otherwise else "")
        )


def spark_cores(spark: object) -> int | None:
    """Spark's default parallelism: the SparkContext's on a classic session; on Spark
    Connect (no context) ``spark.default.parallelism`` where set, else the cores of a
    ``local[N]`` or ``local-cluster[N,C,M]`` master, else None."""
    if not is_spark_connect(spark):
        return spark.sparkContext.defaultParallelism
    try:
        given = spark.conf.get("spark.default.parallelism", None)
        master = spark.conf.get("spark.master", None) or ""
    except Exception:  # noqa: BLE001 - a session that shows neither
        return None
    if given and str(given).strip().isdigit():
        return int(given)
    local = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", master)
    cluster = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),.*\]", master)
    if local:
        return int(local.group(1))
    return int(cluster.group(1)) * int(cluster.group(2)) if cluster else None


#: Where Spark reads ``spark.master`` when nothing else names one.
SPARK_DEFAULTS = "spark-defaults.conf"


def submit_args_master(submit_args: str | None) -> str | None:
    """The ``--master`` of ``PYSPARK_SUBMIT_ARGS`` (``--master X`` or ``--master=X``)."""
    words = shlex.split(submit_args or "")
    for i, word in enumerate(words):
        if word == "--master" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--master="):
            return word.split("=", 1)[1]
    return None


def spark_defaults_master(environ: Mapping[str, str] | None = None) -> str | None:
    """``spark.master`` of spark-defaults.conf (``$SPARK_CONF_DIR`` or ``$SPARK_HOME/conf``)."""
    environ = os.environ if environ is None else environ
    folder = environ.get("SPARK_CONF_DIR") or (
        str(Path(environ["SPARK_HOME"]) / "conf") if environ.get("SPARK_HOME") else None)
    path = Path(folder) / SPARK_DEFAULTS if folder else None
    if path is None or not path.is_file():
        return None
    for line in path.read_text().splitlines():
        words = line.split(None, 1)
        if len(words) == 2 and words[0] == "spark.master":
            return words[1].strip()
    return None


def requested_master(master: str | None = None,
                     environ: Mapping[str, str] | None = None) -> str | None:
    """The Spark master asked for, as pyspark users expect, first found: ``master``
    (``--master``, ``spark.master`` in the job config), ``SPARK_MASTER``, the
    ``--master`` of ``PYSPARK_SUBMIT_ARGS``, ``spark.master`` of spark-defaults.conf.
    None: raybricks' embedded default, ``local[N]``."""
    environ = os.environ if environ is None else environ
    return (master or environ.get("SPARK_MASTER")
            or submit_args_master(environ.get("PYSPARK_SUBMIT_ARGS"))
            or spark_defaults_master(environ))


def is_local_cluster(master: str) -> bool:
    """Spark's multi-process test topology on one machine: ``local-cluster[N,C,M]``."""
    return master.startswith("local-cluster")


def prepare_local_cluster() -> None:
    """What ``local-cluster[...]`` needs: SPARK_HOME with Spark's ``bin``, ``jars`` and
    ``sbin`` (the pyspark package has them) and executors bound to 127.0.0.1."""
    import pyspark

    home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    if not (home / "bin" / "spark-class").exists():
        raise SetupError(
            f"master local-cluster[...] starts Spark workers with {home}/bin/spark-class, "
            "which does not exist: set SPARK_HOME to a Spark distribution or to the "
            "pyspark package's folder (it holds bin/, jars/ and sbin/)")
    os.environ["SPARK_HOME"] = str(home)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def local_spark_session(
    cores: int | None = None,
    driver_memory: str = "4g",
    warehouse_dir: str | None = None,
    app_name: str = "raybricks",
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return the active SparkSession, or start one ready for Ray on Spark.

    With ``SPARK_REMOTE`` set, the Spark Connect session it names. Else the master is
    ``master``, else the one pyspark users name elsewhere
    (``requested_master``: ``SPARK_MASTER``, ``PYSPARK_SUBMIT_ARGS``, spark-defaults),
    else ``local[N]`` with ``cores`` slots. The local default is one slot per core plus
    one: Ray on Spark holds a slot for its worker node for as long as Ray runs, and Spark
    keeps one per core for reading and staging. ``conf``: more Spark settings. Tables
    written with ``saveAsTable`` land in ``warehouse_dir`` (default ``./spark-warehouse``).
    """
    existing = active_spark()
    if existing is not None:
        return existing
    if os.environ.get("SPARK_REMOTE"):  # Spark Connect: pyspark refuses a master beside it
        from pyspark.sql import SparkSession

        return SparkSession.builder.getOrCreate()
    check_java()
    env = prepare_executor_environment()
    from pyspark.sql import SparkSession

    master = requested_master(master) or f"local[{cores or (os.cpu_count() or 1) + 1}]"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.pyspark.python", env["PYSPARK_PYTHON"])
        .config("spark.executorEnv.PATH", env["PATH"])
    )
    if is_local_cluster(master):
        prepare_local_cluster()
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    if warehouse_dir:
        builder = builder.config("spark.sql.warehouse.dir", str(Path(warehouse_dir).resolve()))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_local_tables(spark)
    return spark


def in_memory_catalog(spark: SparkSession) -> bool:
    """True for Spark's default local catalog, which forgets tables when it stops."""
    return spark.conf.get("spark.sql.catalogImplementation", "in-memory") == "in-memory"


def warehouse_path(spark: SparkSession) -> Path:
    return Path(spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:"))


def register_local_tables(spark: SparkSession) -> list[str]:
    """Make the local catalog remember: register the Parquet tables an earlier session
    left in the warehouse (``<db>.db/<table>``) again. Returns their names."""
    if not in_memory_catalog(spark):
        return []
    found = []
    for database in sorted(warehouse_path(spark).glob("*.db")):
        spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database.stem}`")
        for table in sorted(p for p in database.iterdir() if p.is_dir()):
            name = f"{database.stem}.{table.name}"
            if any(table.glob("*.parquet")) and not spark.catalog.tableExists(name):
                spark.catalog.createTable(name, path=str(table), source="parquet")
                found.append(name)
    return found


def save_table(df: DataFrame, name: str) -> None:
    """Overwrite a table. In the local in-memory catalog the table is Parquet files at the
    warehouse's ``<db>.db/<table>`` registered by path, so a later session finds it
    (``register_local_tables``); elsewhere (Databricks, Hive) ``saveAsTable``."""
    spark = df.sparkSession
    parts = name.split(".")
    if not in_memory_catalog(spark) or len(parts) > 2:
        df.write.mode("overwrite").saveAsTable(name)
        return
    database, table = parts if len(parts) == 2 else ("default", parts[0])
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    folder = "" if database == "default" else f"{database}.db"
    path = warehouse_path(spark) / folder / table
    staged = path.with_name(f".{table}.writing")
    df.write.mode("overwrite").parquet(str(staged))  # the input may read the old files
    spark.sql(f"DROP TABLE IF EXISTS `{database}`.`{table}`")
    if path.exists():
        shutil.rmtree(path)
    staged.rename(path)
    spark.catalog.createTable(f"{database}.{table}", path=str(path), source="parquet")
