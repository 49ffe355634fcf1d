"""Files as segments: a folder of CSV or Parquet files whose paths hold the segment keys.

``source.path`` is then a template: ``{name}`` marks the part of a file's path that is the
key column ``name`` (``/Volumes/main/sales/raw/zip={zip}/*.csv``,
``dbfs:/sales/{store}/{item}.csv``, ``s3://bucket/sku/{sku}.parquet``), ``*`` a part that
is not. Spark reads every file the template's glob matches, with its file metadata column
(``_metadata.file_path``), and each row's keys are cut from its file's path: a million files
are one Spark job, never a loop over files on the driver.

CSV files are matched by the column names of their own header, so files may order their
columns differently (or lack some: those are null); each file is checked and parsed in
Spark's Python workers (``raybricks.csv_files``: a bad file is skipped with its reason) and
the column types are settled over all files (long, double, boolean, date, timestamp, else
string).
Parquet files are merged by name (``mergeSchema``). A file that gives no rows (empty, only a
header, unreadable) never fails the job and is never lost: ``unread`` finds it against
Spark's own listing of the files, with the reason, and a key none of whose files gave a row
becomes a skipped segment and a segment that lost one of several files names it in its
result row (``SegmentFiles.skipped``).

On Spark Connect (Databricks serverless, standard access mode: no JVM on this side) the
answers are the same, found another way: Spark's listing of the files comes to the client
(``DataFrame.inputFiles``: some 100 bytes a file) and goes back as a local relation; the
sizes of the files without rows are their ``_metadata.file_size`` in one scan of the
folder (a file listed but in no scan is empty: Spark's scans leave those out); a stale
Hadoop checksum file is looked for where the client sees the files (a local path,
``/dbfs``, ``/Volumes``; elsewhere the reason is the general one, as for a file past
``LOOKUPS``); and the listing's settings (``SMALL_FILES``) are sized from
``spark.default.parallelism`` or ``spark.master``, and set where the session allows them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

from raybricks import console, csv_files, parquet
from raybricks.errors import DataError, SourceNotFound, first_line
from raybricks.session import is_spark_connect, spark_cores

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

#: ``{name}`` in a path template: a segment key column cut from the file's path
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: the file path column while reading (dropped from what training sees)
FILE = "__raybricks_file"
#: files Spark lists but could not read, whose size (and checksum file) are looked up to
#: word the reason, one by one (Spark Connect: the sizes in one scan); past this, the
#: reason is the general one
LOOKUPS = 1000


def is_template(path: str | None) -> bool:
    """Whether a source path names key columns (``{name}``)."""
    return bool(path and PLACEHOLDER.search(path))


def key_names(path: str) -> list[str]:
    """The key columns a template names, in order."""
    return PLACEHOLDER.findall(path)


def check_template(path: str, fmt: str) -> None:
    """Refuse a template that cannot be read: a repeated name, a key outside the file
    name's directory parts, or a format other than CSV and Parquet."""
    names = key_names(path)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"source.path names {repeated} more than once: each {{name}} is one "
                         "key column")
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"source.path with {{name}} keys reads csv or parquet files, not "
                         f"{fmt}: set source.format to csv or parquet")
    if re.search(r"\{[^}]*,", path):
        raise ValueError("source.path: {a,b} alternatives are not supported with {name} keys; "
                         "use * and a source.where on the key instead")


def glob_of(path: str) -> str:
    """The template as a glob: every ``{name}`` is ``*``."""
    return PLACEHOLDER.sub("*", path)


def folder_of(path: str) -> tuple[str, str]:
    """The folder Spark lists (the template's parts before the first ``{name}`` or
    wildcard) and the glob of the file names (its last part). Spark lists a folder far
    faster than a glob that matches files, which it checks and lists path by path."""
    parts = glob_of(path).split("/")
    fixed = next((i for i, part in enumerate(parts) if re.search(r"[*?\[]", part)),
                 len(parts) - 1)
    folder = "/".join(parts[:min(fixed, len(parts) - 1)])
    return folder or ("/" if path.startswith("/") else "."), parts[-1]


