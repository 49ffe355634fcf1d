"""Files as segments: folders of small CSV or Parquet files whose paths hold the keys."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raybricks.config import JobConfig
from raybricks.errors import ConfigError
from raybricks.files import SegmentFiles

#: the files that give no rows, by key, and the start of the reason each must get
NO_ROWS = {"empty": "empty file", "header_only": "only a header, no rows",
           "corrupt": "no rows could be read"}
#: what the reason of the corrupt file says, and of an empty Parquet file (no header)
NOT_READABLE = "is not readable as"


def zip_frame(n: int, seed: int = 0) -> pd.DataFrame:
    """16 rows per zip code (leading zeros, a space and a plus among the codes)."""
    rng = np.random.default_rng(seed)
    zips = [f"{i:05d}" for i in range(n - 2)] + ["new york", "a+b"]
    x1 = rng.normal(size=16 * n).round(4)
    x2 = rng.integers(0, 9, 16 * n)
    codes = np.repeat(np.arange(n), 16)
    return pd.DataFrame({"zip": np.array(zips)[codes], "x1": x1, "x2": x2,
                         "y": (2 * x1 + x2 + codes % 7 + rng.normal(size=16 * n)).round(4)})


def write_zip_files(root, frame: pd.DataFrame, fmt: str) -> None:
    """One file per zip code under ``zip=<code>/``; every third file orders its columns
    the other way; plus an empty file, one with a header only and a corrupt one, each in
    a folder of its own."""
    for i, (code, rows) in enumerate(frame.groupby("zip", sort=False)):
        folder = root / f"zip={code}"
        folder.mkdir(parents=True)
        rows = rows.drop(columns="zip")
        if i % 3 == 0:
            rows = rows[rows.columns[::-1]]
        if fmt == "csv":
            (folder / "part.csv").write_text(rows.to_csv(index=False))
        else:
            pq.write_table(pa.Table.from_pandas(rows, preserve_index=False),
                           folder / "part.parquet")
    for code in NO_ROWS:
        (root / f"zip={code}").mkdir()
    suffix = "csv" if fmt == "csv" else "parquet"
    (root / f"zip=empty/part.{suffix}").write_bytes(b"")
    corrupt = b"\x1f\x8b" + bytes(range(40))  # a gzip magic number, then no gzip
    if fmt == "csv":
        (root / "zip=header_only/part.csv").write_text("y,x1,x2\n")
        (root / "zip=corrupt/part.csv.gz").write_bytes(corrupt)
    else:
        pq.write_table(pa.table({"x1": pa.array([], pa.float64())}),
                       root / "zip=header_only/part.parquet")
        (root / "zip=corrupt/part.parquet").write_bytes(b"PAR1 not a parquet file PAR1")


@pytest.mark.parametrize("fmt,n", [
    ("csv", 100), ("parquet", 100),
    pytest.param("csv", 2000, marks=pytest.mark.heavy, id="csv-thousands"),  # ~25 s
])
def test_every_file_is_read_by_its_header_and_every_file_without_rows_is_named(
        spark, tmp_path, fmt, n):
    frame = zip_frame(n)
    write_zip_files(tmp_path, frame, fmt)
    files = SegmentFiles(spark, f"{tmp_path}/zip={{zip}}/*", fmt)
    read = files.frame.toPandas()
    assert read.columns[0] == "zip" and sorted(read.columns) == ["x1", "x2", "y", "zip"]
    assert read.zip.nunique() == n  # leading zeros, spaces and plus signs kept
    columns = ["zip", "x1", "x2", "y"]
    pd.testing.assert_frame_equal(
        read[columns].sort_values(columns).reset_index(drop=True),
        frame[columns].sort_values(columns).reset_index(drop=True), check_dtype=False)
    assert pd.api.types.is_float_dtype(read.x1) and pd.api.types.is_integer_dtype(read.x2)
    unread = {u.key[0]: u.reason for u in files.unread()}
    assert set(unread) == set(NO_ROWS)
    assert unread["empty"].startswith(NO_ROWS["empty"])
    assert unread["corrupt"].startswith(NO_ROWS["corrupt"]) and NOT_READABLE in unread["corrupt"]
    if fmt == "csv":
        assert unread["header_only"].startswith(NO_ROWS["header_only"])
    else:  # a Parquet file without rows has no header to tell it from an unreadable one
        assert "holds no rows" in unread["header_only"]
    skipped = files.skipped(["zip"])
    absent = dict(skipped.absent)
    assert {(k,) for k in NO_ROWS} == set(absent) and absent[("empty",)] == unread["empty"]
    assert {key: count for key, (count, _) in skipped.notes.items()} == {
        (k,): 1 for k in NO_ROWS}
    files.release()


def test_a_path_template_is_checked_with_the_config(tmp_path):
    base = {"segment_by": ["zip"], "target": "y",
            "models": [{"name": "ridge", "kind": "sklearn",
                        "estimator": "sklearn.linear_model.Ridge"}]}
    problems = {
        "/data/{zip}/{zip}.csv": "names ['zip'] more than once",
        "/data/{y}/part.csv": "target 'y' is a {key} of source.path",
        "/data/{zip}/{a,b}.csv": "{a,b} alternatives are not supported",
    }
    for path, message in problems.items():
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("{", r"\{")):
            JobConfig.from_dict(base | {"source": {"path": path, "format": "csv"}})
    with pytest.raises(ConfigError, match="reads csv or parquet files, not delta"):
        JobConfig.from_dict(base | {"source": {"path": "/d/{zip}", "format": "delta"}})
    config = JobConfig.from_dict(base | {"source": {"path": "/d/{zip}/*.csv",
                                                    "format": "csv"}})
    assert config.source.path == "/d/{zip}/*.csv"


def test_a_file_column_named_like_a_key_is_refused(spark, tmp_path):
    from raybricks.errors import DataError

    (tmp_path / "a").mkdir()
    (tmp_path / "a/part.csv").write_text("zip,y\n1,2\n")
    with pytest.raises(DataError, match=r"\['zip'\] are in the files \(e.g. .*a/part.csv\) and"):
        SegmentFiles(spark, f"{tmp_path}/{{zip}}/part.csv", "csv")


def test_the_file_that_makes_a_column_text_is_named(spark, tmp_path, capsys):
    for name, values in {"a": "1.5\n2.5\n", "b": "3\n4\n", "c": "5\n6 kg\n"}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "part.csv").write_text("y\n" + values)
    files = SegmentFiles(spark, f"{tmp_path}/{{zip}}/part.csv", "csv")
    assert dict(files.frame.dtypes)["y"] == "string"
    said = capsys.readouterr()
    assert "column 'y' is read as text" in said.out + said.err
    assert "c/part.csv holds values that are not numbers" in said.out + said.err
    files.release()


def stale_checksum(path, content: bytes) -> None:
    """Hadoop's checksum file beside ``path`` (``.name.crc``: CRC32 per 512 bytes), made
    for other ``content``: what a file edited outside Hadoop leaves behind."""
    import struct
    import zlib

    sums = b"".join(struct.pack(">I", zlib.crc32(content[i:i + 512]))
                    for i in range(0, len(content), 512))
    (path.parent / f".{path.name}.crc").write_bytes(b"crc\0" + struct.pack(">i", 512) + sums)


#: bad files, each alone in its segment's folder or beside a good file of a trained
#: segment (``write_bad_files``), and the start of the reason each must be skipped with
BAD_FILES = {
    "gzip": (b"\x1f\x8b\x08\x00" + bytes(range(200)), "not a CSV file"),  # as part.csv
    "xlsx": (b"PK\x03\x04\x14\x00\x06\x00" + bytes(range(60)), "not a CSV file"),
    "binary": (b"\x00\x01\x02abc", "not a CSV file"),  # short, no comma
    "random": (np.random.default_rng(3).integers(0, 256, 300, dtype=np.uint8).tobytes()
               + b"`,\n1,2\n", "not a CSV file"),
    "control": (b"x1\x07,y\n1,2\n", "not a CSV file"),
    "unparsed": (b'x1,"y\n1,2\n', "the header of"),
    "repeated": (b"x1,x1,y\n1,2,3\n", "the header of"),
    "ragged": (b"x1,x2,y\n1,2,3\n1,2,3,4,5\n", "rows that do not parse"),
    "checksum": (b"x1,x2,y\n1,2,3\n", "no rows could be read"),  # a stale .crc beside it
}


def write_bad_files(root, beside: list[str]) -> None:
    """Each of ``BAD_FILES`` as the only file of segment ``bad-<kind>``, and again as a
    second file of an existing (good) segment's folder in ``beside``."""
    for (kind, (content, _)), good in zip(BAD_FILES.items(), beside, strict=True):
        for folder in (root / f"zip=bad-{kind}", root / f"zip={good}"):
            folder.mkdir(exist_ok=True)
            (folder / "part-9.csv").write_bytes(content)
            if kind == "checksum":
                stale_checksum(folder / "part-9.csv", b"x1,x2,y\n7,7,7\n")


