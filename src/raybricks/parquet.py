"""Reading Parquet files with Spark, as pandas writes them too.

pandas' ``to_parquet`` writes timestamps in nanoseconds (``TIMESTAMP(NANOS)``), which
Spark refuses to read. With ``spark.sql.legacy.parquet.nanosAsLong`` (Spark 3.2.4+) it
reads them as integers; ``read`` sets that setting while Spark works out the files' schema
(and puts it back after), tells which of the integer columns are nanosecond timestamps
from the Parquet footer of one file (a few more, then the file a one-column job finds a
value in, for a column the first file lacks: files merged by name), and converts those to
Spark timestamps, cut to the microsecond as Spark keeps them: a timestamp of UTC instants
(``isAdjustedToUTC``, pandas' time-zone-aware columns) becomes a ``timestamp``, a naive
one a ``timestamp_ntz`` (what Spark makes of microsecond columns of each kind). Real
integer columns stay untouched; nanosecond fields inside structs, arrays or maps stay
integers (nanoseconds since 1970).

The footer is read by the JVM's parquet-hadoop on a classic session (any file system
Spark reads). Spark Connect has no JVM here: its frames are read as Spark reads them
first, and only where Spark meets nanosecond timestamps are the footers read with
pyarrow on the driver, which must see the files too (a local path, ``file:``, ``dbfs:``
through ``/dbfs``, ``/Volumes``; otherwise ``read`` says so and how to write the files
instead), and the files read again with the schema found (Connect works a frame's schema
out anew for every query, when the setting is back as it was).

When ``mergeSchema`` finds files disagreeing on a column's type, Spark names no file;
``read`` then scans that column alone across the files, which fails at a file holding the
other type (a job reading one column, on the error path only), and names it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from raybricks.errors import DataError, first_line
from raybricks.session import is_spark_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameReader, SparkSession

log = logging.getLogger(__name__)

#: Spark's setting that reads ``TIMESTAMP(NANOS)`` columns as integers (nanoseconds).
NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"
#: Spark's setting that reads naive (not UTC-adjusted) timestamps as ``timestamp_ntz``.
INFER_NTZ = "spark.sql.parquet.inferTimestampNTZ.enabled"
#: At most this many footers are read to find the integer columns of the schema.
FOOTERS = 4
#: How to write pandas timestamps Spark reads without help.
MICROS = "df.to_parquet(path, coerce_timestamps='us', allow_truncated_timestamps=True)"

#: The nanosecond timestamps of a footer: column -> True where UTC-adjusted.
Nanos = dict[str, bool]


def read(spark: SparkSession, reader: DataFrameReader, path: str | list[str]) -> DataFrame:
    """The Parquet files at ``path`` (a file, folder, glob, or a list of them) read by
    ``reader`` (``spark.read`` with the caller's options set: ``mergeSchema``,
    ``recursiveFileLookup``, ``pathGlobFilter``, ``ignoreCorruptFiles``, ...), with the
    top-level nanosecond timestamp columns as Spark timestamps (see the module).

    ``reader`` is used up: ``read`` sets its format, and may set options and a schema on
    it. The session's settings are as before when it returns (``NANOS_AS_LONG`` is set
    while the schema is read, unless it was already true). Raises ``DataError`` for files
    disagreeing on a column's type under ``mergeSchema`` (naming a file where a one-column
    scan finds it) and for nanosecond timestamps it cannot read (a session that refuses
    the setting; Spark Connect with files the driver cannot read); Spark's own exceptions
    otherwise (``AnalysisException`` for a path that does not exist)."""
    if is_spark_connect(spark):
        return _read_connect(spark, reader, path)
    with nanos_as_long(spark) as refused:
        frame = _load_refused(reader, path, refused)
        nanos = _find_nanos(frame, _jvm_files(frame), _jvm_footer(spark))
    # Spark wants the setting only to build the schema: a classic frame's is fixed here.
    return with_timestamps(frame, nanos, _infer_ntz(spark))


@contextlib.contextmanager
def nanos_as_long(spark: SparkSession) -> Iterator[str | None]:
    """``NANOS_AS_LONG`` true on the session inside, as it was after (untouched where it
    was true already). Yields None, or why the session refused the setting."""
    before = spark.conf.get(NANOS_AS_LONG, None)
    if str(before).lower() == "true":
        yield None
        return
    try:
        spark.conf.set(NANOS_AS_LONG, "true")
    except Exception as exc:  # noqa: BLE001 - a session that allows no legacy setting
        yield first_line(exc)
        return
    try:
        yield None
    finally:
        if before is None:
            spark.conf.unset(NANOS_AS_LONG)
        else:
            spark.conf.set(NANOS_AS_LONG, before)


def with_timestamps(frame: DataFrame, nanos: Nanos, ntz: bool = True) -> DataFrame:
    """``frame`` with its nanosecond columns ``nanos`` (integers) as timestamps cut to
    the microsecond (the floor: before 1970 too): ``timestamp`` for UTC-adjusted ones,
    ``timestamp_ntz`` for naive ones (``timestamp`` where ``ntz`` is false)."""
    from pyspark.sql import functions as F

    if not nanos:
        return frame
    converted = {}
    for name, utc in nanos.items():
        column = quoted(name)
        micros = (f"({column} div 1000 - CASE WHEN {column} % 1000 < 0 THEN 1 ELSE 0 END)")
        converted[name] = F.expr(
            f"timestamp_micros({micros})" if utc or not ntz
            else f"TIMESTAMP_NTZ'1970-01-01 00:00:00' + INTERVAL '0.000001' SECOND * {micros}")
    return frame.withColumns(converted)


def quoted(name: str) -> str:
    """A column name as Spark SQL reads it whatever it holds (dots, spaces, backticks)."""
    return "`" + name.replace("`", "``") + "`"


class _NanosFound(Exception):
    """Spark met nanosecond timestamps it reads only with ``NANOS_AS_LONG``."""


def _load(reader: DataFrameReader, path: str | list[str]) -> DataFrame:
    """The files' frame, its schema read (Spark Connect reads it when asked)."""
    try:
        frame = reader.format("parquet").load(path)
        frame.schema  # noqa: B018 - Spark Connect works it out here, classic Spark at load
        return frame
    except Exception as exc:
        text = str(exc)
        if "TIMESTAMP(NANOS" in text:  # Spark 4: AnalysisException; 3.5: a failed job
            raise _NanosFound(text) from exc
        if "CANNOT_MERGE_SCHEMAS" in text or "Failed merging schema" in text:
            raise _merge_conflict(reader, path, text) from exc
        if "ChecksumException" in text or "Checksum error" in text:
            raise DataError(_stale_checksum(path, text)) from exc
        raise


