"""The segmented model on disk: a TrainingResult as the directory the pyfunc reads.

One directory holds every segment's model (see ``raybricks.segmented_model.SegmentStore``):
members in each library's native bytes, in a few Parquet shards whose row groups never
split a segment, an index of every segment with its status and metric, the global
fallback model and a manifest (also the versions of the model libraries the members were
trained with). ``merge_segments`` builds the directory of a model that takes, per segment,
the better of two.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raybricks import kinds, metrics
from raybricks.data import segment_starts
from raybricks.results import TrainingResult, read_parts, rows_to_table
from raybricks.segmented_model import (
    CLASSIFICATION,
    FALLBACK,
    INDEX,
    MANIFEST,
    SHARDS,
    installed_version,
    key_tuples,
    shard_name,
    trained_versions,
)

FORMAT_VERSION = 1
SEGMENTS_PER_ROW_GROUP = 256
SEGMENTS_PER_SHARD = 20_000
INDEX_COLUMNS = ("status", "reason", "metric", "baseline", "chosen", "source")


@dataclass
class Packaged:
    """A segmented model directory and what it holds."""

    directory: Path
    manifest: dict[str, Any]
    segments: int  # segments in the index
    with_model: int  # segments that have their own model

    @property
    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.directory.iterdir())


def package_result(result: TrainingResult, directory: Path, source: str = "") -> Packaged:
    """Write a training run's models as a segmented model directory."""
    results = read_parts(result.run_dir / "results")
    metric = f"metric_{result.metric}"
    index = pa.table({
        **{c: results.column(c) for c in result.segment_by},
        "status": results.column("status"),
        "reason": results.column("reason").cast(pa.string()),
        "metric": _float_column(results, metric),
        "baseline": _float_column(results, f"baseline_{result.metric}"),
        "chosen": _string_column(results, "chosen"),
        "source": pa.array([source] * results.num_rows, pa.string()),
    })
    models = result.models()
    fallback = rows_to_table(result.fallback) if result.fallback else None
    manifest = {
        "format_version": FORMAT_VERSION,
        "segment_by": result.segment_by,
        "features": result.features,
        "task": result.task,
        "metric": result.metric,
        "classes": _classes(models, fallback) if result.task in CLASSIFICATION else None,
        "training_run": result.run_id,
        "forecast": result.forecast,
    }
    return write_segments(directory, manifest, index, models, fallback)


def _float_column(table: pa.Table, name: str) -> pa.Array:
    if name not in table.column_names:
        return pa.nulls(table.num_rows, pa.float64())
    return table.column(name).cast(pa.float64())


def _string_column(table: pa.Table, name: str) -> pa.Array:
    if name not in table.column_names:
        return pa.nulls(table.num_rows, pa.string())
    return table.column(name).cast(pa.string())


def _classes(models: pa.Table, fallback: pa.Table | None) -> list:
    """Every class label any member predicts, sorted as training sorts them."""
    found: dict[Any, None] = {}
    for table in (models, fallback):
        if table is not None and table.num_rows:
            for meta in pc.unique(table.column("meta")).to_pylist():
                found.update(dict.fromkeys(json.loads(meta).get("classes") or []))
    return sorted(found, key=lambda v: (str(type(v)), v))


def stored_kinds(tables: list[pa.Table | None]) -> list[str]:
    """The kinds of the members of ``tables``."""
    stored = set()
    for table in tables:
        if table is not None and table.num_rows and "kind" in table.column_names:
            stored |= set(pc.unique(table.column("kind")).to_pylist())
    return sorted(stored)


def library_versions(stored: list[str], recorded: dict[str, Any] | None = None
                     ) -> dict[str, str | list[str]]:
    """Per library the members of the ``stored`` kinds are stored with, the version(s)
    they were trained with: as ``recorded`` (a merge keeps both models'), else the one
    installed here, the driver's, which is also what the model's requirements pin."""
    versions = {}
    libraries = {name for kind in stored for name in kinds.resolve(kind).libraries()}
    for library in sorted(name for name in libraries if name):
        version = (recorded or {}).get(library) or installed_version(library)
        if version:
            versions[library] = version
    return versions


