"""The tabular task (regression, binary, multiclass) as the engine runs it: planning a job
from the table's schema, the global models a job shares (one per validation split, to
compete in every segment, and one over all rows, the fallback), training a block's
segments, spreading the settings of a few segments over Ray tasks, and the input example.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from raybricks import kinds
from raybricks.config import CandidateConfig, JobConfig
from raybricks.data import segment_bounds
from raybricks.errors import DataError, missing_columns
from raybricks.kinds import ModelKind
from raybricks.results import keep_fallback
from raybricks.training import recipe
from raybricks.training.blocks import Blocks
from raybricks.training.plan import (
    GivenGlobal,
    Plan,
    SegmentTrainer,
    Shared,
    is_categorical,
    replace_plan,
    segment_rows,
    shrink_of,
)
from raybricks.training.selection import Evaluation, SegmentResult
from raybricks.training.tabular import segment as seg
from raybricks.training.tabular.large import train_large_segments

log = logging.getLogger(__name__)

UNSUPPORTED = (pa.types.is_nested, pa.types.is_binary, pa.types.is_large_binary)


def table_plan(config: JobConfig, schema: pa.Schema, threads: int = 1) -> Plan:
    """Resolve features and their kinds from the table's schema; refuse what cannot work."""
    names = schema.names
    needed = config.segment_by + [config.target] + (config.features or [])
    if config.time_column:
        needed.append(config.time_column)
    missing = [c for c in needed if c not in names]
    if missing:
        raise DataError(missing_columns(missing, names))
    exclude = set(config.segment_by) | {config.target}
    if config.time_column:
        exclude.add(config.time_column)
    features = config.features or [n for n in names if n not in exclude]
    if not features:
        raise DataError("no feature columns: the table holds only keys, target and time")
    bad = [f for f in features if any(test(schema.field(f).type) for test in UNSUPPORTED)]
    if bad:
        kinds = {f: str(schema.field(f).type) for f in bad}
        raise DataError(
            f"feature column(s) of unsupported type {kinds}: maps, arrays, structs and "
            "binary cannot be features; drop them from features or derive numbers"
        )
    target_type = schema.field(config.target).type
    if config.task == "regression" and not (
        pa.types.is_integer(target_type) or pa.types.is_floating(target_type)
        or pa.types.is_decimal(target_type) or pa.types.is_boolean(target_type)
    ):
        raise DataError(
            f"target {config.target!r} is {target_type}, not numeric: task regression needs "
            "a numeric target (or use task binary / multiclass)"
        )
    categorical = [f for f in features if is_categorical(schema.field(f).type)]
    return Plan(
        segment_by=list(config.segment_by), target=config.target, features=features,
        categorical=categorical, time_column=config.time_column, task=config.task,
        metric=config.metric, method=config.validation.method,
        fraction=config.validation.fraction, folds=config.validation.folds,
        candidates=[fitted_for_metric(c, config) for c in config.models],
        ensemble=config.ensemble.method,
        top_k=config.ensemble.top_k, within=config.ensemble.within,
        margin=config.ensemble.margin, shrink=shrink_of(config, TABLE_SHRINK),
        refit=config.refit, min_rows=config.min_rows,
        seed=config.seed, threads=threads, selection=config.selection,
        pool=competitors(config),
        serve_skipped=config.selection == "all" and config.fallback != "global",
        large_segment_rows=config.training.large_segment_rows,
        key_fields=[schema.field(name) for name in config.segment_by],
    )


#: Regression metrics of absolute errors, for which candidates are fitted for them.
ABSOLUTE_ERROR_METRICS = frozenset({"mae"})


def fitted_for_metric(candidate: CandidateConfig, config: JobConfig) -> CandidateConfig:
    """The candidate fitted for the job's metric where its kind knows how: for absolute
    errors (mae) in regression, the kind's ``absolute_error`` parameters, unless the
    candidate's params or search set them. Fitted for squared error, a model predicts
    means, the wrong point for absolute errors on skewed targets (counts mostly zero: on
    the county murder rates of docs/benchmarks.md, the global LightGBM's held-out median
    MAE fell from 0.321 to 0.224, below the baseline's 0.241)."""
    if config.task != "regression" or config.metric not in ABSOLUTE_ERROR_METRICS:
        return candidate
    extra = kinds.resolve(candidate.kind).absolute_error
    if not extra or any(k in candidate.params or k in candidate.search for k in extra):
        return candidate
    return candidate.model_copy(update={"params": extra | candidate.params})