def checksum_file(path: str) -> str:
    """The Hadoop checksum file beside ``path`` (``.name.crc`` in the same folder)."""
    folder, _, name = path.rpartition("/")
    return f"{folder}/.{name}.crc"


def _stale_checksum(path: str | list[str], text: str) -> str:
    """What a file whose Hadoop checksum file (``.name.crc``) no longer matches it says."""
    found = re.search(r"Checksum error: (?:file:)?(\S+?)(?: at \d|$)", text)
    file = found.group(1) if found else None
    crc = checksum_file(file) if file else "the file's .crc"
    return (f"cannot read parquet at {path!r}: {file or 'a file'} does not match its "
            f"checksum file {crc}, left by an earlier Hadoop or Spark write of it (the file "
            f"was rewritten by another tool since): delete {crc} (Spark then reads the "
            "file without a checksum) and run again")


def _load_refused(reader: DataFrameReader, path: str | list[str], refused: str | None
                  ) -> DataFrame:
    """``_load`` where ``NANOS_AS_LONG`` is set (or ``refused``: why not)."""
    try:
        return _load(reader, path)
    except _NanosFound as exc:
        raise DataError(_cannot_read_nanos(
            path, f"this Spark session refuses {NANOS_AS_LONG}=true, which reads them as "
            f"integers ({refused})")) from exc


