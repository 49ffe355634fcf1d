"""The hand-off from training to packaging and tracking: statuses, the result and model
schemas, the run's Parquet parts on disk, and the immutable ``TrainingResult``.

Training writes parts under ``training.output_dir/<run_id>/`` (``results/`` one row per
segment, ``models/`` the serialized members, ``fallback.parquet`` the global model) as its
tasks finish, and returns a ``TrainingResult``; packaging and tracking only read them.
"""

from __future__ import annotations

import functools
import gc
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raybricks.config import RESERVED_NAMES
from raybricks.metrics import metric

TRAINED, SKIPPED, FAILED = "trained", "skipped", "failed"
STATUSES = (TRAINED, SKIPPED, FAILED)


# --------------------------------------------------------------------------- schemas


def result_schema(keys: list[pa.Field], metric_name: str, candidates: list[str]) -> pa.Schema:
    """The columns of every result row, in order: every part of a run has this schema,
    whichever statuses its segments ended in, so the parts read as one table.
    ``<candidate>_seconds``: the core seconds of evaluating that candidate on the segment
    (its fits and scoring, every setting searched), beside ``fit_seconds``, the whole
    segment's; ``profile``: a trained segment's training rows summarized for monitoring
    (``raybricks.profiles``, JSON); ``files_skipped`` (files as segments): the segment's
    files that gave no rows, each named in ``reason``."""
    scores = [f"baseline_{metric_name}", *(f"{c}_{metric_name}" for c in candidates),
              f"metric_{metric_name}"]
    timed = [f"{c}_seconds" for c in candidates if c not in RESERVED_NAMES]
    return pa.schema([
        *keys,
        pa.field("status", pa.string()), pa.field("reason", pa.string()),
        pa.field("n_rows", pa.int64()), pa.field("n_valid", pa.int64()),
        *(pa.field(name, pa.float64()) for name in scores),
        pa.field("chosen", pa.string()), pa.field("weights", pa.string()),
        pa.field("fit_seconds", pa.float64()),
        *(pa.field(name, pa.float64()) for name in timed),
        pa.field("profile", pa.string()), pa.field("files_skipped", pa.int64()),
    ])


MEMBER_FIELDS = [
    pa.field("candidate", pa.string()), pa.field("kind", pa.string()),
    pa.field("weight", pa.float64()), pa.field("params", pa.string()),
    pa.field("payload", pa.binary()), pa.field("meta", pa.string()),
]


def members_schema(keys: list[pa.Field]) -> pa.Schema:
    """The columns of the models parts: the segment's keys, then one member per row."""
    return pa.schema(keys + MEMBER_FIELDS)


# --------------------------------------------------------------------------- parts


def write_part(directory: Path, name: str, data: bytes) -> None:
    """Write a Parquet part atomically (a crash never leaves half a file)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, directory / f"{name}.parquet")


def parquet_bytes(table: pa.Table) -> bytes:
    """A table as the bytes of a Parquet file (no bytes for an empty table)."""
    if not table.num_rows:
        return b""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


@dataclass(frozen=True)
class Outcome:
    """A batch of result rows and serialized models, encoded as Parquet files. Tasks
    encode their own, so the driver only writes bytes it never decodes."""

    segments: int
    results: bytes
    models: bytes

    @classmethod
    def of(cls, results: pa.Table, models: pa.Table) -> Outcome:
        return cls(results.num_rows, parquet_bytes(results), parquet_bytes(models))

    def write(self, run_dir: Path, name: str) -> None:
        """Write the batch as parts of the run; models first, so a result row (what
        ``resume`` goes by) never exists without its models."""
        for directory, data in (("models", self.models), ("results", self.results)):
            if data:
                write_part(run_dir / directory, name, data)


def commit_part(staged: Path, run_dir: Path, name: str) -> None:
    """Move a part a task wrote under ``staged`` (its ``models`` and ``results``) into
    the run, models first (as ``Outcome.write`` writes them)."""
    for directory in ("models", "results"):
        source = staged / directory / f"{name}.parquet"
        if source.exists():
            (run_dir / directory).mkdir(parents=True, exist_ok=True)
            os.replace(source, run_dir / directory / f"{name}.parquet")


def part_files(directory: Path) -> list[Path]:
    """The Parquet parts of a run's ``results`` or ``models``, in name order."""
    return sorted(directory.glob("*.parquet")) if directory.exists() else []


