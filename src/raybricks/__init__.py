"""raybricks: train one model per segment with Ray on Spark, register one MLflow model."""

from raybricks.cluster import RayCluster, ray_cluster, start_ray, stop_ray
from raybricks.config import ClusterConfig, JobConfig
from raybricks.data import SegmentedDataset, to_ray_dataset
from raybricks.errors import ClusterError, ConfigError, DataError, RaybricksError, SetupError
from raybricks.flights_demo import run as demo
from raybricks.monitoring import Thresholds
from raybricks.pipeline import MonitorReport, TrainingReport, Validation, monitor, train, validate
from raybricks.scoring import ScoreSummary, forecast, score
from raybricks.session import local_spark_session
from raybricks.tracking import Publication, RegistryError, publish, register_run
from raybricks.training import TrainingResult, train_segments

__version__ = "0.1.0"

__all__ = [
    "ClusterConfig",
    "ClusterError",
    "ConfigError",
    "DataError",
    "Publication",
    "RegistryError",
    "ScoreSummary",
    "demo",
    "forecast",
    "publish",
    "register_run",
    "score",
    "JobConfig",
    "MonitorReport",
    "Thresholds",
    "monitor",
    "RayCluster",
    "RaybricksError",
    "SegmentedDataset",
    "SetupError",
    "local_spark_session",
    "ray_cluster",
    "start_ray",
    "stop_ray",
    "to_ray_dataset",
    "train",
    "train_segments",
    "TrainingReport",
    "TrainingResult",
    "Validation",
    "validate",
]
