"""The numpy metrics agree with scikit-learn's reference implementations."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as sk

from raybricks.training import metrics

rng = np.random.default_rng(3)
Y = rng.normal(loc=5, size=200)
PRED = Y + rng.normal(scale=0.5, size=200)
CLASSES = rng.integers(0, 3, 300)
PROBA = rng.dirichlet(np.ones(3), size=300)
BINARY = rng.integers(0, 2, 300)
PROBA2 = np.column_stack([1 - rng.random(300), np.zeros(300)])
PROBA2[:, 1] = 1 - PROBA2[:, 0]


@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("rmse", lambda y, p: np.sqrt(sk.mean_squared_error(y, p))),
        ("mae", sk.mean_absolute_error),
        ("mape", sk.mean_absolute_percentage_error),
        ("r2", sk.r2_score),
    ],
)
def test_regression_metrics(name, reference):
    assert metrics.score(name, Y, PRED) == pytest.approx(reference(Y, PRED))


def test_smape_and_zero_actuals():
    assert metrics.smape(np.array([0.0, 2.0]), np.array([0.0, 1.0])) == pytest.approx(1 / 3)
    assert metrics.mape(np.array([0.0, 2.0]), np.array([5.0, 1.0])) == pytest.approx(0.5)


def test_classification_metrics():
    assert metrics.logloss(CLASSES, PROBA) == pytest.approx(sk.log_loss(CLASSES, PROBA))
    assert metrics.accuracy(CLASSES, PROBA) == pytest.approx(
        sk.accuracy_score(CLASSES, PROBA.argmax(1)))
    assert metrics.f1(CLASSES, PROBA) == pytest.approx(
        sk.f1_score(CLASSES, PROBA.argmax(1), average="macro"))
    assert metrics.f1(BINARY, PROBA2) == pytest.approx(sk.f1_score(BINARY, PROBA2.argmax(1)))
    assert metrics.auc(BINARY, PROBA2) == pytest.approx(sk.roc_auc_score(BINARY, PROBA2[:, 1]))
    assert metrics.auc(CLASSES, PROBA) == pytest.approx(
        sk.roc_auc_score(CLASSES, PROBA, multi_class="ovr", average="macro"))


def test_loss_orders_every_metric_lower_is_better():
    assert metrics.loss("r2", 0.9) < metrics.loss("r2", 0.5)
    assert metrics.loss("rmse", 0.5) < metrics.loss("rmse", 0.9)
    assert metrics.loss("auc", float("nan")) == float("inf")
