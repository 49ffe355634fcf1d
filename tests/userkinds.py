"""A user's own model kind, as the README's "Extending raybricks" shows it: ordinary least
squares in numpy, stored as its coefficients (no model library at all)."""

from __future__ import annotations

import io

import numpy as np

from raybricks.kinds import ModelKind, filled_input


class LeastSquares(ModelKind):
    """Linear regression by least squares; ``params: {ridge: 0.1}`` shrinks it."""

    name = "tests.userkinds.LeastSquares"
    model_input = staticmethod(filled_input)  # a float matrix, gaps filled with medians

    def check(self) -> None:
        unknown = set(self.candidate.params) - {"ridge"}
        if unknown:
            from raybricks.errors import ConfigError

            raise ConfigError(f"models[{self.candidate.name}]: unknown params {unknown}")

    def fit(self, params, X, y, task, seed, threads, meta):
        if task != "regression":
            raise ValueError("LeastSquares fits regression only")
        design = np.column_stack([np.ones(len(X)), X])
        penalty = float(params.get("ridge", 0.0)) * np.eye(design.shape[1])
        penalty[0, 0] = 0.0  # the intercept is not shrunk
        return np.linalg.solve(design.T @ design + penalty, design.T @ y)

    def predict(self, model, X, task):
        return model[0] + np.asarray(X) @ model[1:]

    def serialize(self, model) -> bytes:
        buffer = io.BytesIO()
        np.save(buffer, model)
        return buffer.getvalue()

    @classmethod
    def load(cls, payload, meta):
        return np.load(io.BytesIO(payload))

    @classmethod
    def predict_loaded(cls, model, features, meta):
        return model[0] + cls.model_input(features, meta) @ model[1:]


class Unnamed(LeastSquares):
    """``LeastSquares`` as the README shows it: no ``name`` of its own."""

    name = ""
