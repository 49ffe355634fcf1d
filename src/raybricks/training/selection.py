"""Choosing a segment's model from its evaluated candidates, and what the choice is worth.

``select``: the ensemble of the best candidates (``choose``), kept only when it beats the
simpler reference by more than the noise of the comparison (``ensemble.margin``
standard errors of the paired loss differences on the validation rows, which must hold
every class of the segment), and then blended with the reference (``ensemble.shrink``).
The reference is the global model, or the naive baseline where it is shown better by the
same rule. Picking the best of several candidates on a few noisy rows rewards luck; the
reference needs none. Where the validation rows cannot rank the candidates at all (the
metric has no value for any of them: AUC on rows of one class, mape on rows whose actuals
are all zero), the reference serves, or, with no reference (``selection: local_only``),
the mean of the candidates that fitted; never the first of the job's list
(``unranked``).

``cross_fitted``: the validation predictions of the selection made without each group of
rows (a fold, a backtest window, or a fifth of a holdout), so the reported metric estimates
how the selection does on rows it did not choose on, not the winner's own, flattering
score.
"""

from __future__ import annotations

import json
import math
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from raybricks import metrics
from raybricks.config import RESERVED_NAMES, CandidateConfig
from raybricks.kinds import CLASSIFICATION
from raybricks.kinds.base import MemberMeta
from raybricks.results import FAILED, SKIPPED, members_schema, result_schema

if TYPE_CHECKING:
    from raybricks.training.plan import Plan


@dataclass(eq=False)
class Evaluation:
    """The best setting found for one candidate on one segment (equal only to itself)."""

    candidate: CandidateConfig
    params: dict[str, Any] | None = None
    value: float = float("nan")
    predictions: np.ndarray | None = None  # out-of-split predictions, validation rows
    split_models: list = field(default_factory=list)
    error: str | None = None
    stored: list[dict[str, Any]] | None = None  # its member rows, made where it was fitted


def is_reference(evaluation: Evaluation) -> bool:
    """The naive baseline and the global model: what a local candidate must beat."""
    return evaluation.candidate.name in RESERVED_NAMES


def choose(evaluations: list[Evaluation], plan: Plan) -> list[tuple[Evaluation, float]]:
    """The ensemble's members and weights by validation metric alone, from the
    candidates that fitted and have a value (none where no candidate has one)."""
    metric = metrics.metric(plan.metric)
    # a candidate without a value (NaN) cannot be ranked: it stays out of the ensemble
    ok = sorted((e for e in evaluations if e.error is None and has_value(e)),
                key=lambda e: metric.loss(e.value))
    if not ok:
        return []
    if plan.ensemble == "best":
        return [(ok[0], 1.0)]
    top = [e for e in ok[: plan.top_k] if plan.within is None
           or metric.within(e.value, ok[0].value, plan.within)]
    if plan.ensemble == "mean":
        return [(e, 1.0 / len(top)) for e in top]
    weights = metric.weights([e.value for e in top])
    return list(zip(top, weights, strict=True))


def reference(evaluations: list[Evaluation], y: np.ndarray, plan: Plan) -> Evaluation | None:
    """What the segment falls back on: the global model, unless the naive baseline is
    shown better on the rows ``y`` (``shown_better``; None when neither competes). The
    global model learned from every segment's rows, the baseline from this segment's
    few: on the held-out rows of docs/benchmarks.md the baseline was behind it on
    average on every dataset, and where it won a few validation rows by luck (county
    murder rates, 3 rows each) it cost most of the registered model's gap to the
    global model alone. Where no candidate has a value on these rows (``unranked``), a
    reference whose predictions are all finite is one."""
    fitted = [e for e in evaluations if e.error is None]
    ranked = any(has_value(e) for e in fitted)
    found = {e.candidate.name: e for e in fitted if is_reference(e) and (
        has_value(e) if ranked else finite_predictions(e))}
    naive, pooled = found.get("baseline"), found.get("global")
    if naive is None or pooled is None:
        return naive or pooled
    return naive if shown_better(y, naive.predictions, pooled.predictions, plan) else pooled


def select(evaluations: list[Evaluation], y: np.ndarray, plan: Plan
           ) -> list[tuple[Evaluation, float]]:
    """``choose``, then the noise rule: anything but the reference (a local candidate, a
    blend) serves only when it is shown better than the reference on the rows ``y``,
    and then blended with it (``shrunk``). Where the rows cannot rank the candidates,
    ``unranked_choice``."""
    if unranked(evaluations, y, plan) is not None:
        return unranked_choice(evaluations, y, plan)
    chosen = choose(evaluations, plan)
    fallback = reference(evaluations, y, plan)
    if not chosen or fallback is None or (len(chosen) == 1 and chosen[0][0] is fallback):
        return chosen
    if shown_better(y, blended(chosen), fallback.predictions, plan):
        return shrunk(chosen, fallback, plan.shrink)
    return [(fallback, 1.0)]


