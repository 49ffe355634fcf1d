"""Files as segments on Spark Connect: the client of tests/test_connect_files.py, in a
process of its own (a Connect session turns pyspark in its process to remote mode):

    python tests/connect_files_client.py sc://HOST:PORT ROOT

Reads each folder of ROOT the test wrote (``CASES``) with ``SegmentFiles`` and prints what
it found as one JSON line (``found``); the test finds the same with its classic session.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

#: The folders under ROOT, their templates' ends and formats (the segment key: ``zip``).
CASES = {"csv": ("zip={zip}/*", "csv"), "parquet": ("zip={zip}/*", "parquet"),
         "text": ("{zip}/part.csv", "csv")}
#: Folders whose reading fails: the template's end and the format.
FAILING = {"missing": ("zip={zip}/*", "csv"), "clash": ("{zip}/part.csv", "csv"),
           "conflict": ("{zip}/part.parquet", "parquet")}


def described(spark, template: str, fmt: str) -> dict:
    """What ``SegmentFiles`` finds: the frame's columns, types and rows (as text, sorted),
    what raybricks said while reading, and the segments by ``zip`` with files that gave
    no rows: those without any row (the reason) and the notes of all (how many files,
    the reasons naming them)."""
    from raybricks.files import SegmentFiles

    with contextlib.redirect_stdout(io.StringIO()) as said:
        files = SegmentFiles(spark, template, fmt)
    rows = files.frame.toPandas().astype(str)
    skipped = files.skipped(["zip"])
    found = {"columns": files.frame.dtypes,
             "rows": sorted(rows.itertuples(index=False, name=None)),
             "said": said.getvalue().splitlines(),
             "absent": sorted([list(key), reason] for key, reason in skipped.absent),
             "notes": sorted([list(key), count, note]
                             for key, (count, note) in skipped.notes.items())}
    files.release()
    return json.loads(json.dumps(found))  # tuples as lists, as the client's JSON has them


def found(spark, root: Path) -> dict:
    """``described`` for every case under ``root``, and each failing one's error."""
    from raybricks.files import SegmentFiles

    result: dict = {name: described(spark, f"{root / name}/{end}", fmt)
                    for name, (end, fmt) in CASES.items()}
    for name, (end, fmt) in FAILING.items():
        try:
            SegmentFiles(spark, f"{root / name}/{end}", fmt)
            result[name] = "read"
        except Exception as exc:  # noqa: BLE001 - what is raised is compared
            result[name] = f"{type(exc).__name__}: {exc}"
    return result


def main(url: str, root: Path) -> dict:
    from pyspark.sql import SparkSession

    from raybricks.session import is_spark_connect

    spark = SparkSession.builder.remote(url).getOrCreate()
    assert is_spark_connect(spark)
    try:
        return {"connect": True, **found(spark, root)}
    finally:
        spark.stop()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]))))
