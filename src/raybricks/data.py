"""Spark table -> Ray Dataset whose every block holds whole segments.

Spark does the column pruning, the filter and the clustering (hash-partition by the
segment key: every segment lands in exactly one partition); Ray only reads. Each Spark
partition is handed to one Ray reader task, which sorts it by the key with Arrow and
cuts it at segment boundaries into blocks of at most ``max_block_rows`` rows (a single
segment larger than that is one block of its own). No segment is ever split across
blocks, and Ray does no shuffle. (Sorting in the reader rather than in Spark halves
Spark's work on small clusters: Arrow sorts a partition in a fraction of the time
Spark's row-based sort takes, and the readers run in parallel. ``chunks`` is the
exception, see below.)

Strategies (``strategy=``):

``chunks``
    Databricks Runtime ML 15+ (the mechanism behind Ray's own ``ray.data.from_spark``
    there): Spark sorts each partition by the key and persists it on the executors as
    Arrow chunks of at most ``chunk_bytes`` (``pyspark.databricks.sql.chunk``); Ray
    tasks read the chunks. A partition may become several chunks, so a segment may
    straddle two or more: the readers cut blocks from the segments wholly inside a chunk
    and set aside the first and last segment of every chunk, and a second, small round of
    tasks puts those pieces together by key. The chunks are unpersisted once the blocks
    are in Ray, and on any error. Needs ``spark.databricks.pyspark.dataFrameChunk.enabled``
    and a dedicated access mode cluster; ``auto`` uses it only on a fixed-size on-demand
    cluster (chunks die with their executor).
``parquet``
    Spark writes the clustered table as Parquet under a unique staging directory (a Unity
    Catalog volume path on Databricks, a temporary directory locally), Ray tasks read one
    file each, and the directory stays until training is over (``SegmentedDataset.release``,
    or when the dataset is dropped): a Ray worker node lost mid-training takes its blocks
    with it, and Ray rebuilds them by reading those files again.
``arrow``
    Small tables only: the table collected as Arrow on the driver, cut into blocks there.
    Refused above ``arrow_max_rows`` so no large table is collected on the driver.
``auto``
    ``chunks`` where available on a fixed-size on-demand cluster, else ``arrow`` for
    tables up to ``arrow_max_rows`` rows and an estimated ``ARROW_AUTO_MAX_BYTES`` in
    Arrow (no Spark shuffle, no staging: several times faster up to there), else
    ``parquet``.

Types: integers, floats, booleans, strings, binary, dates and decimals (same precision
and scale) arrive as their Arrow equivalents; Spark ``TIMESTAMP`` arrives as
``timestamp[us, tz=UTC]`` (the same instant), ``TIMESTAMP_NTZ`` as ``timestamp[us]``;
nulls stay nulls. Null segment keys are kept: all rows whose key is null form one
segment of their own (per distinct combination of the key columns).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raybricks.compat import arrow_schema
from raybricks.databricks import (
    CHUNK_API_CONF,
    STAGING_PREFIX,
    chunk_api_available,
    chunk_api_problem,
    in_databricks_runtime,
    unstable_workers,
)
from raybricks.errors import DataError, first_line, missing_columns
from raybricks.segmented_model import KeyIndex, key_tuples
from raybricks.sources import read_source

if TYPE_CHECKING:
    import ray.data
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

Strategy = Literal["auto", "chunks", "parquet", "arrow"]
DEFAULT_MAX_BLOCK_ROWS = 200_000
DEFAULT_ARROW_MAX_ROWS = 2_000_000
#: ``auto`` collects on the driver only tables estimated this small in Arrow, so the
#: driver's memory stays bounded whatever the table (``arrow_size_estimate``).
ARROW_AUTO_MAX_BYTES = 128 * 1024 * 1024
#: What ``arrow_size_estimate`` counts per value of a column without a fixed width.
VARIABLE_WIDTH_BYTES = 32
#: Rows per Spark partition when staging: readers load a partition whole, then cut it.
ROWS_PER_PARTITION = 1_000_000
#: Blocks per Ray CPU by default: enough tasks to balance uneven segments.
BLOCKS_PER_CPU = 4
#: Largest Arrow chunk of the ``chunks`` strategy (what Ray's ``from_spark`` uses).
DEFAULT_CHUNK_BYTES = 32 * 1024 * 1024


@dataclass
class SegmentedDataset:
    """Segment-aligned blocks in Ray's object store, with what is known about them.

    ``refs``: the blocks (Arrow tables), in order. ``segments``: per block, its
    segments' keys and row counts in order (``BlockSegments``), as the readers found them
    when they cut the blocks. ``dataset``: the same blocks as a Ray Dataset (made when
    first asked for: the engine reads the blocks directly).
    """

    refs: list
    segment_by: list[str]
    strategy: str
    num_rows: int
    schema: pa.Schema
    segments: list[BlockSegments]
    _dataset: ray.data.Dataset | None = field(default=None, repr=False)
    #: The Parquet files the blocks were read from (strategy parquet), kept until
    #: ``release``: Ray rebuilds the blocks a lost worker node held by reading them again.
    staging: str | None = None

    def __post_init__(self) -> None:
        if self.staging is not None:  # also when the dataset is dropped without release
            self._remove_staging = weakref.finalize(self, remove_staging, self.staging)

    def release(self) -> None:
        """Remove the staged Parquet files (training is over: no block is needed again)."""
        if self.staging is not None:
            self._remove_staging()

    @property
    def num_blocks(self) -> int:
        return len(self.refs)

    @property
    def dataset(self) -> ray.data.Dataset:
        if self._dataset is None:
            import ray.data

            self._dataset = ray.data.from_arrow_refs(self.refs)
        return self._dataset

    def block_refs(self) -> list:
        """References to the blocks (Arrow tables), in order."""
        return self.refs

    def count_segments(self) -> int:
        """Distinct segments across all blocks (no segment spans two blocks)."""
        return sum(len(block) for block in self.segments)


# --------------------------------------------------------------------------- input


def select_and_filter(
    df: DataFrame,
    segment_by: Sequence[str],
    columns: Sequence[str] | None = None,
    where: str | None = None,
) -> DataFrame:
    """Check the columns exist, apply the SQL predicate, keep only the needed columns."""
    from pyspark.errors import AnalysisException

    segment_by = list(segment_by)
    if not segment_by:
        raise DataError("segment_by is empty: name at least one segment column")
    wanted = list(dict.fromkeys(segment_by + list(columns or [])))
    if columns is None:
        wanted += [c for c in df.columns if c not in wanted]
    available = {c.lower(): c for c in df.columns}
    needed = {c.lower() for c in wanted}
    twins = sorted(c for c in df.columns if c.lower() in needed
                   and sum(o.lower() == c.lower() for o in df.columns) > 1)
    if twins:
        raise DataError(
            f"columns {twins} differ only in case: Spark matches column names without "
            "regard to case, so they cannot be told apart; rename or drop one (e.g. in a "
            "view over the source) or list features without them"
        )
    missing = [c for c in wanted if c.lower() not in available]
    if missing:
        raise DataError(missing_columns(missing, df.columns, "the table"))
    if where:
        try:
            df = df.where(where)
            df.schema  # noqa: B018 - forces analysis so a bad predicate fails here
        except AnalysisException as exc:
            raise DataError(
                f"where={where!r} is not a valid predicate on this table "
                f"({first_line(exc)}); columns are {df.columns}"
            ) from exc
    return df.select(*[available[c.lower()] for c in wanted])


@dataclass(frozen=True)
class SegmentSizes:
    """How many segments a DataFrame holds (null keys included) and the rows of its
    largest."""

    segments: int
    largest: int


def segment_sizes(df: DataFrame, segment_by: Sequence[str]) -> SegmentSizes:
    """The segments of ``df`` and the rows of its largest (one Spark job)."""
    from pyspark.sql import functions as F

    counts = df.groupBy(*segment_by).count()
    found = counts.agg(F.count("*"), F.max("count")).first()
    return SegmentSizes(int(found[0]), int(found[1] or 0))


def lay_out_by_segment(
    df: DataFrame, segment_by: Sequence[str], num_partitions: int | None
) -> DataFrame:
    """Hash-partition by the segment key (into ``num_partitions``; None: Spark's
    shuffle partitions, which adaptive execution may coalesce) and sort within partitions.

    Every key lands in exactly one partition and each segment becomes a contiguous run
    of rows (what scoring's ``mapInPandas`` needs). Staging for Ray skips the Spark sort:
    its readers sort with Arrow.
    """
    by = [num_partitions, *segment_by] if num_partitions else list(segment_by)
    return df.repartition(*by).sortWithinPartitions(*segment_by)


def sort_by_segment(table: pa.Table, segment_by: Sequence[str]) -> pa.Table:
    """The table sorted by the segment key (nulls last, so a null key is one run)."""
    return table.sort_by([(name, "ascending") for name in segment_by])


# --------------------------------------------------------------------------- blocks


def segment_starts(table: pa.Table, segment_by: Sequence[str]) -> list[int]:
    """Row offsets where a new segment begins in a table sorted by the segment key.

    Nulls compare equal to nulls, so rows with a null key form one segment.
    """
    n = table.num_rows
    if n == 0:
        return []
    changed = pa.array([False] * (n - 1), type=pa.bool_())
    for name in segment_by:
        column = table.column(name).combine_chunks()
        head, tail = column.slice(0, n - 1), column.slice(1)
        differs = pc.fill_null(pc.not_equal(head, tail), False)
        null_flip = pc.xor(pc.is_null(head), pc.is_null(tail))
        changed = pc.or_(changed, pc.or_(differs, null_flip))
    boundaries = pc.indices_nonzero(changed).to_pylist()
    return [0] + [i + 1 for i in boundaries]


def segment_bounds(block: pa.Table, segment_by: Sequence[str]) -> list[tuple[tuple, int, int]]:
    """(key, start, end) of every segment in a block sorted by the segment key."""
    starts = segment_starts(block, segment_by)
    if not starts:  # no rows
        return []
    ends = starts[1:] + [block.num_rows]
    keys = block.select(list(segment_by)).take(starts).to_pylist()
    return [(tuple(k[c] for c in segment_by), s, e)
            for k, s, e in zip(keys, starts, ends, strict=True)]


@dataclass(frozen=True, eq=False)
class BlockSegments:
    """The segments of one block, in row order: their keys (an Arrow table of the key
    columns, one row per segment) and row counts. A few bytes per segment where a Python
    (key, rows) tuple takes about 150: the driver holds one of these per block, so its
    memory stays small at millions of segments."""

    keys: pa.Table
    rows: np.ndarray

    @classmethod
    def of(cls, table: pa.Table, bounds: Sequence[tuple[tuple, int, int]],
           segment_by: Sequence[str]) -> BlockSegments:
        """From a table's segment bounds (key, start, end) in it."""
        starts = np.fromiter((start for _, start, _ in bounds), np.int64, len(bounds))
        ends = np.fromiter((end for _, _, end in bounds), np.int64, len(bounds))
        keys = table.select(list(segment_by)).take(pa.array(starts)).combine_chunks()
        return cls(keys, ends - starts)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[tuple[tuple, int]]:
        """(key, rows) of every segment (made as iterated)."""
        return iter(zip(self.key_tuples(), self.rows.tolist(), strict=True))

    @property
    def offsets(self) -> np.ndarray:
        """The first row of every segment in the block, then the block's row count."""
        return np.concatenate([[0], np.cumsum(self.rows)])

    def __contains__(self, key: object) -> bool:
        """Whether a key (a tuple, as ``key_tuples`` gives them) is one of these (a null
        matches a null, as segments group them)."""
        if not isinstance(key, tuple) or len(key) != self.keys.num_columns:
            return False
        names = self.keys.column_names
        index = KeyIndex(self.keys.append_column("__found", pa.array(np.ones(len(self), bool))),
                         names)
        asked = pa.Table.from_pylist([dict(zip(names, key, strict=True))],
                                     schema=self.keys.schema)
        return index.lookup(asked).column("__found")[0].as_py() is True

    def key_tuples(self, where: slice | np.ndarray = slice(None)) -> list[tuple]:
        """The keys (as tuples) of these segments: a slice of positions, or a mask."""
        if isinstance(where, slice):
            start, stop, _ = where.indices(len(self))
            keys = self.keys.slice(start, max(stop - start, 0))
        else:
            keys = self.keys.filter(pa.array(where))
        return key_tuples(keys, keys.column_names)


def block_segments(block: pa.Table, segment_by: Sequence[str]) -> BlockSegments:
    """The segments of a key-sorted block."""
    return BlockSegments.of(block, segment_bounds(block, segment_by), segment_by)


def cut_into_blocks(
    table: pa.Table, segment_by: Sequence[str], max_block_rows: int
) -> tuple[list[pa.Table], list[BlockSegments]]:
    """Cut a key-sorted table into blocks of whole segments, at most ``max_block_rows``
    rows each (a segment larger than that becomes a block of its own); also every
    block's segments, found in the same pass."""
    return cut_at_bounds(table, segment_bounds(table, segment_by), max_block_rows, segment_by)


def cut_at_bounds(
    table: pa.Table, bounds: list[tuple[tuple, int, int]], max_block_rows: int,
    segment_by: Sequence[str],
) -> tuple[list[pa.Table], list[BlockSegments]]:
    """``cut_into_blocks`` with the table's segment bounds (key, start, end) known."""
    blocks: list[pa.Table] = []
    segments: list[BlockSegments] = []
    block_start = first = 0
    for position, (_, start, end) in enumerate(bounds):
        if end - block_start > max_block_rows and start > block_start:
            blocks.append(table.slice(block_start, start - block_start))
            segments.append(BlockSegments.of(table, bounds[first:position], segment_by))
            block_start, first = start, position
    if bounds:
        blocks.append(table.slice(block_start, table.num_rows - block_start))
        segments.append(BlockSegments.of(table, bounds[first:], segment_by))
    return blocks, segments


def split_into_blocks(
    table: pa.Table, segment_by: Sequence[str], max_block_rows: int
) -> list[pa.Table]:
    """The blocks of ``cut_into_blocks``."""
    return cut_into_blocks(table, segment_by, max_block_rows)[0]


def normalize_types(table: pa.Table) -> pa.Table:
    """Give every strategy the same Arrow types: UTC timestamps in microseconds, and
    plain strings/binary instead of their large variants."""
    fields = []
    for f in table.schema:
        t = f.type
        if pa.types.is_timestamp(t):
            t = pa.timestamp("us", tz="UTC" if t.tz else None)
        elif pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_large_binary(t):
            t = pa.binary()
        fields.append(pa.field(f.name, t, f.nullable))
    target = pa.schema(fields)
    return table if target.equals(table.schema) else table.cast(target)


class ReaderReport(NamedTuple):
    """A reader's last output: the schema of its tables, every block's segments, and the
    (key, rows) of the pieces it yielded after the blocks (segments that may have more
    rows in other readers' chunks, see ``_read_chunk_blocks``)."""

    schema: pa.Schema
    segments: list[BlockSegments]
    pieces: list[tuple[tuple, int]] = []


def _read_parquet_blocks(path: str, segment_by: list[str], max_block_rows: int):
    """Ray task body: one staged Parquet file -> segment-aligned blocks."""
    import pyarrow.parquet as pq

    table = sort_by_segment(normalize_types(pq.read_table(path)), segment_by)
    # Ray's streaming generators need a plain yield, not `yield from`.
    for output in _blocks_then_report(table, segment_by, max_block_rows):  # noqa: UP028
        yield output


def _read_chunk_blocks(chunk_ids: list[str], segment_by: list[str], max_block_rows: int):
    """Ray task body: Databricks Arrow chunks -> blocks, then pieces, then the report.

    Each chunk is a key-sorted run of one Spark partition, and every segment lies in one
    partition, so only a chunk's first and last segment can have rows in other chunks.
    The segments between them are whole: they are cut into blocks. The first and last
    are yielded as pieces, one per key (a reader may hold both ends of a straddling
    segment), for ``_assemble_pieces`` to join with the same key's pieces of other readers.
    """
    from pyspark.databricks.sql.chunk import readChunk  # Databricks Runtime only

    schema, inner, bounds, rows = None, [], [], 0
    edges: dict[tuple, list[pa.Table]] = {}
    for chunk_id in chunk_ids:
        table = normalize_types(readChunk(chunk_id))
        schema = table.schema if schema is None else schema
        found = segment_bounds(table, segment_by)
        for key, start, end in [found[0], found[-1]] if len(found) > 1 else found:
            edges.setdefault(key, []).append(table.slice(start, end - start))
        if len(found) > 2:
            first, last = found[1][1], found[-2][2]
            inner.append(table.slice(first, last - first))
            bounds += [(key, start - first + rows, end - first + rows)
                       for key, start, end in found[1:-1]]
            rows += last - first
    table = pa.concat_tables(inner) if inner else schema.empty_table()
    blocks, segments = cut_at_bounds(table, bounds, max_block_rows, segment_by)
    pieces = [(key, pa.concat_tables(parts)) for key, parts in edges.items()]
    # Ray's streaming generators need a plain yield, not `yield from`.
    for output in (*blocks, *(piece for _, piece in pieces)):  # noqa: UP028
        yield output
    yield ReaderReport(schema, segments, [(key, piece.num_rows) for key, piece in pieces])


def _assemble_pieces(pieces: list, segment_by: list[str], max_block_rows: int):
    """Ray task body: pieces of segments (references, those of one key next to each
    other) -> segment-aligned blocks, then the report."""
    import ray

    table = pa.concat_tables(ray.get(pieces))
    # Ray's streaming generators need a plain yield, not `yield from`.
    for output in _blocks_then_report(table, segment_by, max_block_rows):  # noqa: UP028
        yield output


def _blocks_then_report(table: pa.Table, segment_by: list[str], max_block_rows: int):
    """A reader's outputs: its blocks, then its report (so the engine knows what each
    block holds without reading it again)."""
    blocks, segments = cut_into_blocks(table, segment_by, max_block_rows)
    yield from blocks
    yield ReaderReport(table.schema, segments)


# --------------------------------------------------------------------------- transfer


def _gather_blocks(read_fn, items: list, segment_by: list[str], max_block_rows: int):
    """Run ``read_fn`` as a streaming Ray task per item; return the block references,
    the schema, every block's segments, and the pieces as (key, rows, reference)."""
    import ray

    reader = ray.remote(num_returns="streaming", max_retries=3)(read_fn)
    generators = [reader.remote(item, segment_by, max_block_rows) for item in items]
    outputs = [list(generator) for generator in generators]
    reports = ray.get([output[-1] for output in outputs])
    refs, segments, pieces = [], [], []
    for output, report in zip(outputs, reports, strict=True):
        blocks = len(report.segments)
        refs += output[:blocks]
        segments += report.segments
        pieces += [(key, rows, ref)
                   for (key, rows), ref in zip(report.pieces, output[blocks:-1], strict=True)]
    return refs, unify_schemas([r.schema for r in reports]), segments, pieces


def unify_schemas(schemas: list[pa.Schema]) -> pa.Schema:
    """One schema for the readers' tables (Spark gives them all the same columns; a
    partition without rows may lack the metadata the others carry)."""
    return pa.unify_schemas([s.remove_metadata() for s in schemas]) if schemas else pa.schema([])


def stage_as_parquet(df: DataFrame, staging_dir: str) -> list[str]:
    """Write the clustered DataFrame as one Parquet file per partition; list the files."""
    spark = df.sparkSession
    key = "spark.sql.parquet.outputTimestampType"
    previous = spark.conf.get(key, None)
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        df.write.mode("overwrite").parquet(staging_dir)
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)
    local_dir = staging_dir.removeprefix("file:").removeprefix("dbfs:")
    return sorted(
        os.path.join(local_dir, name)
        for name in os.listdir(local_dir)
        if name.endswith(".parquet") and not name.startswith(("_", "."))
    )


