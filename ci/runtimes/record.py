"""Record what a test run ran on: Python, Spark and the key packages' versions, and the
suite's outcome (``build/runtimes/<profile>.json``, read by ``table.py``).

    python record.py PROFILE JUNIT_XML     (run with the profile's own Python)
"""

from __future__ import annotations

import json
import os
import platform
import sys
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

PACKAGES = ("ray", "mlflow-skinny", "mlflow", "pyspark", "pandas", "numpy", "pyarrow",
            "scikit-learn", "xgboost", "lightgbm", "pydantic", "databricks-sdk")


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def outcome(junit: Path) -> dict[str, int]:
    if not junit.exists():
        return {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}


def main(profile: str, junit: str) -> None:
    record = {
        "profile": profile,
        "python": ".".join(platform.python_version_tuple()[:2]),  # patch releases vary
        "packages": {name: installed(name) for name in PACKAGES},
        "outcome": outcome(Path(junit)),
        # "core": the profile ran part of the suite (SUITE in its profile.env)
        "suite": os.environ.get("RUNTIME_SUITE") or "full",
    }
    target = Path("build/runtimes") / f"{profile}.json"
    target.write_text(json.dumps(record, indent=2) + "\n")
    print(f"recorded {target}: {record['outcome']}", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:3])