@pytest.mark.topology  # read on executors in their own JVMs too
def test_a_bad_file_is_skipped_with_its_path_and_never_touches_other_files(spark, tmp_path):
    frame = zip_frame(30, seed=2)
    write_zip_files(tmp_path, frame, "csv")
    beside = sorted(frame.zip.unique())[:len(BAD_FILES)]
    write_bad_files(tmp_path, beside)
    files = SegmentFiles(spark, f"{tmp_path}/zip={{zip}}/*", "csv")
    read = files.frame.toPandas()
    # no bad file added a column or a row: the good files' rows, exactly
    assert sorted(read.columns) == ["x1", "x2", "y", "zip"]
    columns = ["zip", "x1", "x2", "y"]
    pd.testing.assert_frame_equal(
        read[columns].sort_values(columns).reset_index(drop=True),
        frame[columns].sort_values(columns).reset_index(drop=True), check_dtype=False)
    assert pd.api.types.is_float_dtype(read.x1) and pd.api.types.is_integer_dtype(read.x2)
    unread = {u.path.rsplit("/", 2)[-2]: u.reason for u in files.unread()
              if u.path.endswith("part-9.csv")}
    for kind, (_, reason) in BAD_FILES.items():
        for folder in (f"zip=bad-{kind}", f"zip={beside[list(BAD_FILES).index(kind)]}"):
            assert unread[folder].startswith(reason), (kind, unread[folder])
            assert f"{folder}/part-9.csv" in unread[folder]  # the reason names the file
    assert "stale .crc" in unread["zip=bad-checksum"]
    skipped = files.skipped(["zip"])
    absent = dict(skipped.absent)
    assert set(absent) == {(f"bad-{k}",) for k in BAD_FILES} | {(k,) for k in NO_ROWS}
    for good in beside:  # trained on its good file; the bad one named in its row
        count, note = skipped.notes[(good,)]
        assert count == 1 and note.startswith("1 of its files skipped") and "part-9" in note
    files.release()


