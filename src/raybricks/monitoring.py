"""Per-segment monitoring of a registered model on realized outcomes: how each segment's
model does on rows it has now met, against what training promised.

``measure`` reads a table of outcomes (the segment columns, the actual target and either
the model's predictions or the features, which it then scores), joins each segment's
row of the model's index (its status and validation metric from training, its baseline's
and its ``profile``: ``raybricks.profiles``), lays the rows out by segment and, in Spark
tasks, writes one row per segment and period: the realized metric, the naive baseline's
realized metric on the same rows, the validation metric, feature drift (PSI) and a
status with its reason:

- ``degraded``: the realized error is significantly worse than the validation error
  (by more than ``Thresholds.tolerance``, and by a one-sided test where the metric is a
  mean of row losses), or the baseline beats the model on these rows (a paired test);
- ``drifted``: a feature's PSI is at least ``Thresholds.psi`` and a chi-square test says
  the shift is not noise;
- ``new``: a segment the model has never seen; ``silent``: a segment of the model with
  no row in the latest period; ``ok`` otherwise (also when too few rows to judge, said
  in the reason).

Forecasting models: each row's horizon step is its period's position after the series'
history; the realized metric is also given per step (``step_errors``).

No segment's numbers end the job: a validation error of 0 is judged by the same test
(any realized error is worse than it), a metric without a value (a missing validation,
r2 of a constant target) reads "n/a", rows without a prediction or an actual are
counted as unscored and said in the reason, and a segment the judge still fails on gets
a row saying it was not judged (``NOT_JUDGED``). ``summarize`` sums up the written table
for the report and the MLflow run, part by part: a part that fails is said, not fatal.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raybricks import console, metrics, profiles
from raybricks.errors import ConfigError, DataError
from raybricks.kinds.baseline import BaselineKind
from raybricks.segmented_model import (
    CLASSIFICATION,
    DEFAULT_CACHE_SEGMENTS,
    GLOBAL,
    default_global,
)

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

OK, DEGRADED, DRIFTED, NEW, SILENT = "ok", "degraded", "drifted", "new", "silent"
#: One segment's (or period's) rows as a task reads them: column name -> values.
Columns = dict[str, np.ndarray]
STATUSES = (OK, DEGRADED, DRIFTED, NEW, SILENT)
#: How the reason of a segment's period that monitoring failed to judge begins.
NOT_JUDGED = "not judged: monitoring failed on its rows"
#: Periods ``--period`` cuts outcomes into (Spark's ``date_trunc`` units).
PERIODS = ("day", "week", "month", "quarter", "year")
#: A metric that is the mean of its row losses, and the validation value's row-loss
#: mean (rmse: its square): what the one-sided test against validation compares.
ROW_LOSS_MEAN = {
    "mae": lambda v: v, "mase": lambda v: v, "smape": lambda v: v, "mape": lambda v: v,
    "rmse": lambda v: v * v, "logloss": lambda v: v, "accuracy": lambda v: 1.0 - v,
}


@dataclass(frozen=True)
class Thresholds:
    """When a segment's period is judged: at least ``min_rows`` scored rows (a forecast's
    horizon, if fewer); degraded
    when realized error is worse than validation by more than ``tolerance`` (a share)
    at significance ``alpha``, or the baseline is better at ``alpha``; drifted when a
    feature's PSI reaches ``psi`` at ``alpha`` (split over the features)."""

    min_rows: int = 10
    tolerance: float = 0.5
    alpha: float = 0.01
    psi: float = 0.25

    def __post_init__(self) -> None:
        if self.min_rows < 2 or self.tolerance < 0 or not 0 < self.alpha < 1 or self.psi <= 0:
            raise ConfigError(
                f"monitoring thresholds out of range: min_rows {self.min_rows} (>= 2), "
                f"tolerance {self.tolerance} (>= 0), alpha {self.alpha} (0..1), psi "
                f"{self.psi} (> 0)")


def output_schema(key_fields: list) -> Any:
    """The monitoring table's Spark schema: the segment columns, then what was measured."""
    from pyspark.sql import types as T

    double, text, count = T.DoubleType(), T.StringType(), T.LongType()
    return T.StructType([*key_fields, *[T.StructField(name, kind) for name, kind in (
        ("period", text), ("rows", count), ("scored_rows", count), ("metric", text),
        ("realized", double), ("baseline_realized", double), ("validation", double),
        ("validation_baseline", double), ("drift_psi", double), ("drift_feature", text),
        ("drift_p", double), ("feature_psi", text), ("step_errors", T.ArrayType(double)),
        ("model_status", text), ("status", text), ("reason", text),
        ("model_version", text))]])


# --------------------------------------------------------------------------- the tasks


