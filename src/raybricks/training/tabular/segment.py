"""Training one segment of a table: checks, validation splits, candidate search, the
global model's and the baseline's scores, selection, refit.

Plain Python on one segment's pandas frame or ``Columns``, so the packed path, the
spread path (``tabular_task.py``), large segments (``large.py``) and the global models
all share it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from raybricks import kinds, metrics, profiles
from raybricks.config import CandidateConfig
from raybricks.kinds import CLASSIFICATION, ModelKind, filled_input, prepare_features
from raybricks.kinds.base import MemberMeta, member_meta
from raybricks.kinds.baseline import BaselineKind
from raybricks.segmented_model import align_classes
from raybricks.training import recipe
from raybricks.training.plan import GLOBAL, Plan, global_models, on_device, stable_seed
from raybricks.training.recipe import Chosen, Evaluator, Unit
from raybricks.training.search import search_best
from raybricks.training.selection import (
    Evaluation,
    SegmentResult,
    Skip,
    member_row,
    summarize,
)


@dataclass
class Columns:
    """A block's or one segment's rows as the segment logic reads them: the raw target
    and time values as arrays, and the features either as one float64 matrix (NaN for
    missing or infinite values) when all are numeric, or as the raw frame when some are
    categorical (their categories are found per segment). Made once per block; a
    segment's rows are cheap slices of it."""

    target: np.ndarray
    times: np.ndarray | None
    matrix: np.ndarray | None
    frame: pd.DataFrame | None

    def __len__(self) -> int:
        return len(self.target)

    def rows(self, index: slice | np.ndarray) -> Columns:
        """These rows (a slice gives views, positions a copy)."""
        return Columns(
            self.target[index],
            None if self.times is None else self.times[index],
            None if self.matrix is None else self.matrix[index],
            None if self.frame is None else self.frame.iloc[index],
        )


def columns_of(frame: pd.DataFrame, plan: Plan) -> Columns:
    """The plan's columns of a frame (a block or one segment) as ``Columns``."""
    target = frame[plan.target].to_numpy()
    times = frame[plan.time_column].to_numpy() if plan.time_column else None
    if plan.categorical:
        return Columns(target, times, None, frame)
    matrix = prepare_features(frame, {"features": plan.features}).to_numpy()
    return Columns(target, times, matrix, None)


@dataclass
class Prepared:
    """One segment, ready to fit: features, encoded target, splits, model metadata.

    ``values``: the numeric features' matrix (NaN for missing). ``X``, the feature frame
    every kind's input is made from, is built from it on first use when no feature is
    categorical; ``matrix`` is ``filled_input``'s result (the values with gaps filled by
    the training medians), made once per segment; ``inputs`` other kinds' inputs."""

    y: np.ndarray
    splits: list[tuple[np.ndarray, np.ndarray]]
    meta: MemberMeta
    n_rows: int
    values: np.ndarray | None = None
    frame: pd.DataFrame | None = None
    matrix: Any = None
    inputs: dict = field(default_factory=dict)
    positions: np.ndarray | None = None  # input rows of these rows (None: all, in order)
    ordered: np.ndarray | None = None  # ``values`` sorted by column (``feature_summary``)

    @property
    def X(self) -> pd.DataFrame:
        if self.frame is None:
            self.frame = pd.DataFrame(self.values, columns=self.meta["features"])
        return self.frame

    def rows(self, kind: ModelKind, indices: np.ndarray) -> Any:
        """The kind's model input for these rows, made once per segment and input form
        (the feature frame as it is, the filled matrix, or the kind's own)."""
        make = kind.model_input
        if make is kinds.frame_input:
            return self.X.iloc[indices]
        if make is filled_input:
            if self.matrix is None:
                self.matrix = filled_input(self.X, self.meta)
            data = self.matrix
        else:
            if make not in self.inputs:
                self.inputs[make] = make(self.X, self.meta)
            data = self.inputs[make]
        return data[indices] if isinstance(data, np.ndarray) else data.iloc[indices]