def default_staging_root() -> str:
    """Where Parquet staging goes when no ``staging_dir`` is given: a local temp dir.

    On Databricks a Unity Catalog volume path must be given instead (workers do not
    share the driver's local disk).
    """
    if in_databricks_runtime():
        raise DataError(
            "Parquet staging on Databricks needs a shared location: set data.staging_dir "
            "to a Unity Catalog volume path such as /Volumes/<catalog>/<schema>/<volume>/"
            "raybricks, or, on a fixed-size on-demand cluster, enable the chunk API "
            f"({CHUNK_API_CONF}=true)"
        )
    return tempfile.gettempdir()


def remove_staging(path: str) -> None:
    """Remove a staging directory and what is in it, if it is still there."""
    shutil.rmtree(path.removeprefix("file:").removeprefix("dbfs:"), ignore_errors=True)


def _blocks_via_parquet(df, segment_by, max_block_rows, staging_dir):
    """Stage as Parquet in a directory of its own under ``staging_dir`` (concurrent jobs
    never collide) and read it into blocks. The files stay for the dataset's life (it
    removes them on ``release``): removed on any failure here."""
    root = staging_dir or default_staging_root()
    path = os.path.join(root, f"{STAGING_PREFIX}{uuid.uuid4().hex}")
    try:
        files = stage_as_parquet(df, path)
        refs, schema, segments, _ = _gather_blocks(
            _read_parquet_blocks, files, segment_by, max_block_rows
        )
    except BaseException:
        remove_staging(path)
        raise
    return refs, schema, segments, path


