"""CSV files parsed one by one, inside Spark's Python workers (``raybricks.files``).

Each file is checked before it is parsed: a first line that is not a plausible CSV header
(binary bytes, control characters, a compressed or spreadsheet file under a text name,
names that do not parse, an empty or repeated name) skips the file with the reason and its
path, as does a row that does not parse; a file never fails the job and never adds
columns to other files. Files that share a header and hold no quotes are parsed together,
as one CSV text (Arrow's reader); the others one by one.

Two passes over the files' bytes: ``summarize`` (each header's column names and the
Arrow types its files' values take, and the files skipped, with their reasons), then,
with the column types settled across every file (``settle``), ``parse``: every row of
every good file in the one schema.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

#: the columns ``summarize`` writes: a header's layout (``header``: its names as JSON,
#: ``types``: each column's Spark type as JSON, ``files``/``rows``: how many, ``path``:
#: one of those files), or a skipped file (``path``, ``reason``)
SUMMARY = pa.schema([pa.field("path", pa.string()), pa.field("header", pa.string()),
                     pa.field("types", pa.string()), pa.field("files", pa.int64()),
                     pa.field("rows", pa.int64()), pa.field("reason", pa.string()),
                     pa.field("text", pa.string())])
#: a number as CSV text (what makes a column of numbers and a stray word text)
NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
#: the Spark types a CSV column can take, widest last within each family
NUMBERS = ("bigint", "double")
#: values read as null (pandas' and Arrow's defaults)
NULLS = ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
         "1.#QNAN", "N/A", "NA", "NULL", "NaN", "n/a", "nan", "null"]
#: how a file's first bytes give away a format that is not text
MAGIC = {b"\x1f\x8b": "gzip-compressed data", b"PK\x03\x04": "a zip archive (an .xlsx "
         "spreadsheet or zipped files)", b"\xd0\xcf\x11\xe0": "an old Excel (.xls) or "
         "Office file", b"PAR1": "a Parquet file", b"BZh": "bzip2-compressed data",
         b"\x28\xb5\x2f\xfd": "zstd-compressed data", b"%PDF": "a PDF document",
         b"7z\xbc\xaf": "a 7-zip archive"}
#: the compressions a file name's suffix asks for, as Python opens them
SUFFIXES = {".gz": gzip.decompress, ".gzip": gzip.decompress, ".bz2": bz2.decompress,
            ".deflate": zlib.decompress}
#: Spark's type names for the Arrow types the reader infers (else string)
INFERRED = {"int64": "bigint", "double": "double", "bool": "boolean", "date32[day]": "date"}
#: the Arrow type each Spark type is parsed as (dates and timestamps as text: Spark
#: converts those, in its session's time zone)
PARSED = {"bigint": pa.int64(), "double": pa.float64(), "boolean": pa.bool_()}


class Skipped(Exception):  # noqa: N818 - a file skipped, not an error of the job
    """A file that gives no rows, and why (the reason names the file)."""


@dataclass
class File:
    """One file's path and text: its header line and its data lines (non-blank)."""

    path: str
    header: str
    lines: list[bytes]
    quoted: bool  # a quote in its data: parsed alone (a value may hold a line break)


def read_file(path: str, content: bytes) -> File:
    """The file's header and data lines, or ``Skipped`` with the reason."""
    content = _decompressed(path, content)
    if not content.strip():
        raise Skipped(f"empty file: {path}")
    for magic, kind in MAGIC.items():
        if content.startswith(magic):
            raise Skipped(f"not a CSV file: {path} holds {kind} under a text name (rename "
                          "or convert it, or keep it out of the folder)")
    first, _, body = content.partition(b"\n")
    header = _header(path, first.rstrip(b"\r"))
    lines = [line for line in body.split(b"\n") if line.strip()]
    if not lines:
        raise Skipped(f"only a header, no rows: {path}")
    return File(path, header, lines, quoted=b'"' in body)


