"""The verbs end to end: ``train`` reads the source, starts Ray, converts, trains,
then logs the run and registers the model in MLflow (on the driver, after Ray stops).

Everything that can be checked without a cluster (the config, importable estimators,
the registry name, the source's existence, columns and types, a target that is not
entirely missing) is checked before Ray starts. At the end the job reconciles its result
with the source (every distinct segment of the source has exactly one result row) and
fails loudly, before anything is registered, when they disagree.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from raybricks import console, hierarchy, kinds, monitoring
from raybricks.cluster import ray_cluster
from raybricks.compat import arrow_schema
from raybricks.config import JobConfig
from raybricks.console import stage
from raybricks.data import (
    SegmentSizes,
    no_rows,
    segment_sizes,
    select_and_filter,
    to_ray_dataset,
)
from raybricks.errors import (
    ConfigError,
    DataError,
    RaybricksError,
    SourceNotFound,
    first_line,
    key_text,
)
from raybricks.files import SegmentFiles, is_template
from raybricks.kinds.forecasting import ForecastSpec
from raybricks.results import release_memory
from raybricks.session import require_spark_context
from raybricks.sources import only_segments, read_source, segment_files
from raybricks.training import TrainingResult, train_segments
from raybricks.training.blocks import RayBlocks
from raybricks.training.engine import with_run_id
from raybricks.training.on_spark import spark_segments
from raybricks.training.plan import GivenGlobal
from raybricks.training.tasks import make_plan, task_of

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Future

    from pyspark.sql import DataFrame, SparkSession

    from raybricks.scoring import ScoreSummary
    from raybricks.tracking import Publication

log = logging.getLogger(__name__)
T = TypeVar("T")
#: How many segments' dates ``check_frequency`` reads.
FREQUENCY_SEGMENTS = 5
#: The run's log (in its directory): raybricks' and the libraries' logging and warnings.
LOG_FILE = "raybricks.log"


class AccountingError(RaybricksError):
    """The result does not hold exactly one row per distinct segment of the source."""


def check_target(df: DataFrame, target: str, where: str | None,
                 segments: str | None = None) -> int:
    """Refuse a source without rows, or whose target is missing (null, NaN or infinite)
    in every row; returns its number of rows (one Spark job counts both). ``segments``:
    the source was cut to the segments listed there (``source.segments``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType

    column = F.col(target)
    usable = column.isNotNull()
    if isinstance(df.schema[target].dataType, DoubleType | FloatType):
        usable &= ~F.isnan(column) & (F.abs(column) != float("inf"))
    rows, with_target = df.agg(F.count(F.lit(1)), F.count(F.when(usable, True))).first()
    if not rows and segments is not None:
        raise DataError(f"nothing to train on: none of the segments listed in "
                        f"source.segments {segments!r} has rows in the source"
                        + (f" matching where={where!r}" if where else ""))
    if not rows:
        raise no_rows(where)
    if not with_target:
        which = f"row matching where={where!r}" if where else "row of the source"
        raise DataError(
            f"target {target!r} is null (or NaN / infinite) in every {which}: nothing to "
            "train on; check the target column name and the source"
        )
    return int(rows)


def check_job(config: JobConfig, *, register: bool = True) -> None:
    """What needs neither Ray nor the data: every candidate's kind can build its model
    (its library imports, its parameters are accepted) and the registry name fits the
    registry."""
    from raybricks import tracking

    for candidate in config.models:
        task_of(config).kind(candidate).check()
    if config.forecast is not None:
        check_forecasters(config)
    if hierarchical(config):
        from raybricks.reconciliation import check_installed

        check_installed()
    if register:
        tracking.check_registry_name(config, tracking.tracking_target().registry_uri)
    elif forecast_output(config):
        raise ConfigError("forecast.output writes the forecasts of the model the job logs "
                          "to MLflow: train with register=True, or leave output out")


def check_forecasters(config: JobConfig) -> None:
    """The candidates' ``check_forecast_config`` again, now that their ``check`` has
    fetched what some of them read (a hub id's weights: whether its model takes
    exogenous columns)."""
    for candidate in config.models:
        try:
            kinds.forecaster_kind(candidate.kind).check_forecast_config(candidate,
                                                                        config.forecast)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def forecast_output(config: JobConfig) -> str | None:
    """Where the job writes every series' forecasts (``forecast.output``), if anywhere."""
    return config.forecast.output if config.forecast is not None else None


def read_columns(config: JobConfig, source: DataFrame) -> DataFrame:
    """The source's columns that training reads, ``where`` applied."""
    features = config.features or ([*config.forecast.exogenous, *config.forecast.static,
                                     *hierarchy_columns(config)]
                                    if config.forecast else None)
    columns = list(dict.fromkeys(
        (features or []) + [config.target]
        + ([config.time_column] if config.time_column else [])
    )) if features is not None else None
    return select_and_filter(source, config.segment_by, columns, config.source.where)


def checked_source(config: JobConfig, source: DataFrame) -> tuple[DataFrame, int]:
    """The source as training reads it (its columns, ``where`` applied) and its number of
    rows, once its columns and types fit the config and its target is not missing in
    every row."""
    df = read_columns(config, source)
    plan = make_plan(config, arrow_schema(df.schema))  # column and type errors
    if config.source.segments is not None:
        df = only_segments(df, config.source.segments, config.segment_by,
                           statuses=config.source.statuses)
    rows = check_target(df, config.target, config.source.where, config.source.segments)
    if plan.forecast:
        check_frequency(df, config, plan.forecast)
    return df, rows


def hierarchical(config: JobConfig) -> bool:
    """Task forecast with ``forecast.hierarchy``."""
    return config.forecast is not None and config.forecast.hierarchy is not None


def hierarchy_columns(config: JobConfig) -> list[str]:
    """The hierarchy's level columns that are not segment columns."""
    return hierarchy.Levels.of(config).extra if hierarchical(config) else []


def check_frequency(df: DataFrame, config: JobConfig, spec: ForecastSpec) -> None:
    """Refuse a forecast whose frequency fits the dates of none of a few segments (the
    first ``FREQUENCY_SEGMENTS`` met in the source), which training would all skip."""
    from functools import reduce

    from pyspark.sql import functions as F

    from raybricks.kinds.forecasting import times_of
    from raybricks.training.forecast.series import frequency_problem

    keys, time = config.segment_by, config.time_column
    first = df.select(*keys).limit(FREQUENCY_SEGMENTS * 100).distinct().limit(
        FREQUENCY_SEGMENTS).collect()
    if not first:
        return
    chosen = reduce(lambda a, b: a | b, [
        reduce(lambda a, b: a & b, [F.col(k).eqNullSafe(row[k]) for k in keys])
        for row in first])
    rows = df.where(chosen & F.col(time).isNotNull()).select(*keys, time).toPandas()
    times = {key if isinstance(key, tuple) else (key,): times_of(group[time], spec.frequency)
             for key, group in rows.groupby(keys, dropna=False)}
    problem = frequency_problem(times, spec)
    if problem:
        raise ConfigError(problem)


#: How a policy of ``forecast.duplicates`` treats a series' dates with several rows.
DUPLICATES_POLICY = {
    "sum": "adds each such date's targets into one value",
    "mean": "averages each such date's targets",
    "last": "keeps each such date's last row",
    "skip": "skips those series (set forecast.duplicates: sum, mean or last to keep them)",
}


def duplicate_dates(df: DataFrame, config: JobConfig) -> str:
    """Task forecast: which series of the source (as training reads it) have dates with
    more than one row (how many series, of how many; how many such dates; the first
    such series and date), and what ``forecast.duplicates`` will do with them. One
    Spark job."""
    from pyspark.sql import functions as F

    keys, time = config.segment_by, config.time_column
    per_date = df.where(F.col(time).isNotNull()).groupBy(*keys, time).agg(
        F.count(F.lit(1)).alias("rows"))
    repeated = F.col("rows") > 1
    per_series = per_date.groupBy(*keys).agg(
        F.count(F.when(repeated, True)).alias("dates"),
        F.min(F.when(repeated, F.col(time))).alias("first"))
    has = F.col("dates") > 0
    found = per_series.agg(
        F.count(F.lit(1)).alias("total"), F.count(F.when(has, True)).alias("series"),
        F.sum("dates").alias("dates"),
        F.min(F.when(has, F.struct(*[F.col(k) for k in keys], F.col("first"))))
        .alias("example")).first()
    policy = config.forecast.duplicates
    if not found or not found["series"]:
        return "duplicate dates: none (every series has one row per date)"
    example = found["example"]
    key = key_text(example, keys)
    return (f"duplicate dates: {found['series']} of {found['total']} series have dates with "
            f"more than one row ({found['dates']} such date(s) in all; e.g. {key} on "
            f"{example['first']}); forecast.duplicates: {policy} "
            f"{DUPLICATES_POLICY[policy]}")


@dataclass(frozen=True)
class Validation:
    """What ``validate`` found: the config (with its defaults resolved) is valid, and the
    source was checked (``source_columns``) or why not (``unchecked``); ``findings``:
    what the source holds that training will act on (task forecast: duplicate dates);
    ``timings``: the wall seconds of its stages and ``other``, adding up to ``seconds``."""

    config: JobConfig
    source_columns: list[str] | None
    unchecked: str | None = None
    findings: tuple[str, ...] = ()
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        config = self.config
        lines = [f"config valid: task {config.task}, segments by {config.segment_by}, "
                 f"{len(config.models)} candidate(s): "
                 + ", ".join(f"{m.name} ({m.kind})" for m in config.models)]
        if self.source_columns is not None:
            lines.append(f"source valid: {len(self.source_columns)} column(s) as training "
                         f"reads them: {', '.join(self.source_columns)}")
        else:
            lines.append(f"source not checked: {self.unchecked}")
        lines.extend(self.findings)
        return "\n".join(lines)

    def wall_time(self) -> str:
        """The wall time per stage and in all (``console.wall_time``)."""
        return console.wall_time(self.timings, self.seconds)


def validate(config: JobConfig, spark: SparkSession | None = None, *, source: bool = True
             ) -> Validation:
    """Every check ``train`` makes before Ray starts, without starting Ray: the kinds,
    the registry name and (``source``) the source's columns, types and target where the
    source can be read from here (also over Spark Connect, where ``train`` cannot run);
    and, for task forecast, the series with duplicate dates (``duplicate_dates``).
    Raises ConfigError or DataError for what is wrong; a source that cannot be found is
    reported in the result, not raised. Its stages are ``train``'s first: checks, spark
    (when it starts Spark), source."""
    columns, unchecked, findings = None, "not asked to (--no-source)", ()
    with console.clock() as clock:
        with stage("checks", says="checks: config, estimators, registry name"):
            check_job(config)
        if source:
            spark = console.spark_session(spark, config.spark)
            with stage("source", says=f"source: {source_name(config)}: columns, types, "
                       "target"):
                try:
                    found = read_source(config.source, spark)
                except SourceNotFound as exc:
                    unchecked = str(exc)
                else:
                    df = checked_source(config, found)[0]
                    findings = ((duplicate_dates(df, config),) if config.task == "forecast"
                                else ())
                    if hierarchical(config):
                        hierarchy.check_levels(df, config)
                        findings += (f"hierarchy: {len(hierarchy.Levels.of(config).levels)} "
                                     "levels, the segments' and every aggregate's series "
                                     "trained and reconciled with "
                                     f"{config.forecast.hierarchy.method}",)
                    columns, unchecked = df.columns, None
        seconds = clock.seconds()
    return Validation(config, columns, unchecked, findings, seconds, clock.timings(seconds))


def reconcile(result: TrainingResult, source_segments: int) -> dict[str, int]:
    """Check the result holds exactly one row per distinct segment of the source
    (trained + skipped + failed); returns the counts, raises AccountingError if not."""
    counts = result.counts()
    keys = result.columns(result.segment_by)
    duplicates = keys.num_rows - keys.group_by(result.segment_by).aggregate([]).num_rows
    accounting = {"source_segments": source_segments, **counts, "duplicates": duplicates}
    total = sum(counts.values())
    if total != source_segments or duplicates:
        raise AccountingError(
            f"run {result.run_id} does not reconcile with its source: {source_segments} "
            f"distinct segments in the source but {total} results ({counts}, {duplicates} "
            f"duplicated). Nothing was registered; the results in {result.run_dir} are "
            "kept. Was the source changed during the run, or a run_id reused with "
            "training.resume over different data? Rerun with a new training.run_id"
        )
    log.info("accounting: %d segments in the source = %d trained + %d skipped + %d failed",
             source_segments, counts["trained"], counts["skipped"], counts["failed"])
    return accounting


@dataclass(frozen=True)
class TrainingReport:
    """What ``train`` did: the training ``result``, what MLflow logged and registered
    (``publication``; None when not registering), the wall seconds of every stage
    (``timings``: with ``other``, the time between them, they add up to ``seconds``, the
    job's wall time) and the ``accounting`` of the result against the source's distinct
    segments."""

    result: TrainingResult
    publication: Publication | None
    timings: dict[str, float]
    accounting: dict[str, int]
    forecasts: ScoreSummary | None = None  # ``forecast.output``: what was written there
    seconds: float = 0.0

    def summary(self) -> str:
        """The result's summary and the accounting."""
        return (f"{self.result.summary()}\naccounting: {self.accounting['source_segments']} "
                "segments in the source = trained + skipped + failed")

    def wall_time(self) -> str:
        """The wall time per stage and in all (``console.wall_time``)."""
        return console.wall_time(self.timings, self.seconds)


def train(
    config: JobConfig, spark: SparkSession | None = None, *, register: bool = True
) -> TrainingReport:
    """Train every segment of the configured source, then (``register``) log one MLflow
    run and register the model; the report says what each stage did."""
    timings: dict[str, float] = {}
    config = with_run_id(config)
    log_file = Path(config.training.output_dir) / str(config.training.run_id) / LOG_FILE
    with (console.clock() as clock, console.quiet(not config.training.progress),
          console.logging_to(log_file)):
        with stage("checks", timings, "checks: config, estimators, registry name"):
            check_job(config, register=register)
        tracking_ready = opening_tracking() if register else None
        spark = console.spark_session(spark, config.spark, timings)
        if config.training.executor == "ray":  # before it reads or starts Ray
            require_spark_context(spark, "training.executor: ray (Ray on Spark)",
                                  "or train with --executor spark (Spark's own tasks)")
        with stage("source", timings, f"source: {source_name(config)}: columns, types, "
                   "target"):
            files = segment_files(config.source, spark) if is_template(config.source.path) \
                else None
            source = files.frame if files else read_source(config.source, spark)
            df, num_rows = checked_source(config, source)
            if hierarchical(config):  # every level's series, trained as segments
                df = hierarchy.with_aggregates(df, config)
                config = hierarchy.trained_config(config)
                num_rows = df.count()
        if tracking_ready is not None:  # its errors before any segment trains
            tracking_opened(tracking_ready)
        given = None
        if config.source.segments is not None and config.fallback == "global":
            with stage("champion", timings, "champion: its global model, kept or refitted"):
                config = global_choice(config, spark)
                given = kept_global(config) if register else None
        # the source's segments and its largest, counted by Spark beside what follows
        sizes = beside("accounting", segment_sizes, df, config.segment_by)
        executor, why = choose_executor(config, spark, num_rows, sizes.result)
        console.say(f"executor: {executor}: {why}")
        log.info("executor: %s: %s", executor, why)
        durable = durable_run_dir(config, spark)
        if durable:
            console.say(durable)
            log.warning("%s", durable)
        large = config.training.large_segment_rows
        if (executor == "spark" and config.task != "forecast" and num_rows > large
                and sizes.result().largest > large):
            console.say(f"executor: a segment of {sizes.result().largest:,} rows (above "
                        f"training.large_segment_rows={large:,}) trains in one Spark task "
                        "with its library's threads here: data-parallel training (Ray "
                        "Train, Tune's ASHA) needs training.executor: ray")
        config = config.model_copy(update={"training": config.training.model_copy(
            update={"executor": executor})})
        try:
            result, accounting = _train_source(config, spark, df, num_rows, sizes, files,
                                               timings, given, source)
        finally:
            if files:
                files.release()
        publication = forecasts = None
        if register:
            with stage("registry", timings, "registry: MLflow run and model version"):
                publication = publish(result, config, timings, accounting)
        output = forecast_output(config)
        if output is not None and publication is not None:
            with stage("forecasts", timings, f"forecasts: every series into {output}"):
                forecasts = write_forecasts(publication, config, output, spark)
        seconds = clock.seconds()
    return TrainingReport(result, publication, clock.timings(seconds), accounting, forecasts,
                          seconds)


def opening_tracking() -> Future[object]:
    """MLflow's store opened (``tracking.configure_tracking``: on a new local store, its
    tables created) in a thread, beside Spark's start and the source's checks, where the
    driver mostly waits for Spark's JVM."""
    from raybricks import tracking

    return beside("tracking", tracking.configure_tracking)


def beside(name: str, work: Callable[..., T], *args: Any) -> Future[T]:
    """``work(*args)`` in a thread of its own (``raybricks-<name>``) while the caller
    goes on."""
    thread = ThreadPoolExecutor(1, thread_name_prefix=f"raybricks-{name}")
    done = thread.submit(work, *args)
    thread.shutdown(wait=False)
    return done


def tracking_opened(ready: Future[object]) -> None:
    """Wait for ``opening_tracking``; a store that cannot be opened is refused before
    training, naming the store and the fix."""
    from raybricks import tracking

    try:
        ready.result()
    except Exception as exc:
        uri = tracking.tracking_target().tracking_uri
        raise ConfigError(
            f"MLflow's tracking store {uri} cannot be opened ({failure(exc)}): nothing "
            "was trained. Point MLFLOW_TRACKING_URI at a store this process can write "
            "(unset: ./mlflow.db), or train with register=False"
        ) from exc


def failure(exc: BaseException) -> str:
    """``Type: the first line of its message`` (nothing after the colon without one)."""
    return f"{type(exc).__name__}: {first_line(exc) if str(exc).strip() else ''}"


def choose_executor(config: JobConfig, spark: SparkSession, num_rows: int,
                    sizes: Callable[[], SegmentSizes]) -> tuple[str, str]:
    """Where the job's segments train (``training.executor``; ``auto`` resolved) and why.
    Refuses what the chosen executor cannot do. ``sizes``: the source's segments and its
    largest (a Spark job, waited for only where the choice needs it).

    ``auto`` takes Ray only for what Spark's tasks cannot do as well: GPU candidates, a
    job that says how to run Ray (``cluster.mode``), a tabular segment above
    ``training.large_segment_rows`` (Ray Train fits it data-parallel), and a tabular job
    with a search over fewer segments than cores (Ray spreads one segment's settings
    over tasks; a Spark task trains a segment alone). Measured on the same jobs, Spark's
    tasks train a segment as fast as Ray's and start without Ray's 11-26 s
    (docs/benchmarks.md, "Executors: Ray and Spark")."""
    from raybricks.session import is_spark_connect, spark_cores

    asked = config.training.executor
    gpus = [c.name for c in config.models if c.resources.num_gpus > 0]
    connect = is_spark_connect(spark)
    if gpus and (asked == "spark" or connect):
        raise ConfigError(
            f"candidate(s) {', '.join(gpus)} ask for GPUs, which only the Ray executor "
            "gives a task"
            + (" and this Spark Connect session cannot start Ray" if connect else "")
            + ": train on a dedicated access mode cluster with training.executor: ray (or "
            "auto), or drop resources.num_gpus")
    if asked != "auto":
        return asked, f"training.executor: {asked}"
    if connect:
        return "spark", ("a Spark Connect session (serverless, standard access mode): "
                         "Ray on Spark cannot start here")
    if gpus:
        return "ray", f"GPU candidates ({', '.join(gpus)}) train on Ray's GPU tasks"
    if config.cluster.mode != "auto":
        return "ray", f"the job sets cluster.mode: {config.cluster.mode} (how to run Ray)"
    if config.task != "forecast":
        large = config.training.large_segment_rows
        if num_rows > large and sizes().largest > large:
            return "ray", (f"a segment of {sizes().largest:,} rows (above "
                           f"training.large_segment_rows={large:,}): Ray Train fits it "
                           "data-parallel")
        searched = [c.name for c in config.models if c.search]
        cores = spark_cores(spark) or 1
        if searched and sizes().segments < cores:
            return "ray", (f"{sizes().segments:,} segment(s) for {cores} cores with a "
                           f"search ({', '.join(searched)}): Ray spreads each segment's "
                           "settings over tasks")
    return "spark", (f"{num_rows:,} rows: Spark's own tasks, without Ray's start (no GPU, "
                     "large segment or search to spread over Ray's tasks)")


#: Where a run directory outlives a Databricks serverless job (its driver's disk does not).
DURABLE_PREFIXES = ("/Volumes/", "/dbfs/", "dbfs:/", "/Workspace/")


def durable_run_dir(config: JobConfig, spark: SparkSession) -> str | None:
    """What to say when the run directory is on the local disk of a Databricks Spark
    Connect driver (serverless, standard access mode), which may not outlive the job:
    the run's results and log are lost with it, and a resume finds nothing."""
    from raybricks.databricks import in_databricks_runtime
    from raybricks.session import is_spark_connect

    output = str(config.training.output_dir)
    if (not is_spark_connect(spark) or not in_databricks_runtime()
            or output.startswith(DURABLE_PREFIXES)):
        return None
    return (f"training.output_dir {output!r} is this driver's local disk, which a serverless "
            "job does not keep: the run's results and log go when it ends (the registered "
            "model is kept), and a resume would find nothing. Set training.output_dir to a "
            "Unity Catalog Volume path (/Volumes/CATALOG/SCHEMA/VOLUME/runs)")


def source_name(config: JobConfig) -> str:
    """The job's source as a person names it: its table or path."""
    return str(config.source.table or config.source.path)


def write_forecasts(publication: Publication, config: JobConfig, output: str,
                    spark: SparkSession) -> ScoreSummary:
    """``forecast.output``: the next ``horizon`` periods of every series the job's model
    serves (the registered version; the logged model where none was registered), as
    ``raybricks forecast`` writes them, in the job's Spark session."""
    from raybricks.scoring import forecast

    model = (f"models:/{publication.name}/{publication.version}"
             if publication.version is not None else publication.model_uri)
    summary = forecast(model, output, spark=spark,
                       intervals=bool(config.forecast and config.forecast.intervals))
    console.say(str(summary))
    return summary


def global_choice(config: JobConfig, spark: SparkSession) -> JobConfig:
    """A retrain from monitoring (``source.statuses``) whose global model monitoring found
    degraded refits it on the whole source (``global_model: refit``), unless the job
    says ``global_model`` itself."""
    if (config.source.statuses is None or config.fallback != "global"
            or "global_model" in config.model_fields_set):
        return config
    from raybricks.sources import degraded_globals

    degraded = degraded_globals(str(config.source.segments), spark)
    if not degraded:
        return config
    console.say(f"global model: monitoring {config.source.segments} found "
                f"{', '.join(degraded)} degraded: refitted on the whole source "
                "(global_model: refit; set global_model=keep to keep it)")
    return config.model_copy(update={"global_model": "refit"})


def kept_global(config: JobConfig) -> GivenGlobal | None:
    """A retrain of listed segments with ``fallback: global`` and ``global_model: keep``:
    the champion's global model, which the retrained segments compare and blend with
    (None: nothing to keep: another job, no champion, or a champion without one)."""
    if (config.source.segments is None or config.fallback != "global"
            or config.global_model != "keep"):
        return None
    from raybricks import tracking

    found = tracking.champion_global(config.registry.name, config.registry.alias)
    if found is None:
        console.say(f"global model: {config.registry.name}@{config.registry.alias} has none "
                    "to keep; the retrain fits its own on the listed segments' rows")
        return None
    name, members = found
    console.say(f"global model: kept from {config.registry.name}@{config.registry.alias} "
                f"({name}); the retrained segments compare and blend with it")
    return GivenGlobal(name=name, members=members)


def _train_source(config: JobConfig, spark: SparkSession, df: DataFrame, num_rows: int,
                  sizes: Future[SegmentSizes], files: SegmentFiles | None,
                  timings: dict[str, float],
                  given: GivenGlobal | None = None, source: DataFrame | None = None
                  ) -> tuple[TrainingResult, dict[str, int]]:
    """Every segment trained on the job's executor (``training.executor``, resolved: Ray
    up and the source as Ray blocks, or Spark's tasks), the result reconciled with the
    source's segments (a path template's keys whose files gave no rows are skipped
    segments). ``sizes``: the source's segments, being counted. ``given``: the champion's
    global model, kept; with ``global_model: refit``, a retrain's global model learns
    from the whole ``source``."""
    skipped = beside("files", files.skipped, config.segment_by) if files else None
    refit = (given is None and config.source.segments is not None and source is not None
             and config.fallback == "global" and config.global_model == "refit")
    on_ray = config.training.executor == "ray"

    def laid_out(frame: DataFrame, rows: int | None = None):
        """``frame`` as the executor trains it: Ray blocks, or Spark's layout."""
        if on_ray:
            return to_ray_dataset(frame, config.segment_by, strategy=config.data.strategy,
                                  max_block_rows=config.data.max_block_rows,
                                  staging_dir=config.data.staging_dir, num_rows=rows)
        return spark_segments(frame, config.segment_by,
                              frame.count() if rows is None else rows, spark)

    with (ray_cluster(config.cluster, spark, timings, config.gpu_candidates()) if on_ray
          else contextlib.nullcontext()):
        with stage("data", timings, "data: the source as Ray blocks by segment" if on_ray
                   else "data: the source laid out by segment for Spark's tasks"):
            segmented = laid_out(df, num_rows)
        whole = None
        if refit:
            with stage("global data", timings, "global data: the whole source, for the "
                       "global model"):
                whole = laid_out(read_columns(config, source))
                given = GivenGlobal(blocks=RayBlocks.of(whole) if on_ray else whole.blocks(),
                                    num_rows=whole.num_rows)
        try:
            lost = skipped.result() if skipped else None
            empty = lost.absent if lost else []
            total = None if on_ray else sizes.result().segments
            with stage("training", timings, f"training (run {config.training.run_id})"):
                result = train_segments(segmented, config, absent=empty, given_global=given,
                                        file_notes=lost.notes if lost else None,
                                        total=total)
        finally:  # the staged files, kept for rebuilding lost blocks, are not needed
            segmented.release()
            if whole is not None:
                whole.release()
        del segmented  # its index of every segment: the results are on disk now
        if hierarchical(config):
            with stage("reconciliation", timings, "reconciliation: every level adds up"):
                reconcile_levels(result, config, on_ray)
    release_memory()
    with stage("accounting", timings, "accounting: one result per source segment"):
        accounting = reconcile(result, sizes.result().segments + len(empty))
    return result, accounting


def reconcile_levels(result: TrainingResult, config: JobConfig, on_ray: bool = True) -> None:
    """``reconciliation.reconcile`` on the running Ray (or, ``on_ray`` false, on the
    driver), said in the log and console."""
    from raybricks.reconciliation import reconcile

    cpus = 1
    if on_ray:
        import ray

        cpus = int(ray.cluster_resources().get("CPU", 1))
    found = reconcile(result, config, cpus, on_ray)
    log.info("%s", found.describe())
    console.say(found.describe())


def publish(result: TrainingResult, config: JobConfig, timings: dict[str, float] | None = None,
            accounting: dict[str, int] | None = None) -> Publication:
    """``tracking.publish``; a failure says how to retry without training again."""
    from raybricks import tracking

    try:
        return tracking.publish(result, config, timings=timings, accounting=accounting)
    except tracking.RegistryError:
        raise  # already says what to retry (register_run with the MLflow run)
    except Exception as exc:
        raise tracking.RegistryError(
            f"publishing run {result.run_id} to MLflow failed ({failure(exc)}); nothing "
            "was registered and no alias moved. The training results "
            f"are kept in {result.run_dir}: once MLflow is reachable, rerun with --set "
            f"training.resume=true --set training.run_id={result.run_id} to publish them "
            "without training again"
        ) from exc


@dataclass(frozen=True)
class MonitorReport:
    """What ``monitor`` found: per status, how many segments are in it now (their latest
    period), the monitoring table's location, the latest period, the MLflow run that
    logged it (None: not logged) and the worst segments (their key and reason)."""

    model_uri: str
    model_version: str | None
    output: str
    latest_period: str | None
    counts: dict[str, int]
    run_id: str | None
    seconds: float
    worst: list[str]
    #: What could not be summed up or logged after the table was written.
    problems: list[str] = field(default_factory=list)
    #: Each global model's status and reason in the latest period (its own table:
    #: ``sources.global_table(output)``).
    global_models: list[str] = field(default_factory=list)
    #: The wall seconds of its stages and ``other``, adding up to ``seconds``.
    timings: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        from raybricks.monitoring import STATUSES

        counts = ", ".join(f"{self.counts.get(s, 0)} {s}" for s in STATUSES)
        period = f" in period {self.latest_period}" if self.latest_period else ""
        lines = [f"monitored {sum(self.counts.values())} segments of {self.model_uri} "
                 f"(version {self.model_version}){period} into {self.output} in "
                 f"{self.seconds:.1f}s: {counts}"]
        lines += [f"  {line}" for line in self.worst]
        lines += self.global_models
        if self.run_id:
            lines.append(f"MLflow run: {self.run_id}")
        lines += [f"incomplete: {line}" for line in self.problems]
        return "\n".join(lines)

    def wall_time(self) -> str:
        """The wall time per stage and in all (``console.wall_time``)."""
        return console.wall_time(self.timings, self.seconds)


def global_models_health(measured: monitoring.Measured, output: str, spark: SparkSession,
                         problems: list[str]):
    """``monitoring.global_health`` of the written table, written beside it
    (``sources.global_table``); None when the model has no global model or it failed
    (said in ``problems``)."""
    from raybricks.scoring import write_output
    from raybricks.sources import global_table, read_source, source_of
    from raybricks.tracking.monitoring import failure

    try:
        found = monitoring.global_health(measured, read_source(source_of(output), spark))
        if not len(found):
            return None
        write_output(monitoring.global_frame(spark, found), global_table(output))
        return found
    except Exception as exc:  # noqa: BLE001 - the segments' table is written
        problems.append(failure("judging the global models", exc))
        log.warning("%s", problems[-1])
        return None


def monitor(model_uri: str, outcomes: str | DataFrame, output: str, *,
            spark: SparkSession | None = None, period: str | None = None,
            time_column: str | None = None, target: str | None = None,
            thresholds: monitoring.Thresholds | None = None, log_run: bool = True,
            partitions: int | None = None) -> MonitorReport:
    """Monitor a registered model on realized ``outcomes`` (``monitoring.measure``):
    write one row per segment and period to ``output``, then (``log_run``) log an
    MLflow run beside the model's training run: counts by status, the realized against
    validation error, the worst segments, a plot. Once the table is written, a part of
    the summary or of the run that fails is said in the report's ``problems`` and the
    run's tag instead of ending the job; a run that cannot be logged at all raises
    ``MonitoringRunError``, naming the table and the command that retrains from it."""
    from raybricks.scoring import write_output
    from raybricks.sources import source_of
    from raybricks.tracking.monitoring import MonitoringLog, log_monitoring

    with console.clock() as clock:
        spark = console.spark_session(spark)
        found = outcomes
        if isinstance(outcomes, str):
            with stage("source", says=f"source: the outcomes {outcomes}"):
                found = read_source(source_of(outcomes), spark)
        with stage("preparation", says="preparation: the model, the outcomes by segment"):
            measured = monitoring.measure(model_uri, found, spark, period=period,
                                          time_column=time_column, target=target,
                                          thresholds=thresholds, partitions=partitions)
        with stage("monitoring", says=f"monitoring: every segment into {output}"):
            write_output(measured.table, output)
        with stage("summary", says="summary: counts by status, the worst segments"):
            summary = monitoring.summarize(measured, output, spark)  # says what it lacks
        with stage("global models", says="global models: how each does on what it serves"):
            globals_ = global_models_health(measured, output, spark, summary.problems)
        run_id = None
        if log_run:
            params = {"model": model_uri, "model_version": measured.version,
                      "outcomes": outcomes if isinstance(outcomes, str) else "DataFrame",
                      "output": output, "period": period, "latest_period": measured.latest,
                      "metric": measured.metric,
                      **vars(thresholds or monitoring.Thresholds())}
            with stage("tracking", says="tracking: the monitoring run in MLflow"):
                run_id = log_monitoring(model_uri, MonitoringLog(
                    params, summary.counts, measured.metric, summary.sample, summary.worst,
                    summary.steps,
                    {"segments": float(summary.total), **summary.distribution},
                    summary.problems, globals_))
        seconds = clock.seconds()
    worst = summary.worst.head(5).itertuples() if summary.worst is not None else []
    described = [f"{row.segment}: {row.reason}" for row in worst]
    latest = globals_ if globals_ is None or measured.latest is None else globals_[
        globals_.period == measured.latest]
    report = MonitorReport(model_uri, measured.version, output, measured.latest,
                           summary.counts, run_id, seconds, described, summary.problems,
                           [] if latest is None else [f"global model {row.global_model}: "
                                                      f"{row.status}: {row.reason}"
                                                      for row in latest.itertuples()],
                           clock.timings(seconds))
    log.info("%s", report.summary())
    return report
