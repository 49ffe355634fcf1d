"""The body of a packed task, on any executor: train the segments of one block (an
Arrow table holding whole segments, sorted by the segment key) and return their result
rows and serialized members as one ``Outcome``. Ray tasks (``engine``) and Spark tasks
(``on_spark``) run the same function.

With ``training.segment_timeout_s`` on Ray, a watchdog thread in the task stops the
worker when one segment's fit runs past the limit, after noting that segment on a small
actor (``TimeoutBoard``): the retried task skips it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from raybricks.compat import thread_limiter
from raybricks.data import segment_bounds
from raybricks.results import Outcome
from raybricks.training.plan import Plan, needs_gpus
from raybricks.training.selection import keyed_members, members_table, results_table
from raybricks.training.tasks import Task

log = logging.getLogger(__name__)


def train_block(
    block: pa.Table, task: Task, plan: Plan, only: frozenset | None = None,
    watch: Watch | None = None, rows: tuple[int, int] | None = None,
    elsewhere: list | None = None,
) -> Outcome:
    """Ray task body: train the segments of one block (``only``: just these segments;
    ``rows``: only the segments in this row range of the block). ``watch``: stop the
    worker when a segment runs past its time limit (segments that already timed out are
    left out). ``elsewhere``: [a reference to the evaluations of the GPU candidates, made
    by ``evaluate_block`` on a task that holds GPUs]: this task evaluates the others,
    then gathers those and selects."""
    frame, todo = block_todo(block, plan, only, watch, rows)
    results, members = [], []
    with limit_threads(task, plan), SegmentWatchdog(watch) as watchdog:
        found = None
        if elsewhere is not None:
            here = [c.name for c in plan.candidates if not needs_gpus(c)]
            found = [evaluate_each(task.evaluator(frame, todo, plan, here, False), todo,
                                   watchdog)]
            import ray

            found.append(ray.get(elsewhere[0]))  # a lost GPU task fails this one too
            late = watch.timed_out() if watch is not None else set()  # on the GPU task
            todo = [item for item in todo if item[0] not in late]
        train = task.trainer(frame, todo, plan, found)
        for key, start, end in todo:
            watchdog.started(key)
            row, segment_members = train(key, start, end)
            watchdog.started(None)
            results.append(row)
            members.extend(keyed_members(plan, key, segment_members))
    return Outcome.of(results_table(results, plan), members_table(members, plan))


def evaluate_block(
    block: pa.Table, task: Task, plan: Plan, only: frozenset | None = None,
    watch: Watch | None = None, rows: tuple[int, int] | None = None,
) -> dict[tuple, Any]:
    """Ray task body, on a task that holds GPUs: the GPU candidates evaluated on each
    segment of the block (as ``train_block`` takes them: its ``elsewhere``)."""
    frame, todo = block_todo(block, plan, only, watch, rows)
    with limit_threads(task, plan), SegmentWatchdog(watch) as watchdog:
        names = [c.name for c in plan.candidates if needs_gpus(c)]
        return evaluate_each(task.evaluator(frame, todo, plan, names, True), todo, watchdog)


def block_todo(block: pa.Table, plan: Plan, only: frozenset | None, watch: Watch | None,
               rows: tuple[int, int] | None) -> tuple[pd.DataFrame, list]:
    """The plan's columns of a block (or its ``rows``) and the segments a task trains:
    (key, start, end) of those in ``only``, not large, not timed out before."""
    if rows is not None:
        block = block.slice(rows[0], rows[1] - rows[0])
    skip = watch.timed_out() if watch is not None else set()
    frame = block.select(plan.columns).to_pandas()
    todo = [(key, start, end) for key, start, end in segment_bounds(block, plan.segment_by)
            if key not in skip and (only is None or key in only)
            and not is_large(end - start, plan)]
    return frame, todo


def evaluate_each(evaluate: Any, todo: list, watchdog: SegmentWatchdog) -> dict[tuple, Any]:
    """A task's evaluator run on every segment to train, each under the watchdog."""
    found = {}
    for key, start, end in todo:
        watchdog.started(key)
        found[key] = evaluate(key, start, end)
        watchdog.started(None)
    return found


def warm_up(task: Task, plan: Plan) -> None:
    """Import the candidates' libraries and user code before any clock starts: a fresh
    worker's imports are not part of a segment's fit time."""
    for candidate in plan.candidates:
        task.kind(candidate).warm_up()


def limit_threads(task: Task, plan: Plan) -> contextlib.AbstractContextManager:
    """Cap BLAS/OpenMP threads at ``plan.threads`` while a task trains. The candidates'
    libraries are imported first, so threadpoolctl sees them; its scan of the loaded
    libraries (a few milliseconds) is made once per worker and candidate set."""
    warm_up(task, plan)
    candidates = tuple((c.kind, c.estimator, c.function) for c in plan.candidates)
    return _thread_limiter(candidates, bool(plan.categorical))(plan.threads)


@functools.cache
def _thread_limiter(candidates: tuple, categorical: bool):
    return thread_limiter()


class TimeoutBoard:
    """Ray actor: the segments whose fit ran past ``training.segment_timeout_s``."""

    def __init__(self) -> None:
        self.keys: dict[tuple, float] = {}

    def report(self, key: tuple, seconds: float) -> None:
        self.keys[key] = seconds

    def timed_out(self) -> dict[tuple, float]:
        return self.keys


@dataclass
class Watch:
    """What a task's watchdog needs: the time limit and the board to report to."""

    timeout_s: float
    board: Any  # a TimeoutBoard actor handle

    def timed_out(self) -> set[tuple]:
        import ray

        return set(ray.get(self.board.timed_out.remote()))


class SegmentWatchdog:
    """Inside a task: a thread that, when the current segment runs past the limit,
    reports it to the board and ends the worker process (the only way to stop a fit
    stuck in native code). Ray then retries the task, which skips that segment."""

    def __init__(self, watch: Watch | None) -> None:
        self.watch = watch
        self.lock = threading.Lock()
        self.key: tuple | None = None
        self.since = 0.0
        self.stop = threading.Event()

    def __enter__(self) -> SegmentWatchdog:
        if self.watch is not None:
            threading.Thread(target=self._run, daemon=True, name="segment-watchdog").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()

    def started(self, key: tuple | None) -> None:
        """The segment now being trained (None: between segments)."""
        if self.watch is not None:
            with self.lock:
                self.key, self.since = key, time.monotonic()

    def _run(self) -> None:
        import ray

        limit = self.watch.timeout_s
        while not self.stop.wait(min(1.0, limit / 4)):
            with self.lock:  # held to the end: the task cannot move to the next segment
                elapsed = time.monotonic() - self.since
                if self.key is None or elapsed <= limit or self.stop.is_set():
                    continue
                log.error("segment %s still fitting after %.1fs: stopping its worker",
                          self.key, elapsed)
                try:
                    ray.get(self.watch.board.report.remote(self.key, elapsed), timeout=60)
                finally:
                    os._exit(TIMEOUT_EXIT_CODE)


TIMEOUT_EXIT_CODE = 75


def is_large(rows: int | np.ndarray, plan: Plan) -> bool | np.ndarray:
    """Segments above the threshold are trained data-parallel with Ray Train (``rows``:
    one segment's, or an array of them for a mask)."""
    return (plan.large_segment_rows > 0) & (rows > plan.large_segment_rows)
