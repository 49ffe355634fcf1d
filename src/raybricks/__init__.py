"""raybricks: train one model per segment with Ray on Spark, register one MLflow model."""

from raybricks.cluster import RayCluster, ray_cluster, start_ray, stop_ray
from raybricks.config import ClusterConfig
from raybricks.data import SegmentedDataset, to_ray_dataset
from raybricks.errors import ClusterError, ConfigError, DataError, RaybricksError, SetupError
from raybricks.session import local_spark_session

__version__ = "0.1.0"

__all__ = [
    "ClusterConfig",
    "ClusterError",
    "ConfigError",
    "DataError",
    "RayCluster",
    "RaybricksError",
    "SegmentedDataset",
    "SetupError",
    "local_spark_session",
    "ray_cluster",
    "start_ray",
    "stop_ray",
    "to_ray_dataset",
]
