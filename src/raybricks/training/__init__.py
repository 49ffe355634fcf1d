"""Per-segment training: the segment logic, the packed engine, the large-segment path."""

from raybricks.training.engine import TrainingResult, train_segments

__all__ = ["TrainingResult", "train_segments"]
