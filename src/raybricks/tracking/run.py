"""Logging the job's run: the config as params, aggregate metrics, the per-segment result
and failure tables, plots and the model; ``publish`` is the whole job's publication
(the run, then registration and promotion). Everything runs on the driver."""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raybricks.compat import log_run_metrics
from raybricks.config import JobConfig
from raybricks.metrics import metric
from raybricks.packaging import package_result
from raybricks.results import (
    FAILED,
    SKIPPED,
    TRAINED,
    TrainingResult,
    choice_counts,
    float_values,
    part_files,
    release_memory,
)
from raybricks.tracking.model import log_segmented_model
from raybricks.tracking.registration import (
    Publication,
    _alias_version,
    record_decision,
    register_and_promote,
)
from raybricks.tracking.target import check_registry_name, configure_tracking, experiment_id

log = logging.getLogger(__name__)

MODEL_NAME = "segmented_model"
PARAM_VALUE_LIMIT = 6000
LOG_TABLE_ROWS = 10_000  # above this the UI table would be slow; the Parquet has it all


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


def aggregate_metrics(result: TrainingResult, candidates: list[str],
                      timings: dict[str, float] | None = None,
                      accounting: dict[str, int] | None = None) -> dict[str, float]:
    """Segment counts, the distribution of each validation metric, wins over the baseline,
    the wall time per stage (``timings``) and the ``accounting`` against the source."""
    counts = result.counts()
    out: dict[str, float] = {f"segments_{s}": float(n) for s, n in counts.items()}
    out["segments_total"] = float(sum(counts.values()))
    m = result.metric
    columns = {name: f"metric_{m}" if name == m else name
               for name in [m, f"baseline_{m}", *(f"{c}_{m}" for c in candidates)]}
    trained = result.columns(list(columns.values()), TRAINED)  # read once
    for name, column in columns.items():
        values = pd.Series(float_values(trained, column)).dropna()
        if len(values):
            out[f"{name}_median"] = float(values.median())
            out[f"{name}_p90"] = float(values.quantile(0.9))
            out[f"{name}_mean"] = float(values.mean())
    if counts[TRAINED]:
        out["share_beats_baseline"] = metric(m).beats(
            float_values(trained, f"metric_{m}"), float_values(trained, f"baseline_{m}"))
    for choice, count in choice_counts(result.columns(["status", "chosen"])).items():
        out[f"segments_chose_{choice}"] = float(count)
    for stage, seconds in (timings or {}).items():
        out[f"seconds_{stage}"] = float(seconds)
    out["seconds_train_segments"] = float(result.seconds)
    for key, count in (accounting or {}).items():  # raybricks.train's reconcile
        out[f"accounting_{key}"] = float(count)
    return out


def log_tables(result: TrainingResult) -> None:
    """The per-segment results (Parquet, copied part by part; also as an MLflow table
    when small enough for the UI) and the failures and skips with their reasons."""
    import mlflow

    problem = pc.field("status").isin([SKIPPED, FAILED])
    with tempfile.TemporaryDirectory() as tmp:
        copy_parts(result.run_dir / "results", {Path(tmp) / "segments.parquet": None,
                                                 Path(tmp) / "failures.parquet": problem})
        mlflow.log_artifacts(tmp, "results")
        if 0 < sum(result.counts().values()) <= LOG_TABLE_ROWS:
            segments = pd.read_parquet(Path(tmp) / "segments.parquet")
            ui_columns = [c for c in segments.columns if c not in ("params",)]
            mlflow.log_table(_json_safe(segments[ui_columns]), "results/segments.json")
        problems = pq.ParquetFile(Path(tmp) / "failures.parquet")
        if 0 < problems.metadata.num_rows <= LOG_TABLE_ROWS:
            found = problems.read(columns=[*result.segment_by, "status", "reason"])
            mlflow.log_table(_json_safe(found.to_pandas()), "results/failures.json")