class ConstantTarget(Skip):
    """A segment whose target never varies: served by that constant, whatever the
    fallback (no model, the global one included, can beat it on the segment's rows)."""


def prepare(data: pd.DataFrame | Columns, plan: Plan, key: tuple) -> Prepared:
    """Drop rows without a (finite) target, check the segment is trainable, build the
    splits. ``data``: the segment's rows, as a frame or as ``Columns``."""
    columns = columns_of(data, plan) if isinstance(data, pd.DataFrame) else data
    target = columns.target
    if target.dtype.kind == "f":  # an infinite target is as unusable as a missing one
        keep = np.isfinite(target)
    elif target.dtype.kind in "biu":  # plain integers and booleans cannot be missing
        keep = np.ones(len(target), dtype=bool)
    else:
        keep = ~pd.isna(target)
    order = None if keep.all() else np.flatnonzero(keep)
    n = len(columns) if order is None else len(order)
    if n == 0:
        raise Skip(f"no target: the target is null or infinite in all {len(columns)} rows")
    if n < plan.min_rows:
        raise Skip(f"too few rows: {n} < min_rows={plan.min_rows}")
    if plan.time_column:
        base = np.arange(len(columns)) if order is None else order
        order = base[np.argsort(columns.times[base], kind="stable")]
    if order is not None:
        columns = columns.rows(order)
    meta = member_meta(plan.features, plan.task)
    numeric = plan.features
    X = None
    values = columns.matrix
    if plan.categorical:
        frame = columns.frame
        meta["categorical"] = {
            c: sorted(str(v) for v in frame[c].dropna().unique()) for c in plan.categorical
        }
        X = prepare_features(frame, meta).reset_index(drop=True)
        numeric = [c for c in plan.features if c not in meta["categorical"]]
        values = X[numeric].to_numpy(dtype="float64")
    gaps = np.isnan(values)
    has_gaps = bool(gaps.any())
    ordered, low, high, medians = feature_summary(values, gaps)
    medians = np.nan_to_num(medians, nan=0.0)
    varying = np.asarray(high > low)
    if not varying.any() and not any(len(v) > 1 for v in meta["categorical"].values()):
        raise Skip("no usable feature: every feature is empty or constant in this segment")
    meta["fill"] = dict(zip(numeric, medians.tolist(), strict=True))
    # without categoricals, scikit-learn's input is this matrix with the gaps filled
    # (what filled_input would compute again from X)
    matrix = None if plan.categorical else (
        np.where(gaps, medians, values) if has_gaps else values
    )
    raw = columns.target
    if plan.task in CLASSIFICATION:
        classes = sorted_classes(raw)
        if len(classes) < 2:
            raise Skip(f"single class: every target value is {classes[0]!r}")
        if plan.task == "binary" and len(classes) > 2:
            raise Skip(f"task binary but the target has {len(classes)} classes")
        y, meta["classes"] = encode_classes(raw, classes)
    else:
        y = np.asarray(raw, dtype="float64")
        if y.min() == y.max():
            raise ConstantTarget(f"constant target: every value is {float(y[0]):g}; served by it")
    if plan.task in CLASSIFICATION:
        splits = make_splits(n, plan, key, y)
        check_training_classes(splits, y, meta["classes"])
    else:
        splits = make_splits(n, plan, key)
    if not any(len(v) > 1 for v in meta["categorical"].values()):
        check_training_features(splits, values)
    return Prepared(y, splits, meta, n, values, X, matrix, positions=order, ordered=ordered)


