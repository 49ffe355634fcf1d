"""The Spark executor: the packed tasks run inside Spark's own tasks, no Ray.

Spark hash-partitions the source by the segment key (every segment lands in exactly one
partition) and sorts each partition by it; one ``mapInArrow`` task per partition reads
its rows batch by batch, cuts them into runs of whole segments of about ``RUN_BYTES``
(runs sized by bytes, so a task's memory stays bounded whatever the segments: Python
UDF memory is limited on serverless), trains each run with the same body Ray's packed
tasks run (``packed.train_block``: candidates, search, selection, baseline, global
model, profiles) and yields its ``Outcome`` as one row. The driver reads those rows as
Spark's tasks finish (Spark Connect streams them; on a classic session, the Arrow
stream ``collect`` uses, read batch by batch) and writes each as parts of the run
directory, so the registry stage reads the run as it reads a Ray run.

What only Ray does: data-parallel training of large segments (Ray Train: here each
trains in one task with its library's threads), spreading few segments' settings over
tasks (here they are packed), GPU candidates.
"""

from __future__ import annotations

import functools
import logging
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from raybricks import console
from raybricks.compat import arrow_schema
from raybricks.config import JobConfig
from raybricks.data import arrow_size_estimate, segment_starts
from raybricks.results import Outcome
from raybricks.training.blocks import SparkBlocks
from raybricks.training.packed import train_block
from raybricks.training.plan import Plan
from raybricks.training.tasks import Task

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: A run's rows in Arrow, about: what one ``train_block`` call holds at a time.
RUN_BYTES = 16 * 1024 * 1024
#: Partitions per core of the session (uneven segments balance over them) ...
PARTITIONS_PER_CORE = 4
#: ... and at most this many bytes of the source each (in Arrow, estimated).
PARTITION_BYTES = 128 * 1024 * 1024
#: What each task yields per run.
OUTCOMES = "name string, segments long, results binary, models binary"


@dataclass
class SparkSegments:
    """The source, as the Spark executor trains it: its DataFrame (the columns training
    reads), the segment key, its Arrow schema and rows, and the partitions it is cut
    into (``partitions_for``)."""

    df: DataFrame
    segment_by: list[str]
    num_rows: int
    partitions: int

    @property
    def schema(self) -> pa.Schema:
        return arrow_schema(self.df.schema)

    def blocks(self) -> SparkBlocks:
        return SparkBlocks.of(self.df, self.segment_by, self.partitions)

    def release(self) -> None:
        """Nothing to release: Spark keeps no copy of the source for the executor."""


def session_cores(spark: SparkSession) -> int:
    """The cores Spark's tasks run on: the SparkContext's default parallelism; on Spark
    Connect (no SparkContext) ``spark.default.parallelism`` where set, the N of a
    ``local[N]`` master, else the shuffle partitions (200 by default)."""
    from raybricks.session import is_spark_connect

    if not is_spark_connect(spark):
        return max(int(spark.sparkContext.defaultParallelism), 1)
    for key in ("spark.default.parallelism", "spark.master"):
        try:
            value = spark.conf.get(key, None)
        except Exception:  # noqa: BLE001 - a conf the server does not expose
            value = None
        if value and key == "spark.master" and value.startswith("local["):
            value = value[len("local["):].split(",")[0].rstrip("]")
            return max(int(value), 1) if value.isdigit() else 1
        if value and value.isdigit():
            return max(int(value), 1)
    return max(int(spark.conf.get("spark.sql.shuffle.partitions", "200")), 1)


def spark_segments(df: DataFrame, segment_by: list[str], num_rows: int,
                   spark: SparkSession) -> SparkSegments:
    """The source laid out for the Spark executor: ``PARTITIONS_PER_CORE`` partitions per
    core, more when the source is large (``PARTITION_BYTES`` each), never more than rows."""
    size = arrow_size_estimate(arrow_schema(df.schema), num_rows)
    partitions = max(PARTITIONS_PER_CORE * session_cores(spark),
                     math.ceil(size / PARTITION_BYTES))
    return SparkSegments(df, list(segment_by), num_rows, max(min(partitions, num_rows), 1))


