"""``kind: baseline``: the naive prediction every segment is compared with, as a member
of its own: the training mean (``params: {strategy: last}``: the last value, for
time-ordered data), or the training class frequencies. Stored as a few numbers (JSON)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .base import CLASSIFICATION, ModelKind, filled_input


class BaselineKind(ModelKind):
    name = "baseline"
    model_input = staticmethod(filled_input)  # unused but for its length: the cheapest form

    @classmethod
    def load(cls, payload: bytes, meta: dict[str, Any]) -> np.ndarray:
        return np.asarray(json.loads(payload), dtype="float64")

    @classmethod
    def predict_loaded(cls, model, features, meta) -> np.ndarray:
        return cls.constant(model, len(features), meta["task"])

    @staticmethod
    def constant(model: np.ndarray, rows: int, task: str) -> np.ndarray:
        if task in CLASSIFICATION:
            return np.tile(model, (rows, 1))
        return np.full(rows, model[0])

    def fit(self, params, X, y, task, seed, threads, meta) -> np.ndarray:
        if task in CLASSIFICATION:  # y: codes 0..k-1 of the classes in these rows
            return np.bincount(y) / len(y)
        value = y[-1] if params.get("strategy") == "last" else y.mean()
        return np.array([float(value)])

    def predict(self, model, X, task) -> np.ndarray:
        return self.constant(model, len(X), task)

    def serialize(self, model) -> bytes:
        return json.dumps(np.asarray(model).tolist()).encode()