@dataclass(frozen=True)
class Judge:
    """What a task needs to measure a segment's period: the model's manifest, the
    thresholds, the target and prediction columns."""

    manifest: dict
    thresholds: Thresholds
    target: str
    predictions: list[str]  # ``prediction``, or one probability column per class
    version: str | None

    @property
    def metric(self) -> metrics.Metric:
        return metrics.metric(self.manifest["metric"])

    def actual_and_predicted(self, rows: Columns) -> tuple[np.ndarray, np.ndarray,
                                                            np.ndarray, dict[str, int]]:
        """The rows with an actual and a prediction: their positions, actuals (class
        codes for classification) and predictions (a probability matrix); and how many
        rows were left out, by why (a missing, NaN or infinite prediction; then a
        missing actual, or a class the model does not know)."""
        import pandas as pd

        predicted = np.column_stack([profiles.floats(rows[c]) for c in self.predictions])
        has_prediction = np.isfinite(predicted).all(axis=1)
        if self.manifest["task"] in CLASSIFICATION:
            classes = self.manifest.get("classes") or []
            actual = pd.Index(classes).get_indexer(rows[self.target].astype(object))
            has_actual, no_actual = actual >= 0, "without an actual of the model's classes"
        else:
            actual = profiles.floats(rows[self.target])
            has_actual, no_actual = np.isfinite(actual), "without an actual (missing or NaN)"
        kept = np.flatnonzero(has_prediction & has_actual)
        left_out = {"without a prediction (missing or NaN)": int((~has_prediction).sum()),
                    no_actual: int((has_prediction & ~has_actual).sum())}
        if self.manifest["task"] in CLASSIFICATION:
            return kept, actual[kept], predicted[kept], left_out
        return kept, actual[kept], predicted[kept, 0], left_out

    def judge(self, columns: Columns) -> dict[str, Any]:
        """One segment's period (its rows: ``columns``, name -> values) measured and
        judged."""
        status_in_model = columns["_model_status"][0]
        profile = columns["_profile"][0]
        stored = json.loads(profile) if isinstance(profile, str) else None
        rows, y, predicted, left_out = self.actual_and_predicted(columns)
        steps = self.steps(columns, rows, stored)
        if steps is not None:  # forecasts: only the periods after the series' history
            kept = steps > 0
            rows, y, predicted, steps = rows[kept], y[kept], predicted[kept], steps[kept]
            left_out["outside the periods the model forecast"] = int((~kept).sum())
        found: dict[str, Any] = {
            "rows": len(columns[self.target]), "scored_rows": len(rows),
            "metric": self.metric.name, "validation": _number(columns["_validation"][0]),
            "validation_baseline": _number(columns["_validation_baseline"][0]),
            "model_status": status_in_model, "model_version": self.version,
            "realized": None, "baseline_realized": None, "drift_psi": None,
            "drift_feature": None, "drift_p": None, "feature_psi": None,
            "step_errors": None}
        baseline = self.naive(stored, len(rows), steps)
        if self.metric.scaled:  # MASE: errors in units of the series' in-sample error
            scale = _number((stored or {}).get("scale"))
            scale = scale if scale is not None and 0 < scale < np.inf else 1.0
            y, predicted = y / scale, predicted / scale
            baseline = None if baseline is None else baseline / scale
        if len(rows):
            found["realized"] = self.score(y, predicted)
            if baseline is not None:
                found["baseline_realized"] = self.score(y, baseline)
            if steps is not None:
                found["step_errors"] = [
                    self.score(y[steps == s], predicted[steps == s])
                    if (steps == s).any() else None
                    for s in range(1, self.manifest["forecast"]["horizon"] + 1)]
        drift = profiles.drifts(stored, columns) if stored else []
        if drift:
            found.update(drift_psi=drift[0].psi, drift_feature=drift[0].feature,
                         drift_p=drift[0].p_value, feature_psi=json.dumps(
                             {d.feature: round(d.psi, 4) for d in drift}))
        status, reason = self.verdict(found, status_in_model, y, predicted, baseline, drift,
                                      stored)
        unscored = [f"{n} row(s) {why}" for why, n in left_out.items() if n]
        found["status"] = status
        found["reason"] = reason + ("; unscored: " + ", ".join(unscored) if unscored else "")
        return found

    def judge_or_say(self, columns: Columns) -> dict[str, Any]:
        """``judge``; where a segment's rows make it fail (numbers nobody foresaw), that
        segment's row says so instead of the job ending for every segment: not judged
        (status ``ok``, as too few rows; ``new`` for a segment the model never saw),
        the error in its reason (``NOT_JUDGED``)."""
        try:
            return self.judge(columns)
        except Exception as exc:  # noqa: BLE001 - one segment's failure, said in its row
            status_in_model = columns["_model_status"][0]
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            try:
                validation = _number(columns["_validation"][0])
            except (TypeError, ValueError):
                validation = None
            return {
                "rows": len(columns[self.target]), "scored_rows": 0,
                "metric": self.metric.name, "validation": validation,
                "validation_baseline": None, "model_status": status_in_model,
                "model_version": self.version, "realized": None, "baseline_realized": None,
                "drift_psi": None, "drift_feature": None, "drift_p": None,
                "feature_psi": None, "step_errors": None,
                "status": NEW if status_in_model is None else OK,
                "reason": f"{NOT_JUDGED} ({type(exc).__name__}: {first})"}

    def score(self, y: np.ndarray, predicted: np.ndarray) -> float | None:
        """The metric (None where it has no value: NaN, as r2 of a constant target)."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return _number(self.metric.score(y, predicted))

    def steps(self, columns: Columns, rows: np.ndarray, stored: dict | None
              ) -> np.ndarray | None:
        """Forecasting: the horizon step of each of ``rows`` after the series' last
        trained period (0: not a period the model forecast); None for other tasks."""
        spec = self.manifest.get("forecast")
        if not spec:
            return None
        if not stored or "last" not in stored:
            return np.zeros(len(rows), dtype="int64")
        import pandas as pd

        from raybricks.kinds.forecasting import future_times

        last = stored["last"]
        steps = isinstance(last, int)
        future = future_times(spec["frequency"], last if steps else pd.Timestamp(last),
                              spec["answers"])
        known = np.asarray(future, dtype="int64" if steps else "datetime64[ns]").astype("int64")
        position = dict(zip(known.tolist(), range(1, len(known) + 1), strict=True))
        times = pd.Series(columns[spec["time_column"]][rows])
        if steps:
            values = times.astype("int64").tolist()
        else:
            times = pd.to_datetime(times)
            if getattr(times.dt, "tz", None) is not None:  # stored dates are UTC, naive
                times = times.dt.tz_convert("UTC").dt.tz_localize(None)
            values = times.to_numpy(dtype="datetime64[ns]").astype("int64").tolist()
        return np.array([position.get(v, 0) for v in values], dtype="int64")

    def naive(self, stored: dict | None, rows: int, steps: np.ndarray | None
              ) -> np.ndarray | None:
        """The naive baseline's predictions of the rows: the segment's stored constant
        (class frequencies), or for a series its last season's (value's) continuation."""
        if not stored or not stored.get("naive"):
            return None
        naive = np.asarray(stored["naive"], dtype="float64")
        if steps is not None:
            return naive[(steps - 1) % len(naive)]
        return BaselineKind.constant(naive, rows, self.manifest["task"])

    def verdict(self, found: dict[str, Any], status_in_model: str | None, y: np.ndarray,
                predicted: np.ndarray, baseline: np.ndarray | None,
                drift: list[profiles.Drift], stored: dict | None = None) -> tuple[str, str]:
        """The period's status and why."""
        if status_in_model is None:
            return NEW, "not in the model: training never saw this segment"
        limits, metric = self.thresholds, self.metric
        name, scored = metric.name, found["scored_rows"]
        fewest = limits.min_rows
        if self.manifest.get("forecast"):  # a series' period has at most its horizon
            fewest = min(fewest, max(2, self.manifest["forecast"]["horizon"]))
        if scored < fewest:
            return OK, f"{scored} scored row(s): too few to judge (min_rows {fewest})"
        reasons, status = [], OK
        realized, validation = found["realized"], found["validation"]
        if self.worse_than_validation(realized, validation, y, predicted,
                                      (stored or {}).get("validation_rows")):
            status = DEGRADED
            reasons.append(f"realized {name} {_text(realized)} against {_text(validation)} "
                           f"in validation ({_change(realized, validation)})")
        if baseline is not None and metric.clearly_better(
                y, baseline, predicted, _z(limits.alpha)):
            status = DEGRADED
            reasons.append(f"the naive baseline does better on these {scored} rows "
                           f"({name} {_text(found['baseline_realized'])} against "
                           f"{_text(realized)})")
        level = limits.alpha / max(len(drift), 1)  # every feature is a test
        moved = [d for d in drift if d.psi >= limits.psi and d.p_value < level]
        if moved:
            status = DRIFTED if status == OK else status
            reasons.append("drifted: " + ", ".join(
                f"{d.feature} (PSI {d.psi:.2f}, p {d.p_value:.1g})" for d in moved[:3])
                + (f" and {len(moved) - 3} more" if len(moved) > 3 else ""))
        if status == OK:
            reasons.append(f"realized {name} {_text(realized)}, validation "
                           f"{_text(validation)}" + (f", largest PSI {drift[0].psi:.2f} "
                                                     f"({drift[0].feature})" if drift else ""))
        return status, "; ".join(reasons)

    def worse_than_validation(self, realized: float | None, validation: float | None,
                              y: np.ndarray, predicted: np.ndarray,
                              validation_rows: int | None) -> bool:
        """Realized worse than validation by more than the tolerance and, for a metric
        that is a mean of row losses, by a one-sided two-sample test of the mean row
        loss (the validation mean measured on ``validation_rows`` rows, with the spread
        of the realized rows' losses: a validation on few rows is noisy too)."""
        metric, limits = self.metric, self.thresholds
        if realized is None or validation is None or metric.signed:
            return False
        worse = metric.loss(realized) - metric.loss(validation)
        if worse <= limits.tolerance * abs(metric.loss(validation)) + metrics.EPS:
            return False
        expected = ROW_LOSS_MEAN.get(metric.name)
        if expected is None:
            return True
        losses = metric.row_loss(y, predicted)
        losses = losses[np.isfinite(losses)]
        if len(losses) < 2:
            return False
        spread = 1 / len(losses) + (1 / validation_rows if validation_rows else 0.0)
        error = float(losses.std(ddof=1)) * np.sqrt(spread)
        return float(losses.mean()) - expected(validation) > _z(limits.alpha) * error


