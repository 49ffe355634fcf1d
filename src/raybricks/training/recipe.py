"""The one training recipe every path runs: prepare a unit (a table's segment or a
series), evaluate every candidate, add what competes beside them (the baseline and the
global model), select or blend, build the stored members.

``train(unit)`` is the recipe. A ``Unit`` says what its task does at each step
(``tabular.segment.TableSegment``, ``forecast.backtest.SeriesUnit``,
``tabular.large.LargeSegment``); how one candidate is fitted and scored is the evaluator
passed into it: the local fit (``tabular.segment.fit_locally``), the best of the settings
the spread path fitted on other Ray tasks (``tabular.task.finish_segment``), or Ray
Train on the workers (``tabular.large``), the backtest for a series.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from raybricks.config import CandidateConfig
from raybricks.results import TRAINED
from raybricks.training.plan import Plan
from raybricks.training.selection import Evaluation, SegmentResult, result_for_error

#: How one candidate is fitted and scored on a prepared unit: (prepared, candidate) ->
#: its best setting's evaluation (an error in it, rather than raised, when none fits).
Evaluator = Callable[[Any, CandidateConfig], Evaluation]

#: A choice: the chosen evaluations and their weights.
Chosen = list[tuple[Evaluation, float]]


class Unit:
    """One segment or series, as ``train`` trains it. A task's subclass says how to
    prepare it, what competes beside the candidates, how to choose and what to store;
    ``evaluate`` is the evaluator it was given."""

    #: Whether ``train`` records the unit's time in ``fit_seconds`` (not where the
    #: candidates were fitted elsewhere, as in the spread path).
    timed = True
    #: Core seconds spent on the unit outside ``train`` (its share of work done for a
    #: whole block at once), added to ``fit_seconds``.
    shared_seconds = 0.0

    def __init__(self, key: tuple, plan: Plan, evaluate: Evaluator, n_rows: int) -> None:
        self.key, self.plan, self.evaluate, self.n_rows = key, plan, evaluate, n_rows

    def prepare(self) -> Any:
        """The unit ready to fit; raises ``Skip`` for a data condition."""
        raise NotImplementedError

    def rows(self, prepared: Any) -> int:
        """The rows the result row reports (``n_rows``)."""
        return self.n_rows

    def rivals(self, prepared: Any) -> list[Evaluation]:
        """What competes beside the candidates: the baseline (``selection: all``) and the
        global model (``fallback: global``), evaluated on the same rows."""
        return []

    def select(self, prepared: Any, row: SegmentResult, evaluations: list[Evaluation]
               ) -> Chosen:
        """Choose or blend (``selection.summarize``), writing the scores and the choice
        into ``row``."""
        raise NotImplementedError

    def members(self, prepared: Any, chosen: Chosen) -> list[dict[str, Any]]:
        """The chosen members, refitted where the plan says so, serialized."""
        raise NotImplementedError

    def served(self, error: Exception, row: SegmentResult) -> list[dict[str, Any]]:
        """What serves a unit that was skipped or failed (``row``: its result, whose
        reason may be completed); nothing by default."""
        return []

    def profile(self, prepared: Any) -> dict[str, Any] | None:
        """A trained unit's training rows as monitoring compares new rows with them
        (``raybricks.profiles``); none by default."""
        return None


def train(unit: Unit) -> tuple[SegmentResult, list[dict[str, Any]]]:
    """Train one unit. Never raises: the result row says trained, skipped (a data
    condition, with the reason) or failed (with the error)."""
    start = time.perf_counter()
    try:
        prepared = unit.prepare()
        # preparing may narrow the plan (a short series' fewer windows)
        evaluations, seconds = [], {}
        for candidate in unit.plan.candidates:
            began = time.perf_counter()
            evaluations.append(unit.evaluate(prepared, candidate))
            seconds[candidate.name] = time.perf_counter() - began
        evaluations += unit.rivals(prepared)
        row = SegmentResult(unit.key, unit.rows(prepared))
        if unit.timed:
            row.seconds = seconds
        chosen = unit.select(prepared, row, evaluations)
        members = unit.members(prepared, chosen)
        row.profile = unit.profile(prepared)
        row.status = TRAINED
    except Exception as exc:  # noqa: BLE001 - a bad unit never stops the job
        row = result_for_error(exc, unit.key, unit.n_rows)
        members = unit.served(exc, row)
    if unit.timed:
        row.fit_seconds = time.perf_counter() - start + unit.shared_seconds
    return row, members
