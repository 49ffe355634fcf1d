"""The "Supported runtimes" table of docs/databricks.md, from what the test runs recorded
(``build/runtimes/*.json``, written by ``ci/runtimes/test``).

    python ci/runtimes/table.py --write   # rewrite the table in docs/databricks.md
    python ci/runtimes/table.py --check   # fail if the docs differ from what just ran
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "databricks.md"
START, END = "<!-- runtimes-table:start -->", "<!-- runtimes-table:end -->"
PROFILES = ("dbr-15.4", "dbr-16.4", "dbr-17.3", "latest")
COLUMNS = ("pyspark", "ray", "mlflow-skinny", "pandas", "numpy", "pyarrow", "scikit-learn",
           "xgboost", "lightgbm", "pydantic", "databricks-sdk")


def profile_env(profile: str) -> dict[str, str]:
    path = ROOT / "ci" / "runtimes" / profile / "profile.env"
    pairs = re.findall(r'^([A-Z_]+)="?([^"\n]*)"?$', path.read_text(), re.M)
    return dict(pairs)


def allowed_upgrades(profile: str) -> str:
    path = ROOT / "ci" / "runtimes" / profile / "allowed-upgrades.txt"
    if not path.exists():
        return "none"
    entries = []
    for line in path.read_text().splitlines():
        name, _, why = (part.strip() for part in line.partition("#"))
        if name:
            entries.append(f"{name} ({why})" if why else name)
    return "; ".join(entries) or "none"


def row(profile: str, record: dict) -> str:
    packages = record["packages"]
    if profile == "latest":
        name, python = "newest (`uv.lock`, `make test`)", record["python"]
    else:
        env = profile_env(profile)
        name = f"DBR {env['RUNTIME']}"
        python = record["python"]
        if env.get("RUNTIME_PYTHON"):
            python += f" (runtime: {env['RUNTIME_PYTHON']})"
    versions = [packages.get(column) or "-" for column in COLUMNS]
    upgrades = "-" if profile == "latest" else allowed_upgrades(profile)
    outcome = record["outcome"]
    bad = outcome["failures"] + outcome["errors"]
    verdict = "passed" if outcome["tests"] and not bad else f"{bad} failed"
    if record.get("suite") == "core":
        verdict += " (core tests)"
    return "| " + " | ".join([name, python, *versions, upgrades, verdict]) + " |"


def table() -> str:
    header = ["runtime", "Python", *COLUMNS, "upgraded by raybricks", "suite"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for profile in PROFILES:
        path = ROOT / "build" / "runtimes" / f"{profile}.json"
        if not path.exists():
            raise SystemExit(f"no record of a {profile} run ({path}): run `make test` and "
                             "`make test-runtimes` first")
        lines.append(row(profile, json.loads(path.read_text())))
    return "\n".join(lines)


def main(mode: str) -> int:
    text = DOC.read_text()
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    updated = f"{before}{START}\n{table()}\n{END}{after}"
    if mode == "--write":
        DOC.write_text(updated)
        return 0
    if updated != text:
        print("docs/databricks.md's supported-runtimes table differs from what ran; run "
              "`make runtimes-table` and commit it. What ran:\n" + table(), file=sys.stderr)
        return 1
    print("docs/databricks.md's supported-runtimes table matches what ran")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "--check"))
