"""The plan every training task runs on, and the rows every task writes.

``Plan`` is resolved once on the driver (``tasks.make_plan``) and travels with every Ray
task; the helpers here make the result and member rows of a segment whatever the task
(tabular or forecast), so both write the same tables.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from raybricks.config import CandidateConfig, JobConfig
from raybricks.data import segment_bounds
from raybricks.kinds.base import holds_gpus
from raybricks.kinds.forecasting import ForecastSpec
from raybricks.results import TRAINED, keep_fallback
from raybricks.segmented_model import SegmentModel
from raybricks.training.selection import SegmentResult


@dataclass
class Plan:
    """What every task needs to train segments, resolved once on the driver."""

    segment_by: list[str]
    target: str
    features: list[str]
    categorical: list[str]
    time_column: str | None
    task: str
    metric: str
    method: str
    fraction: float
    folds: int
    candidates: list[CandidateConfig]
    ensemble: str
    top_k: int
    within: float | None  # blend members at most this share worse than the best (None: any)
    margin: float  # standard errors a local choice must beat the baseline/global model by
    shrink: float  # the reference's share of a local choice's weight
    refit: bool
    min_rows: int
    seed: int
    threads: int = 1
    large_segment_rows: int = 0  # segments above this go to Ray Train (0: none)
    selection: str = "local_only"  # "all": the baseline (and global model) compete too
    pool: list[CandidateConfig] = field(default_factory=list)  # the competing non-locals
    # the global model of each split (members), trained on the training rows of every
    # segment's split (``selection: all`` with ``fallback: global``)
    global_members: list[list[dict[str, Any]]] = field(default_factory=list)
    global_token: str = ""
    # task forecast, each series' own forecast made (``ForecastSpec.own_forecast``): the
    # global model over whole series (the fallback's members), which continues a series'
    # history where a series blends it
    global_final: list[dict[str, Any]] = field(default_factory=list)
    serve_skipped: bool = False  # skipped segments get their baseline (no global model)
    key_fields: list[pa.Field] = field(default_factory=list)  # segment columns' types
    forecast: ForecastSpec | None = None  # task forecast: ``forecast.series.forecast_spec``
    # files as segments: each segment's files that gave no rows (how many, what its
    # result row says); None: the source is not a folder of files
    file_notes: dict[tuple, tuple[int, str]] | None = None

    @property
    def columns(self) -> list[str]:
        extra = [self.time_column] if self.time_column else []
        static = self.forecast.static if self.forecast else []
        return list(dict.fromkeys(self.segment_by + self.features + [self.target] + extra
                                  + static))


def is_categorical(arrow_type: pa.DataType) -> bool:
    """Strings and dictionaries are categorical features."""
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_dictionary(arrow_type))


def shrink_of(config: JobConfig, default: float) -> float:
    """``ensemble.shrink``, or the task's default where the job leaves it unset."""
    return default if config.ensemble.shrink is None else config.ensemble.shrink


def stable_seed(*parts: Any) -> int:
    """A seed derived from the job seed and names (stable across processes and runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def needs_gpus(candidate: CandidateConfig) -> bool:
    """Whether the candidate's fitting tasks hold GPUs (``resources.num_gpus``)."""
    return candidate.resources.num_gpus > 0


def on_device(kind: Any, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` for one fit of ``kind``: under them, the kind's ``device_params("cuda")``
    when its candidate asks for GPUs and this Ray task (or Ray Train worker) holds some."""
    return kind.device_params("cuda") | params if holds_gpus(kind.candidate) else params


GLOBAL = CandidateConfig(name="global", kind="global")


_LOADED_GLOBAL: dict[str, list[SegmentModel]] = {}


def global_models(plan: Plan) -> list[SegmentModel]:
    """The global model of each split, loaded once per process and job."""
    if plan.global_token not in _LOADED_GLOBAL:
        if len(_LOADED_GLOBAL) > 4:
            _LOADED_GLOBAL.clear()
        _LOADED_GLOBAL[plan.global_token] = [
            SegmentModel.from_rows(members)
            for members in plan.global_members
        ]
    return _LOADED_GLOBAL[plan.global_token]


def replace_plan(plan: Plan, **changes: Any) -> Plan:
    return dataclasses.replace(plan, **changes)


def segment_rows(block: pa.Table, plan: Plan, key: tuple) -> pd.DataFrame:
    """One segment's rows of a block, as the frame the segment logic takes."""
    start, end = next((s, e) for k, s, e in segment_bounds(block, plan.segment_by) if k == key)
    return block.slice(start, end - start).select(plan.columns).to_pandas()


@dataclass(frozen=True)
class Shared:
    """What a job's segments share, made before they train (``Task.share``): the plan
    they train with (global models, the series' end, ...) and how to finish the job's
    fallback model once they have trained (``fallback(run_dir)``: its members, or None);
    ``global_id``: the name of a global model the job kept rather than fitted."""

    plan: Plan
    fallback: Callable[[Path], list[dict] | None]
    global_id: str | None = None


@dataclass(frozen=True)
class GivenGlobal:
    """A global model a job does not fit from the rows it trains (a retrain of some
    segments, ``global_model``): the champion's, kept (``members``, named ``name``), or
    one fitted on the whole source's blocks (``blocks``: ``blocks.Blocks``, ``num_rows``
    rows)."""

    name: str | None = None
    members: list[dict[str, Any]] | None = None
    blocks: Any = None
    num_rows: int = 0

    @property
    def kept(self) -> bool:
        return self.members is not None

    def shared(self, plan: Plan, copies: int) -> Shared:
        """What a job shares when it keeps this (the champion's) global model: the model
        that competes in each of ``copies`` splits or backtest windows (0: none), and
        the fallback."""
        if copies:
            plan = replace_plan(plan, global_members=[self.members] * copies,
                                global_token=f"kept {self.name}")
        return Shared(plan, lambda run_dir: keep_fallback(
            run_dir, {"status": TRAINED, "kept": self.name}, self.members),
            global_id=self.name)


#: One segment's training: (key, first row, end row) of the block -> its result row and
#: serialized members. Never raises: the row says trained, skipped or failed.
SegmentTrainer = Callable[[tuple, int, int], tuple[SegmentResult, list[dict[str, Any]]]]
