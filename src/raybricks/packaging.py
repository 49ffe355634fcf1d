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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raybricks import kinds, metrics
from raybricks.data import segment_starts
from raybricks.results import TrainingResult, part_files, read_parts, rows_to_table
from raybricks.segmented_model import (
    CLASSIFICATION,
    FALLBACK,
    INDEX,
    MANIFEST,
    SHARDS,
    installed_version,
    key_tuples,
    null_safe_join,
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
    """Write a training run's models as a segmented model directory, one models part at
    a time (the driver never holds every member at once)."""
    results_dir = result.run_dir / "results"
    files = part_files(results_dir)
    names = pq.read_schema(files[0]).names if files else []
    metric, baseline = f"metric_{result.metric}", f"baseline_{result.metric}"
    results = read_parts(results_dir, [c for c in [*result.segment_by, "status", "reason",
                                                   metric, baseline, "chosen"] if c in names])
    index = pa.table({
        **{c: results.column(c) for c in result.segment_by},
        "status": results.column("status"),
        "reason": results.column("reason").cast(pa.string()),
        "metric": _float_column(results, metric),
        "baseline": _float_column(results, baseline),
        "chosen": _string_column(results, "chosen"),
        "source": pa.repeat(pa.scalar(source, pa.string()), results.num_rows),
    })
    fallback = rows_to_table(result.fallback) if result.fallback else None
    manifest = {
        "format_version": FORMAT_VERSION,
        "segment_by": result.segment_by,
        "features": result.features,
        "task": result.task,
        "metric": result.metric,
        "training_run": result.run_id,
        "forecast": result.forecast,
    } | ({} if result.task in CLASSIFICATION else {"classes": None})
    return write_segments(directory, manifest, index, trained_members(result.run_dir),
                          fallback)


def trained_members(run_dir: Path) -> Iterator[pa.Table]:
    """The members of a run's models parts, one part at a time. A models part whose
    results part is missing (its task stopped between the two writes) is left out: its
    segments have no result, so a resumed run trained them again."""
    results = {f.name for f in part_files(run_dir / "results")}
    for file in part_files(run_dir / "models"):
        if file.name in results:
            yield pq.read_table(file)


def _float_column(table: pa.Table, name: str) -> pa.Array:
    if name not in table.column_names:
        return pa.nulls(table.num_rows, pa.float64())
    return table.column(name).cast(pa.float64())


def _string_column(table: pa.Table, name: str) -> pa.Array:
    if name not in table.column_names:
        return pa.nulls(table.num_rows, pa.string())
    return table.column(name).cast(pa.string())


def add_classes(found: dict[Any, None], members: pa.Table) -> None:
    """Add to ``found`` every class label the ``members`` predict."""
    for meta in pc.unique(members.column("meta")).to_pylist():
        found.update(dict.fromkeys(json.loads(meta).get("classes") or []))


def sorted_classes(found: dict[Any, None]) -> list:
    """Class labels sorted as training sorts them."""
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


class ShardWriter:
    """Members, whole segments at a time, into shards of at most ``SEGMENTS_PER_SHARD``
    segments, in row groups of at most ``SEGMENTS_PER_ROW_GROUP`` that never split a
    segment; ``located`` says where each segment went, ``kinds`` the members' kinds and
    ``classes`` (when asked for) their class labels."""

    def __init__(self, directory: Path, segment_by: list[str], classes: bool = False
                 ) -> None:
        self.directory, self.segment_by = directory, segment_by
        self.schema: pa.Schema | None = None
        self.writer: pq.ParquetWriter | None = None
        self.shard, self.in_shard, self.group = -1, 0, 0
        self.pending: list[pa.Table] = []  # whole segments of the next row group
        self.pending_segments = 0
        self.located: list[pa.Table] = []  # keys, shard, row_group per segment
        self.kinds: set[str] = set()
        self.classes: dict[Any, None] | None = {} if classes else None

    def add(self, members: pa.Table) -> None:
        """Add a table of whole segments (in any order)."""
        if not members.num_rows:
            return
        if self.schema is None:
            self.schema = members.schema
        members = members.cast(self.schema).sort_by([(c, "ascending") for c in self.segment_by])
        self.kinds |= set(pc.unique(members.column("kind")).to_pylist())
        if self.classes is not None:
            add_classes(self.classes, members)
        starts = segment_starts(members, self.segment_by) + [members.num_rows]
        first = 0
        while first < len(starts) - 1:
            room = min(SEGMENTS_PER_ROW_GROUP - self.pending_segments,
                       SEGMENTS_PER_SHARD - self.in_shard - self.pending_segments)
            last = min(first + room, len(starts) - 1)
            self.pending.append(members.slice(starts[first], starts[last] - starts[first]))
            self.pending_segments += last - first
            first = last
            if (self.pending_segments == SEGMENTS_PER_ROW_GROUP
                    or self.in_shard + self.pending_segments == SEGMENTS_PER_SHARD):
                self._flush()

    def _flush(self) -> None:
        if not self.pending_segments:
            return
        if self.writer is None:
            self.shard += 1
            self.writer = pq.ParquetWriter(self.directory / shard_name(self.shard),
                                           self.schema)
        rows = pa.concat_tables(self.pending)
        self.writer.write_table(rows, row_group_size=rows.num_rows)
        keys = rows.take(segment_starts(rows, self.segment_by)).select(self.segment_by)
        self.located.append(keys.append_column(
            "shard", pa.repeat(pa.scalar(self.shard, pa.int32()), keys.num_rows),
        ).append_column("row_group", pa.repeat(pa.scalar(self.group, pa.int32()),
                                               keys.num_rows)))
        self.in_shard += self.pending_segments
        self.group += 1
        self.pending, self.pending_segments = [], 0
        if self.in_shard >= SEGMENTS_PER_SHARD:
            self._close_shard()

    def _close_shard(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer, self.in_shard, self.group = None, 0, 0

    def close(self) -> pa.Table | None:
        """Write what is pending; the keys, shard and row group of every segment written."""
        self._flush()
        self._close_shard()
        if not self.located:
            return None
        located = pa.concat_tables(self.located)
        if located.group_by(self.segment_by).aggregate([]).num_rows != located.num_rows:
            raise ValueError("a segment's members came in two batches: the models parts "
                             "of the run hold a segment twice")
        return located


def write_segments(
    directory: Path, manifest: dict[str, Any], index: pa.Table,
    members: pa.Table | Iterable[pa.Table], fallback: pa.Table | None,
) -> Packaged:
    """Write members (a table, or batches of whole segments) into shards and row groups
    that keep each segment whole, then the index (with each segment's shard and row
    group, -1 without a model) and the manifest (with the versions of the libraries the
    members use; a manifest without ``classes`` gets the members' classes)."""
    segment_by = manifest["segment_by"]
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    shards = ShardWriter(directory, segment_by, classes="classes" not in manifest)
    for batch in [members] if isinstance(members, pa.Table) else members:
        shards.add(batch)
    located = shards.close()
    index = locate(index, located, segment_by)
    pq.write_table(index, directory / INDEX)
    has_fallback = fallback is not None and fallback.num_rows > 0
    if has_fallback:
        pq.write_table(fallback, directory / FALLBACK)
    stored = sorted(shards.kinds | set(stored_kinds([fallback])))
    if shards.classes is not None:
        if has_fallback:
            add_classes(shards.classes, fallback)
        manifest = manifest | {"classes": sorted_classes(shards.classes)}
    manifest = manifest | {
        "has_fallback": has_fallback,
        "kinds": stored,
        "libraries": library_versions(stored, manifest.get("libraries")),
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    with_model = int(pc.sum(pc.greater_equal(index.column("shard"), 0)).as_py() or 0)
    return Packaged(directory, manifest, index.num_rows, with_model)


def locate(index: pa.Table, located: pa.Table | None, segment_by: list[str]) -> pa.Table:
    """The index with each segment's ``shard`` and ``row_group`` (-1: no model)."""
    if located is None:
        located = pa.table({**{c: index.column(c).slice(0, 0) for c in segment_by},
                            "shard": pa.array([], pa.int32()),
                            "row_group": pa.array([], pa.int32())})
    joined = null_safe_join(index, located.select([*segment_by, "shard", "row_group"]),
                            segment_by)
    for name in ("shard", "row_group"):
        joined = joined.set_column(joined.schema.get_field_index(name), name,
                                   pc.fill_null(joined.column(name), -1))
    return joined


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
    manifest = manifest | {"classes": sorted_classes(dict.fromkeys(classes))
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