def _blocks_via_chunks(df, segment_by, max_block_rows, chunk_bytes: int, readers: int):
    """Persist the key-sorted partitions as Arrow chunks, read them with ``readers`` Ray
    tasks, join the pieces of segments that straddle chunks; unpersist whatever happens."""
    import ray.exceptions
    from pyspark.databricks.sql.chunk import persistDataFrameAsChunks  # Databricks only

    chunks = persistDataFrameAsChunks(df, chunk_bytes)
    try:
        groups = split_evenly([max(chunk.byte_count, 1) for chunk in chunks], readers)
        items = [[chunks[i].id for i in group] for group in groups]
        refs, schema, segments, pieces = _gather_blocks(
            _read_chunk_blocks, items, segment_by, max_block_rows
        )
        if pieces:
            more_refs, more_schema, more_segments, _ = _gather_blocks(
                _assemble_pieces, pack_pieces(pieces, max_block_rows), segment_by,
                max_block_rows,
            )
            refs, segments = refs + more_refs, segments + more_segments
            schema = unify_schemas([schema, more_schema])
    except ray.exceptions.RayError as exc:
        raise DataError(
            f"reading Spark's Arrow chunks into Ray failed ({first_line(exc)}); chunks live "
            "on the executors and are lost with one (autoscaling, spot instances): use "
            "data.strategy='parquet' there"
        ) from exc
    finally:
        _unpersist(chunks)
    log.info("%d chunks -> %d blocks (%d pieces of straddling segments joined)",
             len(chunks), len(refs), len(pieces))
    check_segments_whole(segments)
    return refs, schema, segments


