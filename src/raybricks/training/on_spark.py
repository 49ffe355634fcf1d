"""The Spark executor: the packed tasks run inside Spark's own tasks, no Ray.

Spark hash-partitions the source by the segment key (every segment lands in exactly one
partition) and sorts each partition by it; one ``mapInArrow`` task per partition reads
its rows batch by batch, cuts them into runs of whole segments of about ``RUN_BYTES``
(runs sized by bytes, so a task's memory stays bounded whatever the segments: Python
UDF memory is limited on serverless), trains each run with the same body Ray's packed
tasks run (``packed.train_block``: candidates, search, selection, baseline, global
model, profiles). Where the tasks reach the run directory (a local master, or a path
every executor sees, such as a Unity Catalog Volume: ``reaches``), each task writes its
runs' parts into the run's staging folder and yields a row per run without bytes, and
the driver moves each part into the run as its row arrives; otherwise it yields
each run's ``Outcome`` as one row, which the driver writes. The driver reads those rows
as Spark's tasks finish (Spark Connect streams them; on a classic session, the Arrow
stream ``collect`` uses, read batch by batch), so the registry stage reads the run as
it reads a Ray run. (A driver takes at most ``spark.driver.maxResultSize`` of task
results in a job, 1 GB by default: a million series' models pass it.)

Faults: with ``training.segment_timeout_s``, each run trains in a child process of the
task (a fork), segment by segment, watched by the task: a segment past the limit is
stopped with its process and ends ``failed`` ("timed out ..."), a segment whose process
dies (killed, out of memory) ends ``failed`` with how it ended, and the rest of the run
goes on in a new child. Without a limit, a task whose Python worker dies is retried by
Spark (``spark.task.maxFailures``); if the job fails all the same, the segments without
a result are trained again in that isolated way, so only the segment that keeps killing
its process ends ``failed``.

What only Ray does: data-parallel training of large segments (Ray Train: here each
trains in one task with its library's threads), spreading few segments' settings over
tasks (here they are packed), GPU candidates.
"""

from __future__ import annotations

import functools
import logging
import math
import shutil
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
from raybricks.errors import SetupError, first_line
from raybricks.results import Outcome, commit_part, read_parts, write_part
from raybricks.sources import join_on_segments
from raybricks.training.blocks import SparkBlocks
from raybricks.training.packed import limit_threads, train_block
from raybricks.training.plan import Plan
from raybricks.training.tasks import Task
from raybricks.workers import workers_import_raybricks

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
    """The cores Spark's tasks run on (``session.spark_cores``), else (a Spark Connect
    session that shows none) the shuffle partitions (200 by default)."""
    from raybricks.session import spark_cores

    cores = spark_cores(spark) or int(spark.conf.get("spark.sql.shuffle.partitions", "200"))
    return max(int(cores), 1)


def spark_segments(df: DataFrame, segment_by: list[str], num_rows: int,
                   spark: SparkSession) -> SparkSegments:
    """The source laid out for the Spark executor: ``PARTITIONS_PER_CORE`` partitions per
    core, more when the source is large (``PARTITION_BYTES`` each), never more than rows."""
    size = arrow_size_estimate(arrow_schema(df.schema), num_rows)
    partitions = max(PARTITIONS_PER_CORE * session_cores(spark),
                     math.ceil(size / PARTITION_BYTES))
    return SparkSegments(df, list(segment_by), num_rows, max(min(partitions, num_rows), 1))


def user_modules(plan: Plan) -> dict[str, Path]:
    """The user's modules the candidates name by import path (functions, kinds,
    estimators), outside installed packages, each with the folder the driver imports it
    from."""
    import importlib
    import sys

    found = {}
    for candidate in plan.candidates:
        for path in (candidate.function, candidate.estimator, candidate.kind):
            if not path or "." not in path:
                continue
            module_name = path.rsplit(".", 1)[0]
            module = sys.modules.get(module_name)
            if module is None:
                try:
                    module = importlib.import_module(module_name)
                except ImportError:
                    continue
            file = getattr(module, "__file__", None)
            if not file or "site-packages" in file or "dist-packages" in file:
                continue
            found[module_name] = Path(file).resolve().parents[module_name.count(".")]
    return found