def copy_parts(directory: Path, outputs: dict[Path, pc.Expression | None]) -> None:
    """The run's parts in ``directory`` as one Parquet file per output (only the rows its
    filter holds, None: all), reading one part at a time, each once."""
    files = part_files(directory)
    schema = pq.read_schema(files[0]) if files else pa.schema([])
    with contextlib.ExitStack() as stack:
        writers = {path: stack.enter_context(pq.ParquetWriter(path, schema))
                   for path in outputs}
        for file in files:
            table = pq.read_table(file, schema=schema)
            for path, where in outputs.items():
                writers[path].write_table(table if where is None else table.filter(where))


def _json_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """Dates, decimals and other objects as strings for MLflow's JSON tables."""
    out = frame.copy()
    for column in out.columns:
        if not (pd.api.types.is_numeric_dtype(out[column]) or out[column].dtype == bool):
            out[column] = out[column].astype("string").astype(object)
    return out


#: The most segments the model-vs-baseline plot draws (a seeded sample above it).
PLOTTED_SEGMENTS = 20_000


def log_plots(result: TrainingResult) -> None:
    """PNG plots: the per-segment metric's distribution, model vs baseline, the winners."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow

    m = result.metric
    scores = result.columns([f"metric_{m}", f"baseline_{m}", "chosen"], TRAINED)
    if not scores.num_rows:
        return
    values = float_values(scores, f"metric_{m}")
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.hist(values[np.isfinite(values)], bins=min(50, max(len(values) // 5, 5)),
              color="#3b7dd8")
    axes.set(xlabel=f"validation {m} per segment", ylabel="segments",
             title=f"{m} over {len(values)} trained segments")
    mlflow.log_figure(figure, "plots/metric_distribution.png")
    plt.close(figure)

    base = float_values(scores, f"baseline_{m}")
    if len(values) > PLOTTED_SEGMENTS:
        shown = np.random.default_rng(0).choice(len(values), PLOTTED_SEGMENTS, replace=False)
        values, base = values[shown], base[shown]
    figure, axes = plt.subplots(figsize=(5, 5))
    axes.scatter(base, values, s=6, alpha=0.5, color="#3b7dd8")
    finite = np.concatenate([base[np.isfinite(base)], values[np.isfinite(values)]])
    if len(finite):
        low, high = float(finite.min()), float(finite.max())
        axes.plot([low, high], [low, high], color="grey", linewidth=1)
    sampled = f" ({len(values)} sampled)" if len(values) < scores.num_rows else ""
    axes.set(xlabel=f"naive baseline {m}", ylabel=f"model {m}",
             title=f"model vs baseline (one dot per segment{sampled})")
    mlflow.log_figure(figure, "plots/model_vs_baseline.png")
    plt.close(figure)

    chosen: dict[str, int] = {}
    for found in pc.value_counts(scores.column("chosen").combine_chunks()).to_pylist():
        for label in json.loads(found["values"]) if found["values"] else []:
            chosen[label] = chosen.get(label, 0) + found["counts"]
    ranked = sorted(chosen.items(), key=lambda item: -item[1])
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.bar([str(label) for label, _ in ranked], [n for _, n in ranked], color="#3b7dd8")
    axes.set(ylabel="segments", title="chosen candidates")
    mlflow.log_figure(figure, "plots/chosen_candidates.png")
    plt.close(figure)


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


def weights_tags(result: TrainingResult) -> dict[str, str]:
    """Where each pretrained candidate's weights came from (source, SHA-256, how the
    model keeps them), as run tags ``raybricks.pretrained.<candidate>.*``."""
    records = (result.forecast or {}).get("pretrained") or {}
    return {f"raybricks.pretrained.{name}.{key}": str(value)
            for name, record in records.items() for key, value in record.items()}


def publish(result: TrainingResult, config: JobConfig, *,
            timings: dict[str, float] | None = None,
            accounting: dict[str, int] | None = None) -> Publication:
    """Log the job's run and model, register a version, apply the promotion rule (with
    the job's wall time per stage and accounting, when given, among the run's metrics)."""
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
        mlflow.set_tags(weights_tags(result))
        metrics = aggregate_metrics(result, [c.name for c in config.models], timings,
                                    accounting)
        log_run_metrics(metrics)
        log_tables(result)
        log_plots(result)
        release_memory()
        packaged = package_result(result, Path(tmp) / "challenger" / "segments", "challenger")
        release_memory()
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