def _unpersist(chunks: list) -> None:
    """Free the executors' copies of the chunks (a failure is logged, not raised)."""
    from pyspark.databricks.sql.chunk import unpersistChunks  # Databricks only

    try:
        unpersistChunks([chunk.id for chunk in chunks])
    except Exception as exc:  # noqa: BLE001 - the blocks are in Ray; do not hide the result
        log.warning("unpersisting %d Spark chunks failed: %s", len(chunks), exc)


def split_evenly(sizes: Sequence[int], parts: int) -> list[list[int]]:
    """Indices of ``sizes`` in at most ``parts`` consecutive runs of about equal total."""
    total = sum(sizes)
    groups: list[list[int]] = []
    current: list[int] = []
    done = 0
    for index, size in enumerate(sizes):
        current.append(index)
        done += size
        if done * parts >= total * (len(groups) + 1) and len(groups) < parts - 1:
            groups.append(current)
            current = []
    return [*groups, current] if current else groups


def pack_pieces(pieces: list[tuple[tuple, int, object]], max_block_rows: int) -> list[list]:
    """The pieces' references grouped by key into tasks of about ``max_block_rows`` rows:
    all pieces of a key in one task, next to each other (so the key is one run of rows)."""
    by_key: dict[tuple, list] = {}
    rows: dict[tuple, int] = {}
    for key, count, ref in pieces:
        by_key.setdefault(key, []).append(ref)
        rows[key] = rows.get(key, 0) + count
    tasks: list[list] = []
    current: list = []
    size = 0
    for key, refs in by_key.items():
        if current and size + rows[key] > max_block_rows:
            tasks.append(current)
            current, size = [], 0
        current += refs
        size += rows[key]
    return [*tasks, current] if current else tasks


