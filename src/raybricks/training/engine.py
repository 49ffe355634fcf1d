"""The execution engine: many segments packed into each Ray task, results streamed back.

``train_segments`` cuts the segments of the segment-aligned blocks into runs of guided
sizes (large first, shrinking towards the end of the job; never across blocks); one Ray
task trains each run and returns its result rows and serialized models already encoded
as Parquet (an ``Outcome``). The driver writes those bytes as parts under the run
directory as they arrive, so its memory holds only result rows, an interrupted run keeps
what finished, and ``resume`` retrains only the segments that have no result yet.

When there are fewer segments than CPUs, the engine spreads the work of each segment
(candidates x settings) over tasks instead, with the segment's data in the object store
once. Segments above ``training.large_segment_rows`` are trained data-parallel with
Ray Train (see ``raybricks.training.tabular.large``).

Faults: a task whose worker dies is retried by Ray (``training.max_retries``); a run
whose task is lost beyond that is retrained one segment per task, so only a segment that
keeps killing its worker ends ``failed``. A task lost because its block is gone (the Ray
node that held it went away with its Spark executor, and Ray could not rebuild it) fails
no segment: the others train, then ``DataLostError`` says how to resume the run, which
reads the source again and trains only the segments without a result.
With ``training.segment_timeout_s``, a watchdog thread in each task stops the worker
when one segment's fit runs past the limit, after noting that segment on a small actor:
the retried task skips it and the segment ends ``failed`` ("timed out ..."), whatever the
fit was stuck in (Python or native code).
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from raybricks import console
from raybricks.config import JobConfig
from raybricks.data import BlockSegments, SegmentedDataset
from raybricks.errors import ConfigError, DataLostError, first_line
from raybricks.results import (
    FAILED,
    SKIPPED,
    TRAINED,
    Outcome,
    TrainingResult,
    part_files,
    read_parts,
)
from raybricks.segmented_model import KeyIndex
from raybricks.training.blocks import Blocks, RayBlocks
from raybricks.training.on_spark import SparkSegments, train_on_spark, user_modules
from raybricks.training.packed import (
    TimeoutBoard,
    Watch,
    evaluate_block,
    is_large,
    train_block,
)
from raybricks.training.plan import (
    GivenGlobal,
    Plan,
    needs_gpus,
    replace_plan,
    stable_seed,
)
from raybricks.training.remote import remote
from raybricks.training.search import spread_settings
from raybricks.training.selection import (
    SegmentResult,
    keyed_members,
    members_table,
    results_table,
)
from raybricks.training.tasks import Task, task_of
from raybricks.workers import ship_to_workers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    """What one packed task trains: the segments at positions ``first``..``stop`` of
    block ``block``, rows ``start``..``end`` of it; ``only``: just these keys of them
    (None: all of them)."""

    block: int
    start: int
    end: int
    first: int
    stop: int
    only: frozenset | None = None

    def keys(self, bounds: list[BlockSegments]) -> list[tuple]:
        """The keys it trains (made when asked: only a lost task needs them)."""
        if self.only is not None:
            return list(self.only)
        return bounds[self.block].key_tuples(slice(self.first, self.stop))


#: Guided chunk sizes: each run of segments takes 1/(GUIDED_SHARE x CPUs) of the segments
#: not yet cut, so runs shrink as the job goes on. The first runs are large (a task's fixed
#: cost, a few milliseconds of the driver's, the raylets' and the worker's time, is paid
#: rarely) and the last are small (no CPU idles long waiting for the last task).
GUIDED_SHARE = 2
#: The smallest run, unless the job is too small to give every CPU work in runs this size.
MIN_SEGMENTS_PER_TASK = 64


def run_size(remaining: int, total: int, cpus: int) -> int:
    """How many segments the next run takes, with ``remaining`` of ``total`` not yet cut."""
    share = max(GUIDED_SHARE * cpus, 1)
    smallest = min(MIN_SEGMENTS_PER_TASK, max(total // share, 1))
    return max(smallest, -(-remaining // share))


def make_chunks(todo: list[np.ndarray], bounds: list[BlockSegments], cpus: int
                ) -> list[Chunk]:
    """Cut each block's segments to train (``todo``: a mask per block) into runs of
    ``run_size`` segments, in decreasing size (blocks are never merged), largest first."""
    total = remaining = sum(int(wanted.sum()) for wanted in todo)
    chunks = []
    for index, (wanted, block) in enumerate(zip(todo, bounds, strict=True)):
        offsets, positions = block.offsets, np.flatnonzero(wanted)
        taken = 0
        while taken < len(positions):
            run = positions[taken:taken + run_size(remaining, total, cpus)]
            first, stop = int(run[0]), int(run[-1]) + 1
            only = None
            if stop - first > len(run):  # done or large segments between: name the others
                inside = np.zeros(len(block), dtype=bool)
                inside[run] = True
                only = frozenset(block.key_tuples(inside))
            chunks.append(Chunk(index, int(offsets[first]), int(offsets[stop]), first, stop,
                                only))
            taken += len(run)
            remaining -= len(run)
    # Ray starts tasks in about this order, so the end of the job waits only on small ones
    return sorted(chunks, key=lambda chunk: chunk.end - chunk.start, reverse=True)


def segment_masks(bounds: list[BlockSegments], plan: Plan, previous: pa.Table
                  ) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """Per block, which segments the packed or spread path trains now and which are
    large (masks), and how many were done before (in ``previous``: a resumed run's
    results)."""
    done = None
    if previous.num_rows:
        seen = KeyIndex(previous.select(plan.segment_by).append_column(
            "__done", pa.repeat(True, previous.num_rows)), plan.segment_by)
        done = [seen.lookup(block.keys).column("__done").is_valid().to_numpy()
                for block in bounds]
    large, todo = [], []
    for position, block in enumerate(bounds):
        big = is_large(block.rows, plan)
        left = np.ones(len(block), dtype=bool) if done is None else ~done[position]
        large.append(big & left)
        todo.append(~big & left)
    return todo, large, sum(int(d.sum()) for d in done) if done else 0


# --------------------------------------------------------------------------- driver


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def with_run_id(config: JobConfig) -> JobConfig:
    """The config with its run's id settled up front (a new one unless given), so the
    run's directory is known from the start."""
    if config.training.run_id:
        return config
    if config.training.resume:
        raise ConfigError("training.resume needs training.run_id: the run to continue")
    training = config.training.model_copy(update={"run_id": new_run_id()})
    return config.model_copy(update={"training": training})


