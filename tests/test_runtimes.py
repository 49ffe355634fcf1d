"""The wheel's dependencies admit every supported runtime's packages, and the profile
tools (ci/runtimes/) catch a moved package and keep the docs' table honest."""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
RUNTIMES = ROOT / "ci" / "runtimes"
PROFILES = sorted(p.name for p in RUNTIMES.glob("dbr-*"))


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, RUNTIMES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dependencies() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def runtime_versions(profile: str) -> dict[str, str]:
    """The runtime's version of each package: its constraints file, including the pins its
    header lists as masked (they are on the runtime too)."""
    text = (RUNTIMES / profile / "constraints.txt").read_text()
    pins = re.findall(r"^[#\s-]*([A-Za-z0-9_.-]+)\s*(?:~=|==)\s*([0-9][^\s\"#]*)", text, re.M)
    return {canonicalize_name(name): version for name, version in pins}


def test_dependencies_are_capped_ranges_never_pins():
    for requirement in dependencies():
        operators = {spec.operator for spec in requirement.specifier}
        assert "==" not in operators and "===" not in operators, requirement
        assert ">=" in operators and "<" in operators, f"{requirement}: lower bound and cap"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_dependency_admits_the_runtimes_own_version(profile):
    runtime = runtime_versions(profile)
    for requirement in dependencies():
        version = runtime.get(canonicalize_name(requirement.name))
        assert version, f"{profile} pins no {requirement.name}: add it to the profile"
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{requirement} would replace {profile}'s {requirement.name} {version}")


def test_full_mlflow_and_spark_only_in_the_local_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {canonicalize_name(r.name) for r in dependencies()}
    assert "mlflow-skinny" in names and not names & {"mlflow", "pyspark"}
    local = {canonicalize_name(Requirement(r).name)
             for r in project["optional-dependencies"]["local"]}
    assert {"mlflow", "pyspark"} <= local


def test_unmoved_refuses_a_replaced_package_unless_allowed(tmp_path, capsys):
    unmoved = load("unmoved")
    before, after, allow = (tmp_path / n for n in ("before", "after", "allow"))
    before.write_text("pandas==1.5.3\nray==2.37.0\nPyYAML==6.0\n")
    after.write_text("pandas==2.3.3\nray==2.37.0\npyyaml==6.0\nraybricks==0.1.0\n")
    assert unmoved.main(str(before), str(after), str(tmp_path / "none")) == 1
    assert "pandas 1.5.3 -> 2.3.3 (NOT ALLOWED)" in capsys.readouterr().out
    allow.write_text("pandas  # the reason\n")
    assert unmoved.main(str(before), str(after), str(allow)) == 0
    after.write_text("ray==2.37.0\npyyaml==6.0\n")  # a package removed counts as moved
    assert unmoved.main(str(before), str(after), str(tmp_path / "none")) == 1


def test_runtimes_table_is_written_from_the_records_and_checked(tmp_path, monkeypatch):
    table = load("table")
    monkeypatch.setattr(table, "ROOT", ROOT)
    records = tmp_path / "build" / "runtimes"
    records.mkdir(parents=True)
    for profile in table.PROFILES:
        packages = {name: f"{i}.0" for i, name in enumerate(table.COLUMNS)}
        outcome = {"tests": 10, "failures": 1 if profile == "dbr-16.4" else 0,
                   "errors": 0, "skipped": 0}
        (records / f"{profile}.json").write_text(json.dumps(
            {"profile": profile, "python": "3.11", "packages": packages, "outcome": outcome}))
    doc = tmp_path / "databricks.md"
    doc.write_text(f"intro\n{table.START}\nold\n{table.END}\nrest\n")
    monkeypatch.setattr(table, "DOC", doc)
    monkeypatch.setattr(table, "ROOT", tmp_path)
    monkeypatch.setattr(table, "profile_env", lambda p: {"RUNTIME": p.removeprefix("dbr-")})
    assert table.main("--check") == 1  # the docs do not show what ran
    assert table.main("--write") == 0 and table.main("--check") == 0
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n")
    assert "| DBR 15.4 | 3.11 |" in text and "| 1 failed |" in text


def documented_rows(table) -> dict[str, dict[str, str]]:
    """docs/databricks.md's runtimes table: each row's package versions by column."""
    text = table.DOC.read_text().split(table.START, 1)[1].split(table.END, 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in text.strip().splitlines()[2:]]
    return {cells[0]: dict(zip(table.COLUMNS, cells[2:], strict=False)) for cells in rows}


def locked_versions() -> dict[str, set[str]]:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    versions: dict[str, set[str]] = {}
    for package in lock["package"]:
        versions.setdefault(canonicalize_name(package["name"]), set()).add(package["version"])
    return versions


def test_the_docs_table_names_the_versions_the_lock_and_the_profiles_hold():
    """The table is rewritten from CI's runs (`make runtimes-table`); this catches, at once,
    a lock refresh or a profile change that the table does not show yet."""
    table = load("table")
    rows = documented_rows(table)
    newest = next(cells for name, cells in rows.items() if name.startswith("newest"))
    locked = locked_versions()
    for column, version in newest.items():
        assert version in locked.get(canonicalize_name(column), set()), (
            f"the table's newest row has {column} {version}; uv.lock holds "
            f"{sorted(locked.get(canonicalize_name(column), []))}: run `make runtimes-table`")
    for profile in PROFILES:
        env = table.profile_env(profile)
        # the runtime's Spark (its constraints list databricks-connect's pyspark, masked)
        runtime = runtime_versions(profile) | {"pyspark": env["SPARK"]}
        name = f"DBR {env['RUNTIME']}"
        for column, version in rows[name].items():
            pinned = runtime.get(canonicalize_name(column))
            assert pinned in (None, version), (
                f"the table's {name} row has {column} {version}; the profile pins {pinned}")
