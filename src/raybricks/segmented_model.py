"""Predicting with stored per-segment models, importing nothing from raybricks.

Every fitted model is stored in its library's own format: LightGBM's model text,
XGBoost's UBJSON, and scikit-learn's pickle (of scikit-learn objects only; kind
``function``: the pickle of the user's model, whose module the consumer needs). Beside the
bytes, a small JSON ``meta`` says how to build the feature matrix: the feature order,
the categories of each categorical feature, the task and the class labels.

This module is what consumers of the registered model run, so it depends only on
numpy, pandas and the model libraries (imported lazily, per kind).
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np
import pandas as pd

CLASSIFICATION = ("binary", "multiclass")


def prepare_features(frame: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """The feature matrix a model was trained on: its columns in its order, numbers as
    float64, categoricals with exactly the training categories (unseen values -> NaN)."""
    categorical: dict[str, list] = meta.get("categorical", {})
    features = meta["features"]
    plain = [
        c for c in features
        if c not in categorical and pd.api.types.is_numeric_dtype(frame[c].dtype)
        and not pd.api.types.is_datetime64_any_dtype(frame[c].dtype)
    ]
    if len(plain) == len(features):  # the common case: one bulk conversion
        values = frame[plain].to_numpy(dtype="float64", na_value=np.nan)
        return pd.DataFrame(values, columns=plain, index=frame.index)
    columns = {}
    for name in features:
        values = frame[name]
        if name in categorical:
            columns[name] = pd.Categorical(
                values.astype("object").where(values.notna(), None), categories=categorical[name]
            )
        else:
            columns[name] = to_float(values)
    return pd.DataFrame(columns, index=frame.index)


def to_float(values: pd.Series) -> np.ndarray:
    """Numbers, booleans, decimals and datetimes (as epoch seconds) as float64."""
    if pd.api.types.is_datetime64_any_dtype(values):
        stamps = pd.to_datetime(values, utc=True)
        seconds = (stamps - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
        return seconds.to_numpy(dtype="float64", na_value=np.nan)
    if values.dtype == object:
        values = pd.to_numeric(values, errors="coerce")
    return pd.Series(values).astype("float64").to_numpy(na_value=np.nan)


def sklearn_input(features: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame | np.ndarray:
    """What scikit-learn models see: missing numbers filled with the training medians;
    a plain float matrix when there are no categoricals, else a frame whose categoricals
    are plain objects for the pipeline's one-hot encoder."""
    fill = meta.get("fill", {})
    categorical = list(meta.get("categorical", {}))
    if not categorical:
        matrix = features.to_numpy(dtype="float64", na_value=np.nan)
        missing = np.isnan(matrix)
        if missing.any():
            medians = np.array([fill.get(c, 0.0) for c in features.columns])
            matrix = np.where(missing, medians, matrix)
        return matrix
    present = {k: v for k, v in fill.items() if k in features.columns}
    if present and features[list(present)].isna().to_numpy().any():
        features = features.fillna(present)
    return features.astype({c: "object" for c in categorical})


class MemberModel:
    """One fitted model: ``predict`` gives values (regression) or an (n, k) matrix of
    class probabilities (classification)."""

    def __init__(self, kind: str, payload: bytes, meta: dict[str, Any]) -> None:
        self.kind = kind
        self.meta = meta
        self.task = meta["task"]
        self.n_classes = len(meta.get("classes") or [])
        if kind == "lightgbm":
            import lightgbm as lgb

            self.model = lgb.Booster(model_str=payload.decode())
        elif kind == "xgboost":
            import xgboost as xgb

            self.model = xgb.Booster()
            self.model.load_model(bytearray(payload))
            self.model.set_param({"nthread": 1})
        else:
            self.model = pickle.loads(payload)  # noqa: S301 - scikit-learn's own format

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        features = prepare_features(frame, self.meta)
        if self.kind == "lightgbm":
            raw = self.model.predict(features, num_threads=1)
        elif self.kind == "xgboost":
            import xgboost as xgb

            raw = self.model.predict(xgb.DMatrix(features, enable_categorical=True))
        else:  # sklearn gets its prepared matrix; a user "function" model the frame
            data = sklearn_input(features, self.meta) if self.kind == "sklearn" else features
            classify = self.task in CLASSIFICATION
            raw = self.model.predict_proba(data) if classify else self.model.predict(data)
        return self._shape(np.asarray(raw, dtype="float64"))

    def _shape(self, raw: np.ndarray) -> np.ndarray:
        if self.task not in CLASSIFICATION:
            return raw.reshape(-1)
        if raw.ndim == 1:  # probability of the positive class
            raw = np.column_stack([1.0 - raw, raw])
        if raw.shape[1] < self.n_classes:  # classes absent from a training split
            trained = self.meta.get("trained_classes", list(range(raw.shape[1])))
            full = np.zeros((raw.shape[0], self.n_classes))
            full[:, trained] = raw
            raw = full
        return raw


class SegmentModel:
    """A segment's ensemble: the weighted mean of its members' predictions."""

    def __init__(self, members: list[tuple[MemberModel, float]]) -> None:
        self.members = members
        self.meta = members[0][0].meta

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]]) -> SegmentModel:
        """Build from stored rows with ``kind``, ``payload``, ``meta`` (JSON), ``weight``."""
        return cls(
            [
                (MemberModel(row["kind"], row["payload"], json.loads(row["meta"])), row["weight"])
                for row in rows
            ]
        )

    def predict_raw(self, frame: pd.DataFrame) -> np.ndarray:
        total = sum(weight for _, weight in self.members)
        return sum(member.predict(frame) * (weight / total) for member, weight in self.members)

    def predict(self, frame: pd.DataFrame, probabilities: bool = False) -> np.ndarray:
        """Values for regression; class labels (or probabilities) for classification."""
        raw = self.predict_raw(frame)
        if self.meta["task"] not in CLASSIFICATION or probabilities:
            return raw
        classes = np.asarray(self.meta["classes"], dtype=object)
        return classes[np.argmax(raw, axis=1)]