def train_partition(batches: Iterator[pa.RecordBatch], task: Task, plan: Plan,
                    run_bytes: int) -> Iterator[pa.RecordBatch]:
    """A Spark task's body (``mapInArrow``): the partition's rows, sorted by the segment
    key, cut into runs of whole segments of about ``run_bytes``, each trained by
    ``train_block``; one row per run: its part name, segments and Outcome bytes."""
    from pyspark import TaskContext

    context = TaskContext.get()
    prefix = (f"part-spark-{context.partitionId():06d}-{context.attemptNumber()}-"
              f"{uuid.uuid4().hex[:6]}")
    pending: list[pa.RecordBatch] = []
    size = number = 0

    def run(table: pa.Table) -> pa.RecordBatch:
        nonlocal number
        outcome = train_block(table, task, plan)
        number += 1
        return pa.RecordBatch.from_pydict(
            {"name": [f"{prefix}-{number:05d}"], "segments": [outcome.segments],
             "results": [outcome.results], "models": [outcome.models]},
            schema=OUTCOME_SCHEMA)

    for batch in batches:
        if not batch.num_rows:
            continue
        pending.append(batch)
        size += batch.nbytes
        if size < run_bytes:
            continue
        table = pa.Table.from_batches(pending)
        cut = segment_starts(table, plan.segment_by)[-1]  # the last segment may go on
        if cut == 0:  # one segment so far: it is the run, whatever its size
            continue
        yield run(table.slice(0, cut))
        rest = table.slice(cut)
        pending, size = rest.to_batches(), rest.nbytes
    if pending:
        yield run(pa.Table.from_batches(pending))


OUTCOME_SCHEMA = pa.schema([("name", pa.string()), ("segments", pa.int64()),
                            ("results", pa.binary()), ("models", pa.binary())])


def train_on_spark(segments: SparkSegments, task: Task, plan: Plan, config: JobConfig,
                   run_dir: Path, previous: pa.Table, total: int | None,
                   progress: bool | None) -> None:
    """Train every segment of ``segments`` without a result in ``previous`` (a resumed
    run's) in Spark's tasks, writing each run's Outcome into ``run_dir`` as it arrives."""
    df = segments.df
    keys = plan.segment_by
    if previous.num_rows:  # a resumed run: only the segments without a result
        spark = df.sparkSession
        done = spark.createDataFrame(previous.select(keys).to_pandas())
        on = functools.reduce(lambda a, b: a & b,
                              [df[name].eqNullSafe(done[name]) for name in keys])
        df = df.join(done, on, "left_anti")
    order = [*keys, *([plan.time_column] if plan.time_column else [])]
    laid_out = df.repartition(segments.partitions, *keys).sortWithinPartitions(*order)
    body = functools.partial(train_partition, task=task, plan=plan, run_bytes=RUN_BYTES)
    show = config.training.progress if progress is None else progress
    with console.progress_bar(total, "training", "segment", show) as bar:
        for row in outcome_rows(laid_out.mapInArrow(body, OUTCOMES)):
            Outcome(row["segments"], row["results"], row["models"]).write(run_dir,
                                                                          row["name"])
            bar.update(row["segments"])


def outcome_rows(df: DataFrame) -> Iterator[dict[str, Any]]:
    """The rows of ``df`` as its tasks finish, without holding them all: Spark Connect's
    ``toLocalIterator`` (one job, streamed); on a classic session the Arrow stream that
    ``collect`` reads (``collectAsArrowToPython``: one job, batches as tasks end; a
    classic ``toLocalIterator`` would run one job per partition, one after another)."""
    from raybricks.session import is_spark_connect

    if is_spark_connect(df.sparkSession):
        for row in df.toLocalIterator():
            yield row.asDict()
        return
    for batch in classic_batches(df):
        yield from batch.to_pylist()


def classic_batches(df: DataFrame) -> Iterator[pa.RecordBatch]:
    """A classic session's Arrow batches of ``df`` in the order its tasks finish."""
    from pyspark.serializers import UTF8Deserializer, read_int
    from pyspark.sql.pandas.serializers import ArrowStreamSerializer
    from pyspark.traceback_utils import SCCallSiteSync

    try:  # pyspark 4
        from pyspark.util import _load_from_socket
    except ImportError:  # pyspark 3.5
        from pyspark.rdd import _load_from_socket

    class Streamed(ArrowStreamSerializer):
        """The batches as the JVM sends them; then the order it would put them in
        (unused here) or its error."""

        def load_stream(self, stream):
            yield from super().load_stream(stream)
            count = read_int(stream)
            if count == -1:
                raise RuntimeError(UTF8Deserializer().loads(stream))
            for _ in range(count):
                read_int(stream)

    with SCCallSiteSync(df._sc):
        port, secret, server = df._jdf.collectAsArrowToPython()
    try:
        found = _load_from_socket((port, secret), Streamed())
        if hasattr(found, "__enter__"):  # pyspark 4: a context manager
            with found as stream:
                yield from stream
        else:
            yield from found
    finally:
        from pyspark.errors.exceptions.captured import unwrap_spark_exception

        with unwrap_spark_exception():
            server.getResult()  # the job's own error, if it failed