def user_code_paths(plan: Plan) -> list[str]:
    """Where the driver imports the user's code from (``user_modules``' folders, and the
    working directory): what Ray puts on its workers' path, which Spark's Python workers
    (in executors of their own) may not have."""
    import os

    return list(dict.fromkeys([os.getcwd(), *map(str, user_modules(plan).values())]))


def on_path(paths: list[str]) -> None:
    """Put the driver's code folders that this machine has first on this worker's path,
    as they are on the driver's (an installed package of the same name, such as a
    library's stray top-level ``tests``, must not shadow the user's)."""
    import os
    import sys

    for path in reversed(paths):
        if os.path.isdir(path):
            if path in sys.path:
                sys.path.remove(path)
            sys.path.insert(0, path)


def train_partition(batches: Iterator[pa.RecordBatch], task: Task, plan: Plan,
                    run_bytes: int, isolated: Isolation | None = None,
                    code_paths: tuple[str, ...] = (), staged: str | None = None
                    ) -> Iterator[pa.RecordBatch]:
    """A Spark task's body (``mapInArrow``): the partition's rows, sorted by the segment
    key, cut into runs of whole segments of about ``run_bytes``, each trained by
    ``train_block`` (``isolated``: in watched child processes, ``train_isolated``); one
    row per run: its part name, segments and Outcome bytes. ``code_paths``: the driver's
    folders of the user's code (``user_code_paths``). ``staged``: the job's folder in the
    run directory, where this task can write it (``reaches``): the task writes its runs'
    parts there and its rows carry no bytes; the driver moves a part into the run when
    its row arrives (``commit_part``), so a failed or cancelled attempt's parts never
    count."""
    from pyspark import TaskContext

    on_path(list(code_paths))

    context = TaskContext.get()
    prefix = (f"part-spark-{context.partitionId():06d}-{context.attemptNumber()}-"
              f"{uuid.uuid4().hex[:6]}")
    pending: list[pa.RecordBatch] = []
    size = number = 0

    def run(table: pa.Table) -> pa.RecordBatch:
        nonlocal number
        outcome = (train_block(table, task, plan) if isolated is None
                   else train_isolated(table, task, plan, isolated))
        number += 1
        name = f"{prefix}-{number:05d}"
        if staged is not None:
            outcome.write(Path(staged), name)
            outcome = Outcome(outcome.segments, b"", b"")  # written: nothing to ship
        return pa.RecordBatch.from_pydict(
            {"name": [name], "segments": [outcome.segments],
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


@dataclass(frozen=True)
class Isolation:
    """How ``train_isolated`` watches a run: each segment's time limit (None: none, only
    its process's end is watched) and the setting it comes from, for the reason."""

    limit_s: float | None


def train_isolated(table: pa.Table, task: Task, plan: Plan, isolation: Isolation
                   ) -> Outcome:
    """The run's segments trained one by one in a forked child that says which segment
    it starts and sends each one's Outcome back; a segment past the time limit (its
    child is killed) or whose child dies ends ``failed``, and a new child goes on with
    the next segment."""
    import os
    import pickle
    import select
    import signal
    import time

    from raybricks.data import segment_bounds
    from raybricks.results import FAILED
    from raybricks.training.selection import SegmentResult, results_table

    limit_threads(task, plan)  # imports made once, here: a child's clock counts fits only
    bounds = segment_bounds(table, plan.segment_by)
    outcomes: list[Outcome] = []
    failed: list[SegmentResult] = []
    position = 0
    while position < len(bounds):
        reading, writing = os.pipe()
        child = os.fork()
        if child == 0:  # the child: train from ``position`` on, say each step
            os.close(reading)
            try:
                with os.fdopen(writing, "wb") as out:
                    for index in range(position, len(bounds)):
                        _, start, end = bounds[index]
                        pickle.dump(("start", index), out)
                        out.flush()
                        done = train_block(table.slice(start, end - start), task, plan)
                        pickle.dump(("done", index, done), out)
                        out.flush()
            finally:
                os._exit(0)
        os.close(writing)
        current, since = None, time.monotonic()
        with os.fdopen(reading, "rb") as found:
            while True:
                wait = (None if current is None or isolation.limit_s is None
                        else max(isolation.limit_s - (time.monotonic() - since), 0))
                ready, _, _ = select.select([found], [], [], wait)
                if not ready:  # past the limit: stop the child, fail the segment
                    os.kill(child, signal.SIGKILL)
                    os.waitpid(child, 0)
                    failed.append(SegmentResult(bounds[current][0], status=FAILED, reason=(
                        f"timed out: still fitting after {time.monotonic() - since:.1f}s "
                        f"(training.segment_timeout_s={isolation.limit_s:g}); its process "
                        "was stopped")))
                    position = current + 1
                    break
                try:
                    message = pickle.load(found)
                except EOFError:  # the child ended: done, or died in ``current``
                    _, status = os.waitpid(child, 0)
                    if current is None:
                        position = len(bounds)
                    else:
                        failed.append(SegmentResult(bounds[current][0], status=FAILED,
                                                    reason=ended(status)))
                        position = current + 1
                    break
                if message[0] == "start":
                    current, since = message[1], time.monotonic()
                else:
                    outcomes.append(message[2])
                    current = None
    if failed:
        outcomes.append(Outcome.of(results_table(failed, plan), pa.table({})))
    return merged(outcomes)


def ended(status: int) -> str:
    """Why a segment whose process died ends ``failed`` (``os.waitpid``'s status)."""
    import os
    import signal

    if os.WIFSIGNALED(status):
        how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        how = f"exit code {os.WEXITSTATUS(status)}"
    return (f"worker lost: its process ended while fitting ({how}; out of memory, or a "
            "crash in native code)")


def merged(outcomes: list[Outcome]) -> Outcome:
    """Several Outcomes as one (their tables concatenated)."""
    import io

    import pyarrow.parquet as pq

    def tables(name: str) -> list[pa.Table]:
        return [pq.read_table(io.BytesIO(getattr(o, name))) for o in outcomes
                if getattr(o, name)]

    results, models = tables("results"), tables("models")
    return Outcome.of(
        pa.concat_tables(results, promote_options="permissive") if results else pa.table({}),
        pa.concat_tables(models, promote_options="permissive") if models else pa.table({}))


#: The run directory's folder where tasks write parts until the driver takes them.
STAGED = "staged"

#: What a job whose tasks sent the driver too many bytes failed of.
RESULT_SIZE = ("the tasks' trained models passed spark.driver.maxResultSize on their way "
               "to the driver, which writes them into training.output_dir")

OUTCOME_SCHEMA = pa.schema([("name", pa.string()), ("segments", pa.int64()),
                            ("results", pa.binary()), ("models", pa.binary())])


def train_on_spark(segments: SparkSegments, task: Task, plan: Plan, config: JobConfig,
                   run_dir: Path, previous: pa.Table, total: int | None,
                   progress: bool | None) -> None:
    """Train every segment of ``segments`` without a result in ``previous`` (a resumed
    run's) in Spark's tasks, writing each run's Outcome into ``run_dir`` as it arrives.
    A job that fails (a task lost beyond Spark's retries) is run again for the segments
    without a result, each run in watched child processes."""
    log.info("training %s segments (%d done before) in %d Spark partitions",
             "the" if total is None else total, previous.num_rows, segments.partitions)
    limit = config.training.segment_timeout_s
    show = config.training.progress if progress is None else progress
    with console.progress_bar(total, "training", "segment", show) as bar:
        try:
            _run(segments, task, plan, run_dir, previous, bar,
                 Isolation(limit) if limit else None)
        except SetupError:
            raise
        except Exception as exc:  # noqa: BLE001 - Spark's error: the job failed
            if limit:
                raise
            first = first_line(exc)
            if "maxResultSize" in str(exc):
                first = (f"{RESULT_SIZE}: set training.output_dir to a path Spark's "
                         "executors reach (a Unity Catalog Volume), where the tasks write "
                         "their own parts, or raise spark.driver.maxResultSize")
            log.warning("a Spark task was lost beyond its retries (%s: %s): training the "
                        "segments without a result again, each run watched",
                        type(exc).__name__, first[:300])
            done = read_parts(run_dir / "results", plan.segment_by)
            _run(segments, task, plan, run_dir, done, bar, Isolation(None))


def _run(segments: SparkSegments, task: Task, plan: Plan, run_dir: Path,
         previous: pa.Table, bar: Any, isolated: Isolation | None) -> None:
    """One Spark job over the segments without a result in ``previous``."""
    df = segments.df
    keys = plan.segment_by
    if previous.num_rows:  # a resumed run: only the segments without a result
        done = df.sparkSession.createDataFrame(previous.select(keys).to_pandas(),
                                               schema=df.select(*keys).schema)
        df = join_on_segments(df, done, keys, "left_anti")
    order = [*keys, *([plan.time_column] if plan.time_column else [])]
    laid_out = df.repartition(segments.partitions, *keys).sortWithinPartitions(*order)
    staged = run_dir / STAGED / uuid.uuid4().hex[:8]
    with workers_import_raybricks():
        reached = reaches(df.sparkSession, run_dir)
        body = functools.partial(
            train_partition, task=task, plan=plan, run_bytes=RUN_BYTES, isolated=isolated,
            code_paths=tuple(user_code_paths(plan)), staged=str(staged) if reached else None)
        try:
            for row in outcome_rows(laid_out.mapInArrow(body, OUTCOMES)):
                Outcome(row["segments"], row["results"], row["models"]).write(run_dir,
                                                                              row["name"])
                if reached:
                    commit_part(staged, run_dir, row["name"])
                bar.update(row["segments"])
        finally:
            shutil.rmtree(staged, ignore_errors=True)  # what no row vouched for


def reaches(spark: SparkSession, run_dir: Path) -> bool:
    """Whether Spark's tasks can write the driver's ``run_dir`` (a local master, or a
    shared path such as a Unity Catalog Volume: one task finds a file the driver wrote
    and writes one beside it, as parts are written), so they write their parts there
    themselves: what they send the driver stays small (a driver collects at most
    ``spark.driver.maxResultSize`` of task results in a job: 1 GB by default, which a
    million series' models pass)."""
    try:
        if spark.conf.get("spark.master", "").startswith("local["):
            return True
    except Exception:  # noqa: BLE001 - a session that does not say (Spark Connect): look
        pass
    marker = run_dir / f".reach-{uuid.uuid4().hex[:8]}"
    answer = marker.with_name(f"{marker.name}-seen.parquet")
    run_dir.mkdir(parents=True, exist_ok=True)
    marker.touch()
    try:
        spark.range(1, numPartitions=1).mapInArrow(
            functools.partial(reach_probe, marker=str(marker)), "seen boolean").collect()
        return answer.exists()
    except Exception:  # noqa: BLE001 - not reached: the driver writes the parts
        return False
    finally:
        marker.unlink(missing_ok=True)
        answer.unlink(missing_ok=True)


def reach_probe(batches: Iterator[pa.RecordBatch], marker: str) -> Iterator[pa.RecordBatch]:
    """``reaches``' task: where it sees ``marker``, it writes ``<marker>-seen.parquet``
    with ``write_part``, as parts are written."""
    for _ in batches:
        pass
    found = Path(marker)
    if found.exists():
        write_part(found.parent, f"{found.name}-seen", b"")
    yield pa.RecordBatch.from_pydict({"seen": [found.exists()]})


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