def _number(value: Any) -> float | None:
    return None if value is None or value != value else float(value)


def _text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _change(realized: float, validation: float) -> str:
    """How much worse ``realized`` is, as a share of ``validation`` (0: no share)."""
    if not validation or not np.isfinite(validation) or not np.isfinite(realized):
        return "worse" if validation else "worse than a perfect validation"
    return f"{abs(realized - validation) / abs(validation):.0%} worse"


@functools.lru_cache(maxsize=8)
def _z(alpha: float) -> float:
    """The one-sided normal quantile of ``alpha`` (remembered: asked once per segment)."""
    from scipy.stats import norm

    return float(norm.isf(alpha))


def realized_over_validation() -> Any:
    """The monitoring table's realized over validation error as a Spark column, safe
    under ANSI mode (where a division by zero fails the query): infinite where the
    validation error is 0 and the realized one positive (worse than a perfect
    validation), 1 where both are 0, null where either is missing."""
    from pyspark.sql import functions as F

    realized, validation = F.col("realized"), F.col("validation")
    return F.when(validation == 0, F.when(realized == 0, F.lit(1.0)).when(
        realized > 0, F.lit(float("inf")))).otherwise(F.try_divide(realized, validation))


def by_period(segment: Columns) -> list[tuple[str | None, Columns]]:
    """A segment's rows split by their ``_period`` (None: rows without a time)."""
    periods = segment["_period"]
    missing = np.array([p is None for p in periods], dtype=bool)
    text = np.where(missing, "", periods.astype(str))
    found = []
    for period in np.unique(text):
        chosen = text == period
        found.append((None if period == "" else str(period),
                      {c: a[chosen] for c, a in segment.items()}))
    return found


