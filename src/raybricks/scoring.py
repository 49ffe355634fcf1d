"""Batch scoring from the registry: ``models:/NAME@ALIAS`` -> predictions, by segment.

Spark lays the input out by segment (hash partitioning, then sorted within each
partition), so each Python worker meets a segment in one run of consecutive batches and
loads its model once; no task loads every segment's model. The model's segments travel to
the executors as one archive (``SparkContext.addFile``; on Spark Connect
``addArtifacts``), which each executor unpacks once and each Python worker opens once:
on any master, as on local[N]. Output: the input columns,
``prediction`` (or one ``probability_<class>`` column per class), ``model_version`` and
``segment_status`` (the segment's status in the model: trained, skipped, failed, unknown;
rows of the last three are scored by the global fallback model, if any, else null).
Model libraries installed in other versions than the model was trained with are reported
once, on the driver; the tasks, which load members of many segments, stay quiet about it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from raybricks import console
from raybricks.data import lay_out_by_segment
from raybricks.errors import DataError, RaybricksError, key_text
from raybricks.kinds.forecasting import interval_columns
from raybricks.segmented_model import (
    CLASSIFICATION,
    FORMAT_VERSION,
    INDEX,
    MANIFEST,
    NO_INTERVALS,
    SegmentStore,
    library_version_problem,
    missing_columns,
    prediction_type,
)
from raybricks.session import is_spark_connect, save_table
from raybricks.sources import join_on_segments, read_source, source_of

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: The start of scikit-learn's InconsistentVersionWarning, raised per unpickled estimator.
SKLEARN_VERSION_WARNING = "Trying to unpickle estimator"
#: The archive of a model's segments that scoring ships; ``{}``: a digest of its files.
ARCHIVE = "raybricks-segments-{}.zip"
#: Per Python worker: (archive name, cache size) -> the store of its segments. Reached
#: through ``segment_store``, a module function, so tasks share it: a function pickled by
#: value (as a task's closure is) would carry its own copy.
_STORES: dict[tuple[str, int], SegmentStore] = {}
_SHIPPING: Path | None = None  # this process' packed models (``shipping_directory``)


#: How many segments a summary names for each reason they were not served.
EXAMPLES = 5
#: The longest training reason a summary quotes.
REASON_CHARACTERS = 120
#: Why a requested segment was not served: no row of it in the model's index.
NOT_IN_MODEL = "not in the model"


@dataclass
class Unserved:
    """Requested segments that got no prediction (or not in every row) for one
    ``reason``: how many (``segments``) and a few of them (``examples``: the key, and
    its reason in training where there is one)."""

    reason: str
    segments: int
    examples: list[str]

    def __str__(self) -> str:
        more = ", ..." if self.segments > len(self.examples) else ""
        return f"{self.reason}: {self.segments}, e.g. " + "; ".join(self.examples) + more


@dataclass
class ScoreSummary:
    """What a scoring run wrote; ``unserved``: the requested segments (the input's, or
    those ``forecast`` was asked for) that got no prediction, by reason."""

    model_uri: str
    model_version: str | None
    output: str
    rows: int
    status_counts: dict[str, int]
    null_predictions: int
    seconds: float
    unserved: list[Unserved] = field(default_factory=list)
    #: The wall seconds of its stages and ``other``, adding up to ``seconds``.
    timings: dict[str, float] = field(default_factory=dict)

    def wall_time(self) -> str:
        """The wall time per stage and in all (``console.wall_time``)."""
        return console.wall_time(self.timings, self.seconds)

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.status_counts.items()))
        text = (f"scored {self.rows} rows with {self.model_uri} (version "
                f"{self.model_version}) into {self.output} in {self.seconds:.1f}s: {counts}; "
                f"{self.null_predictions} without a prediction")
        if not self.unserved:
            return text + "\nevery requested segment served"
        return (text + f"\n{self.unserved_segments} requested segment(s) not served (or "
                "not in every row):"
                + "".join(f"\n  {u}" for u in self.unserved))

    @property
    def unserved_segments(self) -> int:
        return sum(u.segments for u in self.unserved)


def model_version_of(model_uri: str) -> str | None:
    """The registry version behind ``models:/NAME@ALIAS`` or ``models:/NAME/N``."""
    from mlflow import MlflowClient

    from raybricks.tracking.target import BY_ALIAS, BY_NUMBER

    if alias := BY_ALIAS.fullmatch(model_uri):
        return str(MlflowClient().get_model_version_by_alias(*alias.groups()).version)
    number = BY_NUMBER.fullmatch(model_uri)
    return number.group(2) if number else None


@contextlib.contextmanager
def environment_default(name: str, value: str):
    """The environment variable ``name`` set to ``value`` inside the block (unless the
    user set it), as it was after."""
    before = os.environ.get(name)
    os.environ.setdefault(name, value)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)


def download_model(model_uri: str, directory: str) -> Path:
    """The model's files, local; a clear error when the URI does not resolve."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        with environment_default("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"):  # ours only
            return Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri,
                                                            dst_path=directory))
    except MlflowException as exc:
        hint = registry_hint(model_uri)
        raise RaybricksError(
            f"cannot load model {model_uri!r}: {exc.message.splitlines()[0]} "
            + (f"({hint})" if hint else
               f"(tracking URI {mlflow.get_tracking_uri()}; set MLFLOW_TRACKING_URI / "
               "MLFLOW_REGISTRY_URI to the registry that holds it)")
        ) from exc