def _merged_libraries(*records: dict[str, Any] | None) -> dict[str, str | list[str]]:
    """The merged models' library versions: one per library, or all where they differ."""
    found: dict[str, set[str]] = {}
    for record in records:
        for library, recorded in (record or {}).items():
            found.setdefault(library, set()).update(trained_versions(recorded))
    return {library: versions.pop() if len(versions) == 1 else sorted(versions)
            for library, versions in found.items()}


def write_segments(
    directory: Path, manifest: dict[str, Any], index: pa.Table, models: pa.Table,
    fallback: pa.Table | None,
) -> Packaged:
    """Write members sorted by segment into shards and row groups that keep each segment
    whole, then the index (with each segment's shard and row group) and the manifest
    (with the versions of the libraries the members use)."""
    segment_by = manifest["segment_by"]
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    located: dict[tuple, tuple[int, int]] = {}
    if models.num_rows:
        models = models.sort_by([(c, "ascending") for c in segment_by])
        starts = segment_starts(models, segment_by) + [models.num_rows]
        for shard, first in enumerate(range(0, len(starts) - 1, SEGMENTS_PER_SHARD)):
            last = min(first + SEGMENTS_PER_SHARD, len(starts) - 1)
            _write_shard(directory / shard_name(shard), models, starts,
                         first, last, shard, segment_by, located)
    where = [located.get(key, (-1, -1)) for key in key_tuples(index, segment_by)]
    index = index.append_column("shard", pa.array([w[0] for w in where], pa.int32()))
    index = index.append_column("row_group", pa.array([w[1] for w in where], pa.int32()))
    pq.write_table(index, directory / INDEX)
    if fallback is not None and fallback.num_rows:
        pq.write_table(fallback, directory / FALLBACK)
    stored = stored_kinds([models, fallback])
    manifest = manifest | {
        "has_fallback": fallback is not None and fallback.num_rows > 0,
        "kinds": stored,
        "libraries": library_versions(stored, manifest.get("libraries")),
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    with_model = sum(1 for w in where if w[0] >= 0)
    return Packaged(directory, manifest, index.num_rows, with_model)


def _write_shard(path, models, starts, first, last, shard, segment_by, located) -> None:
    with pq.ParquetWriter(path, models.schema) as writer:
        for group, lo in enumerate(range(first, last, SEGMENTS_PER_ROW_GROUP)):
            hi = min(lo + SEGMENTS_PER_ROW_GROUP, last)
            rows = models.slice(starts[lo], starts[hi] - starts[lo])
            writer.write_table(rows, row_group_size=max(rows.num_rows, 1))
            keys = key_tuples(rows, segment_by)
            for position in range(lo, hi):
                located[keys[starts[position] - starts[lo]]] = (shard, group)


def read_index(directory: Path) -> pa.Table:
    return pq.read_table(Path(directory) / INDEX)


def read_members(directory: Path, columns: list[str] | None = None) -> pa.Table:
    """The members of every shard (only ``columns``, if given)."""
    files = sorted(Path(directory).glob(SHARDS))
    if not files:
        return pa.table({})
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files],
                            promote_options="permissive")


@dataclass
class Comparison:
    """A challenger against a champion on the segments both trained."""

    metric: str
    common: int
    challenger: float  # mean metric over the common segments
    champion: float
    challenger_wins: int  # common segments where the challenger is strictly better

    @property
    def not_worse(self) -> bool:
        if self.common == 0:
            return True
        return metrics.metric(self.metric).not_worse(self.challenger, self.champion)

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "common_segments": self.common,
                "challenger_mean": self.challenger, "champion_mean": self.champion,
                "challenger_wins": self.challenger_wins, "not_worse": self.not_worse}


def _trained_metrics(index: pa.Table, segment_by: list[str]) -> dict[tuple, float]:
    rows = index.filter(pc.equal(index.column("status"), "trained"))
    return dict(zip(key_tuples(rows, segment_by), rows.column("metric").to_pylist(),
                    strict=True))