def measure_partitions(judge: Judge, segment_by: list[str], has_period: bool):
    """The mapInPandas function: the rows arrive laid out by segment (a segment's rows
    consecutive, possibly over several batches); each segment's periods are judged
    once all its rows are in."""
    import pandas as pd

    columns = [*segment_by, "period", *[f.name for f in output_schema([]).fields]]

    def segment_codes(frame: pd.DataFrame) -> np.ndarray:
        return frame[segment_by].groupby(segment_by, dropna=False, sort=False
                                         ).ngroup().to_numpy()

    def judged(frame: pd.DataFrame, codes: np.ndarray) -> pd.DataFrame:
        """Every segment (and period) of ``frame``, whose segments are consecutive runs
        of rows (``codes``: each row's segment): its columns as arrays once, each
        segment's a slice of them."""
        out = []
        arrays = {c: frame[c].to_numpy() for c in frame.columns}
        starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        for start, end in zip(starts, [*starts[1:], len(codes)], strict=True):
            keys = {k: arrays[k][start] for k in segment_by}
            segment = {c: a[start:end] for c, a in arrays.items()}
            for period, rows in (by_period(segment) if has_period else [(None, segment)]):
                out.append({**keys, "period": period, **judge.judge_or_say(rows)})
        return pd.DataFrame(out, columns=list(dict.fromkeys(columns)))

    def measure(batches):
        carry = None
        for batch in batches:
            frame = batch if carry is None else pd.concat([carry, batch], ignore_index=True)
            if not len(frame):
                continue
            codes = segment_codes(frame)
            last = int(np.argmax(codes == codes[-1]))  # where the last segment starts
            carry = frame.iloc[last:].reset_index(drop=True)
            if last:
                yield judged(frame.iloc[:last], codes[:last])
        if carry is not None and len(carry):
            yield judged(carry, segment_codes(carry))

    return measure


# --------------------------------------------------------------------------- the job


@dataclass
class Measured:
    """What ``measure`` produced: the monitoring table (lazy, or where it was written),
    the latest period (None: one period, every row) and the model's version."""

    table: DataFrame
    latest: str | None
    version: str | None
    segment_by: list[str]
    metric: str
    forecast: bool
    #: The model's index (segment columns, ``global``, ``chosen``), read by executors.
    index: DataFrame | None = None
    #: The global model unseen keys answer with (None: the model has none).
    default_global: str | None = None
    thresholds: Thresholds = Thresholds()


