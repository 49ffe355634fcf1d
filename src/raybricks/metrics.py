"""Validation metrics, in numpy (cheap enough to run thousands of times per second), and
``Metric``: a metric with its direction, through which every comparison of values goes.

Regression metrics take predicted values; classification metrics take an (n, k) matrix
of class probabilities and integer class codes. This module imports only numpy (and
scikit-learn lazily, for ``auc``), so ``raybricks.config`` can validate against it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

EPS = 1e-12

T = TypeVar("T")


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


def wape(y: np.ndarray, pred: np.ndarray) -> float:
    """Weighted absolute percentage error: the absolute errors over the absolute actuals."""
    total = np.sum(np.abs(y))
    return float(np.sum(np.abs(y - pred)) / total) if total > 0 else float("nan")


def bias(y: np.ndarray, pred: np.ndarray) -> float:
    """Mean forecast error (prediction minus actual): positive when forecasts run high."""
    return float(np.mean(pred - y))


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


def squared_errors(y: np.ndarray, pred: np.ndarray) -> np.ndarray:
    return (y - pred) ** 2


def absolute_errors(y: np.ndarray, pred: np.ndarray) -> np.ndarray:
    return np.abs(y - pred)


def percentage_errors(y: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """Absolute percentage errors; NaN where the actual is zero (mape leaves them out)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(y != 0, np.abs((y - pred) / np.where(y != 0, y, 1.0)), np.nan)


def symmetric_errors(y: np.ndarray, pred: np.ndarray) -> np.ndarray:
    denominator = np.abs(y) + np.abs(pred)
    return np.where(denominator == 0, 0.0, 2 * np.abs(y - pred) / np.maximum(denominator, EPS))


def log_losses(y: np.ndarray, proba: np.ndarray) -> np.ndarray:
    return -np.log(np.clip(proba[np.arange(len(y)), y], 1e-15, 1.0))


def misses(y: np.ndarray, proba: np.ndarray) -> np.ndarray:
    return (np.argmax(proba, axis=1) != y).astype(float)


def brier_scores(y: np.ndarray, proba: np.ndarray) -> np.ndarray:
    """Each row's squared distance between its class probabilities and its class."""
    truth = np.zeros_like(proba, dtype=float)
    truth[np.arange(len(y)), y] = 1.0
    return np.sum((proba - truth) ** 2, axis=1)


def _itself(values: np.ndarray) -> np.ndarray:
    return values


def _root(values: np.ndarray) -> np.ndarray:
    return np.sqrt(values)


def _missing(value: float | None) -> bool:
    return value is None or value != value  # None or NaN