#: ``ensemble.shrink`` of the table tasks when a job leaves it unset (docs/training.md).
TABLE_SHRINK = 0.5


def competitors(config: JobConfig) -> list[CandidateConfig]:
    """What competes with the local candidates in every segment (``selection: all``):
    the naive baseline, as a member of its own."""
    if config.selection == "local_only":
        return []
    strategy = "last" if config.validation.method == "time" else "mean"
    return [CandidateConfig(name="baseline", kind="baseline", params={"strategy": strategy})]


def global_plan(plan: Plan, config: JobConfig) -> Plan:
    """The plan of the global model: every row, whatever its segment (the segment columns
    among the features with ``global_segment_features``), selected among the local
    candidates only."""
    features = plan.features
    categorical = plan.categorical
    if config.global_segment_features:
        keys = [c for c in plan.segment_by if c not in features]
        features = features + keys
        types = {f.name: f.type for f in plan.key_fields}
        categorical = categorical + [c for c in keys if is_categorical(types[c])]
    return replace_plan(plan, features=features, categorical=categorical, min_rows=2,
                        selection="local_only", pool=[], global_members=[])


FALLBACK_ROWS = 1_000_000


def sample_block(block: pa.Table, index: int, fraction: float, seed: int, columns: list[str]
                 ) -> pa.Table:
    """A seeded random share of a block's rows (for the global fallback model; ``seed``
    and the block's ``index`` seed it)."""
    block = block.select(columns)
    if fraction >= 1:
        return block
    rng = np.random.default_rng(seed + index)
    return block.take(np.flatnonzero(rng.random(block.num_rows) < fraction))


def global_training_rows(block: pa.Table, index: int, plan: Plan, fraction: float,
                         splits: int) -> pa.Table | list[pa.Table]:
    """A task's body (``Blocks.map``): per split number, a seeded share of the training
    rows of that split of every segment of the block (the rows of segments that cannot
    be trained, whole): what the global models compared with the local ones may learn
    from (one table for a single split, as Ray's ``num_returns=1`` returns it)."""
    block = block.select(plan.columns)
    columns = seg.columns_of(block.to_pandas(), plan)
    picks: list[list[np.ndarray]] = [[] for _ in range(splits)]
    for key, start, end in segment_bounds(block, plan.segment_by):
        try:
            prep = seg.prepare(columns.rows(slice(start, end)), plan, key)
        except Exception:  # noqa: BLE001 - not validated: all its rows may teach
            for pick in picks:
                pick.append(np.arange(start, end))
            continue
        positions = (np.arange(prep.n_rows) if prep.positions is None else prep.positions)
        for number, (train, _) in enumerate(prep.splits[:splits]):
            picks[number].append(start + positions[train])
    rng = np.random.default_rng(plan.seed + index)
    tables = []
    for pick in picks:
        rows = np.concatenate(pick) if pick else np.array([], dtype=np.int64)
        tables.append(block.take(rows[rng.random(len(rows)) < fraction]))
    return tables[0] if splits == 1 else tables


def train_fallback(plan: Plan, *samples: pa.Table) -> tuple[SegmentResult, list[dict]]:
    """A task's body (``Blocks.call``): one model over (a sample of) all rows, whatever
    the segment; the rows in the order of their segment keys (and times), so the model
    does not depend on how the executor cut the source into blocks."""
    order = [(name, "ascending") for name in
             [*plan.segment_by, *([plan.time_column] if plan.time_column else [])]]
    frame = pa.concat_tables(samples, promote_options="permissive").sort_by(order).to_pandas()
    key = tuple(None for _ in plan.segment_by)
    return seg.train_segment(frame, key, plan)


def prepare_segment(block: pa.Table, plan: Plan, key: tuple):
    """The prepared segment, kept in the object store; or, when it cannot be prepared,
    its finished result (skipped or failed) as ``train_segment`` makes it."""
    rows = segment_rows(block, plan, key)
    try:
        return seg.prepare(rows, plan, key)
    except Exception:  # noqa: BLE001 - Skip or failure, reported by finish_segment
        return seg.train_segment(rows, key, plan)


