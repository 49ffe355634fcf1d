"""Stand-in for the Databricks Runtime's ``pyspark.databricks`` package (see tests.standins)."""
