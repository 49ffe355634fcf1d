"""Task forecast with ``forecast.hierarchy``: every level's forecasts made to add up.

Training's tasks forecast each series' horizon with the models they just fitted, as the
registered model will answer it, and store it with the series' backtest errors in its
members' meta (``backtest.OwnForecast``). After training (Ray still up), each independent
subtree of the hierarchy (the series sharing the columns common to every level; the
whole structure where there is a total or the levels cross) is reconciled from those in
a Ray task beside the others, never all in one process: the task builds the summing
matrix, reconciles with Nixtla's hierarchicalforecast, and writes each series' shift
(reconciled minus its own forecast, per period ahead) in the run. Packaging stores the
shift with the series' members; the registered model adds it to its forecasts.
"""

from __future__ import annotations

import inspect
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from raybricks.config import LEVEL_COLUMN, JobConfig
from raybricks.errors import ConfigError, key_text
from raybricks.hierarchy import Levels
from raybricks.results import part_files
from raybricks.segmented_model import RECONCILIATION, key_tuples

if TYPE_CHECKING:
    from raybricks.results import TrainingResult

#: Above this many segments (bottom series) a tree is reconciled with hierarchicalforecast's
#: sparse methods (the shrunk covariance then becomes its diagonal: ``wls_var``).
SPARSE_FROM = 2_000
#: Ray tasks per CPU of the cluster that the subtrees are shared among.
TASKS_PER_CPU = 2


@dataclass(frozen=True)
class Structure:
    """What a task needs of the job: the levels, the method, the horizon."""

    levels: list[list[str]]
    names: list[str]
    method: str
    middle_level: str | None
    horizon: int
    segment_by: list[str]


@dataclass
class Reconciled:
    """What reconciliation did: subtrees and series reconciled, series without a
    forecast of their own (failed; counted as 0 in the sums), trees reconciled with the
    sparse methods, the method each ran with, and why the first few trained series'
    models could not forecast (``series key: error``, ``SeriesMeta.base_error``)."""

    subtrees: int = 0
    series: int = 0
    without_forecast: int = 0
    sparse_trees: int = 0
    methods: tuple[str, ...] = ()
    forecast_errors: tuple[str, ...] = ()

    def add(self, other: Reconciled) -> Reconciled:
        return Reconciled(self.subtrees + other.subtrees, self.series + other.series,
                          self.without_forecast + other.without_forecast,
                          self.sparse_trees + other.sparse_trees,
                          tuple(sorted(set(self.methods) | set(other.methods))),
                          (self.forecast_errors + other.forecast_errors)[:ERRORS_SHOWN])

    def describe(self) -> str:
        text = (f"reconciled {self.series} series in {self.subtrees} independent "
                f"subtree(s) with {', '.join(self.methods)}")
        if self.without_forecast:
            text += (f"; {self.without_forecast} series without a forecast of their own "
                     "(failed, or their models could not forecast) counted as 0 in the sums")
        if self.forecast_errors:
            text += f" (could not forecast: {'; '.join(self.forecast_errors)})"
        if self.sparse_trees:
            text += f"; {self.sparse_trees} tree(s) large enough for the sparse methods"
        return text


#: How many series' forecast errors ``Reconciled.describe`` names.
ERRORS_SHOWN = 3


def check_installed() -> None:
    """hierarchicalforecast, or a ConfigError naming the extra."""
    try:
        import hierarchicalforecast  # noqa: F401
    except ImportError:
        raise ConfigError("forecast.hierarchy reconciles with Nixtla's hierarchicalforecast: "
                          "pip install 'raybricks[hierarchy]'") from None


def reconcile(result: TrainingResult, config: JobConfig, cpus: int, on_ray: bool = True
              ) -> Reconciled:
    """Reconcile a trained hierarchy from its series' own forecasts (``own_forecasts``)
    on Ray (``cpus``: the cluster's), or without Ray (``on_ray`` false: the Spark
    executor) on the driver, batch after batch; the shifts land in the run
    (``shifts-*.parquet``), which packaging reads."""
    out = result.run_dir / RECONCILIATION
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    levels = Levels.of(config)
    structure = Structure(levels.levels, levels.names, config.forecast.hierarchy.method,
                          config.forecast.hierarchy.middle_level, config.forecast.horizon,
                          list(result.segment_by))
    keys, base, residuals, errors = own_forecasts(result, structure.horizon)
    subtrees, batches = subtree_batches(keys, levels.subtree_columns, cpus * TASKS_PER_CPU)
    work = [(keys.take(pa.array(rows)).append_column("subtree", pa.array(subtrees[rows])),
             base[rows], residuals[rows], asdict(structure),
             str(out / f"shifts-{i:05d}.parquet")) for i, rows in enumerate(batches)]
    if on_ray:
        import ray

        from raybricks.training.remote import remote

        task = remote(reconcile_batch, num_cpus=1, max_retries=2)
        done = ray.get([task.remote(*arguments) for arguments in work])
    else:
        done = [reconcile_batch(*arguments) for arguments in work]
    found = Reconciled(forecast_errors=tuple(errors[:ERRORS_SHOWN]))
    for part in done:
        found = found.add(Reconciled(**part))
    return found


