# Databricks notebook source
# MAGIC %md
# MAGIC # 4. Ray on Spark, interactively
# MAGIC
# MAGIC Start Ray on this cluster's Spark workers (`ray.util.spark.setup_ray_cluster`, sized
# MAGIC from the cluster unless the widgets say otherwise), look at what Ray sees, run a few
# MAGIC Ray tasks, and shut it down. `raybricks.train` does the same start and stop around
# MAGIC each job; this notebook is for exploring Ray by hand.
# MAGIC
# MAGIC Modes: `spark` starts Ray on Spark; `address` connects to a Ray that already runs
# MAGIC (give its address); `local` starts a plain Ray on the driver only. Empty sizes are
# MAGIC derived from the Spark cluster. In code, the context manager form stops Ray even on
# MAGIC errors:
# MAGIC
# MAGIC ```python
# MAGIC with raybricks.ray_cluster(ClusterConfig(max_worker_nodes=2), spark) as cluster:
# MAGIC     ...
# MAGIC ```

# COMMAND ----------

dbutils.widgets.dropdown("mode", "spark", ["spark", "address", "local"], "Mode")
dbutils.widgets.text("address", "", "Ray address (mode address)")
dbutils.widgets.text("max_worker_nodes", "", "Max Ray worker nodes")
dbutils.widgets.text("min_worker_nodes", "", "Min Ray worker nodes (autoscaling)")
dbutils.widgets.text("num_cpus_worker_node", "", "CPUs per Ray worker node")
dbutils.widgets.text("num_cpus_head_node", "", "CPUs of the Ray head (driver)")

# COMMAND ----------

import raybricks
from raybricks import ClusterConfig

sizes = {name: int(dbutils.widgets.get(name))
         for name in ("max_worker_nodes", "min_worker_nodes", "num_cpus_worker_node",
                      "num_cpus_head_node")
         if dbutils.widgets.get(name).strip()}
cluster_config = ClusterConfig(mode=dbutils.widgets.get("mode"),
                               address=dbutils.widgets.get("address").strip() or None, **sizes)
cluster = raybricks.start_ray(cluster_config, spark)
print(f"Ray ({cluster.mode}) at {cluster.address}")
print(cluster.settings)

# COMMAND ----------

# MAGIC %md
# MAGIC ## What Ray sees
# MAGIC The cluster's resources and its nodes: the head on the driver, the worker nodes
# MAGIC inside long-running Spark tasks on the workers.

# COMMAND ----------

import pandas as pd
import ray

resources = ray.cluster_resources()
display(pd.DataFrame(sorted(resources.items()), columns=["resource", "total"]))
nodes = pd.DataFrame([{"node_id": n["NodeID"], "address": n["NodeManagerAddress"],
                       "alive": n["Alive"], "CPU": n["Resources"].get("CPU", 0.0)}
                      for n in ray.nodes()])
display(nodes)

# COMMAND ----------

# MAGIC %md
# MAGIC ## A tiny Ray job
# MAGIC Sixteen tasks; each returns its square and the node it ran on.

# COMMAND ----------


@ray.remote
def square_on(x: int) -> tuple[int, str]:
    return x * x, ray.get_runtime_context().get_node_id()


answers = ray.get([square_on.remote(i) for i in range(16)])
squares = [value for value, _ in answers]
tasks_per_node = pd.Series([node for _, node in answers]).value_counts()
print("squares:", squares)
display(tasks_per_node.rename_axis("node_id").reset_index(name="tasks"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Shut down
# MAGIC Disconnects the notebook and, in mode `spark` or `local`, stops the Ray it started
# MAGIC (the Spark tasks hosting the Ray workers end and free their slots).

# COMMAND ----------

raybricks.stop_ray(cluster)
print("Ray connected:", ray.is_initialized())
