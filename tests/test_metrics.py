"""The numpy metrics agree with scikit-learn's reference implementations."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as sk

from raybricks import metrics

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
    assert metrics.metric(name).score(Y, PRED) == pytest.approx(reference(Y, PRED))


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
    assert metrics.metric("r2").loss(0.9) < metrics.metric("r2").loss(0.5)
    assert metrics.metric("rmse").loss(0.5) < metrics.metric("rmse").loss(0.9)
    assert metrics.metric("auc").loss(float("nan")) == float("inf")


NAN = float("nan")


def test_metric_directions_and_missing_values():
    rmse, auc = metrics.metric("rmse"), metrics.metric("auc")
    assert not rmse.greater_is_better and auc.greater_is_better
    # strictly better; a missing value is never better, anything beats a missing one
    assert rmse.better(0.5, 0.9) and not rmse.better(0.9, 0.5) and not rmse.better(0.5, 0.5)
    assert auc.better(0.9, 0.5) and not auc.better(0.5, 0.9) and not auc.better(0.5, 0.5)
    for m in (rmse, auc):
        assert not m.better(NAN, 0.5) and not m.better(None, 0.5)
        assert m.better(0.5, NAN) and m.better(0.5, None)
        assert not m.better(NAN, NAN)
    # at least as good; False against NaN
    assert rmse.not_worse(0.5, 0.5) and rmse.not_worse(0.4, 0.5)
    assert not rmse.not_worse(0.6, 0.5)
    assert auc.not_worse(0.5, 0.5) and auc.not_worse(0.6, 0.5)
    assert not auc.not_worse(0.4, 0.5)
    assert not rmse.not_worse(NAN, 0.5) and not auc.not_worse(0.5, NAN)


def test_metric_beats_share_and_weights():
    rmse, auc = metrics.metric("rmse"), metrics.metric("auc")
    values, base = [0.5, 0.9, NAN, 0.7], [0.6, 0.8, 0.5, 0.7]
    assert rmse.beats(values, base) == pytest.approx(0.25)  # NaN and ties are no wins
    assert auc.beats(values, base) == pytest.approx(0.25)
    assert auc.beats([0.9, 0.9], [0.5, NAN]) == pytest.approx(0.5)
    assert np.isnan(rmse.beats([], []))
    # weights sum to one; smaller-is-better weighs by the inverse, NaN gets EPS
    assert rmse.weights([1.0, 3.0]) == pytest.approx([0.75, 0.25])
    assert auc.weights([0.6, 0.2]) == pytest.approx([0.75, 0.25])
    assert sum(rmse.weights([1.0, NAN])) == pytest.approx(1.0)
    assert rmse.weights([1.0, NAN])[1] == pytest.approx(metrics.EPS / (1 + metrics.EPS))
    assert auc.weights([-0.5, NAN]) == pytest.approx([0.5, 0.5])  # both clipped to EPS
    assert rmse.best([0.9, NAN, 0.5], lambda v: v) == 0.5
    assert auc.best([0.5, NAN, 0.9], lambda v: v) == 0.9


def test_within_a_share_of_the_best_in_either_direction():
    mae, r2, bias = metrics.metric("mae"), metrics.metric("r2"), metrics.metric("bias")
    assert mae.within(1.1, 1.0, 0.1) and not mae.within(1.11, 1.0, 0.1)
    assert mae.within(1.0, 1.0, 0.0) and mae.within(5.0, 0.0, 0.0) is False
    assert r2.within(0.72, 0.8, 0.1) and not r2.within(0.71, 0.8, 0.1)  # larger is better
    assert bias.within(-1.05, 1.0, 0.1) and not bias.within(1.2, -1.0, 0.1)  # by size
    assert not mae.within(NAN, 1.0, 10.0) and not mae.within(1.0, NAN, 10.0)


def test_metric_lookup_and_registry():
    assert metrics.metric("rmse") is metrics.METRICS["rmse"]
    assert metrics.metric(metrics.METRICS["f1"]) is metrics.METRICS["f1"]
    with pytest.raises(ValueError, match="unknown metric 'nope'"):
        metrics.metric("nope")
    for task, name in metrics.DEFAULT_METRIC.items():
        assert metrics.metric(name).fits(task)
    assert metrics.metric("auc").fits("binary") and not metrics.metric("auc").fits("regression")


def test_time_ordered_differences_are_tested_over_blocks():
    """Errors of neighbouring time-ordered rows move together (a week of storms): a
    lead made of a few good and bad stretches looks certain row by row, and is within
    the noise over blocks of consecutive rows."""
    stretches = np.repeat([-0.6, -0.5, 0.4, -0.4, 0.5], 20)
    noise = np.random.default_rng(0).normal(scale=0.01, size=100)
    y, reference = np.zeros(100), np.ones(100)
    pred = 1 + stretches + noise  # absolute errors: 1 + stretch, against 1
    mae = metrics.metric("mae")
    assert mae.clearly_better(y, pred, reference, margin=1.0)
    assert not mae.clearly_better(y, pred, reference, margin=1.0, blocks=5)
    steady = 1 - 0.12 + noise  # the same lead, every row
    assert mae.clearly_better(y, steady, reference, margin=1.0, blocks=5)


@pytest.mark.parametrize("name", ["rmse", "mae", "mase", "smape", "mape", "wape", "r2"])
def test_scores_without_each_group_equal_the_metric_on_the_other_rows(name):
    """Cross-fitting's scores with a window or fold held out: the shortcut over the mean
    of row losses gives what the metric gives on the remaining rows."""
    rng = np.random.default_rng(3)
    y = rng.normal(5, 2, 42)
    y[::9] = 0.0  # mape leaves zero actuals out
    predictions = [y + rng.normal(0, s, 42) for s in (0.5, 1.0, 3.0)]
    groups = np.arange(42) % 6 if name == "mae" else np.arange(42) // 7  # interleaved too
    labels = np.unique(groups)
    metric = metrics.metric(name)
    found = metric.scores_without(y, predictions, groups, labels)
    expected = [[metric.score(y[groups != g], p[groups != g]) for p in predictions]
                for g in labels]
    assert found.shape == (len(labels), len(predictions))
    np.testing.assert_allclose(found, expected, rtol=1e-12, atol=1e-12)