def has_value(evaluation: Evaluation) -> bool:
    """Whether a candidate's metric has a value on the validation rows (not NaN)."""
    return evaluation.value is not None and math.isfinite(evaluation.value)


def finite_predictions(evaluation: Evaluation) -> bool:
    """Whether a candidate predicted every validation row (no NaN or infinite value)."""
    return evaluation.predictions is not None and bool(
        np.isfinite(evaluation.predictions).all())


def unranked(evaluations: list[Evaluation], y: np.ndarray, plan: Plan) -> str | None:
    """Why the validation rows ``y`` cannot rank the candidates: the metric has no value
    for any candidate that fitted (``<metric> undefined (<cause>)``); None where they
    can (or where nothing fitted)."""
    fitted = [e for e in evaluations if e.error is None]
    if not fitted or any(has_value(e) for e in fitted):
        return None
    return f"{plan.metric} undefined ({undefined_cause(y, plan)})"


def undefined_cause(y: np.ndarray, plan: Plan) -> str:
    """What in the validation rows leaves the metric without a value."""
    if len(y) == 0:
        return "no rows"
    if plan.task in CLASSIFICATION and len(np.unique(y)) < 2:
        return "one class"
    if not np.any(y):
        return "every actual is zero"
    if np.all(y == y.flat[0]):
        return "constant actuals"
    return "NaN for every candidate"


def unranked_choice(evaluations: list[Evaluation], y: np.ndarray, plan: Plan
                    ) -> list[tuple[Evaluation, float]]:
    """What serves where the validation rows cannot rank the candidates (``unranked``):
    the reference alone (the global model, or the baseline where it is shown better on
    the rows' own losses, or the only one competing), with no noise rule and no shrink,
    since nothing was shown better than it; with no reference (``selection:
    local_only``), the mean of every candidate that fitted (those that predicted every
    row, if any did): none ranks above another, so none is left out and none is first."""
    fallback = reference(evaluations, y, plan)
    if fallback is not None:
        return [(fallback, 1.0)]
    fitted = [e for e in evaluations if e.error is None]
    members = [e for e in fitted if finite_predictions(e)] or fitted
    return [(e, 1.0 / len(members)) for e in members]


def unranked_note(why: str, chosen: list[tuple[Evaluation, float]]) -> str:
    """The result row's reason for a segment served by ``unranked_choice``."""
    if len(chosen) == 1 and is_reference(chosen[0][0]):
        served = "the global model" if chosen[0][0].candidate.name == "global" else (
            "the baseline")
    elif len(chosen) == 1:
        served = "the only candidate that fitted"
    else:
        served = "the mean of the candidates"
    return f"validation rows cannot rank candidates: {why}; served by {served}"


def shown_better(y: np.ndarray, pred: np.ndarray, incumbent: np.ndarray, plan: Plan) -> bool:
    """Whether ``pred`` may replace ``incumbent`` on the validation rows ``y``: it beats
    it by more than ``plan.margin`` standard errors of the paired loss differences
    (``Metric.clearly_better``), on rows that hold every class of the segment
    (classification: where a class is missing from the validation rows, a model that
    gives it almost no probability looks best there and pays on the rows that have it;
    on the flight cancellations such local picks lost to the global model on later
    months)."""
    if plan.task in CLASSIFICATION and len(np.unique(y)) < n_classes(incumbent):
        return False
    return metrics.metric(plan.metric).clearly_better(y, pred, incumbent, plan.margin,
                                                      time_blocks(plan))


def n_classes(predictions: np.ndarray) -> int:
    """How many classes a segment's probability predictions cover (one column: two)."""
    return predictions.shape[1] if predictions.ndim == 2 and predictions.shape[1] > 1 else 2


def shrunk(chosen: list[tuple[Evaluation, float]], fallback: Evaluation, share: float
           ) -> list[tuple[Evaluation, float]]:
    """The ensemble that won, with ``share`` of the weight moved to the reference
    (``ensemble.shrink``): a validation win is partly luck and partly a period that
    will not last, and half of the reference held the gain where it was real and
    removed most of the loss where it was not (docs/benchmarks.md)."""
    if share <= 0:
        return chosen
    found = [(e, w * (1 - share)) for e, w in chosen]
    if all(e is not fallback for e, _ in chosen):
        found.append((fallback, 0.0))
    return [(e, w + share if e is fallback else w) for e, w in found]


