"""What monitoring compares new rows with: a segment's training rows summarized at
training time (its ``profile``, stored in the model's index), and the drift of new rows
against it.

A profile holds, per feature, the bins of its training values (numeric: quantile edges;
categorical: its most frequent categories) with the share of training rows in each (and
in a bin of missing values), how many rows it summarizes, and the segment's naive
prediction (``naive``: what its baseline predicts, for the baseline's realized error).
Drift of a feature is the population stability index (PSI) of the new rows' shares
against the training shares, with a chi-square test of the two samples' counts, so a
small segment's noise does not read as drift. numpy, pandas and scipy only: it runs in
the training tasks and in monitoring's Spark tasks.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

#: The most bins a numeric feature is cut into (deciles); fewer for small segments.
MAX_BINS = 10
#: Training rows per bin at least: a segment of 40 rows gets 4 bins.
ROWS_PER_BIN = 10
#: The categories of a categorical feature kept by name (the others share one bin).
TOP_CATEGORIES = 9


def bins_for(rows: int) -> int:
    """How many quantile bins ``rows`` training values are cut into (2 to ``MAX_BINS``)."""
    return int(min(MAX_BINS, max(2, rows // ROWS_PER_BIN)))


@functools.lru_cache(maxsize=MAX_BINS + 1)
def _cuts(bins: int) -> tuple[float, ...]:
    """The inner quantile levels of ``bins`` equal bins."""
    return tuple(np.linspace(0, 1, bins + 1)[1:-1].tolist())


def numeric_profile(values: np.ndarray, presorted: bool = False) -> dict[str, Any]:
    """A numeric feature's training values (NaN: missing; ``presorted``: sorted already,
    NaN last) as quantile ``edges`` and the ``shares`` of rows in each bin
    (``numeric_bins``), the last share being the missing values'. Plain Python on the
    sorted values: a segment has a few dozen rows, where numpy's per-call cost would
    dominate (this runs once per feature of every segment trained)."""
    ordered = values if presorted else np.sort(values)  # NaN last
    rows = len(ordered)
    present = rows - int(np.count_nonzero(ordered != ordered))
    if not present:
        return {"edges": [], "shares": [0.0, 1.0]}
    known = ordered[:present].tolist()
    found = set()
    for level in _cuts(bins_for(present)):  # np.quantile's linear interpolation
        position = level * (present - 1)
        low = int(position)
        high = min(low + 1, present - 1)
        value = known[low] + (position - low) * (known[high] - known[low])
        found.add(float(f"{value:.6g}"))  # six digits: an edge needs no more
    edges = sorted(found)
    below = [bisect.bisect_right(known, edge) for edge in edges]  # values <= each edge
    counts = [b - a for a, b in zip([0, *below], [*below, present], strict=True)]
    return {"edges": edges,
            "shares": [round(c / rows, 6) for c in [*counts, rows - present]]}


def categorical_profile(values: pd.Series) -> dict[str, Any]:
    """A categorical feature's training values as its most frequent ``categories`` and
    the ``shares`` of rows in each, then the other categories', then the missing."""
    text = values.astype("object").where(values.notna(), None)
    counts = text.dropna().astype(str).value_counts()
    categories = counts.index[:TOP_CATEGORIES].tolist()
    return {"categories": categories, "shares": _shares(
        categorical_bins(text.to_numpy(), categories), len(categories) + 2)}


def numeric_bins(values: np.ndarray, edges: np.ndarray | list[float]) -> np.ndarray:
    """Each value's bin: 0..len(edges) by the edges (a value on an edge goes below it),
    len(edges) + 1 for a missing one."""
    edges = np.asarray(edges, dtype="float64")
    found = np.searchsorted(edges, values, side="left")
    return np.where(np.isnan(values), len(edges) + 1, found)


def categorical_bins(values: np.ndarray, categories: list[str]) -> np.ndarray:
    """Each value's bin: its category's position (by its text), len(categories) for
    another category, len(categories) + 1 for a missing one."""
    values = np.asarray(values, dtype=object)
    lookup = {c: i for i, c in enumerate(categories)}
    other = len(categories)
    found = np.fromiter((lookup.get(str(v), other) for v in values), dtype=np.int64,
                        count=len(values))
    return np.where(pd.isna(values), other + 1, found)