@pytest.mark.topology  # the files read on executors in their own JVMs
@pytest.mark.heavy  # ~40 s; the reading itself runs on every runtime (the tests above)
def test_a_folder_of_files_trains_registers_and_scores_by_key(ray_on_spark, spark, tmp_path):
    from raybricks import score, train

    frame = zip_frame(120, seed=1)
    root = tmp_path / "zips"
    write_zip_files(root, frame, "csv")
    beside = sorted(frame.zip.unique())[:len(BAD_FILES)]
    write_bad_files(root, beside)
    template = f"{root}/zip={{zip}}/*.csv*"
    config = JobConfig.model_validate({
        "source": {"path": template, "format": "csv"}, "segment_by": ["zip"],
        "target": "y", "min_rows": 10, "fallback": "global",
        "models": [{"name": "ridge", "kind": "sklearn",
                    "estimator": "sklearn.linear_model.Ridge"}],
        "registry": {"name": "tests.files.zips", "promote": "always"},
        "training": {"output_dir": str(tmp_path / "runs"), "progress": False}})
    report = train(config, spark)
    bad = len(NO_ROWS) + len(BAD_FILES)
    assert report.accounting["source_segments"] == 120 + bad
    assert report.result.counts() == {"trained": 120, "skipped": bad, "failed": 0}
    rows = report.result.segments.set_index("zip")
    for code, reason in [*NO_ROWS.items(), *((f"bad-{k}", r) for k, (_, r) in BAD_FILES.items())]:
        assert rows.loc[code, "status"] == "skipped"
        assert rows.loc[code, "reason"].startswith(reason) and rows.loc[code, "files_skipped"] == 1
    for code in beside:  # trained on its good file, the bad one named
        assert rows.loc[code, "status"] == "trained" and rows.loc[code, "files_skipped"] == 1
        assert f"zip={code}/part-9.csv" in rows.loc[code, "reason"]
    assert (rows.drop(index=[*beside, *(f"bad-{k}" for k in BAD_FILES), *NO_ROWS])
            .files_skipped == 0).all()
    # scoring reads the same template: every row scored by its own zip code's model
    summary = score("models:/tests.files.zips@champion", template,
                    str(tmp_path / "scored.parquet"), spark=spark)
    assert summary.rows == len(frame) and summary.null_predictions == 0
    assert summary.status_counts == {"trained": len(frame)}
    scored = pd.read_parquet(tmp_path / "scored.parquet")
    assert sorted(scored.zip.unique()) == sorted(frame.zip.unique())


def test_parquet_files_as_pandas_writes_them_read_with_their_times(spark, tmp_path):
    times = pd.date_range("2024-03-01 10:00:00.123456", periods=4, freq="D")
    for code in ("a", "b"):
        (tmp_path / code).mkdir()
        pd.DataFrame({"when": times, "y": [1, 2, 3, 4]}).to_parquet(
            tmp_path / code / "part.parquet")  # pandas' default: nanoseconds
    assert "timestamp[ns]" in str(pq.read_schema(tmp_path / "a/part.parquet").field("when"))
    files = SegmentFiles(spark, f"{tmp_path}/{{zip}}/part.parquet", "parquet")
    read = files.frame.toPandas().sort_values(["zip", "when"])
    assert list(read.y) == [1, 2, 3, 4] * 2  # integers stay integers
    assert [pd.Timestamp(t) for t in read.when] == list(times) * 2
    files.release()