def registry_hint(model_uri: str) -> str:
    """For a ``models:/`` URI the registry cannot resolve, what it likely meant: another
    alias or version of the model, or a registered model of a close name ('' if none)."""
    from mlflow import MlflowClient

    from raybricks.kinds import did_you_mean
    from raybricks.tracking.target import BY_ALIAS, BY_NUMBER

    by_alias = BY_ALIAS.fullmatch(model_uri)
    found = by_alias or BY_NUMBER.fullmatch(model_uri)
    if not found:
        return ""
    name, pointer = found.groups()
    client = MlflowClient()
    try:
        try:
            model = client.get_registered_model(name)
        except Exception:  # noqa: BLE001 - no such model: a close name, from one page
            names = [m.name for m in client.search_registered_models(max_results=1000)]
            pointed = model_uri.removeprefix(f"models:/{name}")  # @alias or /version
            return did_you_mean(name, names, shown=lambda n: f"models:/{n}{pointed}")
        if by_alias:
            aliases = sorted(getattr(a, "alias", a) for a in model.aliases or [])
            if pointer in aliases:  # it resolves: the failure is elsewhere
                return ""
            return (did_you_mean(pointer, aliases, shown=f"models:/{name}@{{}}".format)
                    or (f"{name} has the aliases {aliases}" if aliases else
                        f"{name} has no aliases: use models:/{name}/VERSION"))
        versions = sorted(int(v.version) for v in client.search_model_versions(
            f"name='{name}'"))
        if int(pointer) in versions:
            return ""
        return (f"{name} has the versions {versions}" if len(versions) <= 10 else
                f"{name}'s latest versions are {versions[-10:]}")
    except Exception:  # noqa: BLE001 - a registry that cannot be searched: no hint
        return ""


def write_output(df: DataFrame, name_or_path: str) -> None:
    """Overwrite a table by name, or Parquet / CSV files at a path (``source_of``)."""
    target = source_of(name_or_path)
    if target.table:
        save_table(df, name_or_path)
    elif target.format == "csv":
        df.write.mode("overwrite").option("header", "true").csv(name_or_path)
    else:
        df.write.mode("overwrite").parquet(name_or_path)


def output_fields(manifest: dict, probabilities: bool, intervals: bool = False
                  ) -> list[tuple[str, str]]:
    """The columns scoring adds, as (name, Spark SQL type)."""
    if manifest["task"] in CLASSIFICATION and probabilities:
        added = [(f"probability_{c}", "double") for c in manifest.get("classes") or []]
    else:
        added = [("prediction", prediction_type(manifest))]
    if intervals:
        levels = (manifest.get("forecast") or {}).get("intervals") or []
        if not levels:
            raise RaybricksError(NO_INTERVALS)
        added += [(name, "double") for name in interval_columns(levels)]
    return added + [("model_version", "string"), ("segment_status", "string")]


