"""Files as segments on Spark Connect (Databricks serverless, standard access mode): a
real Connect server (``tests.test_connect.connect_server``) and a client in its own
process (``tests/connect_files_client.py``) read the same folders of good and bad CSV and
Parquet files as the suite's classic session, and find the same: the same rows by
segment, the same files without rows and the same reasons naming them, the same absent
segments and notes, the same warning of a text column and the same errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raybricks import files as files_module
from tests import connect_files_client as client
from tests.test_connect import connect_server  # noqa: F401 - the fixture
from tests.test_files import (
    BAD_FILES,
    NO_ROWS,
    write_bad_files,
    write_zip_files,
    zip_frame,
)

CLIENT = Path(client.__file__)


def write_folders(root: Path) -> dict[str, list[str]]:
    """The folders of ``client.CASES`` and ``client.FAILING`` under ``root``; the good
    segments that hold a bad file beside their good one, by case."""
    frame = zip_frame(12, seed=4)
    write_zip_files(root / "csv", frame, "csv")  # an empty file, a header only, bad gzip
    beside = sorted(frame.zip.unique())[:len(BAD_FILES)]
    write_bad_files(root / "csv", beside)  # gzip under .csv, ragged rows, a stale .crc, ...

    parquet = root / "parquet"
    write_zip_files(parquet, zip_frame(6, seed=5), "parquet")  # empty, no rows, corrupt
    times = pd.DataFrame({"x1": [1.5, 2.5], "x2": [1, 2], "y": [3.0, 4.0],
                          "when": pd.to_datetime(["2024-03-01 10:00:00.123456",
                                                  "2024-03-02 11:00:00.000001"])})
    (parquet / "zip=times").mkdir()
    times.to_parquet(parquet / "zip=times/part.parquet")  # pandas' nanoseconds
    (parquet / "zip=00001/part-9.parquet").write_bytes(b"PAR1 cut short")  # a second file

    for name, values in {"a": "1.5\n2.5\n", "b": "3\n4\n", "c": "5\n6 kg\n"}.items():
        (root / "text" / name).mkdir(parents=True)
        (root / "text" / name / "part.csv").write_text("y\n" + values)
    (root / "clash" / "a").mkdir(parents=True)
    (root / "clash" / "a" / "part.csv").write_text("zip,y\n1,2\n")
    for name, values in {"a": pa.array([1, 2]), "b": pa.array(["x", "y"])}.items():
        (root / "conflict" / name).mkdir(parents=True)
        pq.write_table(pa.table({"y": values}), root / "conflict" / name / "part.parquet")
    return {"csv": beside, "parquet": ["00001"]}


@pytest.mark.heavy  # a Spark Connect server in a process of its own
def test_files_as_segments_read_on_spark_connect_find_what_classic_spark_finds(
        connect_server, spark, tmp_path):  # noqa: F811 - the fixture imported above
    beside = write_folders(tmp_path)
    server = connect_server()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(files_module.__file__).parents[1]), str(CLIENT.parents[1])])}
    process = subprocess.Popen([sys.executable, str(CLIENT), server, str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=tmp_path, env=env)
    try:
        classic = client.found(spark, tmp_path)  # meanwhile, on the suite's classic session
    finally:
        out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    on_connect = json.loads(out.splitlines()[-1])
    assert on_connect.pop("connect") is True

    # what classic Spark finds, so that the comparison is not of two empty answers
    csv, parquet, text = classic["csv"], classic["parquet"], classic["text"]
    assert len(csv["rows"]) == 12 * 16 and len(parquet["rows"]) == 6 * 16 + 2
    assert {key for (key,), _ in csv["absent"]} == {f"bad-{k}" for k in BAD_FILES} | set(NO_ROWS)
    assert [key for (key,), count, _ in csv["notes"] if count == 1 and key in beside["csv"]
            ] == beside["csv"]
    crc = dict((key, reason) for (key,), reason in csv["absent"])["bad-checksum"]
    assert "stale .crc" in crc and "zip=bad-checksum/part-9.csv" in crc
    assert {key for (key,), _ in parquet["absent"]} == set(NO_ROWS)
    assert dict(parquet["columns"])["when"] == "timestamp_ntz"
    assert "2024-03-01 10:00:00.123456" in {row[-1] for row in parquet["rows"]}
    [(key, count, note)] = [n for n in parquet["notes"] if n[0] == beside["parquet"]]
    assert count == 1 and "(14 bytes)" in note and "zip=00001/part-9.parquet" in note
    assert any("column 'y' is read as text" in line and "c/part.csv" in line
               for line in text["said"])
    assert classic["missing"].startswith("SourceNotFound: no csv files match")
    assert classic["clash"].startswith("DataError: column(s) ['zip'] are in the files")
    assert classic["conflict"].startswith("DataError: the parquet files at")

    # Spark Connect: the same, to the letter
    for case in classic:
        assert on_connect[case] == classic[case], case