@dataclass(frozen=True)
class Metric:
    """A metric: its function, the tasks it fits and whether larger values are better."""

    name: str
    function: Callable[[np.ndarray, np.ndarray], float]
    tasks: frozenset[str]
    greater_is_better: bool
    #: forecasting: the caller divides actuals and predictions by the series' in-sample
    #: seasonal naive error first (MASE is MAE scaled so)
    scaled: bool = False
    #: a signed metric whose best value is zero (bias): ranked by its absolute value
    signed: bool = False
    #: each row's loss, whose mean orders predictions as the metric does; for a metric
    #: that is not a mean over rows, a proper one of the same predictions (auc, f1: the
    #: Brier score; bias: absolute errors). Paired tests compare predictions with it.
    row_loss: Callable[[np.ndarray, np.ndarray], np.ndarray] = absolute_errors
    #: for a metric that is a function of the mean of ``row_loss`` (mae: itself, rmse:
    #: its square root), that function: ``scores_without`` then needs no row twice
    #: (element by element, on an array of means)
    of_mean: Callable[[np.ndarray], np.ndarray] | None = None

    def score(self, y: np.ndarray, pred: np.ndarray) -> float:
        """The metric of predictions ``pred`` against actual values ``y``."""
        return self.function(y, pred)

    def scores_without(self, y: np.ndarray, predictions: list[np.ndarray],
                       groups: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The metric of every prediction vector on the rows outside each group (``labels``
        x predictions): what each candidate scores when a fold or window is held out."""
        if self.of_mean is None:
            return np.array([[self.score(y[groups != g], p[groups != g]) for p in predictions]
                             for g in labels], dtype=float)
        losses = np.stack([self.row_loss(y, p) for p in predictions])  # candidates x rows
        member = (groups[None, :] == labels[:, None]).astype(float)  # groups x rows
        inside = member @ losses.T  # groups x candidates
        rest = len(y) - member.sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = (losses.sum(axis=1)[None, :] - inside) / rest
        return np.asarray(self.of_mean(np.maximum(means, 0.0)), dtype=float)

    def fits(self, task: str) -> bool:
        return task in self.tasks

    def loss(self, value: float | None) -> float:
        """A value to minimise: the metric, negated where larger is better; a missing
        (None or NaN) value ranks last."""
        if _missing(value):
            return float("inf")
        if self.signed:
            return abs(value)
        return -value if self.greater_is_better else value

    def losses(self, values: np.ndarray) -> np.ndarray:
        """``loss`` of every value (missing: infinite), so ``losses(a) < losses(b)`` is
        ``better`` element by element."""
        values = np.asarray(values, dtype=float)
        found = np.abs(values) if self.signed else -values if self.greater_is_better else values
        return np.where(np.isnan(values), np.inf, found)

    def better(self, a: float | None, b: float | None) -> bool:
        """True when ``a`` is strictly better than ``b``; a missing value (None or NaN)
        is never better, and any value is better than a missing one."""
        if _missing(a):
            return False
        if _missing(b):
            return True
        return self.loss(a) < self.loss(b)

    def not_worse(self, a: float, b: float) -> bool:
        """True when ``a`` is at least as good as ``b`` (False when either is NaN)."""
        if _missing(a) or _missing(b):
            return False
        return self.loss(a) <= self.loss(b)

    def beats(self, values: Iterable[float], baselines: Iterable[float]) -> float:
        """The share of positions where ``values`` is strictly better than ``baselines``
        (NaN on either side counts as not better); NaN when there are none."""
        values = np.asarray(values, dtype=float)
        baselines = np.asarray(baselines, dtype=float)
        if self.signed:
            values, baselines = np.abs(values), np.abs(baselines)
        wins = values > baselines if self.greater_is_better else values < baselines
        return float(np.mean(wins)) if len(values) else float("nan")

    def best(self, items: Iterable[T], value: Callable[[T], float | None]) -> T:
        """The item with the best value (the first on ties; missing values rank last)."""
        return min(items, key=lambda item: self.loss(value(item)))

    def within(self, value: float | None, best: float | None, share: float) -> bool:
        """Whether ``value`` is at most ``share`` (0.1: 10%) worse than ``best``, relative
        to the best's size (a missing value never is)."""
        if _missing(value) or _missing(best):
            return False
        return self.loss(value) - self.loss(best) <= share * abs(self.loss(best)) + EPS

    def differences(self, y: np.ndarray, pred: np.ndarray, reference: np.ndarray
                    ) -> np.ndarray:
        """Per-row loss differences of ``pred`` against ``reference`` (negative where
        ``pred`` does better); rows without a value on either side (mape's zero actuals)
        are left out."""
        found = self.row_loss(y, pred) - self.row_loss(y, reference)
        return found[np.isfinite(found)]

    def clearly_better(self, y: np.ndarray, pred: np.ndarray, reference: np.ndarray,
                       margin: float, blocks: int | None = None) -> bool:
        """Whether ``pred`` beats ``reference`` on the same rows by more than ``margin``
        standard errors of their paired loss differences (a one-sided paired test; with
        ``margin`` 0, by any amount). ``blocks``: the rows are in time order, and their
        differences are averaged over that many consecutive blocks first (batch means:
        neighbouring rows' errors move together, and the spread of single rows would
        understate the noise). Fewer than two comparable units: not shown."""
        found = self.differences(y, pred, reference).tolist()
        if blocks is not None and len(found) > blocks:  # np.array_split's blocks
            size, extra = divmod(len(found), blocks)
            ends = [i * size + min(i, extra) for i in range(blocks + 1)]
            found = [math.fsum(found[a:b]) / (b - a) for a, b in itertools.pairwise(ends)]
        if len(found) < 2:
            return margin == 0 and len(found) == 1 and found[0] < 0
        # plain floats: a segment's few validation rows, where numpy's per-call cost
        # would be most of the selection's time (fsum: exact, whatever the rows' order)
        mean = math.fsum(found) / len(found)
        error = math.sqrt(math.fsum((v - mean) ** 2 for v in found) / (len(found) - 1)
                          / len(found))
        return mean < 0 and -mean > margin * error

    def weights(self, values: Sequence[float | None]) -> list[float]:
        """Weights of a weighted ensemble, summing to one: proportional to the metric
        where larger is better, to its inverse where smaller is (clipped at ``EPS``; a
        missing value gets ``EPS``)."""
        if self.greater_is_better:
            raw = [EPS if _missing(v) else max(v, EPS) for v in values]
        else:
            raw = [EPS if _missing(v) else 1.0 / max(self.loss(v), EPS) for v in values]
        total = sum(raw)
        return [w / total for w in raw]


_REGRESSION = frozenset({"regression", "forecast"})
_CLASSIFICATION = frozenset({"binary", "multiclass"})
_FORECAST = frozenset({"forecast"})

METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("rmse", rmse, _REGRESSION, greater_is_better=False,
               row_loss=squared_errors, of_mean=_root),
        Metric("mae", mae, _REGRESSION, greater_is_better=False,
               row_loss=absolute_errors, of_mean=_itself),
        Metric("mape", mape, _REGRESSION, greater_is_better=False,
               row_loss=percentage_errors),
        Metric("smape", smape, _REGRESSION, greater_is_better=False,
               row_loss=symmetric_errors, of_mean=_itself),
        Metric("r2", r2, frozenset({"regression"}), greater_is_better=True,
               row_loss=squared_errors),
        Metric("mase", mae, _FORECAST, greater_is_better=False, scaled=True,
               row_loss=absolute_errors, of_mean=_itself),
        Metric("wape", wape, _FORECAST, greater_is_better=False,
               row_loss=absolute_errors),
        Metric("bias", bias, _FORECAST, greater_is_better=False, signed=True,
               row_loss=absolute_errors),
        Metric("logloss", logloss, _CLASSIFICATION, greater_is_better=False,
               row_loss=log_losses),
        Metric("auc", auc, _CLASSIFICATION, greater_is_better=True, row_loss=brier_scores),
        Metric("accuracy", accuracy, _CLASSIFICATION, greater_is_better=True,
               row_loss=misses),
        Metric("f1", f1, _CLASSIFICATION, greater_is_better=True, row_loss=brier_scores),
    )
}
DEFAULT_METRIC: dict[str, str] = {
    "regression": "rmse", "binary": "logloss", "multiclass": "logloss", "forecast": "mase",
}


def metric(name: str | Metric) -> Metric:
    """The metric called ``name`` (a ``Metric`` is returned as it is)."""
    if isinstance(name, Metric):
        return name
    try:
        return METRICS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown metric {name!r}; allowed: {sorted(METRICS)}") from None

