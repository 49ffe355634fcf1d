"""Models registered by earlier code still load and predict the same values.

tests/fixtures/registered holds segmented model directories packaged by the code of the
commit that added them (tests/fixtures/make_registered.py): a tabular regression with
blends of local, global and baseline members, a multiclass model of local blends, a
forecast with statistical, lag and global members and intervals (format 1), and a merged
tabular model holding two global models, each segment referring to its own (format 2). Today's
``SegmentStore`` must read each and predict what that code predicted."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybricks.kinds.base import member_meta
from raybricks.segmented_model import SegmentStore

FIXTURES = Path(__file__).parent / "fixtures" / "registered"
NAMES = ["tabular", "classification", "forecast", "merged"]


def fixture_manifest(name: str) -> dict:
    """The manifest of fixture ``name``; skips the test where the installed model
    libraries differ from those it was built with (the members' own bytes across library
    versions are not what these tests test: a runtime profile's older numpy cannot
    unpickle them)."""
    manifest = json.loads((FIXTURES / name / "model" / "manifest.json").read_text())
    changed = {library: (built, version(library)) for library, built in
               manifest["libraries"].items() if version(library) != built}
    if changed:
        pytest.skip(f"model libraries differ from the fixture's: {changed}")
    return manifest


@pytest.mark.parametrize("name", NAMES)
def test_a_model_registered_before_predicts_the_same_today(name):
    here = FIXTURES / name
    fixture_manifest(name)
    frame = pd.read_parquet(here / "input.parquet")
    expected = pd.read_parquet(here / "expected.parquet")
    options = json.loads((here / "options.json").read_text())
    predicted = SegmentStore(here / "model").predict(frame, **options)
    np.testing.assert_array_equal(predicted.status, expected.pop("status").to_numpy())
    values = predicted.values
    values = values.to_frame() if isinstance(values, pd.Series) else values
    assert list(values.columns) == list(expected.columns)
    for column in expected:
        if expected[column].dtype.kind == "f":
            np.testing.assert_allclose(values[column].to_numpy(dtype=float),
                                       expected[column].to_numpy(), rtol=1e-9, atol=1e-12)
        else:
            assert values[column].tolist() == expected[column].tolist()


def test_the_fixtures_cover_what_they_claim():
    """Each fixture holds the members its test relies on (so a fixture rebuilt by a
    later commit cannot quietly lose them)."""
    def kinds(name: str) -> set[str]:
        shards = sorted((FIXTURES / name / "model").rglob("*.parquet"))
        found = set()
        for shard in shards:
            table = pd.read_parquet(shard)
            if "kind" in table:
                found |= set(table.kind)
        return found

    assert {"sklearn", "lightgbm", "global", "baseline"} <= kinds("tabular")
    assert {"sklearn", "lightgbm"} <= kinds("classification")
    assert {"statsforecast", "lags:lightgbm", "global"} <= kinds("forecast")
    index = pd.read_parquet(FIXTURES / "merged" / "model" / "index.parquet")
    globals_ = pd.read_parquet(FIXTURES / "merged" / "model" / "fallback.parquet")
    retrained = index.store.isin(["s2", "s3"])
    assert index["global"].nunique() == globals_["global"].nunique() == 2
    assert index["global"][retrained].nunique() == 1
    assert not set(index["global"][retrained]) & set(index["global"][~retrained])
    assert index.chosen.fillna("").str.contains("global").sum() >= 6
    blends = pd.read_parquet(FIXTURES / "tabular" / "expected.parquet")
    assert (blends.status == "unknown").sum() == 3  # the never-seen key, served by global



@pytest.mark.parametrize("name", NAMES)
def test_the_member_meta_type_reads_and_writes_the_stored_json_exactly(name):
    """``kinds.base.member_meta`` (the one constructor training uses) rebuilds every stored
    member's meta, fallback members included, to the very JSON the earlier code wrote."""
    stored = []
    for shard in sorted((FIXTURES / name / "model").rglob("*.parquet")):
        table = pd.read_parquet(shard)
        if "meta" in table:
            stored += table.meta.tolist()
    assert len(stored) >= 3
    for text in stored:
        meta = json.loads(text)
        rebuilt = member_meta(meta.pop("features"), meta.pop("task"), meta.pop("categorical"),
                              **meta)
        assert json.dumps(rebuilt, default=str) == text