def own_forecasts(result: TrainingResult, horizon: int
                  ) -> tuple[pa.Table, np.ndarray, np.ndarray, list[str]]:
    """The keys of every series of the run, each one's own forecast of the ``horizon``
    periods after its history and its backtest errors (windows x horizon, flattened, the
    latest windows aligned at the end), as the task that fitted its models stored them
    in their meta (``base`` and ``residuals``); NaN where it has none (failed); and why
    trained series have none (``key: error``, from ``base_error``)."""
    segment_by = list(result.segment_by)
    keys, base, errors, failed = [], [], [], []
    for file in part_files(result.run_dir / "results"):  # a part at a time
        part = pq.read_table(file, columns=segment_by)
        models = result.run_dir / "models" / file.name
        stored: dict[tuple, dict[str, Any]] = {}
        if models.exists():
            members = pq.read_table(models, columns=[*segment_by, "meta"])
            for key, meta in zip(key_tuples(members, segment_by),
                                 members.column("meta").to_pylist(), strict=True):
                if key not in stored:  # a series' members share its forecast meta
                    stored[key] = json.loads(meta)["forecast"]
        for key in key_tuples(part, segment_by):
            found = stored.get(key, {})
            base.append(found.get("base") or [np.nan] * horizon)
            if "base_error" in found:
                failed.append(f"{key_text(dict(zip(segment_by, key, strict=True)), segment_by)}: "
                              f"{found['base_error']}")
            errors.append(np.asarray(found.get("residuals") or [], dtype="float64").ravel())
        keys.append(part)
    table = pa.concat_tables(keys) if keys else pa.table({c: [] for c in segment_by})
    return (table, np.array(base, dtype="float64").reshape(-1, horizon), aligned(errors),
            failed)


def aligned(errors: list[np.ndarray]) -> np.ndarray:
    """Each series' flattened backtest errors as one row of a matrix, the latest windows
    aligned at the end (NaN before a series' first window; one NaN column when none has
    any)."""
    width = max((len(e) for e in errors), default=0)
    matrix = np.full((len(errors), max(width, 1)), np.nan)
    for i, e in enumerate(errors):
        if len(e):
            matrix[i, width - len(e):] = e
    return matrix