def index_frame(spark: SparkSession, archive: str, directory: Path, columns: list[str]
                ) -> DataFrame:
    """The model's index (``columns``) as a Spark DataFrame read by the executors from
    the shipped archive, its row groups spread over the tasks (the driver reads only its
    footer)."""
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import from_arrow_type

    from raybricks.segmented_model import INDEX

    schema = pq.read_schema(directory / INDEX)
    groups = pq.ParquetFile(directory / INDEX).metadata.num_row_groups
    present = [c for c in columns if c in schema.names]
    spark_schema = T.StructType([T.StructField(c, from_arrow_type(schema.field(c).type), True)
                                 for c in present])

    def read(batches):
        from pyspark import SparkFiles

        from raybricks.scoring import unpacked

        shipped = unpacked(Path(SparkFiles.get(archive)).resolve()) / INDEX
        file = pq.ParquetFile(shipped)
        for batch in batches:
            for group in batch["id"].tolist():
                yield file.read_row_group(int(group), columns=present).to_pandas()

    from raybricks.session import is_spark_connect

    parallel = groups if is_spark_connect(spark) else spark.sparkContext.defaultParallelism
    slices = max(1, min(groups, parallel))
    frame = spark.range(groups, numPartitions=slices).mapInPandas(read, spark_schema)
    for column in columns:
        if column not in present:  # a model from before profiles
            frame = frame.withColumn(column, F.lit(None).cast("string"))
    return frame


def prediction_columns(manifest: dict, columns: list[str]) -> tuple[list[str], bool]:
    """The outcome columns that hold the model's predictions, and whether they are there
    (else monitoring scores the rows)."""
    if manifest["task"] in CLASSIFICATION:
        wanted = [f"probability_{c}" for c in manifest.get("classes") or []]
        if "prediction" in columns and not all(c in columns for c in wanted):
            raise DataError(
                "the outcomes have a 'prediction' column but not the class probabilities "
                f"{wanted}: monitoring a classifier needs them (score with --probabilities)"
                ", or drop 'prediction' and raybricks scores the rows")
    else:
        wanted = ["prediction"]
    return wanted, all(c in columns for c in wanted)


def measure(model_uri: str, outcomes: str | DataFrame, spark: SparkSession, *,
            period: str | None = None, time_column: str | None = None,
            target: str | None = None, thresholds: Thresholds | None = None,
            partitions: int | None = None) -> Measured:
    """The monitoring table of ``outcomes`` (a table, path or DataFrame) under the model
    at ``model_uri`` (lazy: one Spark job when written)."""
    from pyspark.sql import functions as F

    from raybricks.data import lay_out_by_segment
    from raybricks.scoring import _score, fetch_model, key_types, model_version_of, ship_segments
    from raybricks.sources import join_on_segments, read_source, source_of

    start = time.perf_counter()  # the scoring summary's clock
    thresholds = thresholds or Thresholds()
    with console.stage("model", says=f"model: {model_uri} from the registry"):
        local, manifest = fetch_model(model_uri)
    directory = local / "artifacts" / "segments"
    segment_by, spec = manifest["segment_by"], manifest.get("forecast")
    target = target or manifest.get("target")
    if not target:
        raise ConfigError(f"{model_uri} does not record its target column (trained before "
                          "raybricks 0.x recorded it): pass --target")
    df = outcomes if not isinstance(outcomes, str) else read_source(source_of(outcomes), spark)
    missing = [c for c in [*segment_by, target] if c not in df.columns]
    if missing:
        raise DataError(f"the outcomes lack column(s) {missing}: monitoring needs the "
                        f"segment columns {segment_by} and the actual target {target!r}")
    time_column = time_column or (spec or {}).get("time_column") or manifest.get("time_column")
    if period is not None:
        if period not in PERIODS:
            raise ConfigError(f"period {period!r}: use one of {', '.join(PERIODS)}")
        if not time_column or time_column not in df.columns:
            raise DataError(f"period {period!r} needs the outcomes' time column "
                            f"({time_column!r} not found): pass --time-column")
        kind = df.schema[time_column].dataType
        if kind.typeName() not in ("date", "timestamp", "timestamp_ntz", "string"):
            raise DataError(f"period {period!r} cuts the outcomes by the dates of "
                            f"{time_column!r}, which holds {kind.simpleString()} values: "
                            "give a date or timestamp column (--time-column), or leave "
                            "out --period")
    predictions, predicted = prediction_columns(manifest, df.columns)
    version = model_version_of(model_uri)
    archive = ship_segments(spark, directory)
    index = index_frame(spark, archive, directory,
                        [*segment_by, "status", "metric", "baseline", "profile", GLOBAL,
                         "chosen"])
    latest = None
    if period is not None:  # on the outcomes alone: no join for the latest period
        df = df.withColumn("_period", F.date_format(F.date_trunc(period, F.col(time_column)),
                                                    "yyyy-MM-dd"))
        latest = df.agg(F.max("_period")).first()[0]
    stored = index.select(*segment_by, F.col("status").alias("_model_status"),
                          F.col("metric").alias("_validation"),
                          F.col("baseline").alias("_validation_baseline"),
                          F.col("profile").alias("_profile"))
    joined = join_on_segments(df, stored, segment_by, "left")
    if predicted:
        laid = lay_out_by_segment(joined, segment_by, partitions)
    else:
        laid = _score(model_uri, local, manifest, joined, None, spark,
                      manifest["task"] in CLASSIFICATION, DEFAULT_CACHE_SEGMENTS,
                      partitions, start)
    judge = Judge(manifest, thresholds, target, predictions, version)
    keys = key_types(directory, segment_by)
    measured = laid.mapInPandas(measure_partitions(judge, segment_by, period is not None),
                                output_schema(keys))
    silent = silent_segments(index, df, segment_by, latest, manifest, version, keys)
    return Measured(measured.unionByName(silent), latest, version, segment_by,
                    manifest["metric"], bool(spec), index, default_global(manifest),
                    thresholds)


