"""``kind: function``: a user's ``fit(X, y, params)`` (``function:``, an import path)
returning a model with ``predict`` / ``predict_proba``; it gets the feature frame and is
stored as a pickle (the consumer needs the model's module)."""

from __future__ import annotations

from typing import Any

from .base import ModelKind, import_object


class FunctionKind(ModelKind):
    name = "function"
    library = "scikit-learn"

    @classmethod
    def check_config(cls, candidate) -> None:
        if not candidate.function:
            raise ValueError(
                f"models[{candidate.name}] of kind function needs function: an import path "
                "of fit(X, y, params) returning a fitted model"
            )

    def warm_up(self) -> None:
        import_object(self.candidate.function)

    def check(self) -> None:
        import_object(self.candidate.function)

    def fit(self, params, X, y, task, seed, threads, meta) -> Any:
        return import_object(self.candidate.function)(X, y, params)
