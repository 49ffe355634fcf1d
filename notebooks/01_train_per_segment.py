# Databricks notebook source
# MAGIC %md
# MAGIC # 1. Train one model per segment
# MAGIC
# MAGIC `raybricks.train` runs a job config end to end: it reads the source table with Spark,
# MAGIC starts Ray on this cluster's workers (Ray on Spark), trains every candidate model for
# MAGIC every segment in packed Ray tasks, shuts Ray down, then logs one MLflow run and
# MAGIC registers one segmented model version (alias `challenger`; `champion` when the
# MAGIC promotion rule says so).
# MAGIC
# MAGIC Needs a single-user DBR ML cluster (15.4 LTS ML or later) with the raybricks wheel
# MAGIC installed (a cluster library, or `%pip install` of the wheel the bundle uploaded).
# MAGIC Then look at the results in `02_inspect_results` and score in
# MAGIC `03_score_with_registered_model`.

# COMMAND ----------

dbutils.widgets.text("config_path", "../jobs/sales_regression.yml", "Job config (YAML)")
dbutils.widgets.text("overrides", "", "Overrides: key=value; key=value")
dbutils.widgets.dropdown("register", "yes", ["yes", "no"], "Register in MLflow")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The job config
# MAGIC The YAML file with the overrides applied (the same `key.sub=value` syntax as
# MAGIC `raybricks train --set`), validated before any cluster starts. Relative paths are
# MAGIC relative to this notebook's folder.

# COMMAND ----------

import yaml

import raybricks

overrides = [item.strip() for item in dbutils.widgets.get("overrides").split(";") if item.strip()]
config = raybricks.JobConfig.load(dbutils.widgets.get("config_path"), overrides)
print(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True), sort_keys=False))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Train
# MAGIC Ray on Spark is sized from the cluster unless `cluster:` says otherwise
# MAGIC (`cluster.mode=address` with `cluster.address=...` uses a Ray that already runs).

# COMMAND ----------

report = raybricks.train(config, spark, register=dbutils.widgets.get("register") == "yes")
print(report.summary())
result = report.result

# COMMAND ----------

# MAGIC %md
# MAGIC ## Per segment
# MAGIC One row per segment: its status (`trained`, `skipped` or `failed`, with the reason),
# MAGIC the chosen candidates, the validation metric of the model, of every candidate and
# MAGIC of the naive baseline.

# COMMAND ----------

display(result.segments)

# COMMAND ----------

import pandas as pd

display(pd.DataFrame(list(report.timings.items()), columns=["stage", "seconds"]))

# COMMAND ----------

# MAGIC %md
# MAGIC ## What the registry did

# COMMAND ----------

publication = report.publication
if publication is None:
    print("not logged to MLflow (register = no)")
else:
    print(publication.describe())
    model_uri = f"models:/{publication.name}@{config.registry.alias}"
    print(f"\nrun_id for 02_inspect_results: {publication.run_id}")
    print(f"model_uri for 03_score_with_registered_model: {model_uri}")
