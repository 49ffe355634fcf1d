"""The monitoring run in MLflow: beside the model version's training run (same
experiment), its counts by status, the realized against the validation error, the worst
segments and, for a forecasting model, the realized error per horizon step.

The run is logged after the monitoring table is written, and points at it (the tag
``raybricks.output``, which ``--segments-from-monitor RUN`` reads). Whatever part of
the run fails to log (a table, the plot) leaves the rest logged and is named in the tag
``raybricks.monitor.problems``; a run that cannot be started at all raises
``MonitoringRunError``, which names the table written and the command that retrains from
it."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from raybricks.errors import RaybricksError
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
#: The tag of a monitoring run that lacks some of its parts (what failed, and why).
PROBLEMS_TAG = "raybricks.monitor.problems"

log = logging.getLogger(__name__)


class MonitoringRunError(RaybricksError):
    """The monitoring table is written but its MLflow run could not be logged."""


def failure(what: str, exc: BaseException) -> str:
    """``what`` failed, in one line: the exception's type and first line."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{what} failed ({type(exc).__name__}: {first})"


def retrain_from(output: str) -> str:
    """The command that retrains the segments a monitoring table found (its path or
    table name)."""
    return (f"raybricks train --config <the model's job config> --segments-from-monitor "
            f"{output} --statuses degraded,new")


@dataclass
class MonitoringLog:
    """What the run logs: the parameters, counts by status, a sample of segments
    (``sample``: the segment label, realized, validation, baseline's realized, status),
    the worst segments (``worst``: label, realized, validation, reason), and per horizon
    step the mean realized error (``steps``: step, mean, series); ``sample`` and
    ``worst`` are None when the summary could not make them."""

    params: dict[str, Any]
    counts: dict[str, int]
    metric: str
    sample: pd.DataFrame | None
    worst: pd.DataFrame | None
    steps: pd.DataFrame | None = None
    extra: dict[str, float] = field(default_factory=dict)
    #: What could not be summed up or logged (``failure``): the run says it lacks them.
    problems: list[str] = field(default_factory=list)
    #: The global models' health (``monitoring.global_health``), if the model has any.
    globals: pd.DataFrame | None = None


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
    """One MLflow run of a monitoring job; returns its id. The run is created with the
    tags that point at the monitoring table first; each part after that is logged on
    its own, and one that fails is added to ``found.problems`` (the run's tag
    ``raybricks.monitor.problems`` lists them) instead of ending the job. A run that
    cannot be created raises ``MonitoringRunError``: the table is written, and the
    message says how to retrain from it."""
    import mlflow

    from raybricks.tracking.target import configure_tracking

    output = str(found.params.get("output", ""))
    try:
        configure_tracking()
        experiment = experiment_of(model_uri)
        if experiment is None:
            experiment = mlflow.set_experiment(FALLBACK_EXPERIMENT).experiment_id
        run = mlflow.start_run(experiment_id=experiment, run_name="raybricks monitor")
    except Exception as exc:  # noqa: BLE001 - the table is written: say how to use it
        raise MonitoringRunError(
            f"the monitoring table {output} is written, but its MLflow run could not be "
            f"logged: {failure('starting the run', exc)}. Retrain from the table itself: "
            f"{retrain_from(output)}; or rerun raybricks monitor once MLflow answers"
        ) from exc
    with run:
        try:
            mlflow.set_tags({"raybricks.monitor": "true", "raybricks.model": model_uri,
                             "raybricks.output": output})
        except Exception as exc:  # noqa: BLE001 - a run that cannot point at the table
            raise MonitoringRunError(
                f"the monitoring table {output} is written, but its MLflow run "
                f"{run.info.run_id} could not point at it: {failure('tagging the run', exc)}"
                f". Retrain from the table itself: {retrain_from(output)}") from exc
        parts: list[tuple[str, Callable[[], Any]]] = [
            ("the parameters", lambda: mlflow.log_params(
                {k: str(v)[:500] for k, v in found.params.items()})),
            ("the metrics", lambda: mlflow.log_metrics(
                {f"segments_{s}": float(n) for s, n in found.counts.items()}
                | {k: float(v) for k, v in found.extra.items() if v is not None})),
            ("status_counts.json", lambda: mlflow.log_dict(
                found.counts, "monitoring/status_counts.json"))]
        if found.globals is not None and len(found.globals):
            parts.append(("global_models.json", lambda: mlflow.log_table(
                _strings(found.globals), "monitoring/global_models.json")))
            parts.append(("the global models' metrics", lambda: mlflow.log_metrics({
                "global_models_degraded": float((found.globals.status == "degraded").sum()),
                "global_models": float(found.globals.global_model.nunique())})))
        if found.worst is not None and len(found.worst):
            parts.append(("worst_segments.json", lambda: mlflow.log_table(
                _strings(found.worst), "monitoring/worst_segments.json")))
        if found.steps is not None and len(found.steps):
            parts.append(("realized_by_step.json", lambda: mlflow.log_table(
                found.steps, "monitoring/realized_by_step.json")))
        if found.sample is not None:
            parts.append(("the plot segments.png", lambda: log_plot(found)))
        for what, log_part in parts:
            try:
                log_part()
            except Exception as exc:  # noqa: BLE001 - the rest of the run still logs
                found.problems.append(failure(f"logging {what}", exc))
        if found.problems:
            log.warning("the monitoring run %s lacks some parts: %s", run.info.run_id,
                        "; ".join(found.problems))
            try:
                mlflow.set_tag(PROBLEMS_TAG, "; ".join(found.problems)[:5000])
            except Exception as exc:  # noqa: BLE001 - said above, and in the report
                log.warning("%s", failure("tagging the run's problems", exc))
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
    try:
        draw(found, figure, axes)
        mlflow.log_figure(figure, "monitoring/segments.png")
    finally:
        plt.close(figure)


def draw(found: MonitoringLog, figure: Any, axes: Any) -> None:
    """The plot's panels (``log_plot``): a row of one or two ``axes``."""
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
    worst = found.worst if found.worst is not None else sample.head(0)
    for row in worst.head(NAMED).itertuples():
        if all(isinstance(v, int | float) and np.isfinite(v)
               for v in (row.validation, row.realized)):
            left.annotate(str(row.segment), (row.validation, row.realized), fontsize=7)
    left.set(xlabel=f"validation {metric} (training)", ylabel=f"realized {metric}",
             title="realized against validation error, one dot per segment")
    if len(both):
        left.legend(fontsize=8)
    if len(axes[0]) == 2:
        right = axes[0][1]
        right.plot(found.steps.step, found.steps["mean"], marker="o", color="#3b7dd8")
        right.set(xlabel="horizon step", ylabel=f"mean realized {metric}",
                  title="realized error by horizon step")
    figure.tight_layout()
