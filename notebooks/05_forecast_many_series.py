# Databricks notebook source
# MAGIC %md
# MAGIC # 5. Forecast many series
# MAGIC
# MAGIC A job config with `task: forecast` trains one forecaster per series: every
# MAGIC candidate (lag models such as LightGBM or Ridge, statsforecast models such as
# MAGIC AutoETS or Croston) is backtested over rolling origins, measured against the
# MAGIC series' naive forecasts, the best three (weighted) are refitted on the whole
# MAGIC series, and one segmented model is registered. `raybricks.forecast` then writes
# MAGIC the next `horizon` periods of every series with Spark.
# MAGIC
# MAGIC Needs the forecast extra on the cluster: `%pip install "raybricks[forecast]"` (or
# MAGIC the wheel plus statsforecast and mlforecast, as the bundle's forecasting job does).

# COMMAND ----------

dbutils.widgets.text("config_path", "../jobs/route_flights_forecast.yml", "Job config (YAML)")
dbutils.widgets.text("overrides", "", "Overrides: key=value; key=value")
dbutils.widgets.text("output_table", "main.raybricks.route_daily_forecast",
                     "Forecasts: table or path")
dbutils.widgets.text("horizon", "", "Periods per series (empty: the trained horizon)")

# COMMAND ----------

import raybricks

overrides = [item.strip() for item in dbutils.widgets.get("overrides").split(";") if item.strip()]
config = raybricks.JobConfig.load(dbutils.widgets.get("config_path"), overrides)
print(config.forecast)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Train: backtest, select, refit, register
# MAGIC Each series ends `trained` (with a note when it had gaps filled, is intermittent
# MAGIC or ended before the others) or `skipped` with the reason (too short, duplicate or
# MAGIC off-frequency dates, constant); skipped series are served by their naive forecast.

# COMMAND ----------

report = raybricks.train(config, spark)
print(report.summary())
series = report.result.segments
display(series[[*config.segment_by, "status", "reason", "chosen",
                f"metric_{config.metric}", f"baseline_{config.metric}"]])

# COMMAND ----------

# MAGIC %md
# MAGIC ## Forecast every series
# MAGIC The next periods after each series' own last date, from the registered champion:
# MAGIC segment columns, the time column, `prediction`, `model_version`, `segment_status`.

# COMMAND ----------

from raybricks.sources import read_source, source_of

model_uri = f"models:/{config.registry.name}@{config.registry.alias}"
output_table = dbutils.widgets.get("output_table")
horizon = int(dbutils.widgets.get("horizon") or 0) or None
summary = raybricks.forecast(model_uri, output_table, horizon=horizon, spark=spark)
print(summary)
forecasts = read_source(source_of(output_table), spark)
display(forecasts.limit(200))

# COMMAND ----------

# MAGIC %md
# MAGIC ## One series: its history and its forecast

# COMMAND ----------

import pandas as pd
from pyspark.sql import functions as F

first = forecasts.select(*config.segment_by).limit(1).first().asDict()
history, ahead = read_source(config.source, spark), forecasts
for column, value in first.items():
    history = history.where(F.col(column) == value)
    ahead = ahead.where(F.col(column) == value)
one = pd.concat([
    history.select(config.time_column, F.col(config.target).alias("value")).toPandas()
    .assign(kind="history"),
    ahead.select(config.time_column, F.col("prediction").alias("value")).toPandas()
    .assign(kind="forecast"),
]).sort_values(config.time_column)
display(one.tail(120))