def evaluate_setting(prep, plan: Plan, key: tuple, name: str, params: dict | None):
    """Ray task body: one setting of a candidate on a prepared segment, or (``None``, a
    sequential bayes search: ``search.spread_settings``) its whole search."""
    if not isinstance(prep, seg.Prepared):
        return None
    candidate = next(c for c in plan.candidates if c.name == name)
    one = candidate if params is None else seg.replace_search(candidate, params)
    evaluation = seg.evaluate(prep, one, plan, key)
    evaluation.split_models = []  # not needed back on the driver
    return evaluation


def finish_segment(prep, plan: Plan, key: tuple, trials: dict[str, list]):
    """The recipe on a prepared segment whose candidates' settings were fitted on other
    Ray tasks (``trials``: per candidate, their evaluations): each candidate's best
    setting, the rivals, the choice, the refit; the segment's result row."""
    import ray

    if not isinstance(prep, seg.Prepared):  # skipped or failed: already its result
        return prep
    # gathered before the recipe: a setting's task lost beyond its retries fails this
    # task, and the engine ends the segment failed as a lost worker
    found = {name: [e for e in ray.get(refs) if e is not None] for name, refs in trials.items()}
    return finish_prepared(prep, plan, key, found)


def finish_prepared(prep: seg.Prepared, plan: Plan, key: tuple,
                    found: dict[str, list[Evaluation]], data: seg.Columns | None = None
                    ) -> tuple[SegmentResult, list[dict]]:
    """The recipe on a prepared segment whose candidates were evaluated already, here or
    on other Ray tasks (``found``: per candidate, the evaluations of its settings)."""

    def best_setting(prepared: seg.Prepared, candidate: CandidateConfig) -> Evaluation:
        return seg.best_of(found[candidate.name], candidate, plan)

    return recipe.train(seg.TableSegment(data, key, plan, best_setting, prepared=prep))


@dataclass
class Evaluated:
    """Some candidates evaluated on one segment (``TableTask.evaluator``): the prepared
    segment (None where the task that selects prepares its own) and the evaluations by
    candidate name; ``seconds`` it took."""

    prep: seg.Prepared | None
    evaluations: dict[str, Evaluation]
    seconds: float


def evaluate_only(columns: seg.Columns, plan: Plan, names: list[str], store: bool
                  ) -> Callable[[tuple, int, int], Evaluated | None]:
    """One segment's evaluation of the candidates ``names`` (None: the segment cannot be
    prepared; the task that selects says why). ``store``: for a task other than the one
    that selects (the GPU task), each candidate's member is made here, where it holds its
    device, and its fitted models are not sent back."""
    chosen = [c for c in plan.candidates if c.name in names]

    def evaluate(key: tuple, start: int, end: int) -> Evaluated | None:
        begin = time.perf_counter()
        try:
            prep = seg.prepare(columns.rows(slice(start, end)), plan, key)
        except Exception:  # noqa: BLE001 - Skip or failure, reported by the selecting task
            return None
        found = {}
        for candidate in chosen:
            evaluation = seg.evaluate(prep, candidate, plan, key)
            if store and evaluation.error is None:
                try:
                    evaluation.stored = seg.member_rows(prep, [(evaluation, 1.0)], plan, key)
                except Exception as exc:  # noqa: BLE001 - its refit failed: not a member
                    evaluation.error = f"refit: {type(exc).__name__}: {exc}"
                evaluation.split_models = []
            found[candidate.name] = evaluation
        return Evaluated(None if store else prep, found, time.perf_counter() - begin)

    return evaluate


def finish_evaluated(columns: seg.Columns, plan: Plan, found: list[dict[tuple, Evaluated]]
                     ) -> SegmentTrainer:
    """The trainer of a block whose candidates were evaluated already (``found``: this
    task's evaluations first, with the prepared segments, then other tasks')."""

    def train(key: tuple, start: int, end: int) -> tuple[SegmentResult, list[dict]]:
        rows = columns.rows(slice(start, end))
        parts = [part.get(key) for part in found]
        if parts[0] is None:  # not prepared: the recipe says why
            return seg.train_segment(rows, key, plan)
        begin = time.perf_counter()
        evaluations = {name: [e] for part in parts if part for name, e in
                       part.evaluations.items()}
        for candidate in plan.candidates:
            evaluations.setdefault(candidate.name, [Evaluation(
                candidate, error="not evaluated: its task returned nothing for the segment")])
        row, members = finish_prepared(parts[0].prep, plan, key, evaluations, rows)
        row.fit_seconds = (time.perf_counter() - begin
                           + sum(part.seconds for part in parts if part))
        return row, members

    return train