def _cannot_read_nanos(path: str | list[str], why: str) -> str:
    return (f"cannot read parquet at {path!r}: it holds nanosecond timestamps (pandas' "
            f"to_parquet writes them by default), and {why}. Write microseconds instead, "
            f"e.g. {MICROS}")


# ------------------------------------------------------------------ finding the columns


def _find_nanos(frame: DataFrame, files: Iterable[str],
                footer: Callable[[str, list[str]], dict[str, bool | None]]) -> Nanos:
    """Which integer columns of ``frame`` are nanosecond timestamps, from the footers of
    ``files`` (at most ``FOOTERS``: until each such column was in one), then, for a column
    none of those holds (files merged by name), of a file Spark finds a value of it in (a
    job reading that column until its first value). ``footer(file, names)``: for each of
    ``names`` in the file, True / False for a nanosecond timestamp (UTC-adjusted or not),
    None for another type."""
    from pyspark.sql.types import LongType

    wanted = {f.name for f in frame.schema.fields if isinstance(f.dataType, LongType)}
    found: Nanos = {}

    def read_footer(file: str) -> None:
        nonlocal wanted
        wanted -= {name for name in wanted if f"/{name}=" in file}  # partition columns
        try:
            kinds = footer(file, sorted(wanted))
        except Exception as exc:  # noqa: BLE001 - not Parquet, unreadable: another one
            log.warning("could not read the Parquet footer of %s: %s", file,
                        first_line(exc))
            return
        found.update({name: utc for name, utc in kinds.items() if utc is not None})
        wanted -= set(kinds)

    for file in islice(files, FOOTERS) if wanted else ():
        read_footer(file)
        if not wanted:
            return found
    for _ in range(FOOTERS):  # a job each: for a column, and those its file holds too
        if not wanted:
            break
        name = min(wanted)
        _footer_with(frame, name, read_footer)
        wanted.discard(name)  # in no footer read: left as it is
    if wanted:
        log.warning("Parquet columns %s left as integers: no footer read tells whether "
                    "they hold nanosecond timestamps", sorted(wanted))
    return found


def _footer_with(frame: DataFrame, name: str, read_footer: Callable[[str], None]) -> None:
    """Reads the footer of a file holding a value of column ``name``, if any."""
    from pyspark.sql import functions as F

    try:
        first = (frame.where(F.col(quoted(name)).isNotNull())
                 .select(F.col("_metadata.file_path")).limit(1).collect())
    except Exception as exc:  # noqa: BLE001 - no metadata column: left as it is
        log.warning("could not find a file holding column %s: %s", name, first_line(exc))
        return
    if first:
        read_footer(first[0][0])


#: How a footer's logical type names a nanosecond timestamp (parquet-mr's text).
NANOS_TYPE = re.compile(r"TIMESTAMP\(NANOS,(true|false)\)")