def check_segments_whole(segments: list[BlockSegments]) -> None:
    """Raise if a segment is listed in two blocks (chunks that were not key-sorted runs
    of one partition each would cause it)."""
    keys = pa.concat_tables([block.keys for block in segments], promote_options="permissive")
    if keys.group_by(keys.column_names).aggregate([]).num_rows == keys.num_rows:
        return
    seen: set[tuple] = set()
    for key in key_tuples(keys, keys.column_names):  # which one, for the message
        if key in seen:
            raise DataError(
                f"segment {key} arrived in two blocks: the Spark chunks were not "
                "key-sorted runs of one partition each; use data.strategy='parquet'"
            )
        seen.add(key)


def collect_arrow(df: DataFrame) -> pa.Table:
    """The DataFrame as one Arrow table on the driver: ``toArrow`` (Spark 4.0+), else
    the Arrow batches ``toPandas`` collects (Spark 3.5)."""
    to_arrow = getattr(df, "toArrow", None)
    if to_arrow is not None:
        return to_arrow()
    batches = df._collect_as_arrow()
    if batches:
        return pa.Table.from_batches(batches)
    return arrow_schema(df.schema).empty_table()


def _blocks_via_arrow(df, segment_by, max_block_rows):
    """Small tables: collect as Arrow, sort and cut on the driver (no Spark shuffle)."""
    import ray

    table = sort_by_segment(normalize_types(collect_arrow(df)), segment_by)
    blocks, segments = cut_into_blocks(table, segment_by, max_block_rows)
    return [ray.put(b) for b in blocks], table.schema.remove_metadata(), segments


