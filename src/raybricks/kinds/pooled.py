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

    def serialize(self, model) -> bytes:
        return b""