def subtree_batches(keys: pa.Table, shared: list[str], tasks: int
                    ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each series' subtree number (those sharing the ``shared`` columns' values) and the
    series' rows in at most ``tasks`` batches of whole subtrees; each subtree, the
    largest first, goes to the least loaded batch."""
    frame = keys.to_pandas()
    if shared:
        codes = frame.groupby(shared, dropna=False, sort=False).ngroup().to_numpy()
    else:
        codes = np.zeros(len(frame), dtype="int64")
    sizes = np.bincount(codes)
    order = np.argsort(-sizes, kind="stable")
    loads = np.zeros(max(min(tasks, len(sizes)), 1))
    batch_of = np.empty(len(sizes), dtype="int64")
    for subtree in order:  # the largest subtree to the least loaded batch
        batch_of[subtree] = int(np.argmin(loads))
        loads[batch_of[subtree]] += sizes[subtree]
    row_batch = batch_of[codes]
    return codes, [rows for b in range(len(loads))
                   if len(rows := np.flatnonzero(row_batch == b))]


def reconcile_batch(batch: pa.Table, base: np.ndarray, residuals: np.ndarray,
                    structure: dict[str, Any], out: str) -> dict[str, Any]:
    """A Ray task: the subtrees of ``batch`` (its series' keys and subtree numbers,
    their own forecasts and backtest errors) reconciled; each series' shift written to
    ``out``."""
    layout = Structure(**structure)
    keys = batch.select(layout.segment_by)
    subtrees = batch.column("subtree").to_numpy()
    shifts = np.zeros_like(base)
    found = Reconciled()
    order = np.argsort(subtrees, kind="stable")
    cuts = np.flatnonzero(np.diff(subtrees[order])) + 1
    for rows in np.split(order, cuts):  # each subtree's rows
        frame = keys.take(pa.array(rows)).to_pandas()
        shifts[rows], done = reconcile_tree(frame, base[rows], residuals[rows], layout)
        found = found.add(done)
    table = keys.append_column(RECONCILIATION, pa.array(list(shifts), pa.list_(pa.float64())))
    pq.write_table(table, out)
    return asdict(found)


def summing_matrix(frame: pd.DataFrame, layout: Structure):
    """A subtree's summing matrix S (its series, in ``frame``'s order, by its bottom
    series; SciPy sparse), the rows of the bottom series, and ``tags`` (each level's
    rows, top first)."""
    from scipy import sparse

    level = frame[LEVEL_COLUMN].to_numpy()
    bottom = np.flatnonzero(level == layout.names[-1])
    bottoms = frame.iloc[bottom].reset_index(drop=True)
    entries_row, entries_bottom, tags = [], [], {}
    for columns, name in zip(layout.levels, layout.names, strict=True):
        rows = np.flatnonzero(level == name)
        if not len(rows):
            continue
        tags[name] = rows
        if not columns:  # the total
            entries_row.append(np.repeat(rows, len(bottom)))
            entries_bottom.append(np.tile(np.arange(len(bottom)), len(rows)))
            continue
        nodes = frame.iloc[rows][columns].reset_index(drop=True)
        node_of = nodes.assign(__node=np.arange(len(nodes))).merge(
            bottoms[columns].assign(__bottom=np.arange(len(bottoms))), on=columns)
        entries_row.append(rows[node_of["__node"].to_numpy()])
        entries_bottom.append(node_of["__bottom"].to_numpy())
    row, column = np.concatenate(entries_row), np.concatenate(entries_bottom)
    S = sparse.csr_matrix((np.ones(len(row)), (row, column)), shape=(len(frame), len(bottom)))
    return S, bottom, tags


def reconcile_tree(frame: pd.DataFrame, base: np.ndarray, residuals: np.ndarray,
                   layout: Structure) -> tuple[np.ndarray, Reconciled]:
    """One subtree's shifts (reconciled minus base forecasts, per series and period)."""
    # hierarchicalforecast's order: the levels top first, the bottom series last
    rank = {name: i for i, name in enumerate(layout.names)}
    order = np.argsort(frame[LEVEL_COLUMN].map(rank).to_numpy(), kind="stable")
    frame = frame.iloc[order].reset_index(drop=True)
    base, residuals = base[order], residuals[order]
    S, bottom, tags = summing_matrix(frame, layout)
    missing = np.isnan(base).any(axis=1)
    y_hat = np.where(np.isnan(base), 0.0, base)
    sparse = len(bottom) > SPARSE_FROM
    method, reconciler = reconciler_for(layout, sparse)
    arguments = {"S": S if sparse else S.toarray(), "y_hat": y_hat, "idx_bottom": bottom,
                 "tags": tags, "y_insample": residuals,
                 "y_hat_insample": np.zeros_like(residuals)}
    reconciled = call(reconciler.fit_predict, arguments)["mean"]
    done = Reconciled(1, len(frame), int(missing.sum()), int(sparse), (method,))
    shifts = np.empty_like(y_hat)
    shifts[order] = reconciled - y_hat
    return shifts, done


def reconciler_for(layout: Structure, sparse: bool) -> tuple[str, Any]:
    """The hierarchicalforecast reconciler of the job's method (its sparse variant for
    a large tree) and the method's name as it ran."""
    from hierarchicalforecast import methods

    def pick(name: str) -> Callable:
        return getattr(methods, f"{name}Sparse" if sparse else name)

    method = layout.method
    if method == "bottom_up":
        return method, pick("BottomUp")()
    if method == "top_down":
        return method, pick("TopDown")(method="forecast_proportions")
    if method == "middle_out":
        return method, pick("MiddleOut")(middle_level=layout.middle_level,
                                         top_down_method="forecast_proportions")
    variant = method.removeprefix("min_trace_")
    variant = "mint_shrink" if variant == "shrink" else variant
    if sparse and variant == "mint_shrink":  # a dense covariance of every series: too big
        return "min_trace_wls_var (large tree)", pick("MinTrace")(method="wls_var")
    return method, pick("MinTrace")(method=variant)


def call(function: Callable, arguments: dict[str, Any]) -> Any:
    """``function`` with those of ``arguments`` it takes (hierarchicalforecast's methods
    take different ones, and they differ between its versions)."""
    accepted = inspect.signature(function).parameters
    return function(**{k: v for k, v in arguments.items() if k in accepted})
