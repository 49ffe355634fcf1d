"""Validation metrics, in numpy (cheap enough to run thousands of times per second).

Regression metrics take predicted values; classification metrics take an (n, k) matrix
of class probabilities and integer class codes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from raybricks.config import METRICS

EPS = 1e-12


def rmse(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.sqrt(np.mean((y - pred) ** 2)))


def mae(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.mean(np.abs(y - pred)))


def mape(y: np.ndarray, pred: np.ndarray) -> float:
    """Mean absolute percentage error over rows whose actual value is not zero."""
    nonzero = y != 0
    if not nonzero.any():
        return float("nan")
    return float(np.mean(np.abs((y[nonzero] - pred[nonzero]) / y[nonzero])))


def smape(y: np.ndarray, pred: np.ndarray) -> float:
    denominator = np.abs(y) + np.abs(pred)
    ratio = np.where(denominator == 0, 0.0, 2 * np.abs(y - pred) / np.maximum(denominator, EPS))
    return float(np.mean(ratio))


def r2(y: np.ndarray, pred: np.ndarray) -> float:
    total = np.sum((y - y.mean()) ** 2)
    if total == 0:
        return float("nan")
    return float(1 - np.sum((y - pred) ** 2) / total)


def logloss(y: np.ndarray, proba: np.ndarray) -> float:
    picked = proba[np.arange(len(y)), y]
    return float(-np.mean(np.log(np.clip(picked, 1e-15, 1.0))))


def accuracy(y: np.ndarray, proba: np.ndarray) -> float:
    return float(np.mean(np.argmax(proba, axis=1) == y))


def f1(y: np.ndarray, proba: np.ndarray) -> float:
    """F1 of the positive class for two classes, macro-averaged F1 for more."""
    labels = np.argmax(proba, axis=1)
    classes = [1] if proba.shape[1] == 2 else range(proba.shape[1])
    scores = []
    for c in classes:
        tp = np.sum((labels == c) & (y == c))
        fp = np.sum((labels == c) & (y != c))
        fn = np.sum((labels != c) & (y == c))
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def auc(y: np.ndarray, proba: np.ndarray) -> float:
    """ROC AUC (one-vs-rest macro for more than two classes); NaN with a single class."""
    from sklearn.metrics import roc_auc_score

    present = np.unique(y)
    if len(present) < 2:
        return float("nan")
    if proba.shape[1] == 2:
        return float(roc_auc_score(y, proba[:, 1]))
    scores = [roc_auc_score(y == c, proba[:, c]) for c in present]
    return float(np.mean(scores))


FUNCTIONS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "rmse": rmse, "mae": mae, "mape": mape, "smape": smape, "r2": r2,
    "logloss": logloss, "auc": auc, "accuracy": accuracy, "f1": f1,
}


def score(metric: str, y: np.ndarray, pred: np.ndarray) -> float:
    return FUNCTIONS[metric](y, pred)


def greater_is_better(metric: str) -> bool:
    return bool(METRICS[metric]["greater_is_better"])


def loss(metric: str, value: float) -> float:
    """A value to minimise: the metric, negated where larger is better; NaN ranks last."""
    if value != value:  # NaN
        return float("inf")
    return -value if greater_is_better(metric) else value