def path_regex(path: str) -> str:
    """A regex matching the end of a (decoded) file path; group i is the i-th key."""
    parts = []
    for piece in re.split(r"(\{[A-Za-z_][A-Za-z0-9_]*\}|\*|\?)", path):
        if PLACEHOLDER.fullmatch(piece or ""):
            parts.append("([^/]+)")
        elif piece == "*":
            parts.append("[^/]*")
        elif piece == "?":
            parts.append("[^/]")
        else:
            parts.append(re.escape(piece))
    # a path as Spark writes it may start with a scheme (file:, dbfs:): match the end
    return "".join(parts).lstrip("/") + "$"


def _decode(path: Column) -> Column:
    """A file path as Spark reports it (URL-encoded), decoded (``+`` kept)."""
    from pyspark.sql import functions as F

    return F.call_function("url_decode", F.regexp_replace(path, r"\+", "%2B"))


def _comparable(column: str) -> Column:
    """A decoded path with its scheme's slashes normalized (``file:///a`` = ``file:/a``),
    to compare Spark's listing with its metadata column."""
    from pyspark.sql import functions as F

    return F.regexp_replace(_decode(F.col(column)), r"^([A-Za-z][A-Za-z0-9+.-]*):/+", "$1:/")


@dataclass(frozen=True)
class UnreadFile:
    """A file that gave no rows, its key (when the path holds the whole segment key) and
    why."""

    path: str
    key: tuple | None
    reason: str


@dataclass(frozen=True)
class SkippedFiles:
    """The files that gave no rows, by segment: ``absent``, the segments without any
    row (key, reason); ``notes``, every segment with a skipped file: how many, and what
    its result row says (``training.engine.train_segments``)."""

    absent: list[tuple[tuple, str]]
    notes: dict[tuple, tuple[int, str]]