def silent_segments(index: DataFrame, outcomes: DataFrame, segment_by: list[str],
                    latest: str | None, manifest: dict, version: str | None, keys: list
                    ) -> DataFrame:
    """The model's segments without a row in the latest period (every row, without
    periods) of ``outcomes``, as monitoring rows of status ``silent`` (the reason: the
    last period they had rows in, if any)."""
    from pyspark.sql import functions as F

    from raybricks.sources import join_on_segments

    seen = outcomes.groupBy(*segment_by).agg(
        (F.max("_period") if latest is not None else F.lit(None).cast("string"))
        .alias("_last_seen"), F.lit(True).alias("_seen"))
    both = join_on_segments(index, seen, segment_by, "left")
    quiet = ~F.coalesce(F.col("_seen"), F.lit(False))
    if latest is not None:  # rows without a time (no period) are not in the latest one
        quiet = quiet | F.coalesce(F.col("_last_seen") < F.lit(latest), F.lit(True))
    why = F.when(F.col("_last_seen").isNotNull(),
                 F.concat(F.lit(f"no rows in the latest period {latest}; last rows in "),
                          F.col("_last_seen"))).when(
        F.col("_seen"), F.lit(f"no rows in the latest period {latest}; its rows have no "
                              "time (no period)")).otherwise(
        F.lit("no rows in the outcomes" + (f" (latest period {latest})" if latest else "")))
    schema = output_schema(keys)
    values = {"period": F.lit(latest).cast("string"), "rows": F.lit(0).cast("long"),
              "scored_rows": F.lit(0).cast("long"), "metric": F.lit(manifest["metric"]),
              "validation": F.col("metric"), "validation_baseline": F.col("baseline"),
              "model_status": F.col("status"), "status": F.lit(SILENT), "reason": why,
              "model_version": F.lit(version).cast("string")}
    columns = [F.col(k) for k in segment_by] + [
        values.get(f.name, F.lit(None).cast(f.dataType)).alias(f.name)
        for f in schema.fields[len(segment_by):]]
    return both.where(quiet).select(*columns)


# --------------------------------------------------------------------------- the summary

#: How many segments the monitoring run's plot samples, and how many worst it lists.
SAMPLE, WORST = 20_000, 50


@dataclass
class Summary:
    """The written monitoring table summed up for the report and the MLflow run (its
    latest period): counts by status, the distribution of realized against validation
    error, a sample of segments for the plot, the worst degraded segments and, for a
    forecasting model, the mean realized error per horizon step. A part that could not
    be made is empty (None) and said in ``problems``."""

    counts: dict[str, int]
    distribution: dict[str, float]
    sample: pd.DataFrame | None
    worst: pd.DataFrame | None
    steps: pd.DataFrame | None
    problems: list[str]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def summarize(measured: Measured, output: str, spark: SparkSession) -> Summary:
    """``Summary`` of the monitoring table written at ``output``. Each part is one Spark
    job, made on its own: the table is written, and a part that fails is said in the
    summary's problems (and the run's) rather than ending the job without a run."""
    from pyspark.sql import functions as F

    from raybricks.sources import read_source, source_of
    from raybricks.tracking.monitoring import failure

    problems: list[str] = []

    def attempt(what: str, make, empty=None):
        try:
            return make()
        except Exception as exc:  # noqa: BLE001 - said, and the run still logs the rest
            problems.append(failure(f"summing up {what}", exc))
            log.warning("%s (the monitoring table %s is written)", problems[-1], output)
            return empty

    written = attempt("the table", lambda: read_source(source_of(output), spark))
    if written is None:
        return Summary({}, {}, None, None, None, problems)
    current = written if measured.latest is None else written.where(
        F.col("period") == measured.latest)
    by_status = attempt("the counts by status", lambda: current.groupBy("status").agg(
        F.count(F.lit(1)).alias("count"), F.sum(F.col("reason").startswith(
            NOT_JUDGED).cast("long")).alias("not_judged")).collect(), [])
    counts = {r["status"]: int(r["count"]) for r in by_status}
    not_judged = sum(int(r["not_judged"] or 0) for r in by_status)
    if not_judged:
        log.warning("%d segment(s) not judged: monitoring failed on their rows (their "
                    "reason in %s says how)", not_judged, output)
    label = F.concat_ws("/", *[F.coalesce(F.col(k).cast("string"), F.lit("null"))
                               for k in measured.segment_by]).alias("segment")

    def sample() -> pd.DataFrame:
        shown = current.select(label, "realized", "validation", "baseline_realized",
                               "status").where(F.col("status") != SILENT)
        total = sum(counts.values())
        if total > SAMPLE:
            shown = shown.sample(fraction=SAMPLE / total, seed=0)
        return shown.toPandas()

    def worst() -> pd.DataFrame:
        return (current.where(F.col("status") == DEGRADED)
                .withColumn("ratio", realized_over_validation())
                .orderBy(worst_first(F.col("ratio"), measured.metric)).limit(WORST)
                .select(label, "realized", "validation", "reason").toPandas())

    def steps() -> pd.DataFrame:
        found = (current.select(F.posexplode("step_errors").alias("position", "error"))
                 .where(F.col("error").isNotNull()).groupBy("position")
                 .agg(F.avg("error").alias("mean"), F.count("error").alias("series"))
                 .orderBy("position").toPandas())
        found.insert(0, "step", found.pop("position") + 1)
        return found

    distribution = attempt("realized against validation",
                           lambda: realized_against_validation(current, measured.metric),
                           {})
    if not_judged:
        distribution["segments_not_judged"] = float(not_judged)
    return Summary(
        counts, distribution,
        attempt("the plot's sample", sample), attempt("the worst segments", worst),
        attempt("the error per horizon step", steps) if measured.forecast else None,
        problems)