def _jvm_files(frame: DataFrame) -> Iterator[str]:
    """A few of the files Spark listed for ``frame``: the first, last, middle, ... (the
    listing stays in the JVM)."""
    files = frame._jdf.inputFiles()
    count = len(files)
    picked = dict.fromkeys([0, count - 1, count // 2, count // 4, 3 * count // 4])
    for i in picked:
        if 0 <= i < count:
            yield str(files[i])


def _jvm_footer(spark: SparkSession) -> Callable[[str, list[str]], dict[str, bool | None]]:
    """Reads a footer with the JVM's parquet-hadoop (the session's file systems)."""
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()

    def footer(uri: str, names: list[str]) -> dict[str, bool | None]:
        path = jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(uri))
        opened = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(
            jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(path, conf))
        try:
            schema = opened.getFooter().getFileMetaData().getSchema()
        finally:
            opened.close()
        kinds: dict[str, bool | None] = {}
        for name in names:
            if schema.containsField(name):
                field = schema.getType(name)
                annotation = field.getLogicalTypeAnnotation() if field.isPrimitive() else None
                match = NANOS_TYPE.search(str(annotation.toString()) if annotation else "")
                kinds[name] = match.group(1) == "true" if match else None
        return kinds

    return footer


def _arrow_footer(file: str, names: list[str]) -> dict[str, bool | None]:
    """Reads a footer on the driver with pyarrow (``file``: a path or URI Spark gave)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    local = _local_path(file)
    if local is None:
        raise FileNotFoundError(f"{file} is not readable on the driver")
    schema = pq.read_schema(local)
    kinds: dict[str, bool | None] = {}
    for name in names:
        if schema.get_field_index(name) >= 0:
            kind = schema.field(name).type
            nanos = pa.types.is_timestamp(kind) and kind.unit == "ns"
            kinds[name] = kind.tz is not None if nanos else None
    return kinds


def _local_files(path: str | list[str]) -> Iterator[str]:
    """The files at ``path`` as the driver sees them (its own file system, ``/dbfs``),
    by name, as Spark lists them (no ``_`` or ``.`` names); none where it cannot see
    them."""
    import glob

    for one in [path] if isinstance(path, str) else path:
        local = _local_path(one)
        if local is None:
            continue
        for match in sorted(glob.glob(local)) if glob.has_magic(local) else [local]:
            if os.path.isfile(match):
                yield match
                continue
            for folder, dirs, files in os.walk(match):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")) or "=" in d)
                yield from (os.path.join(folder, f) for f in sorted(files)
                            if not f.startswith((".", "_")))


def _local_path(path: str) -> str | None:
    """Where the driver sees ``path``: ``file:`` and plain paths as they are (under
    ``/dbfs`` where not, as Databricks reads a plain path), ``dbfs:`` under ``/dbfs``;
    None for other schemes or where nothing is there."""
    if path.startswith("file:"):
        candidates = [unquote(urlparse(path).path)]
    elif path.startswith("dbfs:"):
        candidates = ["/dbfs" + "/" + path[len("dbfs:"):].lstrip("/")]
    elif re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", path):
        return None
    else:
        candidates = [path, "/dbfs" + "/" + path.lstrip("/")]
    import glob

    for candidate in candidates:
        if glob.glob(candidate) if glob.has_magic(candidate) else Path(candidate).exists():
            return candidate
    return None


# ---------------------------------------------------------------------- Spark Connect


def _read_connect(spark: SparkSession, reader: DataFrameReader, path: str | list[str]
                  ) -> DataFrame:
    """Spark Connect works a frame's schema out anew for every query, under the session's
    settings then: the frame is read as is first (no nanosecond timestamps: done); else
    with the setting, the footers read on the driver, and read again with the schema so
    found, which needs no setting."""
    already = str(spark.conf.get(NANOS_AS_LONG, None)).lower() == "true"
    local = all(_local_path(one) for one in ([path] if isinstance(path, str) else path))
    try:
        frame = _load(reader, path)
    except _NanosFound as exc:
        if not local:
            raise DataError(_cannot_read_nanos(
                path, "on Spark Connect raybricks tells which columns they are from the "
                "Parquet footers read on the driver, which does not see these files (a "
                "path it sees too: local, /dbfs, /Volumes)")) from exc
    else:
        if not (already and local):  # as Spark reads it (already: the user's integers)
            return frame
        nanos = _find_nanos(frame, _local_files(path), _arrow_footer)
        return with_timestamps(frame, nanos, _infer_ntz(spark))
    with nanos_as_long(spark) as refused:
        frame = _load_refused(reader, path, refused)
        nanos = _find_nanos(frame, _local_files(path), _arrow_footer)
        frame = reader.schema(frame.schema).load(path)  # needs no setting when queried
    return with_timestamps(frame, nanos, _infer_ntz(spark))


def _infer_ntz(spark: SparkSession) -> bool:
    return str(spark.conf.get(INFER_NTZ, None)).lower() != "false"


# ---------------------------------------------------------------------- merge conflicts

#: The two schemas of Spark's CANNOT_MERGE_SCHEMAS message.
MERGE = re.compile(r'Initial schema:\s*"(STRUCT<.*?>)"\s*Schema that cannot be merged with '
                   r'the initial schema:\s*"(STRUCT<.*?>)"', re.DOTALL)
#: The file in Spark's message about a column of another type than the schema's.
FILE_AT_FAULT = re.compile(r"(?:reading file|in file) (\S+?)\.(?:\s|$)")


def _merge_conflict(reader: DataFrameReader, path: str | list[str], text: str) -> DataError:
    """The error for files disagreeing on a column's type, naming a file that holds the
    other type where a scan of the columns (no merge) finds one."""
    from pyspark.sql import functions as F

    found = MERGE.search(text)
    first, other = (_fields(found.group(1)), _fields(found.group(2))) if found else ({}, {})
    lower = {name.lower(): kind for name, kind in other.items()}
    differ = {name: (kind, lower[name.lower()]) for name, kind in first.items()
              if name.lower() in lower and lower[name.lower()] != kind}
    where = f"the parquet files at {path!r} disagree on the type of "
    if not differ:
        return DataError(f"{where}a column, which mergeSchema cannot merge "
                         f"({first_line(Exception(text))}). Compare the files' schemas "
                         "(e.g. pyarrow.parquet.read_schema) and rewrite the odd ones")
    said = ", ".join(f"{name} ({a} in some, {b} in others)" for name, (a, b) in differ.items())
    ddl = ", ".join(f"{quoted(name)} {a}" for name, (a, _) in differ.items())
    file = None
    try:
        scan = (reader.option("mergeSchema", "false").option("ignoreCorruptFiles", "false")
                .schema(ddl).load(path))
        scan.select(F.max(F.xxhash64(*[F.col(quoted(name)) for name in differ]))).collect()
    except Exception as exc:  # noqa: BLE001 - the file of another type, as expected
        named = FILE_AT_FAULT.search(str(exc))
        file = unquote(named.group(1)) if named else None
    first_column, (kind, _) = next(iter(differ.items()))
    if file:
        return DataError(f"{where}{said}: {file} does not hold {first_column} as {kind}. "
                         "Rewrite the odd files with the other files' types, or move them "
                         "out of the folder")
    return DataError(f"{where}{said}. To find the odd files, read the folder with "
                     f"spark.read.schema('{ddl}').parquet(...) without mergeSchema and "
                     "collect the column: Spark names a file of another type")


def _fields(struct: str) -> dict[str, str]:
    """The top-level fields of Spark's ``STRUCT<a: BIGINT, `b c`: ARRAY<INT>>`` text."""
    body = struct[len("STRUCT<"):-1]
    fields, depth, quoted, start = {}, 0, False, 0
    for i, char in enumerate(body + ","):
        if char == "`":
            quoted = not quoted
        elif not quoted and char in "<(":
            depth += 1
        elif not quoted and char in ">)":
            depth -= 1
        elif not quoted and depth == 0 and char == ",":
            fields.update([_field(body[start:i].strip())])
            start = i + 1
    return fields


def _field(text: str) -> tuple[str, str]:
    """``name: TYPE`` (a name in backticks where Spark quotes it) as (name, type)."""
    if text.startswith("`"):
        end = 1
        while end < len(text) and not (text[end] == "`" and text[end + 1:end + 2] != "`"):
            end += 2 if text[end] == "`" else 1
        return text[1:end].replace("``", "`"), text[end + 1:].lstrip(": ").strip()
    name, _, kind = text.partition(": ")
    return name, kind.strip()

