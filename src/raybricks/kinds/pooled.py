"""``global``: the member that stands for the job's global model (``fallback: global``) in
a segment's blend. The segmented model predicts it with the global model it already
holds. It stores nothing, except in task forecast: there it stores its series' last
periods (Parquet), which the global lag model continues. A segment of another task that
chose the global model alone has no members."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pandas as pd

from .base import ModelKind


class GlobalKind(ModelKind):
    name = "global"
    uses_fallback = True

    @classmethod
    def load(cls, payload: bytes, meta: dict[str, Any]) -> pd.DataFrame | None:
        """Task forecast: the series' history; else None."""
        if not payload:
            return None
        import pyarrow.parquet as pq

        return pq.read_table(io.BytesIO(payload)).to_pandas()

    @classmethod
    def predict_loaded(cls, model, features, meta):
        raise RuntimeError("a global member predicts through the segmented model's fallback")

    @classmethod
    def continue_series(cls, history: pd.DataFrame, fallback: Any, features: pd.DataFrame,
                        meta: dict[str, Any]) -> np.ndarray:
        """Task forecast: the global lag model (``fallback``, a loaded member) forecasting
        the rows of ``features`` from a series' ``history`` (``meta``: the series')."""
        from .lags import Continued

        return fallback.kind.predict_loaded(Continued(fallback.model, history), features, meta)

    @classmethod
    def continue_many_series(cls, requests: list[tuple[pd.DataFrame, pd.DataFrame,
                                                       dict[str, Any]]],
                             fallback: Any) -> list[np.ndarray]:
        """``continue_series`` of many series at once (``requests``: each series'
        history, rows of features and meta): one recursion of the global lag model for
        all series forecast the same number of periods ahead, instead of one each."""
        from .forecasting import ID, future_of, placed

        found = [future_of(features, meta) for _, features, meta in requests]
        out = [np.full(len(steps), np.nan) for steps, _ in found]
        horizons: dict[int, list[int]] = {}
        for number, (_, future) in enumerate(found):
            if future is not None:
                horizons.setdefault(len(future), []).append(number)
        exogenous = fallback.meta["forecast"]["exogenous"]
        for horizon, numbers in horizons.items():
            histories = pd.concat([requests[n][0].assign(**{ID: i})
                                   for i, n in enumerate(numbers)], ignore_index=True)
            futures = pd.concat([found[n][1].assign(**{ID: i}) for i, n in enumerate(numbers)],
                                ignore_index=True)
            paths = fallback.kind.continue_many(fallback.model, histories, futures, horizon,
                                                exogenous)
            for i, n in enumerate(numbers):
                out[n] = placed(paths[i], found[n][0])
        return out

    def serialize(self, model) -> bytes:
        return b""
