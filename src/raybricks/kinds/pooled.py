"""``global``: the member that stands for the job's global model (``fallback: global``) in
a segment's blend. It stores nothing: the segmented model predicts it with the global
model it already holds. A segment that chose the global model alone has no members."""

from __future__ import annotations

from typing import Any

from .base import ModelKind


class GlobalKind(ModelKind):
    name = "global"
    uses_fallback = True

    @classmethod
    def load(cls, payload: bytes, meta: dict[str, Any]) -> None:
        return None

    @classmethod
    def predict_loaded(cls, model, features, meta):
        raise RuntimeError("a global member predicts through the segmented model's fallback")

    def serialize(self, model) -> bytes:
        return b""