def pack_segments(segments: Path, directory: Path) -> Path:
    """One zip archive in ``directory`` of the files of ``segments`` (a model's
    ``artifacts/segments``, all the tasks read), stored uncompressed (Parquet already is)
    and named by a digest of their names and contents: the same model packs to the same
    name and the same bytes (packed once per ``directory``), as Spark requires of a file
    added again under its name."""
    files = sorted(p for p in segments.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.relative_to(segments).as_posix().encode() + b"\0")
        with file.open("rb") as source:
            while chunk := source.read(1 << 20):
                digest.update(chunk)
    archive = directory / ARCHIVE.format(digest.hexdigest()[:24])
    if archive.exists():
        return archive
    handle, staging = tempfile.mkstemp(suffix=".zip.tmp", dir=directory)
    with os.fdopen(handle, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as packed:
        for file in files:
            entry = zipfile.ZipInfo(file.relative_to(segments).as_posix(),
                                    date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            with file.open("rb") as source, packed.open(entry, "w", force_zip64=True) as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
    return Path(staging).rename(archive)


def shipping_directory() -> Path:
    """This process' folder of packed models, removed when it exits: one path per archive
    name for the life of the process, as Spark's file server requires of a name."""
    global _SHIPPING
    if _SHIPPING is None:
        _SHIPPING = Path(tempfile.mkdtemp(prefix="raybricks-ship-"))
        atexit.register(shutil.rmtree, _SHIPPING, True)
    return _SHIPPING


def ship_segments(spark: SparkSession, segments: Path) -> str:
    """Pack a model's segments into one archive and add it to the files every executor
    fetches: ``SparkContext.addFile`` (a file: Spark refuses local directories on any
    master but local[N]), on Spark Connect ``addArtifacts``. Returns the archive's name,
    for ``segment_store`` in the tasks."""
    archive = pack_segments(segments, shipping_directory())
    if is_spark_connect(spark):
        spark.addArtifacts(str(archive), file=True)  # the same bytes again: a no-op
    elif not any(Path(added).name == archive.name for added in spark.sparkContext.listFiles):
        spark.sparkContext.addFile(str(archive))
    return archive.name


def unpacked(archive: Path) -> Path:
    """The directory of a shipped archive's files, beside it (in the temp dir when that
    is read-only), unpacked once per executor: Python workers that race each unpack
    into a directory of their own and rename it into place; the first rename wins."""
    for parent in (archive.parent, Path(tempfile.gettempdir())):
        target = parent / archive.stem
        if target.is_dir():
            return target
        try:
            staging = Path(tempfile.mkdtemp(prefix=f".{archive.stem}-", dir=parent))
        except OSError:  # not writable: the next place
            continue
        try:
            with zipfile.ZipFile(archive) as packed:
                packed.extractall(staging)
            try:
                staging.rename(target)
            except OSError:
                if not target.is_dir():  # not a worker that was faster: a real failure
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target
    raise RaybricksError(f"cannot unpack the model archive {archive}: neither its folder "
                         f"nor {tempfile.gettempdir()} is writable")


def segment_store(archive: str, cache_segments: int) -> SegmentStore:
    """In a task: this Python worker's store of the model shipped as ``archive`` (its
    name, as ``ship_segments`` returned it), opened on the worker's first batch."""
    store = _STORES.get((archive, cache_segments))
    if store is None:
        from pyspark import SparkFiles

        shipped = Path(SparkFiles.get(archive)).resolve()
        if not shipped.is_file():
            raise RaybricksError(f"the model archive {archive} is not among this executor's "
                                 f"added files (SparkFiles: {shipped.parent})")
        directory = unpacked(shipped)
        store = _STORES[(archive, cache_segments)] = SegmentStore(directory, cache_segments)
    return store


def score_partitions(archive: str, version: str | None, probabilities: bool,
                     cache_segments: int, quiet_versions: bool = False,
                     intervals: bool = False):
    """The mapInPandas function: predicts each batch with the worker's store of the
    shipped model (``archive``: its name, from ``ship_segments``).
    ``quiet_versions``: the driver reported the library versions, so the libraries'
    own version warnings, per loaded model, are silenced in the tasks."""

    def predict(batches):
        for batch in batches:
            with warnings.catch_warnings():  # members load lazily: in both calls
                if quiet_versions:
                    warnings.filterwarnings("ignore", message=SKLEARN_VERSION_WARNING)
                store = segment_store(archive, cache_segments)
                result = store.predict(batch, probabilities, intervals)
            if intervals:
                for column in result.values.columns:
                    batch[column] = result.values[column].to_numpy()
            elif probabilities and store.task in CLASSIFICATION:
                for column in result.values.columns:
                    batch[f"probability_{column}"] = result.values[column].to_numpy()
            else:
                batch["prediction"] = result.values.to_numpy()
            batch["model_version"] = version
            batch["segment_status"] = result.status
            yield batch

    return predict


def score(
    model_uri: str, input: str | DataFrame, output: str | None = None, *,
    spark: SparkSession | None = None, probabilities: bool = False,
    cache_segments: int = 2048, partitions: int | None = None, intervals: bool = False,
) -> ScoreSummary | DataFrame:
    """Score a table (name, path or DataFrame) with a segmented model, by segment
    (``intervals``: a forecasting model's interval bounds beside the prediction).

    With ``output`` (table name or path) the predictions are written there and a
    ScoreSummary returned (its ``timings``: spark, when it starts Spark, model, source,
    scoring, summary and ``other``, adding up to its ``seconds``); without, the scored
    Spark DataFrame is returned (lazy).
    """
    with console.clock() as clock:
        spark = console.spark_session(spark)
        with console.stage("model", says=f"model: {model_uri} from the registry"):
            local, manifest = fetch_model(model_uri)
        df, rows = input, None
        if isinstance(input, str):
            with console.stage("source", says=f"source: {input}"
                               + (", its rows counted" if output else "")):
                df = read_source(source_of(input), spark)
                rows = df.count() if output else None  # the progress bar's total
        return clocked(_score(model_uri, local, manifest, df, output, spark, probabilities,
                              cache_segments, partitions, clock.start, intervals, rows),
                       clock)


def clocked(found: ScoreSummary | DataFrame, clock: console.Clock) -> ScoreSummary | DataFrame:
    """A summary with the wall time from the verb's start and its stages (``clock``);
    a DataFrame as it is."""
    if not isinstance(found, ScoreSummary):
        return found
    seconds = clock.seconds()
    found = replace(found, seconds=seconds, timings=clock.timings(seconds))
    log.info("%s\n%s", found, found.wall_time())
    return found


def fetch_model(model_uri: str) -> tuple[Path, dict]:
    """The model's files, local, and its manifest; refuses what is not a segmented model
    this raybricks reads."""
    from raybricks.tracking import configure_tracking

    configure_tracking()
    workdir = tempfile.mkdtemp(prefix="raybricks-score-")
    local = download_model(model_uri, workdir)
    manifest_path = local / "artifacts" / "segments" / MANIFEST
    if not manifest_path.exists():
        raise RaybricksError(f"{model_uri} is not a raybricks segmented model (no {MANIFEST})")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format_version", 1) > FORMAT_VERSION:
        raise RaybricksError(
            f"{model_uri} was written by a newer raybricks (format "
            f"{manifest['format_version']}); upgrade raybricks to score it"
        )
    return local, manifest


def _score(model_uri: str, local: Path, manifest: dict, df: DataFrame, output: str | None,
           spark: SparkSession, probabilities: bool, cache_segments: int,
           partitions: int | None, start: float, intervals: bool = False,
           rows: int | None = None, missing: DataFrame | None = None,
           every_segment: bool = False) -> ScoreSummary | DataFrame:
    """Score ``df`` (``rows`` of them, if known: the progress bar's total); the summary
    names the segments that got no prediction, in the output or among ``missing``
    (requested segments without a row in ``df``: their segment columns and
    ``segment_status``; ``every_segment``: every segment of the model was requested, so
    those without a model are the missing ones)."""
    versions = library_version_problem(manifest, model_uri)
    if versions:  # once, here: not in every task that loads the model's members
        log.warning("%s", versions)
    segment_by = manifest["segment_by"]
    problem = missing_columns(df.columns, segment_by, manifest["features"])
    if problem:
        raise DataError(problem)
    connect = is_spark_connect(spark)  # no SparkContext: no RDDs, no status tracker
    added = output_fields(manifest, probabilities, intervals)

    def scored(partitions: int | None) -> tuple[DataFrame, str | None]:
        """The scored frame (lazy), once the model's segments are shipped; its version."""
        version = model_version_of(model_uri)
        archive = ship_segments(spark, local / "artifacts" / "segments")
        schema = ", ".join([f"`{f.name}` {f.dataType.simpleString()}"
                            for f in df.schema.fields]
                           + [f"`{name}` {kind}" for name, kind in added])
        if partitions is None and not connect:  # Connect: Spark's shuffle partitions
            partitions = max(df.rdd.getNumPartitions(), spark.sparkContext.defaultParallelism)
        return lay_out_by_segment(df, segment_by, partitions).mapInPandas(
            score_partitions(archive, version, probabilities, cache_segments,
                             quiet_versions=versions is not None, intervals=intervals),
            schema), version

    if output is None:
        return scored(partitions)[0]
    progress = (contextlib.nullcontext() if connect
                else console.spark_progress(spark, rows, "scoring"))
    with console.stage("scoring", says=f"scoring: predictions into {output}"), progress:
        frame, version = scored(partitions)
        write_output(frame, output)
    with console.stage("summary", says="summary: rows by status, the segments not served"):
        counts, nulls, unserved = written_summary(spark, output, local, manifest, added,
                                                  missing, every_segment)
    return ScoreSummary(model_uri, version, output, sum(counts.values()), counts, nulls,
                        time.perf_counter() - start, unserved)


def written_summary(spark: SparkSession, output: str, local: Path, manifest: dict,
                    added: list[tuple[str, str]], missing: DataFrame | None,
                    every_segment: bool) -> tuple[dict[str, int], int, list[Unserved]]:
    """What scoring wrote at ``output``: its rows by segment status, those without a
    prediction, and the requested segments not served (``_score``)."""
    from pyspark.sql import functions as F

    segment_by = manifest["segment_by"]
    written = read_source(source_of(output), spark)
    first, kind = added[0]  # the prediction, or the first class' probability
    column = F.col(f"`{first}`")
    unscored = column.isNull() | (F.isnan(column) if kind == "double" else F.lit(False))
    per_segment = written.groupBy(*segment_by, "segment_status").agg(
        F.count("*").alias("rows"), F.sum(unscored.cast("long")).alias("nulls"))
    per_status = per_segment.groupBy("segment_status").agg(
        F.sum("rows").alias("rows"), F.sum("nulls").alias("nulls")).collect()
    counts = {r["segment_status"]: int(r["rows"]) for r in per_status}
    nulls = sum(int(r["nulls"] or 0) for r in per_status)
    without = no_model(spark, local / "artifacts" / "segments", segment_by)
    if every_segment and without is not None:
        missing = without.select(*segment_by, F.col("status").alias("segment_status"))
    unserved_rows = per_segment.where(F.col("nulls") > 0).select(*segment_by, "segment_status")
    if missing is not None:
        unserved_rows = unserved_rows.unionByName(missing.select(*segment_by, "segment_status"))
    return counts, nulls, unserved_segments(unserved_rows, without, manifest)


def forecast(
    model_uri: str, output: str | None = None, *, horizon: int | None = None,
    segments: str | DataFrame | None = None, spark: SparkSession | None = None,
    cache_segments: int = 2048, partitions: int | None = None, intervals: bool = False,
) -> ScoreSummary | DataFrame:
    """The next ``horizon`` periods (default: the model's) of every segment the model
    serves (or of those in ``segments``: a table, path or DataFrame with the segment
    columns), after each series' own last date: one row per segment and period with the
    time column and ``prediction`` (``intervals``: and the bounds ``lo_<level>``,
    ``hi_<level>``), written to ``output`` as ``score`` writes (the stages: spark, when
    it starts Spark, model, source, scoring, summary)."""
    with console.clock() as clock:
        spark = console.spark_session(spark)
        with console.stage("model", says=f"model: {model_uri} from the registry"):
            local, manifest = fetch_model(model_uri)
        spec = manifest.get("forecast")
        if not spec:
            raise RaybricksError(f"{model_uri} is a {manifest['task']} model, not a "
                                 "forecasting one: use raybricks score")
        if spec["exogenous"]:
            raise RaybricksError(
                f"{model_uri} forecasts with exogenous columns {spec['exogenous']}: it needs "
                "their future values; score a table of the future rows (segment columns, "
                f"{spec['time_column']!r} and {spec['exogenous']}) with raybricks score")
        horizon = horizon or spec["horizon"]
        if not 0 < horizon <= spec["answers"]:
            raise RaybricksError(f"horizon {horizon} is outside 1..{spec['answers']}, the "
                                 f"periods this model answers (trained horizon "
                                 f"{spec['horizon']})")
        which = f" of the segments in {segments}" if isinstance(segments, str) else ""
        with console.stage("source", says=f"source: the next {horizon} periods of every "
                           f"series{which}"):
            rows, missing, served = forecast_rows(spark, local / "artifacts" / "segments",
                                                  manifest, horizon, segments)
        return clocked(_score(model_uri, local, manifest, rows, output, spark, False,
                              cache_segments, partitions, clock.start, intervals, served,
                              missing, every_segment=segments is None), clock)


def forecast_rows(spark: SparkSession, directory: Path, manifest: dict, horizon: int,
                  segments: str | DataFrame | None
                  ) -> tuple[DataFrame, DataFrame | None, int | None]:
    """``forecast``'s rows to score: the next ``horizon`` periods of every series the
    model serves (``future_rows``), or of those in ``segments``; the requested segments
    without a series (None: every segment of the model was requested, ``_score`` finds
    those without one) and the number of rows, when known."""
    from pyspark.sql import functions as F

    segment_by = manifest["segment_by"]
    rows, served = future_rows(spark, directory, manifest, horizon)
    if segments is None:
        return rows, None, served * horizon
    wanted = segments if not isinstance(segments, str) else read_source(
        source_of(segments), spark)
    keys = wanted.select(*segment_by).distinct()
    rows = rows.join(keys, on=segment_by, how="inner")
    missing = keys.join(rows.select(*segment_by).distinct(), on=segment_by,
                        how="left_anti").withColumn("segment_status",
                                                    F.lit(None).cast("string"))
    return rows, missing, None


def future_rows(spark: SparkSession, directory: Path, manifest: dict, horizon: int
                ) -> tuple[DataFrame, int]:
    """Per segment with a model, its next ``horizon`` periods, as a Spark DataFrame: the
    segment columns and the time column (typed as in training: dates, timestamps in UTC
    with a time zone, naive timestamps, integers; ``future_schema``); and how many
    segments. The driver reads each segment's key and last date (Arrow columns); Spark's
    tasks make the periods."""
    segment_by = manifest["segment_by"]
    lasts = series_lasts(directory, segment_by)
    steps = isinstance(manifest["forecast"]["frequency"], int)  # integer time, not dates

    def periods(batches):
        for batch in batches:
            keys = batch[segment_by].astype(object).where(batch[segment_by].notna(), None)
            stamps = [int(v) if steps else v for v in batch["last"]]
            yield future_frame(dict(zip(map(tuple, keys.to_numpy()), stamps, strict=True)),
                               manifest, horizon)

    from pyspark.sql import types as T

    schema = T.StructType([*key_types(directory, segment_by),
                           T.StructField("last", T.StringType())])
    frame = spark.createDataFrame(lasts.to_pandas(), schema)
    return frame.mapInPandas(periods, future_schema(directory, manifest)), lasts.num_rows


def series_lasts(directory: Path, segment_by: list[str]) -> pa.Table:
    """Every segment with a model: its key columns and ``last``, its history's last
    period as its stored meta has it (a string), from the first member row of each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raybricks.data import segment_starts
    from raybricks.segmented_model import SHARDS

    parts = []
    for shard in sorted(directory.glob(SHARDS)):
        table = pq.read_table(shard, columns=[*segment_by, "meta"])
        first = table.take(pa.array(segment_starts(table, segment_by), pa.int64()))
        lasts = [str(json.loads(meta)["forecast"]["last"])
                 for meta in first.column("meta").to_pylist()]
        parts.append(first.select(segment_by).append_column("last", pa.array(lasts)))
    if not parts:
        index = pq.read_schema(directory / INDEX)
        return pa.table({**{c: pa.array([], index.field(c).type) for c in segment_by},
                         "last": pa.array([], pa.string())})
    return pa.concat_tables(parts)


def future_frame(lasts: dict[tuple, object], manifest: dict, horizon: int) -> pd.DataFrame:
    """Per segment key, the ``horizon`` periods after its ``last`` (as its stored meta
    has it), typed as ``future_rows`` says; key-major order."""
    import pandas as pd

    from raybricks.kinds.forecasting import future_times

    segment_by, spec = manifest["segment_by"], manifest["forecast"]
    time_column = spec["time_column"]
    paths = {last: future_times(spec["frequency"],
                                last if isinstance(last, int) else pd.Timestamp(last), horizon)
             for last in set(lasts.values())}
    keys = list(lasts)
    frame = pd.DataFrame(keys, columns=segment_by).loc[
        lambda f: f.index.repeat(horizon)].reset_index(drop=True)
    times = [t for key in keys for t in paths[lasts[key]]]
    if spec["time_type"] == "date":
        frame[time_column] = pd.Series([t.date() for t in times], dtype="object")
    elif spec["time_type"] == "integer":
        frame[time_column] = pd.Series(times, dtype="int64")
    else:  # the stored dates are UTC, naive
        stamps = pd.Series(pd.DatetimeIndex(times, dtype="datetime64[ns]"))
        frame[time_column] = (stamps.dt.tz_localize("UTC") if spec["time_type"] == "timestamp"
                              else stamps)
    return frame


def key_types(directory: Path, segment_by: list[str]) -> list:
    """The Spark types of the segment columns, as the model's index holds them."""
    import pyarrow.parquet as pq
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import from_arrow_type

    schema = pq.read_schema(directory / INDEX)
    return [T.StructField(k, from_arrow_type(schema.field(k).type, True)) for k in segment_by]


def future_schema(directory: Path, manifest: dict):
    """The Spark schema of ``future_rows``: the segment columns as the model's index
    types them, the time column as the training source did (DATE; TIMESTAMP, with a
    time zone; TIMESTAMP_NTZ, naive; BIGINT)."""
    from pyspark.sql import types as T

    spec = manifest["forecast"]
    time_type = {"date": T.DateType(), "timestamp": T.TimestampType(),
                 "timestamp_ntz": T.TimestampNTZType(),
                 "integer": T.LongType()}[spec["time_type"]]
    return T.StructType([*key_types(directory, manifest["segment_by"]),
                         T.StructField(spec["time_column"], time_type)])


def no_model(spark: SparkSession, directory: Path, segment_by: list[str]
             ) -> DataFrame | None:
    """The model's segments without a model of their own (failed, or skipped with nothing
    to serve them): the segment columns, ``status`` and ``reason``; None when every
    segment has one."""
    import pandas as pd
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyspark.sql import types as T

    index = pq.read_table(directory / INDEX, columns=[*segment_by, "status", "reason",
                                                      "shard"])
    index = index.filter(pc.less(index.column("shard"), 0))
    if not index.num_rows:
        return None
    schema = T.StructType([*key_types(directory, segment_by),
                           T.StructField("status", T.StringType()),
                           T.StructField("reason", T.StringType())])
    frame = index.select([*segment_by, "status", "reason"]).to_pandas()
    return spark.createDataFrame(frame.astype(object).where(pd.notna(frame), None), schema)


def unserved_segments(segments: DataFrame, without: DataFrame | None, manifest: dict
                      ) -> list[Unserved]:
    """Why each of ``segments`` (their segment columns and ``segment_status`` in the
    model: requested segments that got no prediction in some or every row) was not
    served, counted by reason with a few examples (one Spark job, with ``without``: the
    model's segments without a model, ``no_model``): failed or skipped in training
    (their training reason), not in the model, or served but not in every row (a
    forecasting model answers only the periods after each series' history)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    segment_by = manifest["segment_by"]
    unanswered = ("served, but not every row: dates not among the periods it answers "
                  "after the series' history" if manifest.get("forecast")
                  else "served, but not every row")
    if without is None:
        found = segments.withColumn("_status", F.lit(None).cast("string")).withColumn(
            "_reason", F.lit(None).cast("string"))
    else:
        other = without.select(*segment_by, F.col("status").alias("_status"),
                               F.col("reason").alias("_reason"))
        found = join_on_segments(segments, other, segment_by, "left")
    why = (F.when(F.col("_status").isNotNull(),
                  F.concat(F.col("_status"), F.lit(" in training, without a model")))
           .when(F.coalesce(F.col("segment_status"), F.lit("unknown")) == "unknown",
                 F.lit(NOT_IN_MODEL))
           .otherwise(F.lit(unanswered)))
    explained = found.select(*segment_by, why.alias("_why"), F.col("_reason"))
    by_reason = Window.partitionBy("_why")
    ranked = (explained.withColumn("_n", F.row_number().over(by_reason.orderBy(*segment_by)))
              .withColumn("_total", F.count(F.lit(1)).over(by_reason))
              .where(F.col("_n") <= EXAMPLES).collect())
    grouped: dict[str, Unserved] = {}
    for row in sorted(ranked, key=lambda r: (-r["_total"], r["_why"], r["_n"])):
        entry = grouped.setdefault(row["_why"], Unserved(row["_why"], row["_total"], []))
        key = key_text(row, segment_by)
        reason = row["_reason"]
        if reason and len(reason) > REASON_CHARACTERS:
            reason = reason[:REASON_CHARACTERS - 3] + "..."
        entry.examples.append(f"{key} ({reason})" if reason else key)
    return list(grouped.values())