def time_blocks(plan: Plan) -> int | None:
    """Consecutive blocks of a time-ordered holdout's rows for the noise rule's test
    (``HOLDOUT_GROUPS``); None where rows are exchangeable (random holdout, folds)."""
    return HOLDOUT_GROUPS if plan.method == "time" else None


def blended(chosen: list[tuple[Evaluation, float]]) -> np.ndarray:
    """The ensemble's validation predictions: its members' weighted sum."""
    return sum(e.predictions * w for e, w in chosen)


#: A single holdout's validation rows are cross-fitted in this many interleaved groups.
HOLDOUT_GROUPS = 5


def interleaved(n: int) -> np.ndarray:
    """``HOLDOUT_GROUPS`` interleaved groups of ``n`` validation rows (a random holdout's
    rows are in random order already; each group of a time-ordered one spans its period),
    so each choice is made on four fifths of the rows."""
    return np.arange(n) % HOLDOUT_GROUPS


def group_labels(groups: np.ndarray) -> np.ndarray:
    """The distinct groups of validation rows, in order (``groups``: each row's fold,
    window or fifth, small non-negative integers; without ``np.unique``'s sort)."""
    return np.flatnonzero(np.bincount(groups))


def cross_fitted(evaluations: list[Evaluation], y: np.ndarray, groups: np.ndarray,
                 plan: Plan, chosen: list[tuple[Evaluation, float]] | None = None
                 ) -> np.ndarray:
    """Each group's validation predictions of the selection made on the other groups'
    rows (where the other rows cannot rank the candidates, as a metric without a value
    on them, of the selection made on all rows: ``chosen``, when the caller has it)."""
    metric = metrics.metric(plan.metric)
    fitted = [e for e in evaluations if e.error is None]
    if not fitted:  # nothing to predict with (the caller reports why)
        return np.full(len(y), np.nan)
    whole = blended(select(fitted, y, plan) if chosen is None else chosen)
    found = np.array(whole, dtype=float, copy=True)
    labels = group_labels(groups)
    values = metric.scores_without(y, [e.predictions for e in fitted], groups, labels)
    ranked = np.isfinite(values).all(axis=1).tolist()
    for group, scores, usable in zip(labels, values.tolist(), ranked, strict=True):
        if not usable:
            continue
        inside = groups == group
        others = ~inside
        rescored = [Evaluation(e.candidate, e.params, value, e.predictions[others])
                    for e, value in zip(fitted, scores, strict=True)]
        original = dict(zip(map(id, rescored), fitted, strict=True))
        chosen = select(rescored, y[others], plan)
        found[inside] = sum(original[id(e)].predictions[inside] * w for e, w in chosen)
    return found


def choice_label(candidate: CandidateConfig, plan: Plan) -> str:
    """How the result table names a chosen member: ``local:<candidate>``, ``baseline``
    or ``global`` (with ``selection: local_only``, the candidate's name)."""
    if plan.selection == "local_only" or candidate.name in RESERVED_NAMES:
        return candidate.name
    return f"local:{candidate.name}"


@dataclass
class SegmentResult:
    """One segment's result, as every path fills it; ``as_row`` writes it in the run's
    result schema (``results.result_schema``). ``scores``: each candidate's validation
    score and the global model's, by name (None: it failed); ``baseline``: the naive
    baseline's; ``estimate``: the choice's, cross-fitted; ``chosen``: its members'
    labels, with ``weights``; ``fit_seconds``: None where not measured; ``seconds``: each
    candidate's evaluation, by name (where measured)."""

    key: tuple
    n_rows: int = 0
    status: str = FAILED
    reason: str | None = None
    n_valid: int | None = None
    baseline: float | None = None
    scores: dict[str, float | None] = field(default_factory=dict)
    estimate: float | None = None
    chosen: list[str] | None = None
    weights: list[float] | None = None
    fit_seconds: float | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # each candidate's, by name
    profile: dict[str, Any] | None = None  # ``Unit.profile``: what monitoring compares with

    def as_row(self, plan: Plan) -> dict[str, Any]:
        """The result table's row: the segment columns, then the schema's columns (those
        never set left out: null in the table)."""
        metric = plan.metric
        row: dict[str, Any] = dict(zip(plan.segment_by, self.key, strict=True))
        row.update(status=self.status, reason=self.reason, n_rows=self.n_rows)
        if plan.file_notes is not None:  # files as segments: the files it lost, named
            count, note = plan.file_notes.get(tuple(self.key), (0, None))
            row["files_skipped"] = count
            if note and note not in (self.reason or ""):
                row["reason"] = f"{self.reason}; {note}" if self.reason else note
        optional = {"n_valid": self.n_valid, f"baseline_{metric}": self.baseline,
                    **{f"{name}_{metric}": v for name, v in self.scores.items()},
                    f"metric_{metric}": self.estimate,
                    "chosen": None if self.chosen is None else json.dumps(self.chosen),
                    "weights": None if self.weights is None else json.dumps(self.weights),
                    "fit_seconds": self.fit_seconds,
                    **{f"{name}_seconds": v for name, v in self.seconds.items()},
                    "profile": None if self.profile is None else json.dumps(self.profile)}
        scored = {f"{name}_{metric}" for name in self.scores}
        row.update({k: v for k, v in optional.items() if v is not None or k in scored})
        return row