class SegmentFiles:
    """The files a template matches, read by Spark: ``frame`` (the key columns, then the
    files' columns) for training and scoring, and ``unread`` for what gave no rows."""

    def __init__(self, spark: SparkSession, path: str, fmt: str) -> None:
        check_template(path, fmt)
        self.spark, self.path, self.format = spark, path, fmt
        self.keys = key_names(path)
        self.regex = path_regex(path)
        self.folder, self.file_glob = folder_of(path)
        self._skipped: dict[str, str] = {}  # files skipped while parsed: their reasons
        self._parsed = 0  # how many files gave rows (CSV)
        self.example: dict[str, str] = {}  # a file holding each column (CSV)
        self._text: dict[str, str] = {}  # a file with text values in each column (CSV)
        self._mixed: set[str] = set()  # columns of words and numbers within files read together
        rows, self._listing = self._read()
        present = {c.lower() for c in rows.columns}
        clash = sorted(k for k in self.keys if k.lower() in present)
        if clash:
            holder = next((self.example[c] for c in self.example if c.lower() in
                           {k.lower() for k in clash}), None)
            raise DataError(
                f"column(s) {clash} are in the files"
                + (f" (e.g. {holder})" if holder else "") + " and also keys of source.path "
                f"{path!r}: rename the {{name}} in the path (e.g. {{{clash[0]}_key}})")
        self.rows = rows
        self.frame = self.rows.select(*self.key_columns(), *[c for c in rows.columns
                                                              if c != FILE])

    def key_columns(self) -> list[Column]:
        """The key columns cut from the file path column."""
        from pyspark.sql import functions as F

        decoded = _decode(F.col(FILE))
        return [F.regexp_extract(decoded, self.regex, i + 1).alias(name)
                for i, name in enumerate(self.keys)]

    def _reader(self):
        """Every file under the template's folder whose name fits its last part (the
        rows of files that do not fit the whole template are dropped after)."""
        return (self.spark.read.option("ignoreCorruptFiles", "true")
                .option("ignoreMissingFiles", "true")
                .option("recursiveFileLookup", "true")
                .option("pathGlobFilter", self.file_glob))

    def _read(self) -> tuple[DataFrame, DataFrame]:
        """The rows with their file's path (``FILE``), and a frame Spark lists files of."""
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as F

        glob = glob_of(self.path)
        with _small_files(self.spark):
            try:
                if self.format == "csv":  # each file's bytes, as one row
                    raw = self._reader().format("binaryFile").load(self.folder)
                    raw.schema  # noqa: B018 - Spark Connect looks for the folder here
                else:
                    raw = parquet.read(self.spark, self._reader().option("mergeSchema", "true"),
                                       self.folder)
            except AnalysisException as exc:
                first = first_line(exc)
                raise SourceNotFound(
                    f"no {self.format} files match source.path {self.path!r} (as the glob "
                    f"{glob!r}): {first}. Check the folder and the template") from exc
            if self.format == "csv":  # read here, into the cache
                contents = (raw.select(F.col("_metadata.file_path").alias("path"), "content")
                            .where(self.fits(F.col("path"))))
                return self._csv_rows(contents), raw
            rows = (raw.select("*", F.col("_metadata.file_path").alias(FILE))
                    .where(self.fits(F.col(FILE))).persist())
            rows.count()  # read here, into the cache
            return rows, raw

    def fits(self, path: Column) -> Column:
        """Whether a file path (as Spark reports it) fits the whole template."""
        from pyspark.sql import functions as F

        return F.regexp_extract(_decode(path), self.regex, 0) != ""

    def _csv_rows(self, contents: DataFrame) -> DataFrame:
        """CSV rows by their files' own headers, parsed in Spark's Python workers
        (``raybricks.csv_files``): a pass finds each header's names and its columns' types
        and the files to skip, a second parses every good file in the one schema."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        contents = contents.persist()
        try:
            summary = contents.mapInArrow(csv_files.summarize,
                                          from_arrow_schema(csv_files.SUMMARY)).collect()
            self._skipped = {_normalized(row["path"]): row["reason"] for row in summary
                             if row["header"] is None}
            found = [row for row in summary if row["header"] is not None]
            layouts = [(json.loads(row["header"]), json.loads(row["types"])) for row in found]
            for (names, kinds), row in zip(layouts, found, strict=True):
                text = json.loads(row["text"])
                for name, kind in zip(names, kinds, strict=True):
                    self.example.setdefault(name, unquote(row["path"]))
                    if kind == "string":  # a file of this layout with a word in it
                        self._text.setdefault(name, unquote(text.get(name, row["path"])))
                        if name in text:
                            self._mixed.add(name)
            if not layouts:
                shown = "; ".join(list(self._skipped.values())[:3])
                raise DataError(f"no file matching source.path {self.path!r} gave a row"
                                + (f": {shown}" if shown else ": no file found"))
            self._parsed = sum(row["files"] for row in found)
            types = csv_files.settle(layouts)
            self._say_text(types, layouts)
            parsed = {n: csv_files.PARSED.get(t) for n, t in types.items()}
            schema = from_arrow_schema(csv_files.parsed_schema(types, FILE))
            rows = contents.mapInArrow(csv_files.parse(types, FILE), schema).select(
                FILE, *[_column(n) if parsed[n] is not None
                        else F.expr(f"try_cast({parquet.quoted(n)} as {t})").alias(n)
                        for n, t in types.items()]).persist()
            rows.count()  # read here, into the cache
        finally:
            contents.unpersist()
        return rows

    def _say_text(self, types: dict[str, str], layouts: list) -> None:
        """Name a file that made a column text where other files hold numbers or dates
        (a stray value, a unit or a comma in one file of a million)."""
        for name, kind in types.items():
            others = any(n == name and k not in (None, "string")
                         for names, kinds in layouts for n, k in zip(names, kinds, strict=True))
            if kind == "string" and (others or name in self._mixed) and name in self._text:
                console.say(f"source: column {name!r} is read as text: {self._text[name]} "
                            "holds values that are not numbers (other files' values are)")

    def unread(self) -> list[UnreadFile]:
        """The files that gave no rows, with the reason: those skipped while parsing, and
        those Spark lists but could not read (one Spark job over the listing and the
        rows; the sizes of those looked up, up to ``LOOKUPS``)."""
        from pyspark.sql import functions as F

        listing = (_listing(self.spark, self._listing).where(self.fits(F.col("path")))
                   .select(_comparable("path").alias("p")))
        if self.format == "csv" and listing.count() == self._parsed + len(self._skipped):
            missing = list(self._skipped)  # every file listed was read
        else:
            read = self.rows.select(_comparable(FILE).alias("p")).distinct()
            missing = [r["p"] for r in listing.join(read, "p", "left_anti").collect()]
        pattern = re.compile(self.regex)
        missing = sorted(missing)
        sizes = self._sizes([p for p in missing if p not in self._skipped][:LOOKUPS])
        unread = []
        for path in missing:
            match = pattern.search(path)
            key = match.groups() if match else None
            reason = self._skipped.get(path)
            if reason is None:
                reason = self._reason(path, sizes.get(path))
            unread.append(UnreadFile(path, key, _decoded(reason)))
        return unread

    def _reason(self, path: str, size: int | None) -> str:
        """Why a file Spark lists gave no row (it was not read at all)."""
        if size == 0:
            return f"empty file: {path}"
        if size is None:
            return f"no rows read from {path}"
        holds_none = ", holds no rows," if self.format == "parquet" else ""
        checksum = self._stale_checksum(path)
        return (f"no rows could be read from {path} ({size} bytes): it{holds_none} is not "
                f"readable as {self.format}" + (
                    f" (its checksum file {checksum} does not match it: a stale .crc "
                    "left from an earlier version of the file; delete the .crc)" if checksum
                    else " (corrupt, truncated or wrongly compressed; Spark's log names "
                    "the error)"))

    def _stale_checksum(self, path: str) -> str | None:
        """The Hadoop checksum file beside ``path`` (``.name.crc``), if there is one (on
        Spark Connect: where the client sees it, ``_on_client``; Spark lists no hidden
        file, so no Spark job can find it)."""
        crc = parquet.checksum_file(path)
        if is_spark_connect(self.spark):
            seen = _on_client(crc)
            return crc if seen is not None and os.path.isfile(seen) else None
        return crc if self._size(crc) is not None else None

    def _sizes(self, paths: list[str]) -> dict[str, int | None]:
        """The sizes of files Spark lists (``_comparable`` paths): by Hadoop's file
        system one by one on a classic session, in one scan of the folder's file metadata
        on Spark Connect (``_metadata.file_size``; a listed file that scan does not give is
        empty: Spark's scans leave out empty files)."""
        if not paths:
            return {}
        if not is_spark_connect(self.spark):
            return {path: self._size(path) for path in paths}
        from pyspark.sql import functions as F

        try:
            wanted = self.spark.createDataFrame([(p,) for p in paths], "p string")
            found = (self._reader().format("binaryFile").load(self.folder)
                     .select(F.col("_metadata.file_path").alias("path"),
                             F.col("_metadata.file_size").alias("size"))
                     .select(_comparable("path").alias("p"), "size")
                     .join(wanted, "p").collect())
        except Exception as exc:  # noqa: BLE001 - the sizes only word the reasons
            log.warning("could not look up the sizes of the files that gave no rows: %s",
                        first_line(exc))
            return {}
        return dict.fromkeys(paths, 0) | {row["p"]: int(row["size"]) for row in found}

    def _size(self, path: str) -> int | None:
        """A file's size by Hadoop's file system (as Spark reaches it), or None (a
        classic session: the JVM's)."""
        try:
            jvm = self.spark._jvm
            hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
            conf = self.spark._jsc.hadoopConfiguration()
            return int(hadoop_path.getFileSystem(conf).getFileStatus(hadoop_path).getLen())
        except Exception:  # noqa: BLE001 - the size only words the reason
            return None

    def skipped(self, segment_by: list[str]) -> SkippedFiles:
        """The files that gave no rows, by segment: the segments none of whose files gave
        a row (skipped, with the reason) and the others' skipped files (their result rows
        name them). By segment only where the path holds the whole segment key (else a
        file's segment is unknown: the files are logged)."""
        unread = self.unread()
        if unread:
            shown = "; ".join(u.reason for u in unread[:5])
            log.warning("%d file(s) of source.path gave no rows: %s%s", len(unread), shown,
                        " ..." if len(unread) > 5 else "")
        if not unread or not set(segment_by) <= set(self.keys):
            return SkippedFiles([], {})
        order = [self.keys.index(name) for name in segment_by]
        by_key: dict[tuple, list[str]] = {}
        for u in unread:
            if u.key is not None:
                by_key.setdefault(tuple(u.key[i] for i in order), []).append(u.reason)
        present = set()
        if by_key:
            wanted = self.spark.createDataFrame(list(by_key), segment_by)
            present = {tuple(r) for r in self.frame.select(*segment_by).distinct()
                       .join(wanted, segment_by).collect()}
        notes = {key: (len(reasons), _skipped_note(reasons, key in present))
                 for key, reasons in sorted(by_key.items())}
        return SkippedFiles([(key, notes[key][1]) for key in notes if key not in present],
                            notes)

    def release(self) -> None:
        """Free the cached rows (after the data went to Ray)."""
        self.rows.unpersist()


def _skipped_note(reasons: list[str], trained: bool) -> str:
    """What a segment's result row says of its skipped files (``trained``: on others)."""
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3
                                      else "")
    if trained:
        return f"{len(reasons)} of its files skipped: {shown}"
    if len(reasons) == 1:
        return reasons[0]
    return f"no rows in any of its {len(reasons)} files: {shown}"