def _decompressed(path: str, content: bytes) -> bytes:
    suffix = "." + path.rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
    if suffix in (".zst", ".lz4", ".snappy", ".zip", ".xz"):
        raise Skipped(f"not read: {path} is compressed as {suffix[1:]}, which CSV sources do "
                      "not read (use plain files, .gz or .bz2)")
    opener = SUFFIXES.get(suffix)
    if opener is None:
        return content
    try:
        return opener(content)
    except Exception as exc:  # noqa: BLE001 - any failure to decompress skips the file
        raise Skipped(f"no rows could be read from {path}: it is not readable as "
                      f"{suffix[1:]} ({type(exc).__name__}: {exc}; corrupt, truncated or not "
                      "compressed as its name says)") from None


def _header(path: str, first: bytes) -> str:
    """The header line as text, if it is a plausible CSV header."""
    try:
        text = first.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError:
        raise Skipped(f"not a CSV file: the first line of {path} is not UTF-8 text (binary "
                      "data?)") from None
    bad = sorted({f"{ord(c):#04x}" for c in text if (ord(c) < 32 and c != "\t") or ord(c) == 127})
    if bad:
        raise Skipped(f"not a CSV file: the first line of {path} holds control characters "
                      f"({', '.join(bad[:4])}): binary data, not a header")
    names = header_names(path, text)
    return ",".join(_quoted(n) for n in names)


def header_names(path: str, header: str) -> list[str]:
    """A CSV header's column names, or ``Skipped`` where they do not parse."""
    try:
        names = [n.strip() for n in next(csv.reader([header], strict=True))]
    except (csv.Error, StopIteration) as exc:
        raise Skipped(f"the header of {path} does not parse as CSV ({exc}): {header[:80]!r}"
                      ) from None
    if not all(names) or len(set(names)) != len(names):
        raise Skipped(f"the header of {path} has an empty or repeated column name "
                      f"({header[:80]!r}): every CSV file needs a header of distinct names")
    return names


def _quoted(name: str) -> str:
    return f'"{name}"' if any(c in name for c in ',"\r\n') else name


def _read(header: str, lines: list[bytes], types: dict[str, pa.DataType] | None,
          columns: list[str] | None = None) -> pa.Table:
    """Lines under their header, parsed as one CSV text (``types``: the column types,
    else inferred; ``columns``: the columns wanted, those missing null)."""
    data = header.encode() + b"\n" + b"\n".join(lines) + b"\n"
    convert = pcsv.ConvertOptions(null_values=NULLS, strings_can_be_null=True,
                                  column_types=types or {})
    if columns is not None:
        convert.include_columns, convert.include_missing_columns = columns, True
    return pcsv.read_csv(pa.py_buffer(data), convert_options=convert,
                         read_options=pcsv.ReadOptions(use_threads=False,
                                                       block_size=len(data) + 1),
                         parse_options=pcsv.ParseOptions(newlines_in_values=True))


def _parsed(files: list[File], types: dict[str, pa.DataType] | None,
            columns: list[str] | None = None) -> Iterator[tuple[list[File], pa.Table | str]]:
    """Files of one header parsed: together where they hold no quotes (one by one if
    that fails, to find the file at fault), else one by one; a file that does not parse
    comes with the parser's message."""
    together = [f for f in files if not f.quoted]
    alone = [[f] for f in files if f.quoted]
    if together:
        try:
            yield together, _read(files[0].header, [ln for f in together for ln in f.lines],
                                  types, columns)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            alone += [[f] for f in together]
    for (file,) in alone:
        try:
            yield [file], _read(file.header, file.lines, types, columns)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            yield [file], f"rows that do not parse as CSV in {file.path}: {exc}"


def _by_header(batch: pa.RecordBatch, skipped: list[tuple[str, str]]
               ) -> dict[str, list[File]]:
    """A batch's files (``path``, ``content``) read, grouped by header; the skipped ones
    added to ``skipped`` with their reasons."""
    groups: dict[str, list[File]] = {}
    for path, content in zip(batch.column("path").to_pylist(),
                             batch.column("content").to_pylist(), strict=True):
        try:
            file = read_file(path, content or b"")
        except Skipped as why:
            skipped.append((path, str(why)))
            continue
        groups.setdefault(file.header, []).append(file)
    return groups


