"""MLflow: one run per job, one registered segmented model version, the alias gate.

``publish(result, config)`` logs the run (config as params, aggregate metrics, the
per-segment result and failure tables, plots), logs the segmented model as an MLflow
pyfunc ("models from code": the file ``raybricks/segmented_model.py`` itself, with the
model directory of ``raybricks.packaging`` as its artifact), registers one version under
``registry.name`` with the alias ``challenger`` and decides whether it becomes the
champion (``registry.promote``: always, if_better, merge). Everything runs on the driver.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybricks import segmented_model
from raybricks.compat import log_model_location, log_run_metrics, model_version_source
from raybricks.config import JobConfig
from raybricks.databricks import in_databricks_runtime
from raybricks.errors import ConfigError, RaybricksError
from raybricks.packaging import Packaged, compare, merge_segments, package_result
from raybricks.segmented_model import SegmentStore, prediction_type
from raybricks.training.engine import TrainingResult, beats_baseline
from raybricks.training.segment import FAILED, SKIPPED, TRAINED

log = logging.getLogger(__name__)

CHALLENGER = "challenger"
MODEL_NAME = "segmented_model"
MERGED_MODEL_NAME = "merged_model"
PARAM_VALUE_LIMIT = 6000
LOG_TABLE_ROWS = 10_000  # above this the UI table would be slow; the Parquet has it all


class RegistryError(RaybricksError):
    """Tracking or registration failed; nothing half-registered was left behind."""


# --------------------------------------------------------------------------- where


@dataclass
class TrackingTarget:
    tracking_uri: str
    registry_uri: str
    artifact_location: str | None  # for new experiments (local default only)


def configure_tracking() -> TrackingTarget:
    """Honour MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI; else the Databricks workspace
    and Unity Catalog inside Databricks, else ``sqlite:///./mlflow.db`` + ``./mlruns``."""
    import mlflow

    # the model's requirements are exactly model_requirements(): no project lock files
    os.environ.setdefault("MLFLOW_LOG_UV_FILES", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    artifacts = None
    if os.environ.get("MLFLOW_TRACKING_URI"):
        tracking = os.environ["MLFLOW_TRACKING_URI"]
    elif in_databricks_runtime():
        tracking = "databricks"
    else:
        tracking = f"sqlite:///{Path('mlflow.db').resolve()}"
        artifacts = Path("mlruns").resolve().as_uri()
    registry = os.environ.get("MLFLOW_REGISTRY_URI") or (
        "databricks-uc" if tracking == "databricks" else tracking
    )
    mlflow.set_tracking_uri(tracking)
    mlflow.set_registry_uri(registry)
    for uri in dict.fromkeys((tracking, registry)):
        if uri.startswith("sqlite:///"):
            create_sqlite_store(uri)
    return TrackingTarget(tracking, registry, artifacts)


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


# --------------------------------------------------------------------------- the run


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow params: ``models.0.params.max_depth -> "4"``."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list) and value and isinstance(value[0], dict | list):
        items = enumerate(value)
    else:
        text = json.dumps(value, default=str) if not isinstance(value, str) else value
        return {prefix: text[:PARAM_VALUE_LIMIT]}
    flat: dict[str, str] = {}
    for key, item in items:
        flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def aggregate_metrics(result: TrainingResult, candidates: list[str]) -> dict[str, float]:
    """Segment counts, the distribution of each validation metric, wins over the baseline,
    the wall time per stage."""
    counts = result.counts()
    out: dict[str, float] = {f"segments_{s}": float(n) for s, n in counts.items()}
    out["segments_total"] = float(sum(counts.values()))
    trained = result.segments[result.segments.status == TRAINED]
    m = result.metric
    columns = {m: f"metric_{m}", f"baseline_{m}": f"baseline_{m}"} | {
        f"{c}_{m}": f"{c}_{m}" for c in candidates
    }
    for name, column in columns.items():
        if column in trained and len(trained):
            values = trained[column].astype(float).dropna()
            if len(values):
                out[f"{name}_median"] = float(values.median())
                out[f"{name}_p90"] = float(values.quantile(0.9))
                out[f"{name}_mean"] = float(values.mean())
    if len(trained) and f"baseline_{m}" in trained:
        out["share_beats_baseline"] = beats_baseline(
            trained[f"metric_{m}"].astype(float), trained[f"baseline_{m}"].astype(float), m)
    for stage, seconds in result.timings.items():
        out[f"seconds_{stage}"] = float(seconds)
    out["seconds_train_segments"] = float(result.seconds)
    for key, count in result.accounting.items():  # set by raybricks.train's reconcile
        out[f"accounting_{key}"] = float(count)
    return out


def log_tables(result: TrainingResult) -> None:
    """The per-segment results (Parquet; also as an MLflow table when small enough for
    the UI) and the failures and skips with their reasons."""
    import mlflow

    segments = result.segments.copy()
    problems = segments[segments.status.isin([SKIPPED, FAILED])]
    with tempfile.TemporaryDirectory() as tmp:
        segments.to_parquet(Path(tmp) / "segments.parquet", index=False)
        problems.to_parquet(Path(tmp) / "failures.parquet", index=False)
        mlflow.log_artifacts(tmp, "results")
    ui_columns = [c for c in segments.columns if c not in ("params",)]
    if 0 < len(segments) <= LOG_TABLE_ROWS:
        mlflow.log_table(_json_safe(segments[ui_columns]), "results/segments.json")
    if 0 < len(problems) <= LOG_TABLE_ROWS:
        mlflow.log_table(_json_safe(problems[result.segment_by + ["status", "reason"]]),
                         "results/failures.json")


def _json_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """Dates, decimals and other objects as strings for MLflow's JSON tables."""
    out = frame.copy()
    for column in out.columns:
        if not (pd.api.types.is_numeric_dtype(out[column]) or out[column].dtype == bool):
            out[column] = out[column].astype("string").astype(object)
    return out


def log_plots(result: TrainingResult) -> None:
    """PNG plots: the per-segment metric's distribution, model vs baseline, the winners."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow

    m = result.metric
    trained = result.segments[result.segments.status == TRAINED]
    if not len(trained):
        return
    values = trained[f"metric_{m}"].astype(float)
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.hist(values.dropna(), bins=min(50, max(len(values) // 5, 5)), color="#3b7dd8")
    axes.set(xlabel=f"validation {m} per segment", ylabel="segments",
             title=f"{m} over {len(values)} trained segments")
    mlflow.log_figure(figure, "plots/metric_distribution.png")
    plt.close(figure)

    base = trained[f"baseline_{m}"].astype(float)
    figure, axes = plt.subplots(figsize=(5, 5))
    axes.scatter(base, values, s=6, alpha=0.5, color="#3b7dd8")
    finite = np.concatenate([base[np.isfinite(base)], values[np.isfinite(values)]])
    if len(finite):
        low, high = float(finite.min()), float(finite.max())
        axes.plot([low, high], [low, high], color="grey", linewidth=1)
    axes.set(xlabel=f"naive baseline {m}", ylabel=f"model {m}",
             title="model vs baseline (one dot per segment)")
    mlflow.log_figure(figure, "plots/model_vs_baseline.png")
    plt.close(figure)

    chosen = trained["chosen"].dropna().map(json.loads).explode().value_counts()
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.bar(chosen.index.astype(str), chosen.to_numpy(), color="#3b7dd8")
    axes.set(ylabel="segments", title="chosen candidates")
    mlflow.log_figure(figure, "plots/chosen_candidates.png")
    plt.close(figure)


# --------------------------------------------------------------------------- the model


def model_requirements(libraries: Iterable[str]) -> list[str]:
    """Exactly what the pyfunc imports, at the versions it was trained with: MLflow, NumPy,
    pandas, PyArrow and the model ``libraries`` (the manifest's, as packaging recorded
    them). MLflow's version is the module's: a Databricks cluster has only the
    mlflow-skinny distribution."""
    import mlflow

    names = ["numpy", "pandas", "pyarrow", *sorted(libraries)]
    return [f"mlflow=={mlflow.__version__}"] + [
        f"{name}=={importlib.metadata.version(name)}" for name in names]


def signature_for(store: SegmentStore, example: pd.DataFrame):
    """Inputs: segment columns and features (types from the example); output: the
    prediction; params: ``probabilities``."""
    from mlflow.models import ModelSignature, infer_signature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    inputs = infer_signature(example[store.segment_by + store.features]).inputs
    outputs = Schema([ColSpec(prediction_type(store.manifest), "prediction")])
    params = ParamSchema([ParamSpec("probabilities", "boolean", False)])
    return ModelSignature(inputs, outputs, params)


def log_segmented_model(packaged: Packaged, example: pd.DataFrame | None, name: str):
    """Log the directory as the pyfunc (models from code); returns MLflow's ModelInfo."""
    import mlflow

    store = SegmentStore(packaged.directory)
    if example is None or example.empty:
        raise RegistryError("no input example: the training result has no rows to show")
    return mlflow.pyfunc.log_model(
        **log_model_location(name),
        python_model=segmented_model.__file__,
        artifacts={"segments": str(packaged.directory)},
        signature=signature_for(store, example),
        input_example=example[store.segment_by + store.features],
        pip_requirements=model_requirements(packaged.manifest["libraries"]),
        model_config={"cache_segments": segmented_model.DEFAULT_CACHE_SEGMENTS},
    )


# --------------------------------------------------------------------------- registry


@dataclass
class Publication:
    """What publishing a training result did in MLflow."""

    run_id: str
    experiment_id: str
    model_uri: str  # the logged model
    name: str
    version: str | None  # the challenger version (None: nothing registered)
    champion_version: str | None
    decision: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """What a person wants to read after a job: run, version, the promotion."""
        lines = [f"MLflow run {self.run_id} (experiment {self.experiment_id})"]
        if self.version is None:
            lines.append(f"not registered: {self.decision.get('decision')}")
            return "\n".join(lines)
        lines.append(f"registered {self.name} version {self.version} (alias {CHALLENGER})")
        decision = self.decision
        text = f"promotion ({decision['rule']}): {decision['decision']}"
        if "reason" in decision:
            text += f", {decision['reason']}"
        comparison = decision.get("comparison")
        if comparison:
            text += (f"; {comparison['metric']} on {comparison['common_segments']} common "
                     f"segments: challenger {comparison['challenger_mean']:.4g} vs champion "
                     f"{comparison['champion_mean']:.4g}")
        lines.append(text)
        lines.append(f"champion: {self.name} version {self.champion_version}")
        return "\n".join(lines)


def _client():
    from mlflow import MlflowClient

    return MlflowClient()


def version_for_alias(name: str, alias: str):
    """The version holding the alias, or None (also when the model does not exist)."""
    from mlflow.exceptions import MlflowException

    try:
        return _client().get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def register(model_uri: str, name: str, run_id: str, tags: dict[str, str], role: str,
             created: list | None = None):
    """Register the logged model as a version, once: a version of this run and role that
    already exists is returned as it is. A failure leaves no version behind. New versions
    are appended to ``created`` (for the caller's roll-back)."""
    from mlflow.exceptions import MlflowException

    client = _client()
    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if "ALREADY_EXISTS" not in str(exc.error_code):
            raise
    for existing in client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'"):
        if existing.tags.get("raybricks.role") == role:
            log.info("run %s is already registered as %s version %s", run_id, name,
                     existing.version)
            return existing
    version = None
    try:
        version = client.create_model_version(
            name, model_uri, run_id=run_id, tags=tags | {"raybricks.role": role},
            **model_version_source(model_uri),
        )
        if version.status != "READY":
            raise RegistryError(f"version {version.version} of {name} is {version.status}")
    except Exception:
        if version is not None:
            _delete_quietly(name, version.version)
        raise
    if created is not None:
        created.append(str(version.version))
    return version


def _delete_quietly(name: str, version: str) -> None:
    try:
        _client().delete_model_version(name, version)
    except Exception as exc:  # noqa: BLE001 - report the first error, not this one
        log.warning("could not remove half-registered %s version %s: %s", name, version, exc)


def download_segments(name: str, version: str, directory: Path) -> Path:
    """A registered version's segmented model directory."""
    import mlflow

    path = mlflow.artifacts.download_artifacts(
        artifact_uri=f"models:/{name}/{version}", dst_path=str(directory)
    )
    return Path(path) / "artifacts" / "segments"


def version_tags(result: TrainingResult, config: JobConfig, metrics: dict[str, float]):
    source = config.source.table or config.source.path or ""
    if config.source.where:
        source += f" where {config.source.where}"
    m = result.metric
    tags = {
        "raybricks.config_hash": config.config_hash(),
        "raybricks.source": source[:5000],
        "raybricks.training_run": result.run_id,
        "raybricks.metric": m,
    }
    for key in ("segments_trained", "segments_skipped", "segments_failed", "segments_total",
                f"{m}_median", f"{m}_p90", f"{m}_mean", "share_beats_baseline"):
        if key in metrics:
            tags[f"raybricks.{key}"] = f"{metrics[key]:.6g}"
    return tags


def publish(result: TrainingResult, config: JobConfig) -> Publication:
    """Log the job's run and model, register a version, apply the promotion rule."""
    import mlflow

    target = configure_tracking()
    check_registry_name(config, target.registry_uri)
    experiment = experiment_id(config, target)
    name, alias = config.registry.name, config.registry.alias
    with tempfile.TemporaryDirectory(prefix="raybricks-model-") as tmp, mlflow.start_run(
        experiment_id=experiment, run_name=f"raybricks-{result.run_id}"
    ) as run:
        start = time.perf_counter()
        mlflow.set_tags({"raybricks.training_run": result.run_id,
                         "raybricks.config_hash": config.config_hash()})
        mlflow.log_params(flatten(config.model_dump(mode="json")))
        mlflow.log_dict(config.model_dump(mode="json"), "config.json")
        metrics = aggregate_metrics(result, [c.name for c in config.models])
        log_run_metrics(metrics)
        log_tables(result)
        log_plots(result)
        packaged = package_result(result, Path(tmp) / "challenger" / "segments", "challenger")
        info = log_segmented_model(packaged, result.example, MODEL_NAME)
        mlflow.set_tag("raybricks.model_uri", info.model_uri)
        log_run_metrics({"model_size_bytes": float(packaged.size_bytes),
                            "model_segments": float(packaged.with_model)})
        if result.counts()[TRAINED] == 0:
            log.warning("no segment trained: nothing registered")
            mlflow.set_tag("raybricks.promotion", "not registered: no trained segment")
            return Publication(run.info.run_id, experiment, info.model_uri, name, None,
                               _alias_version(name, alias), {"decision": "not registered"})
        tags = version_tags(result, config, metrics)
        version, decision = register_and_promote(
            config, info.model_uri, run.info.run_id, tags, packaged, Path(tmp), result.example
        )
        record_decision(decision)
        log_run_metrics({"seconds_registry": time.perf_counter() - start})
        return Publication(run.info.run_id, experiment, info.model_uri, name,
                           str(version.version), _alias_version(name, alias), decision)


def record_decision(decision: dict[str, Any]) -> None:
    """The promotion decision on the active run: ``promotion.json`` and a tag."""
    import mlflow

    mlflow.log_dict(decision, "promotion.json")
    mlflow.set_tag("raybricks.promotion", decision["decision"])


def _alias_version(name: str, alias: str) -> str | None:
    found = version_for_alias(name, alias)
    return str(found.version) if found else None


def register_and_promote(
    config: JobConfig, model_uri: str, run_id: str, tags: dict[str, str], packaged: Packaged,
    workdir: Path, example: pd.DataFrame | None,
):
    """Register the challenger, decide the champion, then move the aliases: on any failure
    before the aliases move, the versions this call created are removed again."""
    name, alias = config.registry.name, config.registry.alias
    created: list[str] = []
    try:
        version = register(model_uri, name, run_id, tags, "challenger", created)
        decision = promote(config, version, packaged, workdir, run_id, tags, example, created)
    except Exception as exc:
        for number in reversed(created):
            _delete_quietly(name, number)
        raise RegistryError(
            f"registering {name} failed: {type(exc).__name__}: {exc}. No version was left "
            f"behind and no alias moved; the run {run_id} holds the model: retry with "
            f"raybricks.registry.register_run({run_id!r}, config) or rerun the job"
        ) from exc
    client = _client()
    client.set_registered_model_alias(name, CHALLENGER, version.version)
    client.set_registered_model_alias(name, alias, decision["champion_version"])
    return version, decision


def promote(config: JobConfig, version, packaged: Packaged, workdir: Path, run_id: str,
            tags: dict[str, str], example: pd.DataFrame | None, created: list[str]
            ) -> dict[str, Any]:
    """Apply ``registry.promote``: the decision, its numbers and the champion-to-be
    (``merge`` registers the merged version here; the caller moves the aliases)."""

    name, alias, rule = config.registry.name, config.registry.alias, config.registry.promote
    current = version_for_alias(name, alias)
    challenger = str(version.version)
    previous = str(current.version) if current else None
    decision: dict[str, Any] = {"rule": rule, "challenger_version": challenger,
                                "previous_champion": previous}
    if previous is None or previous == challenger or rule == "always":
        reason = "first version" if previous is None else rule
        return decision | {"decision": "promoted", "reason": reason,
                           "champion_version": challenger}
    champion_dir = download_segments(name, previous, workdir / "champion")
    comparison = compare(packaged.directory, champion_dir)
    decision["comparison"] = comparison.as_dict()
    log_run_metrics({"promotion_common_segments": comparison.common,
                     "promotion_challenger_mean": comparison.challenger,
                     "promotion_champion_mean": comparison.champion})
    if rule == "if_better":
        if comparison.not_worse:
            return decision | {"decision": "promoted", "reason": "not worse on common segments",
                               "champion_version": challenger}
        return decision | {"decision": "kept", "reason": "worse on common segments",
                           "champion_version": previous}
    labels = (f"version {challenger}", f"version {previous}")
    merged = merge_segments(packaged.directory, champion_dir,
                            workdir / "merged" / "segments", labels)
    info = log_segmented_model(merged, example, MERGED_MODEL_NAME)
    merged_version = register(info.model_uri, name, run_id,
                              tags | {"raybricks.merged_from": ",".join(labels)}, "merged",
                              created)
    origins = pd.read_parquet(merged.directory / segmented_model.INDEX, columns=["source"])
    return decision | {"decision": "merged", "champion_version": str(merged_version.version),
                       "segments_from": origins["source"].value_counts().to_dict()}


def register_run(run_id: str, config: JobConfig) -> Publication:
    """Register (again) the model a run logged, and apply the promotion rule: the retry
    after a failed registration. Idempotent: an existing version of the run is reused."""
    import mlflow

    configure_tracking()
    run = mlflow.get_run(run_id)
    model_uri = run.data.tags.get("raybricks.model_uri")
    if not model_uri:
        raise RegistryError(f"run {run_id} has no raybricks model (tag raybricks.model_uri)")
    name, alias = config.registry.name, config.registry.alias
    tags = {k: v for k, v in run.data.tags.items() if k.startswith("raybricks.")
            and k not in ("raybricks.model_uri", "raybricks.promotion")}
    with tempfile.TemporaryDirectory(prefix="raybricks-model-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp))
        packaged = Packaged(local / "artifacts" / "segments", {}, 0, 0)
        example = _example_of(local)
        with mlflow.start_run(run_id=run_id):
            version, decision = register_and_promote(
                config, model_uri, run_id, tags, packaged, Path(tmp), example)
            record_decision(decision)
    return Publication(run_id, run.info.experiment_id, model_uri, name, str(version.version),
                       _alias_version(name, alias), decision)


def _example_of(model_dir: Path) -> pd.DataFrame | None:
    from mlflow.models import Model

    try:
        return Model.load(str(model_dir)).load_input_example(str(model_dir))
    except Exception:  # noqa: BLE001 - an example is optional for the retry
        return None
