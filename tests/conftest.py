"""One Spark session and one Ray-on-Spark cluster for the whole test session.

Spark runs in ``local[2]``, or on the master ``RAYBRICKS_TEST_MASTER`` names: the suite's
second run, ``make test``'s ``-m topology``, uses ``local-cluster[2,2,1024]`` (a
standalone master and two executor JVMs of two cores), where Ray on Spark takes its
cluster path: one Ray worker node per executor, Spark keeping a slot on each.
"""

from __future__ import annotations

import os
import tempfile
from importlib.util import find_spec

import pytest

# Ray workers must see MLflow settings the driver has: set one before Ray starts, so the
# cluster tests can check it was forwarded.
_TMP = tempfile.mkdtemp(prefix="raybricks-tests-")
os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{_TMP}/mlflow.db")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
#: The Spark master of this run (None: local[2]).
MASTER = os.environ.get("RAYBRICKS_TEST_MASTER") or None


#: Also run the tests marked ``extended`` (slow variants of what other tests cover).
EXTENDED = os.environ.get("RAYBRICKS_EXTENDED_TESTS") == "1"

#: The ``foundation`` extra's packages this environment lacks (found, not imported: torch is
#: slow to import). Only .venv-foundation (``make test-foundation``) has them all.
FOUNDATION_MISSING = [name for name in ("torch", "chronos", "timesfm") if find_spec(name) is None]


def pytest_collection_modifyitems(config, items):
    """On another master, only the tests marked ``topology`` run; in local mode, all but
    those marked ``cluster_only``. Tests marked ``extended`` run only where
    ``RAYBRICKS_EXTENDED_TESTS=1``. Tests marked ``foundation`` are skipped where the
    extra's packages are missing (every environment but .venv-foundation)."""
    wanted = "cluster_only" if MASTER is None else "topology"
    chosen = [item for item in items if (wanted in item.keywords) == (MASTER is not None)
              and (EXTENDED or "extended" not in item.keywords)]
    config.hook.pytest_deselected(items=[item for item in items if item not in chosen])
    items[:] = chosen
    if FOUNDATION_MISSING:
        skip = pytest.mark.skip(reason=f"no {', '.join(FOUNDATION_MISSING)}: the foundation "
                                "extra's tests run in .venv-foundation (make test-foundation)")
        for item in items:
            if "foundation" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def mlflow_restored(monkeypatch):
    """MLflow's tracking and registry URIs (and the environment's MLFLOW_* that MLflow
    and raybricks set) as they were before the test, whatever it pointed them at."""
    import mlflow

    before = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID"):
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])  # put back after the test
        else:
            monkeypatch.delenv(name, raising=False)
    yield
    mlflow.set_tracking_uri(before[0])
    mlflow.set_registry_uri(before[1])


@pytest.fixture(scope="session")
def spark():
    from raybricks.session import local_spark_session

    session = local_spark_session(cores=2, driver_memory="2g", warehouse_dir=f"{_TMP}/warehouse",
                                  master=MASTER)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def ray_on_spark(spark):
    """A real Ray cluster started on the local Spark with setup_ray_cluster."""
    from raybricks.cluster import start_ray, stop_ray
    from raybricks.config import ClusterConfig

    cluster = start_ray(ClusterConfig(mode="spark"), spark)
    yield cluster
    stop_ray(cluster)
