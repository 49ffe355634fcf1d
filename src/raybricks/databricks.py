"""Databricks runtime detection (and, later, databricks-sdk calls).

Everything here works off Databricks too: it answers "no" without raising.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CHUNK_API_CONF = "spark.databricks.pyspark.dataFrameChunk.enabled"


def in_databricks_runtime() -> bool:
    """True inside a Databricks Runtime (notebook, job or cluster process)."""
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def runtime_version() -> tuple[int, int] | None:
    """The Databricks Runtime version as (major, minor), or None outside Databricks."""
    raw = os.environ.get("DATABRICKS_RUNTIME_VERSION")
    if not raw:
        return None
    parts = raw.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    except ValueError:
        return None


def chunk_api_available(spark: SparkSession) -> bool:
    """True where Spark can hand partitions to Ray as Arrow chunks (DBR ML 15+).

    Needs the runtime's ``pyspark.sql.chunk_api`` module and the Spark conf
    ``spark.databricks.pyspark.dataFrameChunk.enabled=true``.
    """
    version = runtime_version()
    if version is None or version[0] < 15:
        return False
    try:
        if importlib.util.find_spec("pyspark.sql.chunk_api") is None:
            return False
    except (ImportError, ValueError):
        return False
    return spark.conf.get(CHUNK_API_CONF, "false").lower() == "true"
