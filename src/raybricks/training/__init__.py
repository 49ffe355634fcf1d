"""Per-segment training: the segment logic, the packed engine, the large-segment path."""

from raybricks.results import TrainingResult
from raybricks.training.engine import train_segments

__all__ = ["TrainingResult", "train_segments"]