def summarize(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Spark ``mapInArrow``: per batch of files, each header's names and the Spark type
    of each column (over its files' values), and every skipped file with its reason."""
    for batch in batches:
        skipped: list[tuple[str, str]] = []
        rows = []
        for header, files in _by_header(batch, skipped).items():
            names = header_names("", header)
            for group, table in _parsed(files, None):
                if isinstance(table, str):
                    skipped.append((group[0].path, table))
                    continue
                types = [INFERRED.get(str(t), "timestamp" if pa.types.is_timestamp(t)
                                      else None if pa.types.is_null(t) else "string")
                         for t in table.schema.types]
                rows.append((group[0].path, json.dumps(names), json.dumps(types),
                             len(group), table.num_rows, None,
                             json.dumps(_text_files(group, table))))
        rows += [(path, None, None, None, None, reason, None) for path, reason in skipped]
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(SUMMARY)
        yield pa.RecordBatch.from_arrays(
            [pa.array(list(c), f.type) for c, f in zip(columns, SUMMARY, strict=True)],
            schema=SUMMARY)


def _text_files(group: list[File], table: pa.Table) -> dict[str, str]:
    """For each text column of files parsed together where some values are numbers:
    the first file holding a value that is not (the file that made the column text)."""
    found = {}
    ends = np.cumsum([len(f.lines) for f in group])
    for name, column in zip(table.column_names, table.columns, strict=True):
        if not pa.types.is_string(column.type):
            continue
        number = pc.match_substring_regex(column, NUMBER).to_numpy(zero_copy_only=False)
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        other = np.flatnonzero(valid & ~number.astype(bool, copy=False))
        if len(other) and (valid & number.astype(bool, copy=False)).any():
            found[name] = group[int(np.searchsorted(ends, other[0], side="right"))].path
    return found


def settle(layouts: Iterable[tuple[list[str], list[str | None]]]) -> dict[str, str]:
    """Each column's Spark type over every file's layout (names, types; None: only
    nulls): the one type its values all take (integers and decimals: double; dates and
    timestamps: timestamp), else string. Columns in the order first seen."""
    seen: dict[str, set[str]] = {}
    for names, types in layouts:
        for name, kind in zip(names, types, strict=True):
            seen.setdefault(name, set())
            if kind is not None:
                seen[name].add(kind)
    return {name: _wider(kinds) for name, kinds in seen.items()}


def _wider(kinds: set[str]) -> str:
    if len(kinds) == 1:
        return next(iter(kinds))
    if kinds and kinds <= set(NUMBERS):
        return "double"
    if kinds and kinds <= {"date", "timestamp"}:
        return "timestamp"
    return "string"


def parsed_schema(columns: dict[str, str], file_column: str) -> pa.Schema:
    """What ``parse`` gives: the file's path, then each column as Arrow parses it."""
    return pa.schema([pa.field(file_column, pa.string()),
                      *(pa.field(n, PARSED.get(t, pa.string())) for n, t in columns.items())])


def parse(columns: dict[str, str], file_column: str
          ) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The Spark ``mapInArrow`` function giving every row of every good file of a batch:
    ``file_column`` (its file's path), then ``columns`` (name: Spark type) in order,
    dates and timestamps as text (Spark casts them)."""
    names = list(columns)
    schema = parsed_schema(columns, file_column)
    types = {n: schema.field(n).type for n in names}

    def rows(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for files in _by_header(batch, []).values():
                for group, table in _parsed(files, types, names):
                    if isinstance(table, str):  # summarize skipped it too
                        continue
                    counts = [len(f.lines) for f in group]
                    if len(group) == 1:  # alone: a line break inside a quoted value
                        counts = [table.num_rows]
                    elif sum(counts) != table.num_rows:
                        raise RuntimeError(f"{table.num_rows} rows parsed from the "
                                           f"{sum(counts)} lines of {len(group)} files")
                    paths = pa.array(np.repeat(np.array([f.path for f in group], dtype=object),
                                               counts), pa.string())
                    table = table.select(names).cast(pa.schema([schema.field(n)
                                                                for n in names]))
                    yield from pa.Table.from_arrays([paths, *table.columns],
                                                    schema=schema).to_batches()

    return rows
