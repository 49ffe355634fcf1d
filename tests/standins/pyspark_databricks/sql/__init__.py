"""Stand-in for ``pyspark.databricks.sql`` (see tests.standins)."""
