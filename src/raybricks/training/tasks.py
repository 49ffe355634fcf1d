"""The training tasks the engine runs, behind one protocol: the engine schedules blocks,
runs and retries; a task knows what planning a job, what the job shares, one segment's
training, its model's manifest and its input example are.

Two tasks implement it, side by side: ``tabular_task.TABLE`` (regression, binary,
multiclass) and ``forecast_task.FORECAST``. A new task is a third object with these
members, returned by ``task_of`` for its config.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import pyarrow as pa

from raybricks.config import CandidateConfig, JobConfig
from raybricks.kinds import StoredKind
from raybricks.training.blocks import Blocks
from raybricks.training.forecast.task import FORECAST
from raybricks.training.plan import GivenGlobal, Plan, SegmentTrainer, Shared
from raybricks.training.tabular.task import TABLE


class Task(Protocol):
    """What the engine asks of a training task."""

    #: Whether a job of fewer segments than CPUs may spread each segment's (candidate,
    #: setting) pairs over Ray tasks (``spread_functions``) instead of packing segments.
    spreads: bool
    #: Whether the candidates of a block may be evaluated on separate Ray tasks
    #: (``evaluator``; the GPU candidates on tasks that hold GPUs) and the segments
    #: selected on the block's own task (``trainer`` with ``found``).
    evaluates_apart: bool

    def plan(self, config: JobConfig, schema: pa.Schema, threads: int) -> Plan:
        """Resolve the job for the table's schema; refuse what cannot work (DataError)."""

    def kind(self, candidate: CandidateConfig) -> StoredKind:
        """The model kind that fits ``candidate`` in this task."""

    def share(self, blocks: Blocks, plan: Plan, config: JobConfig, num_rows: int,
              given: GivenGlobal | None = None) -> Shared:
        """On the driver, before any segment trains: what every segment shares, from the
        job's ``blocks`` (Ray's or Spark's: ``blocks.Blocks``; ``given``: the global
        model kept from the champion or fitted on other blocks)."""

    def trainer(self, frame: pd.DataFrame, todo: list[tuple[tuple, int, int]],
                plan: Plan, found: list[dict] | None = None) -> SegmentTrainer:
        """Inside a Ray task: the function that trains one segment of this block's
        ``frame`` (the plan's columns; ``todo``: the segments it will be asked for).
        ``found``: the candidates were evaluated already (``evaluator``'s results by
        segment key, this task's first): select among them."""

    def evaluator(self, frame: pd.DataFrame, todo: list[tuple[tuple, int, int]],
                  plan: Plan, names: list[str], store: bool) -> Callable[[tuple, int, int], Any]:
        """Inside a Ray task: the function that evaluates only the candidates ``names``
        on one segment of the block, for ``trainer``'s ``found`` (``store``: made on a
        task other than the selecting one: each candidate's member is made here)."""

    def train_large(self, refs: list, keys: list[list[tuple]], plan: Plan,
                    config: JobConfig, run_dir: Path) -> None:
        """Train the segments above ``training.large_segment_rows`` (``keys``: per Ray
        block, ``refs``: the blocks), writing their results into the run (Ray only)."""

    def spread_functions(self) -> tuple[Callable, Callable, Callable]:
        """The Ray task bodies of the spread path: prepare one segment, evaluate one
        (candidate, setting), finish the segment."""

    def example(self, rows: pd.DataFrame, plan: Plan) -> pd.DataFrame:
        """The registered model's input example from one trained segment's rows."""

    def manifest(self, plan: Plan, schema: pa.Schema) -> dict[str, Any] | None:
        """What the registered model records of the task (None: nothing beyond the
        result's own fields)."""


def task_of(config: JobConfig) -> Task:
    """The task that trains ``config``'s job."""
    return FORECAST if config.task == "forecast" else TABLE


def make_plan(config: JobConfig, schema: pa.Schema, threads: int = 1) -> Plan:
    """Resolve the job's plan for the table's schema; refuse what cannot work."""
    return task_of(config).plan(config, schema, threads)