def worst_first(ratio: Any, metric: str) -> Any:
    """The order of realized over validation error that puts the most worsened first:
    the largest ratio for an error, the smallest for a score (auc, r2, accuracy)."""
    better_high = metrics.metric(metric).greater_is_better
    return ratio.asc_nulls_last() if better_high else ratio.desc_nulls_last()


def realized_against_validation(current: DataFrame, metric: str = "rmse"
                                ) -> dict[str, float]:
    """The distribution of realized against validation error over the segments with
    both (one Spark job): medians of each, quartiles of their ratio, and the share of
    segments doing worse than in validation (by the metric's direction: the ratio's).
    A validation error of 0 has no ratio: those segments are left out."""
    from pyspark.sql import functions as F

    both = current.where(F.col("realized").isNotNull() & F.col("validation").isNotNull()
                         & (F.col("validation") != 0))
    ratio = F.try_divide(F.col("realized"), F.col("validation"))
    found = both.agg(
        F.count(F.lit(1)).alias("n"),
        F.percentile_approx("realized", 0.5).alias("realized_median"),
        F.percentile_approx("validation", 0.5).alias("validation_median"),
        F.percentile_approx(ratio, [0.25, 0.5, 0.75, 0.9]).alias("ratio"),
        F.avg((ratio < 1 if metrics.metric(metric).greater_is_better else ratio > 1)
              .cast("double")).alias("share_above_validation")).first()
    if not found or not found["n"]:
        return {}
    quartiles = dict(zip(("p25", "p50", "p75", "p90"), found["ratio"], strict=True))
    return {"realized_median": found["realized_median"],
            "validation_median": found["validation_median"],
            "share_realized_above_validation": found["share_above_validation"],
            **{f"realized_over_validation_{k}": v for k, v in quartiles.items()}}


# --------------------------------------------------------------------------- global models

#: The monitoring table of the global models, beside the segments' (``global_output``).
GLOBAL_COLUMNS = ("global_model", "period", "segments_alone", "segments_skipped",
                  "segments_new", "segments_blended", "scored_rows", "metric", "realized",
                  "validation", "segments_worse", "segments_judged", "status", "reason",
                  "model_version")
#: ``chosen`` of a segment the global model serves alone.
GLOBAL_ALONE = json.dumps(["global"])


