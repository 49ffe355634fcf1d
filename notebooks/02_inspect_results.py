# Databricks notebook source
# MAGIC %md
# MAGIC # 2. Inspect a training run
# MAGIC
# MAGIC Everything a `raybricks train` job logged in its one MLflow run: the per-segment
# MAGIC result table (`results/segments.parquet`), how many segments trained, were skipped
# MAGIC or failed and why, the validation metric against the naive baseline, and the plots
# MAGIC (`plots/*.png`). Give the run id (printed by `01_train_per_segment`, or in the MLflow
# MAGIC UI), or a registered model URI such as `models:/main.retail.sales_forecast@champion`
# MAGIC to inspect the run behind that version.

# COMMAND ----------

dbutils.widgets.text("run_id", "", "MLflow run id")
dbutils.widgets.text("model_uri", "", "or model URI (models:/NAME@ALIAS or models:/NAME/N)")

# COMMAND ----------

import mlflow
import pandas as pd
from mlflow import MlflowClient

from raybricks import JobConfig
from raybricks.tracking import configure_tracking

configure_tracking()  # the workspace registry (Unity Catalog) on Databricks, SQLite locally
client = MlflowClient()
run_id = dbutils.widgets.get("run_id").strip()
if not run_id:
    reference = dbutils.widgets.get("model_uri").strip().removeprefix("models:/")
    if "@" in reference:
        version = client.get_model_version_by_alias(*reference.rsplit("@", 1))
    else:
        version = client.get_model_version(*reference.rsplit("/", 1))
    run_id = version.run_id
run = client.get_run(run_id)
config = JobConfig.from_dict(mlflow.artifacts.load_dict(f"runs:/{run_id}/config.json"))
segments = pd.read_parquet(
    mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="results/segments.parquet")
)
print(f"run {run_id} ({run.info.run_name}): {len(segments)} segments by {config.segment_by}, "
      f"target {config.target}, metric {config.metric}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Status of every segment

# COMMAND ----------

display(segments.status.value_counts().rename_axis("status").reset_index(name="segments"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Why segments were skipped or failed
# MAGIC Reasons grouped by their first part (e.g. `too few rows`), then every such segment.

# COMMAND ----------

problems = segments[segments.status != "trained"]
reasons = (problems.assign(reason=problems.reason.str.split(":").str[0])
           .groupby(["status", "reason"]).size().reset_index(name="segments"))
display(reasons)
display(problems[config.segment_by + ["status", "reason"]])

# COMMAND ----------

# MAGIC %md
# MAGIC ## The metric against the naive baseline
# MAGIC Per trained segment: the validation metric of the chosen model (or blend), of the
# MAGIC naive baseline (the training mean or last value, or the class frequencies), and of
# MAGIC every candidate; then the ten segments where the model gains least over it.

# COMMAND ----------

from raybricks.metrics import metric

m = config.metric
trained = segments[segments.status == "trained"]
columns = [f"metric_{m}", f"baseline_{m}"] + [f"{c.name}_{m}" for c in config.models]
distribution = trained[[c for c in columns if c in trained]].astype(float).describe(
    percentiles=[0.1, 0.5, 0.9]).T
display(distribution.reset_index(names="column"))

sign = 1 if metric(m).greater_is_better else -1
gain = sign * (trained[f"metric_{m}"] - trained[f"baseline_{m}"]).astype(float)
share = metric(m).beats(trained[f"metric_{m}"], trained[f"baseline_{m}"])
print(f"{share:.0%} of {len(trained)} trained segments beat the baseline on {m}")
display(trained.assign(gain=gain).nsmallest(10, "gain")[
    config.segment_by + ["chosen", f"metric_{m}", f"baseline_{m}", "gain"]])

# COMMAND ----------

# MAGIC %md
# MAGIC ## The plots logged on the run

# COMMAND ----------

import base64
from pathlib import Path

plots = [a.path for a in client.list_artifacts(run_id, "plots") if a.path.endswith(".png")]
html = ""
for path in plots:
    png = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path)).read_bytes()
    html += (f"<figure style='display:inline-block'><img src='data:image/png;base64,"
             f"{base64.b64encode(png).decode()}'/><figcaption>{path}</figcaption></figure>")
displayHTML(html or "<p>no plots (no segment trained)</p>")
