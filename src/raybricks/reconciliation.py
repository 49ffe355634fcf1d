"""Task forecast with ``forecast.hierarchy``: every level's forecasts made to add up.

After training (Ray still up), the run's models are packaged once as a store; each
independent subtree of the hierarchy (the series sharing the columns common to every
level; the whole structure where there is a total or the levels cross) is reconciled in
a Ray task beside the others, never all in one process: the task forecasts its series'
horizon from the store (what the registered model will answer), builds the summing
matrix, reconciles with Nixtla's hierarchicalforecast, and writes each series' shift
(reconciled minus its own forecast, per period ahead) in the run. Packaging stores the
shift with the series' members; the registered model adds it to its forecasts.
"""

from __future__ import annotations

import inspect
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from raybricks.config import LEVEL_COLUMN, JobConfig
from raybricks.errors import ConfigError
from raybricks.hierarchy import Levels
from raybricks.segmented_model import INDEX, RECONCILIATION, SegmentStore, key_tuples

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
    sparse methods, and the method each ran with."""

    subtrees: int = 0
    series: int = 0
    without_forecast: int = 0
    sparse_trees: int = 0
    methods: tuple[str, ...] = ()

    def add(self, other: Reconciled) -> Reconciled:
        return Reconciled(self.subtrees + other.subtrees, self.series + other.series,
                          self.without_forecast + other.without_forecast,
                          self.sparse_trees + other.sparse_trees,
                          tuple(sorted(set(self.methods) | set(other.methods))))

    def describe(self) -> str:
        text = (f"reconciled {self.series} series in {self.subtrees} independent "
                f"subtree(s) with {', '.join(self.methods)}")
        if self.without_forecast:
            text += (f"; {self.without_forecast} series without a forecast of their own "
                     "(failed) counted as 0 in the sums")
        if self.sparse_trees:
            text += f"; {self.sparse_trees} tree(s) large enough for the sparse methods"
        return text


def check_installed() -> None:
    """hierarchicalforecast, or a ConfigError naming the extra."""
    try:
        import hierarchicalforecast  # noqa: F401
    except ImportError:
        raise ConfigError("forecast.hierarchy reconciles with Nixtla's hierarchicalforecast: "
                          "pip install 'raybricks[hierarchy]'") from None


def reconcile(result: TrainingResult, config: JobConfig, cpus: int, on_ray: bool = True
              ) -> Reconciled:
    """Reconcile a trained hierarchy on Ray (``cpus``: the cluster's), or without Ray
    (``on_ray`` false: the Spark executor) on the driver, batch after batch; the shifts
    land in the run (``shifts-*.parquet``), which packaging reads."""
    from raybricks.packaging import package_result

    out = result.run_dir / RECONCILIATION
    shutil.rmtree(out, ignore_errors=True)
    base = out / "base"
    package_result(result, base)
    levels = Levels.of(config)
    structure = Structure(levels.levels, levels.names, config.forecast.hierarchy.method,
                          config.forecast.hierarchy.middle_level, config.forecast.horizon,
                          list(result.segment_by))
    keys = pq.read_table(base / INDEX, columns=structure.segment_by)
    batches = subtree_batches(keys, levels.subtree_columns, cpus * TASKS_PER_CPU)
    work = [(str(base), batch, asdict(structure), str(out / f"shifts-{i:05d}.parquet"))
            for i, batch in enumerate(batches)]
    if on_ray:
        import ray

        from raybricks.training.remote import remote

        task = remote(reconcile_batch, num_cpus=1, max_retries=2)
        done = ray.get([task.remote(*arguments) for arguments in work])
    else:
        done = [reconcile_batch(*arguments) for arguments in work]
    shutil.rmtree(base)
    found = Reconciled()
    for part in done:
        found = found.add(Reconciled(**part))
    return found


def subtree_batches(keys: pa.Table, shared: list[str], tasks: int) -> list[pa.Table]:
    """The series' keys in at most ``tasks`` batches of whole subtrees (those sharing the
    ``shared`` columns' values), each row with its ``subtree`` number; each subtree, the
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
    keyed = keys.append_column("subtree", pa.array(codes))
    row_batch = batch_of[codes]
    return [keyed.filter(pa.array(row_batch == b)) for b in range(len(loads))
            if (row_batch == b).any()]


def reconcile_batch(store_dir: str, batch: pa.Table, structure: dict[str, Any], out: str
                    ) -> dict[str, Any]:
    """A Ray task: the subtrees of ``batch`` forecast from the store and reconciled; each
    series' shift written to ``out``."""
    layout = Structure(**structure)
    store = SegmentStore(store_dir, cache_segments=max(batch.num_rows, 1))
    keys = batch.select(layout.segment_by)
    base, residuals = base_forecasts(store, keys, layout.horizon)
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


def base_forecasts(store: SegmentStore, keys: pa.Table, horizon: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Each series' forecast of the ``horizon`` periods after its history, as the store
    answers it (NaN without a model), and its backtest errors (windows x horizon,
    flattened; NaN where it has none), one row per key."""
    from raybricks.scoring import future_frame

    tuples = key_tuples(keys, store.segment_by)
    models = store.models(tuples, store.locate(keys))
    lasts = {key: models[key].meta["forecast"]["last"] for key in tuples if key in models}
    base = np.full((len(tuples), horizon), np.nan)
    if lasts:
        frame = future_frame(lasts, store.manifest, horizon)
        values = store.predict(frame).values.to_numpy(dtype="float64").reshape(-1, horizon)
        position = {key: i for i, key in enumerate(lasts)}
        rows = [i for i, key in enumerate(tuples) if key in position]
        base[rows] = values[[position[tuples[i]] for i in rows]]
    errors = [np.asarray(models[key].meta["forecast"].get("residuals") or [], dtype="float64")
              .reshape(-1) if key in models else np.empty(0) for key in tuples]
    width = max((len(e) for e in errors), default=0)
    residuals = np.full((len(tuples), max(width, 1)), np.nan)
    for i, e in enumerate(errors):  # the latest windows aligned at the end
        if len(e):
            residuals[i, width - len(e):] = e
    return base, residuals


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