def floats(values: np.ndarray) -> np.ndarray:
    """Values as float64, NaN where missing or not a number."""
    if values.dtype.kind in "fiub":
        return values.astype("float64", copy=False)
    return pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(
        dtype="float64", na_value=np.nan)


def _shares(bins: np.ndarray, size: int) -> list[float]:
    counts = np.bincount(bins.astype("int64"), minlength=size)
    return np.round(counts / max(len(bins), 1), 6).tolist()


def profile(values: np.ndarray | None, numeric: list[str], frame: pd.DataFrame | None,
            categorical: list[str], naive: list[float], validation_rows: int,
            ordered: np.ndarray | None = None) -> dict[str, Any]:
    """A segment's profile: ``values`` (rows x ``numeric`` features, NaN for missing;
    ``ordered``: each column sorted, NaN last, when the caller has it), the
    ``categorical`` columns of ``frame``, its ``naive`` prediction and how many rows its
    validation metric was measured on (what its noise depends on)."""
    features: dict[str, Any] = {}
    columns = np.sort(values, axis=0) if ordered is None and numeric else ordered
    for position, name in enumerate(numeric):
        features[name] = numeric_profile(columns[:, position], presorted=True)
    for name in categorical:
        features[name] = categorical_profile(frame[name])
    rows = len(values) if values is not None else len(frame) if frame is not None else 0
    return {"rows": int(rows), "validation_rows": int(validation_rows),
            "naive": [float(v) for v in naive], "features": features}


@dataclass(frozen=True)
class Drift:
    """A feature's drift: its PSI against the training shares and the chi-square
    test's p-value that both samples come from one distribution."""

    feature: str
    psi: float
    p_value: float


def feature_drift(name: str, stored: dict[str, Any], trained_rows: int,
                  values: np.ndarray | pd.Series) -> Drift:
    """The drift of a feature's new ``values`` against its stored profile."""
    values = np.asarray(values)
    if "edges" in stored:
        bins = numeric_bins(floats(values), stored["edges"])
    else:
        bins = categorical_bins(values, stored["categories"])
    expected = np.asarray(stored["shares"], dtype="float64") * trained_rows
    actual = np.bincount(bins.astype("int64"), minlength=len(expected)).astype("float64")
    used = (expected > 0) | (actual > 0)
    expected, actual = expected[used], actual[used]
    if len(expected) < 2 or not actual.sum():
        return Drift(name, 0.0, 1.0)
    return Drift(name, psi(expected, actual), same_distribution(expected, actual))


def same_distribution(expected: np.ndarray, actual: np.ndarray) -> float:
    """The p-value of Pearson's chi-square test that two samples' bin counts come from
    one distribution (scipy's ``chi2_contingency`` without continuity correction, minus
    its per-call overhead, which dominated monitoring's time per segment)."""
    from scipy.special import chdtrc

    table = np.vstack([expected, actual])
    fitted = table.sum(axis=1, keepdims=True) * table.sum(axis=0) / table.sum()
    statistic = float(np.sum((table - fitted) ** 2 / fitted))
    return float(chdtrc(table.shape[1] - 1, statistic))


def psi(expected: np.ndarray, actual: np.ndarray) -> float:
    """The population stability index of counts ``actual`` against ``expected`` (half a
    row added to every bin on both sides, so an empty bin does not make it infinite)."""
    e = (expected + 0.5) / (expected.sum() + 0.5 * len(expected))
    a = (actual + 0.5) / (actual.sum() + 0.5 * len(actual))
    return float(np.sum((a - e) * np.log(a / e)))


def drifts(stored: dict[str, Any], columns: Mapping[str, Any]) -> list[Drift]:
    """Every profiled feature's drift of the new rows (``columns``: a frame, or column
    name -> values; those the profile has), worst (largest PSI) first."""
    found = [feature_drift(name, feature, stored["rows"], columns[name])
             for name, feature in stored.get("features", {}).items() if name in columns]
    return sorted(found, key=lambda d: -d.psi)