def summarize(
    row: SegmentResult, evaluations: list[Evaluation], y_valid: np.ndarray,
    baseline_predictions: np.ndarray, plan: Plan, groups: np.ndarray | None = None,
    cross: np.ndarray | None = None,
) -> list[tuple[Evaluation, float]]:
    """Fill the row's metrics (baseline, every candidate, the selection's cross-fitted
    estimate) and its choice (in ``reason``, why where the validation rows cannot rank
    the candidates: ``unranked``); returns the ensemble's members. ``groups``: each
    validation row's fold or window (None: one holdout, cross-fitted in fifths);
    ``cross``: the cross-fitted predictions over ``groups``, when the caller has them.
    Raises when every local candidate failed."""
    row.n_valid = len(y_valid)
    metric = metrics.metric(plan.metric)
    row.baseline = metric.score(y_valid, baseline_predictions)
    local = [e for e in evaluations if not is_reference(e)]
    for e in evaluations:
        if e.candidate.name != "baseline":  # its column is filled above
            row.scores[e.candidate.name] = e.value
    if all(e.error is not None for e in local):  # an error, not a data condition
        raise RuntimeError(
            "every candidate failed: "
            + " | ".join(f"{e.candidate.name}: {e.error}" for e in local)
        )
    chosen = select(evaluations, y_valid, plan)
    why = unranked(evaluations, y_valid, plan)
    if why is not None:
        row.reason = unranked_note(why, chosen)
    if groups is None:
        groups = interleaved(len(y_valid))
    if cross is not None:
        estimate = metric.score(y_valid, cross)
    elif len(group_labels(groups)) > 1:
        estimate = metric.score(y_valid, cross_fitted(evaluations, y_valid, groups, plan,
                                                      chosen))
    else:  # a single validation row: nothing to cross-fit
        estimate = metric.score(y_valid, blended(chosen))
    row.estimate = estimate
    row.chosen = [choice_label(e.candidate, plan) for e, _ in chosen]
    row.weights = [round(w, 6) for _, w in chosen]
    return chosen


class Skip(Exception):
    """A segment that cannot be trained, with the reason users will read."""


def member_row(candidate: CandidateConfig, weight: float, params: dict[str, Any] | None,
               payload: bytes, meta: MemberMeta) -> dict[str, Any]:
    """One serialized member of a segment's model, as the models table stores it."""
    return {
        "candidate": candidate.name,
        "kind": candidate.kind,
        "weight": float(weight),
        "params": json.dumps(params, default=str, sort_keys=True),
        "payload": payload,
        "meta": json.dumps(meta, default=str),
    }


def results_table(rows: list[SegmentResult], plan: Plan) -> pa.Table:
    """Results as a table of the run's result schema (a column no row has is null)."""
    names = [c.name for c in plan.candidates] + (["global"] if plan.global_members else [])
    schema = result_schema(key_fields(plan), plan.metric, names)
    return pa.Table.from_pylist([row.as_row(plan) for row in rows], schema=schema)


def members_table(rows: list[dict[str, Any]], plan: Plan) -> pa.Table:
    """Serialized members keyed by their segment (``keyed_members``) as a table."""
    return pa.Table.from_pylist(rows, schema=members_schema(key_fields(plan)))


def key_fields(plan: Plan) -> list[pa.Field]:
    """The segment columns as nullable fields (a key may be null)."""
    return [pa.field(f.name, f.type) for f in plan.key_fields]


def result_for_error(error: BaseException, key: tuple, n_rows: int = 0) -> SegmentResult:
    """The result of a segment that was skipped (Skip) or failed (anything else)."""
    if isinstance(error, Skip):
        return SegmentResult(key, n_rows, SKIPPED, str(error))
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return SegmentResult(key, n_rows, FAILED, f"{type(error).__name__}: {error}{where}")


def keyed_members(plan: Plan, key: tuple, members: list[dict[str, Any]]) -> list[dict]:
    """A segment's serialized members, each with the segment's key columns."""
    keys = dict(zip(plan.segment_by, key, strict=True))
    return [keys | member for member in members]