def arrow_size_estimate(schema: pa.Schema, num_rows: int) -> int:
    """Bytes the table would take in Arrow: fixed-width columns at their width (booleans a
    byte), others (strings, binary, nested) at ``VARIABLE_WIDTH_BYTES`` a value."""
    width = 0
    for column in schema:
        try:
            width += max(column.type.bit_width // 8, 1)
        except ValueError:  # not fixed width
            width += VARIABLE_WIDTH_BYTES
    return width * num_rows


def choose_strategy(
    requested: Strategy, spark: SparkSession, num_rows: int, arrow_max_rows: int,
    arrow_bytes: int = 0,
) -> str:
    """Resolve ``auto`` and refuse a strategy that cannot work here. ``arrow_bytes``: the
    table's estimated size in Arrow (``auto`` collects it only up to
    ``ARROW_AUTO_MAX_BYTES``).

    ``auto`` takes ``chunks`` only on a fixed-size on-demand cluster: chunks live on the
    executors, and one that goes away takes its chunks with it. ``chunks`` asked for
    explicitly on another cluster is used, with a warning.
    """
    if requested == "chunks":
        problem = chunk_api_problem(spark)
        if problem:
            raise DataError(
                f"strategy='chunks' cannot work here: {problem}. It needs Databricks Runtime "
                f"ML 15+ with {CHUNK_API_CONF}=true on a dedicated access mode cluster: use "
                "'parquet' or 'auto'"
            )
        risk = unstable_workers(spark)
        if risk:
            log.warning(
                "strategy='chunks' although %s: chunks are lost with their executor, and "
                "the transfer then fails; 'parquet' does not depend on the executors", risk
            )
    if requested == "arrow" and num_rows > arrow_max_rows:
        raise DataError(
            f"strategy='arrow' collects the table on the driver and is limited to "
            f"{arrow_max_rows:,} rows (this one has {num_rows:,}): use 'parquet' or 'auto', "
            "or raise arrow_max_rows"
        )
    if requested != "auto":
        return requested
    if chunk_api_available(spark):
        risk = unstable_workers(spark)
        if risk is None:
            return "chunks"
        log.info("not using Spark's chunk API: %s", risk)
    small = num_rows <= arrow_max_rows and arrow_bytes <= ARROW_AUTO_MAX_BYTES
    return "arrow" if small else "parquet"


def to_ray_dataset(
    source: DataFrame | str,
    segment_by: Sequence[str],
    columns: Sequence[str] | None = None,
    where: str | None = None,
    *,
    strategy: Strategy = "auto",
    max_block_rows: int = DEFAULT_MAX_BLOCK_ROWS,
    min_blocks: int | None = None,
    arrow_max_rows: int = DEFAULT_ARROW_MAX_ROWS,
    staging_dir: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    spark: SparkSession | None = None,
    num_rows: int | None = None,
) -> SegmentedDataset:
    """Turn a Spark DataFrame or table into a Ray Dataset of whole-segment blocks.

    ``columns``: the columns to keep besides ``segment_by`` (default: all). ``where``: a
    Spark SQL predicate applied before anything moves. ``min_blocks``: at least this many
    blocks when the segments allow it (default: four per Ray CPU, so uneven blocks still
    keep every CPU busy to the end). ``chunk_bytes``: the largest Arrow chunk of the
    ``chunks`` strategy. ``num_rows``: the rows after ``where``, when the caller has
    counted them (one Spark job fewer). Ray must be initialised (see
    ``raybricks.cluster``).
    """
    import ray

    if max_block_rows < 1:
        raise DataError(f"max_block_rows={max_block_rows} must be at least 1")
    if chunk_bytes < 1:
        raise DataError(f"chunk_bytes={chunk_bytes} must be at least 1")
    if not ray.is_initialized():
        raise DataError(
            "Ray is not running: start it first with raybricks.cluster.ray_cluster() "
            "(or start_ray())"
        )
    df = read_source(source, spark)
    df = select_and_filter(df, segment_by, columns, where)
    segment_by = [df.columns[i] for i in range(len(list(segment_by)))]
    num_rows = df.count() if num_rows is None else num_rows
    if num_rows == 0:
        raise no_rows(where)
    chosen = choose_strategy(strategy, df.sparkSession, num_rows, arrow_max_rows,
                             arrow_size_estimate(arrow_schema(df.schema), num_rows))
    ray_cpus = max(int(ray.cluster_resources().get("CPU", 1)), 1)
    if min_blocks is None:
        min_blocks = BLOCKS_PER_CPU * ray_cpus
    blocks = max(math.ceil(num_rows / max_block_rows), min_blocks)
    staging = None
    # blocks no larger than their share of the table, so every Ray CPU gets work
    max_block_rows = min(max_block_rows, math.ceil(num_rows / blocks))
    if chosen == "arrow":
        log.info("moving %d rows to Ray via arrow", num_rows)
        refs, schema, segments = _blocks_via_arrow(df, segment_by, max_block_rows)
    else:
        # a whole number of waves of readers, one per Ray CPU (no CPU idles in the last)
        waves = math.ceil(num_rows / ROWS_PER_PARTITION / ray_cpus)
        partitions = min(blocks, ray_cpus * waves)
        clustered = df.repartition(partitions, *segment_by)
        log.info("moving %d rows to Ray via %s in %d partitions", num_rows, chosen, partitions)
        if chosen == "parquet":
            refs, schema, segments, staging = _blocks_via_parquet(
                clustered, segment_by, max_block_rows, staging_dir
            )
        else:  # chunks: Spark sorts, so a segment can only straddle a chunk's ends
            refs, schema, segments = _blocks_via_chunks(
                clustered.sortWithinPartitions(*segment_by), segment_by, max_block_rows,
                chunk_bytes, partitions,
            )
    return SegmentedDataset(refs, segment_by, chosen, num_rows, schema, segments,
                            staging=staging)


def no_rows(where: str | None) -> DataError:
    """The error for a source (after ``where``) without rows."""
    what = f"the filter where={where!r} matched no rows" if where else "the table is empty"
    return DataError(f"nothing to train on: {what}; check the source and the predicate")