def _normalized(path: str) -> str:
    """A path as Spark reports it, as ``_comparable`` makes it (decoded, ``file:/``)."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*):/+", r"\1:/", unquote(path))


def _decoded(reason: str) -> str:
    """A reason naming a path as Spark reports it (URL-encoded), decoded."""
    return unquote(reason) if "%" in reason else reason


def _on_client(path: str) -> str | None:
    """Where this process sees a file Spark names (a ``_comparable`` path, decoded):
    ``file:`` and plain paths as they are (under ``/dbfs`` where not there, as on
    Databricks), ``dbfs:`` under ``/dbfs``; None for other schemes."""
    if path.startswith("dbfs:"):
        return "/dbfs/" + path[len("dbfs:"):].lstrip("/")
    if path.startswith("file:"):
        return "/" + path[len("file:"):].lstrip("/")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", path):
        return None
    return path if os.path.exists(path) else "/dbfs/" + path.lstrip("/")


def _column(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col(parquet.quoted(name))


#: Spark's settings while it lists and reads the files: a listing job of a few tasks per
#: core (Spark's default: a task per folder, up to 10,000), and about a thousand small files
#: per read task (its default counts 4 MB per file opened, so 32 small files make a task,
#: and every later pass over the cached rows keeps those many tiny partitions)
SMALL_FILES = {"spark.sql.sources.parallelPartitionDiscovery.parallelism": "{tasks}",
               "spark.sql.files.openCostInBytes": str(128 * 1024)}


@contextlib.contextmanager
def _small_files(spark: SparkSession) -> Iterator[None]:
    """``SMALL_FILES`` set on the session while the files are listed and first read
    (on Spark Connect: those the session allows; the listing's tasks left to Spark where
    its cores are not known, ``session.spark_cores``)."""
    cores = spark_cores(spark)
    wanted = {name: value.format(tasks=max(4 * cores, 8)) for name, value
              in SMALL_FILES.items() if cores is not None or "{tasks}" not in value}
    before = {}
    for name, value in wanted.items():
        try:
            before[name] = spark.conf.get(name, None)
            spark.conf.set(name, value)
        except Exception as exc:  # noqa: BLE001 - serverless allows few settings
            log.debug("Spark setting %s left as it is: %s", name, exc)
            before.pop(name, None)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                spark.conf.unset(name)
            else:
                spark.conf.set(name, value)


def _listing(spark: SparkSession, frame: DataFrame) -> DataFrame:
    """Every file Spark's file index lists for ``frame``'s relation (empty ones too), as
    a one-column frame ``path``: built in the JVM on a classic session (never collected
    to the driver); on Spark Connect, which has no JVM here, the paths come to the client
    (``DataFrame.inputFiles``, the same listing) and go back as a local relation. Spark's
    scans would not do: they leave out empty files."""
    from pyspark.sql import DataFrame as SparkFrame

    if is_spark_connect(spark):
        return spark.createDataFrame([(path,) for path in frame.inputFiles()], "path string")
    jvm = spark._jvm
    paths = jvm.scala.Predef.genericWrapArray(frame._jdf.inputFiles()).toList()
    dataset = spark._jsparkSession.createDataset(paths, jvm.org.apache.spark.sql.Encoders.STRING())
    return SparkFrame(dataset.toDF(), spark).withColumnRenamed("value", "path")
