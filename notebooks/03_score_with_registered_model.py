# Databricks notebook source
# MAGIC %md
# MAGIC # 3. Score with the registered model
# MAGIC
# MAGIC The registered model is one MLflow pyfunc holding every segment's model. Three ways
# MAGIC to use it:
# MAGIC
# MAGIC 1. `raybricks.score`: Spark batch scoring by segment (what the scoring job runs);
# MAGIC    each Spark task loads only the segments it meets.
# MAGIC 2. `mlflow.pyfunc.load_model(uri).predict(pandas_frame)`: plain MLflow, no raybricks
# MAGIC    needed, for a pandas frame on the driver.
# MAGIC 3. `mlflow.pyfunc.spark_udf`: MLflow's own Spark UDF over the same model.
# MAGIC
# MAGIC Rows need the segment columns and the features; segments without a model of their
# MAGIC own are scored by the global fallback model, if the job trained one.

# COMMAND ----------

dbutils.widgets.text("model_uri", "models:/main.retail.sales_forecast@champion", "Model URI")
dbutils.widgets.text("input_table", "main.retail.daily_sales_to_score", "Input table or path")
dbutils.widgets.text("output_table", "main.retail.daily_sales_predictions",
                     "Output table or path")

# COMMAND ----------

import raybricks
from raybricks.sources import read_source, source_of

model_uri = dbutils.widgets.get("model_uri")
input_table = dbutils.widgets.get("input_table")
output_table = dbutils.widgets.get("output_table")
summary = raybricks.score(model_uri, input_table, output_table, spark=spark)
print(summary)

# COMMAND ----------

scored = read_source(source_of(output_table), spark)
display(scored.groupBy("segment_status").count())
display(scored.limit(100))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Plain MLflow on a pandas frame
# MAGIC `predict` returns one prediction per row, in input order
# MAGIC (`params={"probabilities": True}` gives class probabilities for classifiers).

# COMMAND ----------

import mlflow

model = mlflow.pyfunc.load_model(model_uri)
columns = model.metadata.get_input_schema().input_names()
sample = read_source(source_of(input_table), spark).limit(1000).toPandas()
predictions = model.predict(sample)
display(sample.assign(prediction=predictions.to_numpy()).head(100))

# COMMAND ----------

# MAGIC %md
# MAGIC ## MLflow's Spark UDF
# MAGIC The UDF takes the model's input columns (segment columns first, then the features).

# COMMAND ----------

from pyspark.sql import functions as F

result_type = model.metadata.get_output_schema().inputs[0].type.to_spark()
predict_udf = mlflow.pyfunc.spark_udf(spark, model_uri, result_type=result_type,
                                      env_manager="local")
with_udf = read_source(source_of(input_table), spark).withColumn(
    "prediction", predict_udf(*[F.col(c) for c in columns])
)
display(with_udf.limit(100))