def read_parts(directory: Path, columns: list[str] | None = None) -> pa.Table:
    """The parts of a run's ``results`` or ``models`` as one table (only those of
    ``columns`` the parts have, if given), read in parallel (every part of a run is
    written with the same schema)."""
    files = part_files(directory)
    if not files:
        return pa.table({})
    if columns is not None:
        names = pq.read_schema(files[0]).names
        columns = [c for c in columns if c in names]
    return pq.read_table([str(f) for f in files], columns=columns)


def float_values(table: pa.Table, name: str) -> np.ndarray:
    """A column of ``table`` as floats, NaN where missing (none if the table lacks it)."""
    if name not in table.column_names:
        return np.array([], dtype=float)
    return table.column(name).cast(pa.float64()).to_numpy().astype(float)


def release_memory() -> None:
    """Hand freed memory back to the system: Arrow's allocator keeps what it freed, so
    without this the driver's resident memory would add up stage after stage."""
    gc.collect()
    pa.default_memory_pool().release_unused()


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows of dicts (serialized members, the fallback) as one table."""
    if not rows:
        return pa.table({})
    return pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False)


# --------------------------------------------------------------------------- choices

CHOICES = ("local", "global", "baseline", "blend")


def choice_of(chosen: str | None) -> str | None:
    """What a segment's ``chosen`` (a JSON list of member labels) amounts to: ``local``,
    ``global``, ``baseline``, or ``blend`` (several members); None without a choice."""
    if not isinstance(chosen, str):
        return None
    labels = json.loads(chosen)
    if len(labels) != 1:
        return "blend" if labels else None
    return labels[0] if labels[0] in ("global", "baseline") else "local"


def choice_counts(segments: pa.Table | pd.DataFrame) -> dict[str, int]:
    """Trained segments per choice (local, global, baseline, blend), from their
    ``status`` and ``chosen`` columns (each distinct ``chosen`` is decoded once)."""
    if isinstance(segments, pd.DataFrame):
        segments = pa.Table.from_pandas(segments[["status", "chosen"]], preserve_index=False)
    counts = dict.fromkeys(CHOICES, 0)
    if not segments.num_rows:
        return counts
    trained = segments.filter(pc.equal(segments.column("status"), TRAINED))
    for found in pc.value_counts(trained.column("chosen").combine_chunks()).to_pylist():
        choice = choice_of(found["values"])
        if choice is not None:
            counts[choice] += found["counts"]
    return counts


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class TrainingResult:
    """Per-segment results and where the fitted models are stored.

    The result rows live in the run's ``results`` parts: ``columns`` reads some of their
    columns (what the job's own summaries use, so the driver never holds them all) and
    ``segments`` all of them as one pandas table, one row per segment (keys, status,
    reason, chosen candidates and weights, validation metric of the ensemble, of every
    candidate and of the baseline, row counts, fit seconds). ``models()``: segment keys
    -> serialized members (candidate, kind, weight, params, payload, meta).
    ``fallback``: the global model's serialized members, if one was trained (or kept:
    ``global_id`` names a global model the run took from the champion; a global model
    the run trained is named after the run).
    """

    run_id: str
    run_dir: Path
    segment_by: list[str]
    metric: str
    fallback: list[dict[str, Any]] | None
    seconds: float
    task: str = "regression"
    features: tuple[str, ...] | list[str] = ()
    example: pd.DataFrame | None = None  # a few input rows (segment columns and features)
    forecast: dict[str, Any] | None = None  # task forecast: what ``raybricks forecast`` needs
    target: str | None = None  # the target column (monitoring reads actuals from it)
    time_column: str | None = None  # the time column, if training had one
    global_id: str | None = None  # the champion's global model the run kept, if it did

    @property
    def global_name(self) -> str:
        """The name of the run's global model: the one it kept, or the run's id."""
        return self.global_id or self.run_id

    @functools.cached_property
    def segments(self) -> pd.DataFrame:
        """Every result row, as pandas (read once, on first use)."""
        return read_parts(self.run_dir / "results").to_pandas()

    def columns(self, names: list[str], status: str | None = None) -> pa.Table:
        """These columns of the result rows (only the rows of ``status``, if given)."""
        wanted = list(dict.fromkeys([*names, *([] if status is None else ["status"])]))
        table = read_parts(self.run_dir / "results", wanted)
        if status is not None and table.num_rows:
            table = table.filter(pc.equal(table.column("status"), status)).select(
                [c for c in names if c in table.column_names])
        return table

    def models(self) -> pa.Table:
        return read_parts(self.run_dir / "models")

    @functools.cached_property
    def _counts(self) -> dict[str, int]:
        status = self.columns(["status"])
        found = ({c["values"]: c["counts"] for c in
                  pc.value_counts(status.column("status").combine_chunks()).to_pylist()}
                 if status.num_rows else {})
        return {s: int(found.get(s, 0)) for s in STATUSES}

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def skip_reasons(self, limit: int | None = None) -> str:
        """Skipped segments counted by reason (the text before its first colon), most
        common first: ``too few rows (15), no target (1)``."""
        reasons = self.columns(["reason"], SKIPPED).column("reason").combine_chunks()
        found: dict[str, int] = {}
        for item in pc.value_counts(reasons).to_pylist():
            reason = str(item["values"]).split(":")[0]
            found[reason] = found.get(reason, 0) + item["counts"]
        top = sorted(found.items(), key=lambda item: -item[1])[:limit]
        return ", ".join(f"{r} ({n})" for r, n in top)

    def trained_values(self, column: str) -> np.ndarray:
        """One float column of the trained segments (NaN where missing)."""
        return float_values(self.columns([column], TRAINED), column)

    def summary(self) -> str:
        """Counts per status and the distribution of the validation metric."""
        counts = self.counts()
        total = sum(counts.values())
        lines = [
            f"run {self.run_id}: {total} segments in {self.seconds:.1f}s "
            f"({total / max(self.seconds, 1e-9):.1f}/s): "
            + ", ".join(f"{n} {s}" for s, n in counts.items())
        ]
        values = self.trained_values(f"metric_{self.metric}")
        if len(values):
            q = pd.Series(values).quantile([0.1, 0.5, 0.9])
            lines.append(
                f"{self.metric}: p10 {q[0.1]:.4g}  median {q[0.5]:.4g}  p90 {q[0.9]:.4g}  "
                f"mean {np.nanmean(values):.4g}"
            )
            base = self.trained_values(f"baseline_{self.metric}")
            share = metric(self.metric).beats(values, base)
            lines.append(f"beats the naive baseline: {share:.0%}")
            choices = choice_counts(self.columns(["status", "chosen"]))
            lines.append("chosen: " + ", ".join(f"{n} {c}" for c, n in choices.items() if n))
        if counts[SKIPPED]:
            lines.append("skipped: " + self.skip_reasons(limit=5))
        if counts[FAILED]:
            reason = self.columns(["reason"], FAILED).column("reason")[0].as_py()
            lines.append(f"failed: {counts[FAILED]}, e.g. {reason}")
        return "\n".join(lines)


def keep_fallback(run_dir: Path, row: dict, members: list[dict]) -> list[dict] | None:
    """Write the global model's result row and members into the run; its members."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "fallback.json").write_text(json.dumps(row, default=str))
    if members:
        write_part(run_dir, "fallback", parquet_bytes(rows_to_table(members)))
    return members or None