def feature_summary(values: np.ndarray, gaps: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each feature's values sorted (NaN last: ``gaps``), smallest, largest and median
    (NaN for a feature without a value) from one sort, which the monitoring profile
    reuses: a segment's few rows make numpy's per-call cost the price of each."""
    ordered = np.sort(values, axis=0)
    present = len(values) - np.count_nonzero(gaps, axis=0)
    column = np.arange(values.shape[1])
    last = np.maximum(present - 1, 0)
    middle = (ordered[last // 2, column] + ordered[np.minimum(present // 2, last), column]) / 2
    return ordered, ordered[0], ordered[last, column], middle


def check_training_features(splits: list[tuple[np.ndarray, np.ndarray]],
                            values: np.ndarray) -> None:
    """Skip a segment whose features vary only in its validation rows: nothing to learn
    from in a training split."""
    for number, (train, _) in enumerate(splits):
        part = values[train]
        # fmax/fmin skip NaN (an all-NaN feature gives NaN: not varying), without the
        # nan-functions' per-call cost and warnings
        if not len(part) or not (np.fmax.reduce(part, axis=0)
                                 > np.fmin.reduce(part, axis=0)).any():
            where = (f"fold {number + 1} of {len(splits)}" if len(splits) > 1
                     else "the training split")
            raise Skip(f"no usable feature in {where}: every feature is empty or constant "
                       "in its rows (the feature varies only in the validation rows)")


def sorted_classes(raw: np.ndarray) -> list:
    """The distinct class labels, in the order training codes them."""
    return sorted(pd.unique(raw).tolist(), key=lambda v: (str(type(v)), v))


def encode_classes(raw: np.ndarray, classes: list) -> tuple[np.ndarray, list]:
    """Class codes 0..k-1 of the labels, and the labels as plain Python values (JSON)."""
    codes = pd.Categorical(raw, categories=classes).codes.astype("int64")
    return codes, [v.item() if hasattr(v, "item") else v for v in classes]


def make_splits(n: int, plan: Plan, key: tuple, classes: np.ndarray | None = None
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Train/validation index pairs: one random or time-ordered holdout, or k folds.
    With ``classes`` (classification: each row's class code), random holdouts and folds
    are stratified: every class keeps its share in each part, and a holdout leaves at
    least one row of every class in training."""
    n_valid = min(max(1, int(round(n * plan.fraction))), n - 1)
    if plan.method == "time":  # rows are time-sorted: the last ones validate
        return [(np.arange(n - n_valid), np.arange(n - n_valid, n))]
    rng = np.random.default_rng(stable_seed(plan.seed, key))
    if classes is not None:
        return _stratified_splits(classes, plan, rng)
    order = rng.permutation(n)
    if plan.method == "holdout":
        return [(np.sort(order[n_valid:]), np.sort(order[:n_valid]))]
    folds = np.array_split(order, min(plan.folds, n))
    return _folds_to_splits(folds)


def _folds_to_splits(folds: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    return [
        (np.sort(np.concatenate([f for j, f in enumerate(folds) if j != i])), np.sort(fold))
        for i, fold in enumerate(folds)
    ]


def _stratified_splits(classes: np.ndarray, plan: Plan, rng: np.random.Generator
                       ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Holdout: from each class, its share of the validation rows (never all of its
    rows); folds: each class dealt round-robin over the folds (continuing where the
    previous class stopped, so folds stay the same size)."""
    members = [rng.permutation(np.flatnonzero(classes == c)) for c in np.unique(classes)]
    n = len(classes)
    if plan.method == "holdout":
        take = [min(int(round(len(m) * plan.fraction)), len(m) - 1) for m in members]
        if sum(take) == 0:  # tiny segment: one validation row from the largest class
            take[int(np.argmax([len(m) for m in members]))] = 1
        valid = np.concatenate([m[:t] for m, t in zip(members, take, strict=True)])
        train = np.setdiff1d(np.arange(n), valid)
        return [(train, np.sort(valid))]
    k = min(plan.folds, n)
    dealt = np.concatenate(members)
    fold_of = np.empty(n, dtype=np.int64)
    fold_of[dealt] = np.arange(n) % k
    return _folds_to_splits([np.flatnonzero(fold_of == i) for i in range(k)])


def check_training_classes(splits: list[tuple[np.ndarray, np.ndarray]], y: np.ndarray,
                           classes: list) -> None:
    """Skip a segment whose training split holds a single class (a rare class that a
    fold or a time-ordered holdout leaves alone): no classifier can be fitted on it."""
    for number, (train, _) in enumerate(splits):
        present = np.unique(y[train])
        if len(present) < 2:
            counts = np.bincount(y, minlength=len(classes))
            rare = ", ".join(f"{classes[c]!r} ({counts[c]} rows)" for c in range(len(classes))
                             if c != present[0])
            where = (f"fold {number + 1} of {len(splits)}" if len(splits) > 1
                     else "the training split")
            raise Skip(
                f"rare class: {where} holds only class {classes[present[0]]!r}; too few "
                f"rows of {rare} to train on it (use validation.method=holdout, fewer "
                "folds, or a global fallback to serve this segment)"
            )


def validation_rows(prep: Prepared) -> np.ndarray:
    return np.concatenate([valid for _, valid in prep.splits])


def split_groups(prep: Prepared) -> np.ndarray | None:
    """Each validation row's fold (None for a single holdout)."""
    if len(prep.splits) < 2:
        return None
    return np.concatenate([np.full(len(valid), i) for i, (_, valid) in enumerate(prep.splits)])


def naive_values(y: np.ndarray, plan: Plan, classes: int) -> np.ndarray:
    """What the naive baseline fitted on targets ``y`` predicts: their mean (their last
    value, time-ordered), or the frequencies of the ``classes`` class codes."""
    if plan.task in CLASSIFICATION:
        return np.bincount(y, minlength=classes) / len(y)
    return np.array([y[-1] if plan.method == "time" else y.mean()], dtype="float64")


def baseline(prep: Prepared, plan: Plan) -> np.ndarray:
    """Naive predictions for the validation rows: the training mean (or the last value,
    time-ordered), or the training class frequencies."""
    classes = len(prep.meta.get("classes") or [])
    return np.concatenate([
        BaselineKind.constant(naive_values(prep.y[train], plan, classes), len(valid),
                              plan.task) for train, valid in prep.splits])


def segment_profile(prep: Prepared, plan: Plan) -> dict[str, Any]:
    """The segment's training rows as monitoring compares new rows with them
    (``raybricks.profiles``)."""
    categorical = list(prep.meta["categorical"])
    numeric = [c for c in plan.features if c not in prep.meta["categorical"]]
    naive = naive_values(prep.y, plan, len(prep.meta.get("classes") or []))
    return profiles.profile(prep.values, numeric, prep.X if categorical else None,
                            categorical, naive.tolist(), len(validation_rows(prep)),
                            prep.ordered)


def _fit_split(prep: Prepared, kind: ModelKind, params, train, plan: Plan, seed: int):
    """Fit on the training rows; returns the model and the class codes it saw."""
    y = prep.y[train]
    trained = None
    if plan.task in CLASSIFICATION:
        trained = np.unique(y)
        if len(trained) < 2:
            raise ValueError("the training split holds a single class")
        y = np.searchsorted(trained, y)
    model = kind.fit(on_device(kind, params), prep.rows(kind, train), y, plan.task, seed,
                     plan.threads, prep.meta)
    return model, trained


def _predict_split(prep, kind: ModelKind, model, trained, rows, plan: Plan) -> np.ndarray:
    raw = kind.predict(model, prep.rows(kind, rows), plan.task)
    if trained is None:
        return raw
    if raw.ndim == 1:
        raw = np.column_stack([1 - raw, raw])
    full = np.zeros((len(rows), len(prep.meta["classes"])))
    full[:, trained] = raw
    return full


def evaluate(prep: Prepared, candidate: CandidateConfig, plan: Plan, key: tuple) -> Evaluation:
    """Try the settings of a candidate on the splits (``search.search_best``: grid,
    random draws or bayes); keep the best by the metric."""
    y_valid = prep.y[validation_rows(prep)]
    metric = metrics.metric(plan.metric)
    kind = kinds.of(candidate)
    seed = stable_seed(plan.seed, key, candidate.name, "fit")

    def fit(params: dict[str, Any]) -> Evaluation:
        fitted, parts = [], []
        for train, valid in prep.splits:
            model, trained = _fit_split(prep, kind, params, train, plan, seed)
            fitted.append((model, trained))
            parts.append(_predict_split(prep, kind, model, trained, valid, plan))
        predictions = np.concatenate(parts)
        return Evaluation(candidate, params, metric.score(y_valid, predictions), predictions,
                          fitted)

    return search_best(candidate, stable_seed(plan.seed, key, candidate.name), plan.metric,
                       fit)


#: What serves a constant segment where no baseline competes (``selection: local_only``).
MEAN_BASELINE = CandidateConfig(name="baseline", kind="baseline", params={"strategy": "mean"})


def evaluate_global(prep: Prepared, plan: Plan, key: tuple) -> Evaluation:
    """The global model on this segment's validation rows: for each split, the global
    model trained on the training rows of that split of every segment (so it never saw
    these validation rows)."""
    try:
        models = global_models(plan)
        keys = dict(zip(plan.segment_by, key, strict=True))
        parts = []
        for number, (_, valid) in enumerate(prep.splits):
            model = models[min(number, len(models) - 1)]
            raw = model.predict_raw(prep.X.iloc[valid].assign(**keys))
            if plan.task in CLASSIFICATION:
                raw = align_classes(raw, model.meta["classes"], prep.meta["classes"])
            parts.append(raw)
        predictions = np.concatenate(parts)
        value = metrics.metric(plan.metric).score(prep.y[validation_rows(prep)], predictions)
    except Exception as exc:  # noqa: BLE001 - the global model not fitting this segment
        return Evaluation(GLOBAL, error=f"{type(exc).__name__}: {exc}")
    return Evaluation(GLOBAL, {}, value, predictions)


def member_rows(prep: Prepared, members, plan: Plan, key: tuple) -> list[dict[str, Any]]:
    """Serialized members: refit on all rows, or the model of the (first) training split."""
    rows = []
    if len(members) == 1 and kinds.resolve(members[0][0].candidate.kind).uses_fallback:
        return rows  # the global model alone: the segmented model's fallback serves it
    for evaluation, weight in members:
        if evaluation.stored is not None:  # made where it was fitted (its GPU task)
            rows += [row | {"weight": float(weight)} for row in evaluation.stored]
            continue
        candidate = evaluation.candidate
        kind = kinds.of(candidate)
        if kind.uses_fallback:  # predicted by the fallback: nothing to fit or store
            rows.append(member_row(candidate, weight, {}, b"", prep.meta))
            continue
        if plan.refit or len(prep.splits) > 1:
            seed = stable_seed(plan.seed, key, candidate.name, "fit")
            model, trained = _fit_split(
                prep, kind, evaluation.params, np.arange(prep.n_rows), plan, seed
            )
        else:
            model, trained = evaluation.split_models[0]
        meta = MemberMeta(**prep.meta)
        if trained is not None:
            meta["trained_classes"] = trained.tolist()
        rows.append(member_row(candidate, weight, evaluation.params, kind.serialize(model),
                               meta))
    return rows


def replace_search(candidate: CandidateConfig, params: dict[str, Any]) -> CandidateConfig:
    """The candidate reduced to one fixed setting (for spreading settings over tasks)."""
    return candidate.model_copy(update={"params": params, "search": {}, "trials": None,
                                        "search_method": None})


def best_of(found: list[Evaluation], candidate: CandidateConfig, plan: Plan) -> Evaluation:
    """The best of several single-setting evaluations of one candidate."""
    ok = [e for e in found if e.error is None]
    if not ok:
        errors = "; ".join(dict.fromkeys(e.error or "" for e in found))
        return Evaluation(candidate, error=errors or "no setting could be fitted")
    best = metrics.metric(plan.metric).best(ok, lambda e: e.value)
    return dataclasses.replace(best, candidate=candidate)


class TableSegment(Unit):
    """A table's segment as the recipe trains it: its rows prepared (``prepare``), the
    candidates scored on its validation splits, the baseline and the global model beside
    them, the choice refitted on all rows (``member_rows``); a constant or (with
    ``serve_skipped``) skipped segment is served by its naive baseline. ``prepared``: the
    segment already prepared (the spread path)."""

    def __init__(self, data: pd.DataFrame | Columns | None, key: tuple, plan: Plan,
                 evaluate: Evaluator | None = None, prepared: Prepared | None = None) -> None:
        super().__init__(key, plan, evaluate or self.fit_locally,
                         len(data) if data is not None else prepared.n_rows)
        self.data, self.prepared = data, prepared
        self.timed = prepared is None  # the spread path fitted the candidates elsewhere

    def fit_locally(self, prep: Prepared, candidate: CandidateConfig) -> Evaluation:
        """The evaluator of one process: every setting fitted here (``evaluate``)."""
        return evaluate(prep, candidate, self.plan, self.key)

    def prepare(self) -> Prepared:
        return self.prepared or prepare(self.data, self.plan, self.key)

    def rows(self, prep: Prepared) -> int:
        return prep.n_rows

    def rivals(self, prep: Prepared) -> list[Evaluation]:
        found = [evaluate(prep, c, self.plan, self.key) for c in self.plan.pool]
        if self.plan.global_members:
            found.append(evaluate_global(prep, self.plan, self.key))
        return found

    def select(self, prep: Prepared, row: SegmentResult, evaluations: list[Evaluation]
               ) -> Chosen:
        return summarize(row, evaluations, prep.y[validation_rows(prep)],
                         baseline(prep, self.plan), self.plan, split_groups(prep))

    def members(self, prep: Prepared, chosen: Chosen) -> list[dict[str, Any]]:
        return member_rows(prep, chosen, self.plan, self.key)

    def profile(self, prep: Prepared) -> dict[str, Any]:
        return segment_profile(prep, self.plan)

    def served(self, error: Exception, row: SegmentResult) -> list[dict[str, Any]]:
        if self.data is not None and (isinstance(error, ConstantTarget) or (
                isinstance(error, Skip) and self.plan.serve_skipped)):
            return skipped_baseline(self.data, self.plan, row)
        return []


def train_segment(
    data: pd.DataFrame | Columns, key: tuple, plan: Plan
) -> tuple[SegmentResult, list[dict[str, Any]]]:
    """Train one segment (its rows as a frame or as ``Columns``) in this process. Never
    raises: the result row says trained, skipped or failed."""
    return recipe.train(TableSegment(data, key, plan))


def skipped_baseline(data: pd.DataFrame | Columns, plan: Plan, row: SegmentResult
                     ) -> list[dict[str, Any]]:
    """A skipped segment's naive baseline (the pool's ``baseline`` kind, fitted on its rows
    with a target, in time order where there is a time column), so the registered model
    still serves it; none when no row has a target."""
    columns = columns_of(data, plan) if isinstance(data, pd.DataFrame) else data
    target = pd.Series(columns.target)
    keep = target.notna().to_numpy()
    if target.dtype.kind == "f":
        keep &= np.isfinite(target.to_numpy(dtype="float64", na_value=np.nan))
    if not keep.any():
        return []
    values = target.to_numpy()[keep]
    if plan.time_column and columns.times is not None:
        values = values[np.argsort(columns.times[keep], kind="stable")]
    meta = member_meta(plan.features, plan.task)
    if plan.task in CLASSIFICATION:
        y, meta["classes"] = encode_classes(values, sorted_classes(values))
    else:
        y = values.astype("float64")
    candidate = plan.pool[0] if plan.pool else MEAN_BASELINE
    kind = kinds.of(candidate)
    model = kind.fit(candidate.params, values, y, plan.task, plan.seed, plan.threads, meta)
    return [member_row(candidate, 1.0, candidate.params, kind.serialize(model), meta)]


