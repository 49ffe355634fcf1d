"""Task forecast with ``forecast.hierarchy``: the aggregate series, built with Spark.

Every level of the hierarchy (and the total) becomes series of its own, the sums of the
segments' targets per date, beside the segments' series in one frame whose segment
columns are ``level`` (the level's name) and every level's and segment's column (null
where a level aggregates it). Training then treats each as a segment; ``reconciliation``
makes their forecasts add up. Checked first: every segment has one value of each level
column, and in a strict hierarchy every node has one parent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from raybricks.config import LEVEL_COLUMN, JobConfig, is_chain, level_name
from raybricks.errors import DataError, key_text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: The ``level`` of the sum of every series.
TOTAL = "total"
#: How many offending keys an error names.
SHOWN = 5


@dataclass(frozen=True)
class Levels:
    """A job's hierarchy: ``levels`` (each its columns, top first; the total as ``[]``
    when asked for; the segments last) and ``columns``, every key column in order."""

    levels: list[list[str]]
    columns: list[str]
    strict: bool

    @classmethod
    def of(cls, config: JobConfig) -> Levels:
        hierarchy = config.forecast.hierarchy
        levels = ([[]] if hierarchy.total else []) + [list(level) for level in
                                                      hierarchy.levels]
        levels.append(list(hierarchy.segments or config.segment_by))
        columns = list(dict.fromkeys(c for level in levels for c in level))
        return cls(levels, columns, is_chain(hierarchy.levels))

    @property
    def bottom(self) -> list[str]:
        return self.levels[-1]

    @property
    def extra(self) -> list[str]:
        """The level columns that are not segment columns (a store's region)."""
        return [c for c in self.columns if c not in self.bottom]

    def name(self, level: list[str]) -> str:
        return level_name(level) if level else TOTAL

    @property
    def names(self) -> list[str]:
        return [self.name(level) for level in self.levels]

    @property
    def subtree_columns(self) -> list[str]:
        """The columns every series of an independent subtree shares: those of every
        aggregate level (the segments have every column; none where there is a total or
        the levels cross)."""
        shared = set(self.levels[0])
        for level in self.levels[1:-1]:
            shared &= set(level)
        return [c for c in self.columns if c in shared]


def trained_config(config: JobConfig) -> JobConfig:
    """The job as training runs it: its segments are every level's series, keyed by
    ``level`` and every key column."""
    levels = Levels.of(config)
    hierarchy = config.forecast.hierarchy.model_copy(update={"segments": levels.bottom})
    forecast = config.forecast.model_copy(update={"hierarchy": hierarchy})
    return config.model_copy(update={"segment_by": [LEVEL_COLUMN, *levels.columns],
                                     "forecast": forecast})


def _keys_text(rows: list, columns: list[str]) -> str:
    return "; ".join(key_text(row, columns) for row in rows[:SHOWN])


def check_levels(df: DataFrame, config: JobConfig) -> None:
    """Refuse a hierarchy the data does not follow, naming the offending keys: a segment
    without a value of a level column, a segment with two values of one, and (strict
    hierarchies) a node under two parents."""
    from pyspark.sql import functions as F

    levels = Levels.of(config)
    bottom, extra = levels.bottom, levels.extra
    missing = df.where(F.greatest(*[F.col(c).isNull().cast("int") for c in levels.columns],
                                  F.lit(0)) == 1).select(*bottom).distinct().limit(SHOWN)
    found = missing.collect()
    if found:
        raise DataError(
            f"forecast.hierarchy: segment(s) with no value of a level column "
            f"({', '.join(levels.columns)}): {_keys_text(found, bottom)}. Every segment needs "
            "a value of every level's columns: fill them, or filter those rows out with "
            "source.where")
    if extra:
        counts = df.groupBy(*bottom).agg(*[F.countDistinct(c).alias(c) for c in extra])
        several = counts.where(F.greatest(*[F.col(c) for c in extra], F.lit(1)) > 1)
        found = several.limit(SHOWN).collect()
        if found:
            raise DataError(
                f"forecast.hierarchy: segment(s) with more than one value of a level column "
                f"({', '.join(extra)}): {_keys_text(found, bottom)}. A segment belongs to one "
                "node of each level: fix those rows, or add the column to segment_by")
    if levels.strict:
        _check_parents(df, levels)


def _check_parents(df: DataFrame, levels: Levels) -> None:
    """In a strict hierarchy, each node's own columns name it under one parent only."""
    from pyspark.sql import functions as F

    chain = [level for level in levels.levels[:-1] if level]
    for parent, child in zip(chain, chain[1:], strict=False):
        own = child[len(parent):]
        parents = df.groupBy(*own).agg(
            F.countDistinct(*parent).alias("parents"),
            F.sort_array(F.collect_set(F.struct(*parent))).alias("under"))
        found = parents.where(F.col("parents") > 1).limit(SHOWN).collect()
        if found:
            shown = "; ".join(
                f"{_keys_text([row], own)} is under "
                + " and ".join(_keys_text([u], parent) for u in row["under"][:3])
                for row in found)
            raise DataError(
                f"forecast.hierarchy: a node of level {level_name(child)} under more than "
                f"one {level_name(parent)}: {shown}. A strict hierarchy gives every node one "
                "parent: fix those rows, or, where ids repeat across parents by design, "
                "list the levels as grouped ones (e.g. [[" + ", ".join(parent) + "], ["
                + ", ".join(own) + "]]) with a min_trace or bottom_up method")


def with_aggregates(df: DataFrame, config: JobConfig) -> DataFrame:
    """The segments' rows and every aggregate series' (the sum of the segments' targets
    per date), keyed by ``level`` and every level's and segment's column (null where the
    level aggregates it), once ``check_levels`` passes."""
    from pyspark.sql import functions as F

    check_levels(df, config)
    levels = Levels.of(config)
    target, time = config.target, config.time_column
    types = {c: df.schema[c].dataType for c in levels.columns}

    def keyed(frame: DataFrame, level: list[str], kept: list[str]) -> DataFrame:
        return frame.select(
            F.lit(levels.name(level)).alias(LEVEL_COLUMN),
            *[(F.col(c) if c in kept else F.lit(None)).cast(types[c]).alias(c)
              for c in levels.columns],
            F.col(time), F.col(target).cast("double").alias(target))

    frames = [keyed(df, levels.bottom, levels.columns)]  # a segment has every column
    for level in levels.levels[:-1]:
        summed = df.groupBy(*level, time).agg(F.sum(target).alias(target))
        frames.append(keyed(summed, level, level))
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out