def split_global_models(blocks: Blocks, plan: Plan, whole: Plan, num_rows: int
                         ) -> list[list[dict]]:
    """The global model of each split number, each trained on the training rows of that
    split of every segment (sampled to at most FALLBACK_ROWS): what every segment's
    local models compete with on its validation rows."""
    splits = plan.folds if plan.method == "kfold" else 1
    fraction = min(1.0, FALLBACK_ROWS / max(num_rows, 1))
    parts = blocks.map(global_training_rows, plan, fraction, splits, returns=splits)
    if splits == 1:
        parts = [[part] for part in parts]
    fits = [blocks.call(train_fallback, whole, *[part[n] for part in parts])
            for n in range(splits)]
    return [members for _, members in blocks.get(fits)]


def run_fallback(blocks: Blocks, whole: Plan, config: JobConfig, num_rows: int,
                 run_dir: Path):
    """The global model over all rows (sampled to at most FALLBACK_ROWS), if asked for."""
    if config.fallback != "global":
        return None
    fraction = min(1.0, FALLBACK_ROWS / max(num_rows, 1))
    log.info("global model: fitted in %s on a sample of at most %d rows", blocks.calls_on,
             FALLBACK_ROWS)
    samples = blocks.map(sample_block, fraction, whole.seed, whole.columns)
    [(row, members)] = blocks.get([blocks.call(train_fallback, whole, *samples)])
    return keep_fallback(run_dir, {k: v for k, v in row.as_row(whole).items()
                                    if k not in whole.segment_by}, members)


class TableTask:
    """The tabular task (``tasks.Task``): segments of rows with features and a target."""

    spreads = True
    evaluates_apart = True

    def plan(self, config: JobConfig, schema: pa.Schema, threads: int) -> Plan:
        return table_plan(config, schema, threads)

    def kind(self, candidate: CandidateConfig) -> ModelKind:
        return kinds.of(candidate)

    def share(self, blocks: Blocks, plan: Plan, config: JobConfig, num_rows: int,
              given: GivenGlobal | None = None) -> Shared:
        """With ``selection: all`` and ``fallback: global``, the global model of every
        split competes in every segment; the fallback is trained after the segments.
        ``given``: the champion's global model, kept (it competes in every split and is
        the fallback), or the whole source's blocks the global models learn from."""
        whole = global_plan(plan, config)
        if config.fallback == "global" and given is not None and given.kept:
            splits = plan.folds if plan.method == "kfold" else 1
            return given.shared(plan, splits if config.selection == "all" else 0)
        if given is not None and given.blocks is not None:
            blocks, num_rows = given.blocks, given.num_rows
        if config.fallback == "global" and config.selection == "all":
            members = split_global_models(blocks, plan, whole, num_rows)
            if all(members):  # every split's global model trained
                plan = replace_plan(plan, global_members=members,
                                    global_token=uuid.uuid4().hex)
        return Shared(plan, lambda run_dir: run_fallback(blocks, whole, config, num_rows,
                                                         run_dir))

    def trainer(self, frame: pd.DataFrame, todo: list, plan: Plan,
                found: list[dict] | None = None) -> SegmentTrainer:
        columns = seg.columns_of(frame, plan)  # converted once per block; sliced per segment
        if found is not None:
            return finish_evaluated(columns, plan, found)
        return lambda key, start, end: seg.train_segment(columns.rows(slice(start, end)),
                                                         key, plan)

    def evaluator(self, frame: pd.DataFrame, todo: list, plan: Plan, names: list[str],
                  store: bool) -> Callable[[tuple, int, int], Evaluated | None]:
        return evaluate_only(seg.columns_of(frame, plan), plan, names, store)

    def train_large(self, refs: list, keys: list[list[tuple]], plan: Plan,
                    config: JobConfig, run_dir: Path) -> None:
        train_large_segments(refs, keys, plan, config, run_dir)

    def spread_functions(self) -> tuple[Callable, Callable, Callable]:
        return prepare_segment, evaluate_setting, finish_segment

    def example(self, rows: pd.DataFrame, plan: Plan) -> pd.DataFrame:
        return rows[plan.segment_by + plan.features].head(5).reset_index(drop=True)

    def manifest(self, plan: Plan, schema: pa.Schema) -> None:
        return None


TABLE = TableTask()
