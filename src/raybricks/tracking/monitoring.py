"""The monitoring run in MLflow: beside the model version's training run (same
experiment), its counts by status, the realized against the validation error, the worst
segments and, for a forecasting model, the realized error per horizon step."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from raybricks.tracking.target import BY_ALIAS, BY_NUMBER

if TYPE_CHECKING:
    import pandas as pd

#: The experiment of monitoring runs whose model's training run cannot be found.
FALLBACK_EXPERIMENT = "raybricks-monitoring"
#: Colours of the statuses in the plot.
COLOURS = {"ok": "#3b7dd8", "degraded": "#d83b3b", "drifted": "#e8a33d", "new": "#4caf50",
           "silent": "#9e9e9e"}
#: How many of the worst segments the plot names.
NAMED = 8


@dataclass
class MonitoringLog:
    """What the run logs: the parameters, counts by status, a sample of segments
    (``sample``: the segment label, realized, validation, baseline's realized, status),
    the worst segments (``worst``: label, realized, validation, reason), and per horizon
    step the mean realized error (``steps``: step, mean, series)."""

    params: dict[str, Any]
    counts: dict[str, int]
    metric: str
    sample: pd.DataFrame
    worst: pd.DataFrame
    steps: pd.DataFrame | None = None
    extra: dict[str, float] = field(default_factory=dict)


def experiment_of(model_uri: str) -> str | None:
    """The experiment of the training run behind ``models:/NAME@ALIAS`` or
    ``models:/NAME/N`` (``runs:/ID/...``: that run's); None when not found."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    try:
        run_id = None
        if found := BY_ALIAS.fullmatch(model_uri):
            run_id = client.get_model_version_by_alias(*found.groups()).run_id
        elif found := BY_NUMBER.fullmatch(model_uri):
            run_id = client.get_model_version(*found.groups()).run_id
        elif found := re.match(r"runs:/([^/]+)/", model_uri):
            run_id = found.group(1)
        return client.get_run(run_id).info.experiment_id if run_id else None
    except MlflowException:
        return None


def log_monitoring(model_uri: str, found: MonitoringLog) -> str:
    """One MLflow run of a monitoring job; returns its id."""
    import mlflow

    from raybricks.tracking.target import configure_tracking

    configure_tracking()
    experiment = experiment_of(model_uri)
    if experiment is None:
        experiment = mlflow.set_experiment(FALLBACK_EXPERIMENT).experiment_id
    with mlflow.start_run(experiment_id=experiment, run_name="raybricks monitor") as run:
        mlflow.set_tags({"raybricks.monitor": "true", "raybricks.model": model_uri,
                         "raybricks.output": str(found.params.get("output", ""))})
        mlflow.log_params({k: str(v)[:500] for k, v in found.params.items()})
        mlflow.log_metrics({f"segments_{s}": float(n) for s, n in found.counts.items()}
                           | found.extra)
        mlflow.log_dict(found.counts, "monitoring/status_counts.json")
        if len(found.worst):
            mlflow.log_table(_strings(found.worst), "monitoring/worst_segments.json")
        if found.steps is not None and len(found.steps):
            mlflow.log_table(found.steps, "monitoring/realized_by_step.json")
        log_plot(found)
        return run.info.run_id


def _strings(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.astype({c: "string" for c in frame.columns if frame[c].dtype == object})


def log_plot(found: MonitoringLog) -> None:
    """``monitoring/segments.png``: realized against validation error per segment,
    coloured by status, the worst named; beside it the realized error per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow

    panels = 2 if found.steps is not None and len(found.steps) else 1
    figure, axes = plt.subplots(1, panels, figsize=(6 * panels, 5), squeeze=False)
    left = axes[0][0]
    sample, metric = found.sample, found.metric
    both = sample.dropna(subset=["realized", "validation"])
    for status, colour in COLOURS.items():
        shown = both[both.status == status]
        if len(shown):
            left.scatter(shown.validation, shown.realized, s=10, alpha=0.6, color=colour,
                         label=f"{status} ({found.counts.get(status, 0)})")
    if len(both):
        values = np.concatenate([both.validation.to_numpy(float), both.realized.to_numpy(float)])
        values = values[np.isfinite(values)]
        if len(values):
            low, high = float(values.min()), float(values.max())
            left.plot([low, high], [low, high], color="grey", linewidth=1)
    for row in found.worst.head(NAMED).itertuples():
        if row.validation == row.validation and row.realized == row.realized:
            left.annotate(str(row.segment), (row.validation, row.realized), fontsize=7)
    left.set(xlabel=f"validation {metric} (training)", ylabel=f"realized {metric}",
             title="realized against validation error, one dot per segment")
    if len(both):
        left.legend(fontsize=8)
    if panels == 2:
        right = axes[0][1]
        right.plot(found.steps.step, found.steps["mean"], marker="o", color="#3b7dd8")
        right.set(xlabel="horizon step", ylabel=f"mean realized {metric}",
                  title="realized error by horizon step")
    figure.tight_layout()
    mlflow.log_figure(figure, "monitoring/segments.png")
    plt.close(figure)