def global_health(measured: Measured, written: DataFrame) -> pd.DataFrame:
    """Per global model and period, how it does on the segments it serves: alone
    (chosen over their local models), as the fallback of skipped or failed segments,
    and for keys the model never saw; the segments it is blended into are counted.
    ``realized`` pools the realized error of those rows (weighted by their scored rows),
    ``validation`` the validation error of the trained segments it serves alone; the
    status is ``degraded`` when the realized error is worse by more than the tolerance
    and, by a one-sided sign test at ``alpha``, more of its judged segments got worse
    than validation than chance would make; else ``ok``."""
    import pandas as pd
    from pyspark.sql import functions as F

    from raybricks.sources import join_on_segments

    columns = list(GLOBAL_COLUMNS)
    # a version without a default global model holds none (a merge keeps a default
    # wherever either model had one)
    if measured.index is None or measured.default_global is None:
        return pd.DataFrame(columns=columns)
    refs = measured.index.select(*measured.segment_by, F.col(GLOBAL).alias("_global"),
                                 F.col("chosen").alias("_chosen"))
    rows = join_on_segments(written.where(F.col("status") != SILENT), refs,
                            measured.segment_by, "left")
    trained = F.coalesce(F.col("model_status") == "trained", F.lit(False))
    alone = ~trained | (F.col("_chosen") == GLOBAL_ALONE)
    metric = metrics.metric(measured.metric)
    rmse = metric.name == "rmse"

    def pooled(column: str, where: Any) -> Any:
        value = F.col(column) * F.col(column) if rmse else F.col(column)
        usable = where & F.col(column).isNotNull() & ~F.isnan(F.col(column))
        weight = F.when(usable, F.col("scored_rows").cast("double"))
        mean = F.try_divide(F.sum(F.when(usable, value * F.col("scored_rows"))),
                            F.sum(weight))
        return F.sqrt(mean) if rmse else mean

    judged = alone & trained & F.col("realized").isNotNull() & F.col(
        "validation").isNotNull() & (F.col("scored_rows") >= measured.thresholds.min_rows)
    worse = (F.col("realized") < F.col("validation")) if metric.greater_is_better else (
        F.abs(F.col("realized")) > F.abs(F.col("validation")) if metric.signed
        else F.col("realized") > F.col("validation"))
    found = (rows.withColumn("global_model", F.coalesce(
        F.col("_global"), F.lit(measured.default_global)))
        .where(F.col("global_model").isNotNull())
        .groupBy("global_model", "period").agg(
            F.sum((alone & trained).cast("long")).alias("segments_alone"),
            F.sum((F.col("model_status").isin("skipped", "failed")).cast("long"))
            .alias("segments_skipped"),
            F.sum(F.col("model_status").isNull().cast("long")).alias("segments_new"),
            F.sum((~alone & F.coalesce(F.col("_chosen").contains('"global"'),
                                       F.lit(False))).cast("long"))
            .alias("segments_blended"),
            F.sum(F.when(alone, F.col("scored_rows")).otherwise(0)).alias("scored_rows"),
            pooled("realized", alone).alias("realized"),
            pooled("validation", alone & trained).alias("validation"),
            F.sum((judged & worse).cast("long")).alias("segments_worse"),
            F.sum(judged.cast("long")).alias("segments_judged"))
        .toPandas())
    verdicts = [global_verdict(row, metric, measured.thresholds)
                for row in found.to_dict("records")]
    found["metric"] = metric.name
    found["status"] = [status for status, _ in verdicts]
    found["reason"] = [reason for _, reason in verdicts]
    found["model_version"] = measured.version
    return found[columns]


def global_verdict(row: dict[str, Any], metric: metrics.Metric, limits: Thresholds
                   ) -> tuple[str, str]:
    """A global model's status in a period, and why (``global_health``)."""
    from scipy.stats import binom

    realized, validation = _number(row["realized"]), _number(row["validation"])
    served = (f"serves {row['segments_alone']} segment(s) alone, "
              f"{row['segments_skipped']} skipped, {row['segments_new']} unseen; blended "
              f"into {row['segments_blended']}")
    judged, worse = int(row["segments_judged"] or 0), int(row["segments_worse"] or 0)
    if realized is None or validation is None or not judged:
        return OK, f"{served}: too few scored rows of trained segments to judge"
    far = (metric.loss(realized) - metric.loss(validation)
           > limits.tolerance * abs(metric.loss(validation)) + metrics.EPS)
    chance = float(binom.sf(worse - 1, judged, 0.5))  # P(at least this many worse)
    said = (f"{served}: realized {metric.name} {_text(realized)} against "
            f"{_text(validation)} in validation; {worse} of {judged} judged segments worse "
            f"than their validation")
    if far and chance < limits.alpha:
        return DEGRADED, f"{said} ({_change(realized, validation)}; p {chance:.1g})"
    return OK, said


def global_frame(spark: SparkSession, found: pd.DataFrame) -> DataFrame:
    """``global_health``'s rows as a Spark DataFrame (typed: they may be empty)."""
    from pyspark.sql import types as T

    count, double, text = T.LongType(), T.DoubleType(), T.StringType()
    kinds = {"realized": double, "validation": double, "metric": text, "status": text,
             "reason": text, "model_version": text, "global_model": text, "period": text}
    schema = T.StructType([T.StructField(c, kinds.get(c, count)) for c in GLOBAL_COLUMNS])
    rows = [tuple(None if v is None or (isinstance(v, float) and v != v) else
                  (int(v) if kinds.get(c, count) == count else
                   float(v) if kinds.get(c) == double else str(v))
                  for c, v in zip(GLOBAL_COLUMNS, row, strict=True))
            for row in found[list(GLOBAL_COLUMNS)].itertuples(index=False)]
    return spark.createDataFrame(rows, schema)
