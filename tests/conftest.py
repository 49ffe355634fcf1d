"""One local Spark session and one Ray-on-Spark cluster for the whole test session."""

from __future__ import annotations

import os
import tempfile

import pytest

# Ray workers must see MLflow settings the driver has: set one before Ray starts, so the
# cluster tests can check it was forwarded.
_TMP = tempfile.mkdtemp(prefix="raybricks-tests-")
os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{_TMP}/mlflow.db")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def spark():
    from raybricks.session import local_spark_session

    session = local_spark_session(cores=2, driver_memory="2g", warehouse_dir=f"{_TMP}/warehouse")
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