def train_segments(
    segmented: SegmentedDataset | SparkSegments, config: JobConfig, *,
    progress: bool | None = None, absent: Sequence[tuple[tuple, str]] = (),
    given_global: GivenGlobal | None = None,
    file_notes: dict[tuple, tuple[int, str]] | None = None,
    total: int | None = None,
) -> TrainingResult:
    """Train every segment of a segment-aligned dataset as the job config says: Ray
    blocks (``SegmentedDataset``) on Ray, a Spark source (``on_spark.SparkSegments``)
    in Spark's tasks. ``absent``: segments of the source without rows (files that gave
    none), recorded as skipped with their reason; ``file_notes`` (files as segments):
    each segment's skipped files, counted and named in its result row; ``given_global``:
    the global model kept from the champion or fitted on the whole source's blocks (a
    retrain of some segments); ``total``: the source's segments, if known (Spark's
    progress bar)."""
    start = time.perf_counter()
    config = with_run_id(config)
    run_id = str(config.training.run_id)
    run_dir = Path(config.training.output_dir) / run_id
    if not config.training.resume and any((run_dir / "results").glob("*.parquet")):
        raise ConfigError(
            f"run {run_id!r} already has results in {run_dir}: set training.resume=true to "
            "continue it, or pick another training.run_id"
        )
    threads = max(int(max(c.resources.num_cpus for c in config.models)), 1)
    task = task_of(config)
    on_ray = isinstance(segmented, SegmentedDataset)
    blocks = RayBlocks.of(segmented) if on_ray else segmented.blocks()
    plan = task.plan(config, segmented.schema, threads)
    if not on_ray:  # no Ray Train: a large segment trains in one task, with its threads
        plan = replace_plan(plan, large_segment_rows=0)
        ship_to_workers(segmented.df.sparkSession, ["raybricks", *user_modules(plan)])
    if file_notes is not None:
        plan = replace_plan(plan, file_notes=file_notes)
    shared = task.share(blocks, plan, config, segmented.num_rows, given_global)
    plan = shared.plan
    if absent:
        keys, reasons = zip(*absent, strict=True)
        Outcome.of(failed_rows(keys, plan, list(reasons), SKIPPED), pa.table({})).write(
            run_dir, "part-absent")
    previous = read_parts(run_dir / "results", plan.segment_by) if config.training.resume \
        else pa.table({})
    if on_ray:
        _train_on_ray(segmented, task, plan, config, run_dir, previous, progress)
    else:
        train_on_spark(segmented, task, plan, config, run_dir, previous, total, progress)
    try:
        fallback = shared.fallback(run_dir)
        example = input_example(blocks, first_trained(run_dir, plan.segment_by), task, plan,
                                segmented.schema)
    except Exception as exc:
        if not on_ray or not _ray_error(exc) or not any(blocks_lost(blocks.refs)):
            raise
        raise data_lost(run_id, run_dir, 0, sum(len(b) for b in segmented.segments)
                        ) from None
    result = TrainingResult(run_id, run_dir, plan.segment_by, plan.metric, fallback,
                            time.perf_counter() - start, task=plan.task,
                            features=plan.features, example=example,
                            forecast=task.manifest(plan, segmented.schema),
                            target=plan.target, time_column=plan.time_column,
                            global_id=shared.global_id)
    log.info("%s", result.summary())
    return result


