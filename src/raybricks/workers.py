"""What Spark's Python workers must import to run raybricks' tasks, and shipping it to them.

On a classic session the workers run the cluster's Python, where raybricks is installed
as a cluster library (or, locally, the driver's own interpreter). On Spark Connect
(serverless, standard access mode) they run in an environment of their own: raybricks
belongs in the serverless environment's dependencies or the cluster's libraries, and when
it is not there, ``ship_to_workers`` asks the workers (one small Spark job per session)
and adds what they lack from the driver with ``spark.addArtifacts(..., pyfile=True)``:
raybricks itself and the user's modules that candidates name by import path. Only pure
Python travels that way; raybricks' dependencies (pyarrow, scikit-learn, the model
libraries) must be in the workers' environment.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from raybricks import console
from raybricks.errors import SetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: How to give raybricks to the workers by hand, said when they cannot import it.
INSTALL_HINT = (
    "install the raybricks wheel where Spark's tasks run (serverless: the job's or "
    "notebook's environment dependencies; a standard access mode cluster: a cluster "
    "library), or ship it from the driver with spark.addArtifacts(PATH_TO_A_ZIP_OF_THE_"
    "PACKAGE, pyfile=True)")

#: The workers' side of ``missing_on_workers``, defined from source so that cloudpickle
#: sends it by value (a worker without raybricks can still run it).
_PROBE = '''
def probe(batches):
    import importlib.util

    import pyarrow as pa

    for _ in batches:
        pass
    def found(name):  # a module or regular package, not a folder of data files
        spec = importlib.util.find_spec(name)
        return spec is not None and spec.origin not in (None, "namespace")

    missing = [name for name in NAMES if not found(name)]
    yield pa.RecordBatch.from_pydict({"missing": missing},
                                     schema=pa.schema([("missing", pa.string())]))
'''

#: (session, module) pairs whose workers were found to import the module, or given it.
_ON_WORKERS: set[tuple[str, str]] = set()


def missing_on_workers(spark: SparkSession, names: Iterable[str]) -> list[str]:
    """Which of the top-level modules ``names`` Spark's Python workers cannot import
    (one single-task Spark job)."""
    namespace = {"__name__": "raybricks_probe", "NAMES": list(names)}
    exec(_PROBE, namespace)  # noqa: S102 - our own source, see _PROBE
    rows = spark.range(1, numPartitions=1).mapInArrow(namespace["probe"],
                                                      "missing string").collect()
    return [row["missing"] for row in rows]


def ship_to_workers(spark: SparkSession, modules: Iterable[str] = ("raybricks",)) -> list[str]:
    """On a Spark Connect session, make sure Spark's Python workers import ``modules``
    (import paths; their top-level packages count): what they lack is zipped from the
    driver's copy and added with ``spark.addArtifacts(pyfile=True)``, said on the console.
    Returns the packages shipped. Nothing to do on a classic session; asked once per
    session and package."""
    from raybricks.session import is_spark_connect

    if not is_spark_connect(spark):
        return []
    session = str(getattr(spark, "session_id", id(spark)))
    wanted = [name for name in dict.fromkeys(m.split(".")[0] for m in modules)
              if (session, name) not in _ON_WORKERS]
    if not wanted:
        return []
    missing = missing_on_workers(spark, wanted)
    shipped = []
    for name in missing:
        path = packed_module(name)
        if path is None:  # the driver cannot import it either: the job will say so
            continue
        spark.addArtifacts(str(path), pyfile=True)
        shipped.append(name)
        console.say(f"workers: Spark's Python workers cannot import {name}: shipped the "
                    f"driver's copy ({path.name}) with spark.addArtifacts")
        log.info("shipped %s to Spark's Python workers as %s", name, path)
    if shipped:
        still = missing_on_workers(spark, shipped)
        if still:
            raise SetupError(f"Spark's Python workers cannot import {', '.join(still)}, "
                             f"even when shipped from the driver: {INSTALL_HINT}")
    _ON_WORKERS.update((session, name) for name in wanted
                       if name not in missing or name in shipped)
    return shipped


def packed_module(name: str) -> Path | None:
    """The driver's copy of the top-level module ``name`` as a file ``addArtifacts``
    takes: a package zipped (its sources and data, no bytecode), a module as its
    ``.py``; None if the driver cannot import it or it is not plain Python files."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    file = getattr(module, "__file__", None)
    if not file or not file.endswith(".py"):
        return None
    source = Path(file)
    if source.name != "__init__.py":
        return source
    folder = source.parent
    target = Path(tempfile.mkdtemp(prefix="raybricks-ship-")) / f"{name}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                archive.write(path, Path(name) / path.relative_to(folder))
    return target


@contextlib.contextmanager
def workers_import_raybricks() -> Iterator[None]:
    """Spark jobs whose Python workers run raybricks' code: a worker that cannot import
    it fails the job with a SetupError that says how to give it to them."""
    try:
        yield
    except Exception as exc:
        if "No module named 'raybricks" not in str(exc):
            raise
        raise SetupError(f"Spark's Python workers cannot import raybricks, which the "
                         f"Spark executor runs in them: {INSTALL_HINT}") from exc