def compare(challenger: Path, champion: Path) -> Comparison:
    """Compare two segmented models on the segments both trained."""
    manifest = json.loads((Path(challenger) / MANIFEST).read_text())
    segment_by, metric = manifest["segment_by"], manifest["metric"]
    new = _trained_metrics(read_index(challenger), segment_by)
    old = _trained_metrics(read_index(champion), segment_by)
    common = [k for k in new if k in old and new[k] == new[k] and old[k] == old[k]]
    mean_new = sum(new[k] for k in common) / len(common) if common else float("nan")
    mean_old = sum(old[k] for k in common) / len(common) if common else float("nan")
    better = metrics.metric(metric).better
    wins = sum(better(new[k], old[k]) for k in common)
    return Comparison(metric, len(common), mean_new, mean_old, wins)


def merge_segments(
    challenger: Path, champion: Path, directory: Path, labels: tuple[str, str]
) -> Packaged:
    """A model that takes, per segment, the better of the challenger and the champion
    (the challenger on ties and where only it trained); ``source`` records the origin."""
    manifest = json.loads((Path(challenger) / MANIFEST).read_text())
    old_manifest = json.loads((Path(champion) / MANIFEST).read_text())
    segment_by, metric = manifest["segment_by"], manifest["metric"]
    if old_manifest["segment_by"] != segment_by or old_manifest["features"] != manifest[
            "features"]:
        raise ValueError(
            "cannot merge: the champion was trained with other segment columns or features "
            f"({old_manifest['segment_by']}, {old_manifest['features']}); "
            "use registry.promote=if_better or always"
        )
    new_index, old_index = read_index(challenger), read_index(champion)
    new = _trained_metrics(new_index, segment_by)
    old = _trained_metrics(old_index, segment_by)
    better = metrics.metric(metric).better
    from_old = {k for k in old if k not in new or better(old[k], new[k])}
    index_columns = list(segment_by) + list(INDEX_COLUMNS)
    new_rows = _drop_keys(new_index.select(index_columns), segment_by, from_old)
    old_rows = _keep_keys(old_index.select(index_columns), segment_by, from_old)
    index = pa.concat_tables([
        new_rows.set_column(new_rows.schema.get_field_index("source"), "source",
                            pa.array([labels[0]] * new_rows.num_rows, pa.string())),
        old_rows.set_column(old_rows.schema.get_field_index("source"), "source",
                            pa.array([labels[1]] * old_rows.num_rows, pa.string())),
    ], promote_options="permissive")
    members = pa.concat_tables([
        _drop_keys(read_members(challenger), segment_by, from_old),
        _keep_keys(read_members(champion), segment_by, from_old),
    ], promote_options="permissive")
    fallback_path = Path(challenger) / FALLBACK
    fallback = pq.read_table(fallback_path) if fallback_path.exists() else None
    classes = set(manifest.get("classes") or []) | set(old_manifest.get("classes") or [])
    manifest = manifest | {"classes": sorted(classes, key=lambda v: (str(type(v)), v))
                           if manifest.get("classes") is not None else None,
                           "merged_from": list(labels),
                           "libraries": _merged_libraries(
                               manifest.get("libraries"),
                               old_manifest.get("libraries") if from_old else None)}
    return write_segments(directory, manifest, index, members, fallback)


def _key_mask(table: pa.Table, segment_by: list[str], keys: set[tuple]) -> pa.Array:
    return pa.array([key in keys for key in key_tuples(table, segment_by)], pa.bool_())


def _keep_keys(table: pa.Table, segment_by: list[str], keys: set[tuple]) -> pa.Table:
    if not table.num_rows:
        return table
    return table.filter(_key_mask(table, segment_by, keys))


def _drop_keys(table: pa.Table, segment_by: list[str], keys: set[tuple]) -> pa.Table:
    if not table.num_rows:
        return table
    return table.filter(pc.invert(_key_mask(table, segment_by, keys)))
