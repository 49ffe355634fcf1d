"""Where MLflow points: the tracking and registry URIs (the environment's, the Databricks
workspace and Unity Catalog, or a local SQLite store), the job's experiment, and the
registry-name check made before any work starts."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from raybricks.config import JobConfig
from raybricks.databricks import in_databricks_runtime
from raybricks.errors import ConfigError

#: A registered model's version by alias (``models:/NAME@ALIAS``: name, alias) and by
#: number (``models:/NAME/N``: name, number).
BY_ALIAS = re.compile(r"models:/(.+)@([^@/]+)")
BY_NUMBER = re.compile(r"models:/(.+)/(\d+)")


@dataclass
class TrackingTarget:
    tracking_uri: str
    registry_uri: str
    artifact_location: str | None  # for new experiments (local default only)


#: The registry URI raybricks derived from the tracking URI and set; MLflow copies it into
#: MLFLOW_REGISTRY_URI, where it is not the user's choice (a later tracking URI derives
#: its own).
_DERIVED_REGISTRY: dict[str, str] = {}


def configure_tracking() -> TrackingTarget:
    """Point MLflow at ``tracking_target()`` (creating a local SQLite store's tables)."""
    import mlflow

    # the model's requirements are exactly model_requirements(): no project lock files
    os.environ.setdefault("MLFLOW_LOG_UV_FILES", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    target = tracking_target()
    if not users_registry():
        _DERIVED_REGISTRY["uri"] = target.registry_uri
    mlflow.set_tracking_uri(target.tracking_uri)
    mlflow.set_registry_uri(target.registry_uri)
    for uri in dict.fromkeys((target.tracking_uri, target.registry_uri)):
        if uri.startswith("sqlite:///"):
            create_sqlite_store(uri)
    return target


def tracking_target() -> TrackingTarget:
    """Where MLflow points, touching nothing: MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI;
    else the Databricks workspace and Unity Catalog inside Databricks, else
    ``sqlite:///./mlflow.db`` + ``./mlruns``."""
    artifacts = None
    if os.environ.get("MLFLOW_TRACKING_URI"):
        tracking = os.environ["MLFLOW_TRACKING_URI"]
    elif in_databricks_runtime():
        tracking = "databricks"
    else:
        tracking = f"sqlite:///{Path('mlflow.db').resolve()}"
        artifacts = Path("mlruns").resolve().as_uri()
    registry = users_registry() or (
        "databricks-uc" if tracking == "databricks" else tracking
    )
    return TrackingTarget(tracking, registry, artifacts)


def users_registry() -> str | None:
    """MLFLOW_REGISTRY_URI where the user set it (not where MLflow copied the registry
    raybricks derived)."""
    registry = os.environ.get("MLFLOW_REGISTRY_URI")
    return registry if registry and registry != _DERIVED_REGISTRY.get("uri") else None


def create_sqlite_store(uri: str) -> None:
    """Open a local SQLite store under a file lock: on a fresh file, opening creates the
    tables, and two jobs doing that at once would otherwise collide."""
    import fcntl

    from mlflow import MlflowClient

    path = Path(uri.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_experiments(max_results=1)
        client.search_registered_models(max_results=1)


def check_registry_name(config: JobConfig, registry_uri: str) -> None:
    """Unity Catalog needs three-level names; say so before any work starts."""
    name = config.registry.name
    if registry_uri.startswith("databricks-uc") and len(name.split(".")) != 3:
        raise ConfigError(
            f"registry.name={name!r}: Unity Catalog models need a three-level name "
            "catalog.schema.model (e.g. main.forecasting.sales)"
        )


def experiment_id(config: JobConfig, target: TrackingTarget) -> str:
    """The job's experiment (created when missing; absolute paths on Databricks)."""
    import mlflow

    name = config.tracking.experiment
    if target.tracking_uri.startswith("databricks") and not name.startswith("/"):
        name = f"/Shared/raybricks/{name}"
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    return mlflow.create_experiment(name, artifact_location=target.artifact_location)