def _ray_error(exc: Exception) -> bool:
    import ray

    return isinstance(exc, ray.exceptions.RayError)


def _train_on_ray(segmented: SegmentedDataset, task: Task, plan: Plan, config: JobConfig,
                  run_dir: Path, previous: pa.Table, progress: bool | None) -> None:
    """The Ray executor: packed tasks (or, for fewer segments than CPUs, the spread
    path), then the large segments with Ray Train."""
    import ray

    run_id = str(config.training.run_id)
    refs = segmented.block_refs()
    bounds = segmented.segments
    todo, large, done = segment_masks(bounds, plan, previous)
    n_todo = sum(int(t.sum()) for t in todo)
    n_large = sum(int(x.sum()) for x in large)
    cpus = int(ray.cluster_resources().get("CPU", 1))
    log.info(
        "training %d segments (%d large, %d done before) in %d blocks",
        sum(len(b) for b in bounds), n_large, done, len(refs),
    )
    # with a time limit per segment, segments train in packed tasks, which enforce it
    lost: list[tuple] = []
    # settings of GPU candidates are not spread: a GPU candidate's member is made on the
    # task that fitted it (packed tasks: ``evaluate_block``)
    if (0 < n_todo < cpus and not done and config.training.segment_timeout_s is None
            and task.spreads and not any(needs_gpus(c) for c in plan.candidates)):
        lost = _run_spread(refs, [b.key_tuples(t) for b, t in zip(bounds, todo, strict=True)],
                           task, plan, config, run_dir)
    elif n_todo:
        slots = max(cpus // plan.threads, 1)
        chunks = make_chunks(todo, bounds, slots)
        lost = _run_packed(refs, bounds, chunks, slots, task, plan, config, run_dir, n_todo,
                           progress)
    if lost:
        raise data_lost(run_id, run_dir, len(lost), sum(len(b) for b in bounds))
    if n_large:
        task.train_large(refs, [b.key_tuples(x) for b, x in zip(bounds, large, strict=True)],
                         plan, config, run_dir)


def first_trained(run_dir: Path, segment_by: list[str]) -> tuple | None:
    """The key of a trained segment of the run (None if none trained)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for part in part_files(run_dir / "results"):
        table = pq.read_table(part, columns=[*segment_by, "status"])
        trained = table.filter(pc.equal(table.column("status"), TRAINED))
        if trained.num_rows:
            return tuple(trained.column(c)[0].as_py() for c in segment_by)
    return None


def input_example(blocks: Blocks, wanted: tuple | None, task: Task, plan: Plan,
                  schema: pa.Schema) -> pd.DataFrame | None:
    """The task's input example (``Task.example``) from the rows of a trained segment, if
    any (else of any segment); integer features as pandas ``Int64``, which keeps them
    integers where a value is missing."""
    found = blocks.rows(wanted)
    if found is None:
        return None
    rows = task.example(found.select(plan.columns).to_pandas(), plan)
    return rows.astype({field.name: "Int64" for field in schema
                        if field.name in plan.features and pa.types.is_integer(field.type)})


def _run_packed(refs, bounds: list[BlockSegments], chunks: list[Chunk], slots: int,
                task: Task, plan: Plan, config: JobConfig, run_dir: Path, n_todo: int,
                progress: bool | None) -> list[tuple]:
    """One task per chunk of segments, at most ``slots`` at a time (one per CPU slot: the
    next chunk is submitted when a CPU frees, so it goes to that CPU); results written as
    they arrive. A chunk lost beyond its retries is retrained one segment per task, unless
    its block was lost; with a time limit, segments that ran past it end ``failed``.
    Returns the keys whose block was lost (they have no result)."""
    import ray

    options = {
        "num_cpus": plan.threads,
        "max_retries": config.training.max_retries,
        "retry_exceptions": False,
    }
    gpus = max(c.resources.num_gpus for c in plan.candidates)
    # GPU and CPU candidates together: the GPU ones on a task of their own per chunk
    apart = gpus > 0 and task.evaluates_apart and not all(map(needs_gpus, plan.candidates))
    train = remote(train_block, **options, num_gpus=0 if apart else gpus)
    evaluate = remote(evaluate_block, **options, num_gpus=gpus) if apart else None
    if apart:  # tasks waiting on their GPU task give their CPU back to Ray meanwhile
        slots += max(int(ray.cluster_resources().get("GPU", 0) // gpus), 1)
    limit = config.training.segment_timeout_s
    watch = Watch(limit, ray.remote(num_cpus=0)(TimeoutBoard).remote()) if limit else None
    plan_ref = ray.put(plan)

    # Submitted all at once, Ray queues the chunks' lease requests on nodes as they were
    # when asked, so one CPU can idle while another's queue still holds chunks.
    waiting = collections.deque((chunk, chunk.only) for chunk in chunks)
    pending: dict = {}

    def submit_next() -> None:
        """Fill the free slots with the next chunks (the largest first)."""
        while waiting and len(pending) < slots:
            chunk, only = waiting.popleft()
            rows = (chunk.start, chunk.end)
            block = refs[chunk.block]
            elsewhere = None if evaluate is None else [
                evaluate.remote(block, task, plan_ref, only, watch, rows)]
            pending[train.remote(block, task, plan_ref, only, watch, rows, elsewhere)] = (
                chunk, only)

    attempt = uuid.uuid4().hex[:8]
    show = config.training.progress if progress is None else progress
    lost: list[tuple] = []
    lost_blocks: set[int] = set()
    with console.progress_bar(n_todo, "training", "segment", show) as bar:
        parts = 0
        submit_next()
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            chunk, only = pending.pop(ready[0])
            submit_next()  # the freed CPU's next chunk, before this one's results are read
            try:
                outcome = ray.get(ready[0])
            except (ray.exceptions.RayError, ray.exceptions.RayTaskError) as exc:
                timed_out = watch.timed_out() if watch else set()
                keys = [k for k in (only if only is not None else chunk.keys(bounds))
                        if k not in timed_out]
                if chunk.block in lost_blocks or block_lost(refs[chunk.block]):
                    lost_blocks.add(chunk.block)  # not the segments' fault: left for resume
                    log.warning("task lost with its data (%s): %d segments left for resume",
                                type(exc).__name__, len(keys))
                    lost.extend(keys)
                    continue
                if len(keys) > 1:  # isolate the culprit: one segment per task
                    log.warning("task lost (%s): retraining its %d segments one per task",
                                type(exc).__name__, len(keys))
                    waiting.extend((chunk, frozenset([key])) for key in keys)
                    submit_next()
                    continue
                outcome = Outcome.of(failed_rows(keys, plan, lost_reason(exc)), pa.table({}))
            outcome.write(run_dir, f"part-{chunk.block:06d}-{parts:06d}-{attempt}")
            parts += 1
            bar.update(outcome.segments)
    if watch is not None:
        _write_timed_out(watch, limit, plan, run_dir, attempt)
        ray.kill(watch.board)
    return lost


def _block_rows(block: pa.Table) -> int:
    """Ray task body: a block's rows (it fails when the block cannot be had)."""
    return block.num_rows


def blocks_lost(refs: list) -> list[bool]:
    """Per data block, whether it can no longer be read: the Ray node that held it went
    away and Ray could not rebuild it (its source, e.g. the staged files, is gone).
    Checked by a task next to each block, so nothing moves to the driver."""
    import ray

    probes = [remote(_block_rows, num_cpus=0).remote(ref) for ref in refs]
    lost = []
    for probe in probes:
        try:
            ray.get(probe)
            lost.append(False)
        except ray.exceptions.RayError:
            lost.append(True)
    return lost


def block_lost(ref: Any) -> bool:
    """True when a data block can no longer be read (see ``blocks_lost``)."""
    return blocks_lost([ref])[0]


def data_lost(run_id: str, run_dir: Path, missing: int, total: int) -> DataLostError:
    """The error of a run whose data was lost with a Ray node: what is kept, how to go on."""
    what = (f"{missing} of {total} segments were not trained: their data" if missing else
            f"all {total} segments have a result, but data needed to finish the run")
    return DataLostError(
        f"{what} was lost with a Ray worker node (its Spark executor or machine went away) "
        f"and Ray could not rebuild it. Nothing was registered; the results so far are kept "
        f"in {run_dir}. Resume the run to read the source again and train only what is "
        f"missing: rerun with --set training.resume=true --set training.run_id={run_id}",
        run_id)


def lost_reason(exc: Exception) -> str:
    """Why the segments of a task that failed beyond its retries end ``failed``."""
    return f"worker lost after retries ({type(exc).__name__}): {first_line(exc)}"


def failed_rows(keys: Iterable[tuple], plan: Plan, reason: str | list[str],
                status: str = FAILED) -> pa.Table:
    """``failed`` (or ``status``) result rows for these segments, with one reason or one
    each."""
    keys = list(keys)
    reasons = [reason] * len(keys) if isinstance(reason, str) else reason
    return results_table([SegmentResult(key, status=status, reason=why)
                          for key, why in zip(keys, reasons, strict=True)], plan)


def _write_timed_out(watch: Watch, limit: float, plan: Plan, run_dir: Path, attempt: str):
    """One ``failed`` row per segment that ran past the time limit."""
    import ray

    timed_out = ray.get(watch.board.timed_out.remote())
    reasons = [f"timed out: still fitting after {seconds:.1f}s (training.segment_timeout_s="
               f"{limit:g}); its worker was stopped" for seconds in timed_out.values()]
    Outcome.of(failed_rows(timed_out, plan, reasons), pa.table({})).write(
        run_dir, f"part-timeout-{attempt}")


def _run_spread(refs, todo, task: Task, plan: Plan, config: JobConfig, run_dir: Path
                ) -> list[tuple]:
    """Few segments: every (candidate, setting) of every segment is its own task, over
    the segment's prepared data put in the object store once. Returns the keys whose
    block was lost (they have no result)."""
    import ray

    retries = config.training.max_retries
    prepare_fn, evaluate_fn, finish_fn = task.spread_functions()
    prepare = remote(prepare_fn, max_retries=retries)
    evaluate = remote(evaluate_fn, num_cpus=plan.threads, max_retries=retries)
    finish = remote(finish_fn, num_cpus=plan.threads, max_retries=retries)
    outputs, blocks = {}, {}
    for block_ref, keys in zip(refs, todo, strict=True):
        for key in keys:
            prep_ref = prepare.remote(block_ref, plan, key)
            trials = {
                c.name: [
                    evaluate.remote(prep_ref, plan, key, c.name, params)
                    for params in spread_settings(c, stable_seed(plan.seed, key, c.name))
                ]
                for c in plan.candidates
            }
            outputs[key] = finish.remote(prep_ref, plan, key, trials)
            blocks[key] = block_ref
    results, members, lost = [], [], []
    for key, ref in outputs.items():
        try:
            row, rows = ray.get(ref)
        except ray.exceptions.RayError as exc:  # lost beyond retries: only this segment
            if block_lost(blocks[key]):
                lost.append(key)
                continue
            row, rows = SegmentResult(key, status=FAILED, reason=lost_reason(exc)), []
        results.append(row)
        members.extend(keyed_members(plan, key, rows))
    Outcome.of(results_table(results, plan), members_table(members, plan)).write(
        run_dir, f"part-spread-{uuid.uuid4().hex[:8]}")
    return lost


