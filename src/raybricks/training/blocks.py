"""A job's data where its tasks run, behind one small seam the training tasks use for
what every segment shares (the series' end, the global model's sample):

``RayBlocks``
    the Ray blocks of a ``SegmentedDataset`` (each holds whole segments, sorted);
    ``map`` runs a Ray task next to each block and keeps its result in the object
    store; ``call`` runs one Ray task over those results.
``SparkBlocks``
    a Spark DataFrame hash-partitioned by the segment key (each partition holds whole
    segments); ``map`` runs one Spark task per partition (its rows sorted by the key
    with Arrow, as Ray's readers sort a block) and brings the results to the driver;
    ``call`` runs on the driver (the results are samples bounded in rows).

A function given to ``map`` is called as ``fn(block, index, *args)``: ``block`` an
Arrow table of whole segments sorted by the key, ``index`` the block's (or partition's)
number, for seeds and ids unique in the job.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from raybricks.data import (
    BlockSegments,
    SegmentedDataset,
    collect_arrow,
    segment_bounds,
    sort_by_segment,
)
from raybricks.training.remote import remote
from raybricks.workers import workers_import_raybricks

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class Blocks(Protocol):
    """The job's data, block by block, where its tasks run."""

    #: Where ``call`` runs: said in the run (e.g. "a Ray task", "the driver").
    calls_on: str

    def map(self, fn: Callable, *args: Any, returns: int = 1) -> list:
        """``fn(block, index, *args)`` of every block, as handles ``call`` and ``get``
        take (a list of ``returns`` handles per block when ``returns > 1``)."""

    def call(self, fn: Callable, *args: Any, num_cpus: int = 1) -> Any:
        """``fn(*args)`` in one task (handles among ``args`` given as their values), as
        a handle ``get`` takes: calls made one after another run at the same time."""

    def get(self, handles: list) -> list:
        """The values of handles ``map`` made."""

    def rows(self, key: tuple | None) -> pa.Table | None:
        """One segment's rows (``key`` None: any segment's; None: no such segment)."""

    def latest(self, column: str) -> Any:
        """The largest value of ``column`` over every block, as Arrow gives it to Python
        (None where it has none)."""


def block_latest(block: pa.Table, index: int, column: str) -> Any:
    """A task's body (``RayBlocks.latest``): the largest value of a block's column."""
    import pyarrow.compute as pc

    return pc.max(block.column(column)).as_py()


class RayBlocks:
    """The Ray blocks of a dataset (``refs``: Arrow tables of whole segments, sorted by
    ``segment_by``) and per block its segments (``segments``: ``data.BlockSegments``)."""

    calls_on = "a Ray task"

    def __init__(self, refs: list, segment_by: Sequence[str],
                 segments: Sequence[BlockSegments]) -> None:
        self.refs, self.segment_by, self.segments = refs, list(segment_by), segments

    @classmethod
    def of(cls, dataset: SegmentedDataset) -> RayBlocks:
        """The blocks of a ``data.SegmentedDataset``."""
        return cls(dataset.block_refs(), dataset.segment_by, dataset.segments)

    def map(self, fn: Callable, *args: Any, returns: int = 1) -> list:
        task = remote(fn, num_returns=returns) if returns > 1 else remote(fn)
        return [task.remote(ref, index, *args) for index, ref in enumerate(self.refs)]

    def call(self, fn: Callable, *args: Any, num_cpus: int = 1) -> Any:
        return remote(fn, num_cpus=num_cpus).remote(*args)

    def get(self, handles: list) -> list:
        import ray

        return ray.get(handles)

    def rows(self, key: tuple | None) -> pa.Table | None:
        import ray

        for ref, block in zip(self.refs, self.segments, strict=True):
            if len(block) and (key is None or key in block):
                table = ray.get(ref)
                return next(table.slice(start, end - start) for found, start, end
                            in segment_bounds(table, self.segment_by)
                            if key is None or found == key)
        return None

    def latest(self, column: str) -> Any:
        found = [value for value in self.get(self.map(block_latest, column))
                 if value is not None]
        return max(found, default=None)


#: The rows ``SparkBlocks.map`` brings back: the partition's number, its pickled result.
MAPPED = "index int, value binary"


@dataclass
class SparkBlocks:
    """A DataFrame hash-partitioned by ``segment_by`` into ``partitions`` (every segment
    in exactly one partition), its blocks being the partitions."""

    df: DataFrame
    segment_by: list[str]
    partitions: int
    calls_on: str = "the driver"
    source: DataFrame | None = None  # ``df`` before its partitioning (for aggregates)

    @classmethod
    def of(cls, df: DataFrame, segment_by: Sequence[str], partitions: int) -> SparkBlocks:
        return cls(df.repartition(partitions, *segment_by), list(segment_by), partitions,
                   source=df)

    def latest(self, column: str) -> Any:
        """Spark's own aggregate (no shuffle, no Python worker)."""
        from pyspark.sql import functions as F

        source = self.df if self.source is None else self.source
        found = collect_arrow(source.agg(F.max(column).alias(column)))
        return found.column(column)[0].as_py() if found.num_rows else None

    def map(self, fn: Callable, *args: Any, returns: int = 1) -> list:
        schema = self.df.schema
        segment_by = self.segment_by

        def mapped(batches):
            from pyspark import TaskContext

            from raybricks.compat import arrow_schema

            table = pa.Table.from_batches(list(batches), schema=arrow_schema(schema))
            if not table.num_rows:
                return
            index = TaskContext.get().partitionId()
            value = fn(sort_by_segment(table, segment_by), index, *args)
            yield pa.RecordBatch.from_pydict(
                {"index": [index], "value": [pickle.dumps(value, protocol=5)]},
                schema=pa.schema([("index", pa.int32()), ("value", pa.binary())]))

        with workers_import_raybricks():
            rows = self.df.mapInArrow(mapped, MAPPED).collect()
        found = sorted((row["index"], row["value"]) for row in rows)
        values = [pickle.loads(value) for _, value in found]
        return [list(value) for value in values] if returns > 1 else values

    def call(self, fn: Callable, *args: Any, num_cpus: int = 1) -> Any:
        return fn(*args)  # on the driver, with its threads

    def get(self, handles: list) -> list:
        return list(handles)

    def rows(self, key: tuple | None) -> pa.Table | None:
        from functools import reduce

        from pyspark.sql import functions as F

        if key is None:
            first = self.df.select(*self.segment_by).limit(1).collect()
            if not first:
                return None
            key = tuple(first[0])
        chosen = reduce(lambda a, b: a & b, [F.col(name).eqNullSafe(value)
                                             for name, value in zip(self.segment_by, key,
                                                                    strict=True)])
        table = collect_arrow(self.df.where(chosen))
        return table if table.num_rows else None
