"""The segmented model on disk: a TrainingResult as the directory the pyfunc reads.

One directory holds every segment's model (see ``raybricks.segmented_model.SegmentStore``):
members in each library's native bytes, in a few Parquet shards whose row groups never
split a segment, an index of every segment with its status and metric, the global
fallback model and a manifest (also the versions of the model libraries the members were
trained with). ``merge_segments`` builds the directory of a model that takes, per segment,
the better of two.
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raybricks import kinds, metrics
from raybricks.data import segment_starts
from raybricks.kinds import pretrained
from raybricks.results import TrainingResult, float_values, part_files, rows_to_table
from raybricks.segmented_model import (
    CLASSIFICATION,
    FALLBACK,
    FORMAT_VERSION,
    GLOBAL,
    INDEX,
    MANIFEST,
    RECONCILIATION,
    SHARDS,
    default_global,
    installed_version,
    locations,
    null_safe_join,
    shard_name,
    trained_versions,
)

SEGMENTS_PER_ROW_GROUP = 256
SEGMENTS_PER_SHARD = 20_000
#: Index rows per row group at least (a merge yields a few hundred segments at a time).
INDEX_ROWS_PER_GROUP = 65_536
INDEX_COLUMNS = ("status", "reason", "metric", "baseline", "chosen", "source", "profile",
                 GLOBAL)


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
    """Write a training run's models as a segmented model directory, one part of the run
    at a time (the driver never holds every segment's row or member at once). Every
    segment refers to the run's global model (``result.global_id``), if it has one."""
    name = result.global_name if result.fallback else None
    fallback = named_global(rows_to_table(result.fallback), name) if name else None
    manifest = {
        "format_version": FORMAT_VERSION,
        "segment_by": result.segment_by,
        "features": result.features,
        "task": result.task,
        "metric": result.metric,
        "target": result.target,
        "time_column": result.time_column,
        "training_run": result.run_id,
        "forecast": result.forecast,
        "global_model": name,
    } | ({} if result.task in CLASSIFICATION else {"classes": None})
    packaged = write_segments(directory, manifest, run_parts(result, source, name), fallback)
    carry_weights(packaged.directory, (result.forecast or {}).get("pretrained") or {})
    return packaged


def carry_weights(directory: Path, records: dict[str, dict[str, str]]) -> None:
    """The pretrained weights the candidates of ``records`` (the forecast manifest's
    ``pretrained``: source, SHA-256, store) keep in the model (``store: copy``), copied
    once each into ``pretrained/<sha256>``, checked against their checksum."""
    for name, record in records.items():
        target = Path(directory) / pretrained.CARRIED_FOLDER / record["sha256"]
        if record["store"] != "copy" or target.exists():
            continue
        folder = pretrained.weights_folder(record["source"])
        if pretrained.folder_digest(folder) != record["sha256"]:
            raise ValueError(f"models[{name}]: the weights at {record['source']} changed "
                             "while the job ran: train again")
        shutil.copytree(folder, target, ignore=shutil.ignore_patterns(".*"))


def named_global(members: pa.Table, name: str) -> pa.Table:
    """A global model's member rows, each naming the model (``global``)."""
    if GLOBAL in members.column_names:
        members = members.drop_columns([GLOBAL])
    return members.append_column(GLOBAL, pa.repeat(pa.scalar(name, pa.string()),
                                                   members.num_rows))


def run_parts(result: TrainingResult, source: str, global_name: str | None = None
              ) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Per results part of the run: its index rows and the members of its models part
    (of the same name). A models part without its results part (its task stopped between
    the two writes) is left out: its segments have no result, so a resumed run trained
    them again. In a reconciled hierarchy, each member row carries its series'
    ``reconciliation`` shift."""
    metric, baseline = f"metric_{result.metric}", f"baseline_{result.metric}"
    shifts = reconciled_shifts(result.run_dir)
    for file in part_files(result.run_dir / "results"):
        results = pq.read_table(file)
        index = pa.table({
            **{c: results.column(c) for c in result.segment_by},
            "status": results.column("status"),
            "reason": results.column("reason").cast(pa.string()),
            "metric": _float_column(results, metric),
            "baseline": _float_column(results, baseline),
            "chosen": _string_column(results, "chosen"),
            "source": pa.repeat(pa.scalar(source, pa.string()), results.num_rows),
            "profile": _string_column(results, "profile"),
            GLOBAL: pa.repeat(pa.scalar(global_name, pa.string()), results.num_rows),
        })
        models = result.run_dir / "models" / file.name
        members = pq.read_table(models) if models.exists() else pa.table({})
        if shifts is not None and members.num_rows:
            rows = null_safe_join(members.select(result.segment_by), shifts.select(
                [*result.segment_by, "row"]), result.segment_by).column("row")
            members = members.append_column(
                RECONCILIATION, shifts.column(RECONCILIATION).take(rows))
        yield index, members


def reconciled_shifts(run_dir: Path) -> pa.Table | None:
    """A reconciled hierarchy's shift of every series' forecasts (``reconciliation``
    writes them in the run), or None."""
    files = sorted((run_dir / RECONCILIATION).glob("shifts-*.parquet"))
    if not files:
        return None
    shifts = pa.concat_tables([pq.read_table(f) for f in files]).combine_chunks()
    return shifts.append_column("row", pa.array(np.arange(shifts.num_rows)))  # join key


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
    segment; ``add`` says where each segment goes, ``kinds`` are the members' kinds and
    ``classes`` (when asked for) their class labels."""

    def __init__(self, directory: Path, segment_by: list[str], classes: bool = False
                 ) -> None:
        self.directory, self.segment_by = directory, segment_by
        self.schema: pa.Schema | None = None
        self.writer: pq.ParquetWriter | None = None
        self.shard, self.in_shard, self.group = -1, 0, 0
        self.pending: list[pa.Table] = []  # whole segments of the next row group
        self.pending_segments = 0
        self.kinds: set[str] = set()
        self.classes: dict[Any, None] | None = {} if classes else None

    def add(self, members: pa.Table) -> pa.Table | None:
        """Add a table of whole segments (in any order); their keys, ``shard`` and
        ``row_group``."""
        if not members.num_rows:
            return None
        if self.schema is None:
            self.schema = members.schema
        members = members.cast(self.schema).sort_by([(c, "ascending") for c in self.segment_by])
        self.kinds |= set(pc.unique(members.column("kind")).to_pylist())
        if self.classes is not None:
            add_classes(self.classes, members)
        starts = segment_starts(members, self.segment_by) + [members.num_rows]
        shards, groups = [], []
        first = 0
        while first < len(starts) - 1:
            room = min(SEGMENTS_PER_ROW_GROUP - self.pending_segments,
                       SEGMENTS_PER_SHARD - self.in_shard - self.pending_segments)
            last = min(first + room, len(starts) - 1)
            self.pending.append(members.slice(starts[first], starts[last] - starts[first]))
            shards += [self.shard + (self.writer is None)] * (last - first)
            groups += [self.group] * (last - first)
            self.pending_segments += last - first
            first = last
            if (self.pending_segments == SEGMENTS_PER_ROW_GROUP
                    or self.in_shard + self.pending_segments == SEGMENTS_PER_SHARD):
                self._flush()
        keys = members.take(starts[:-1]).select(self.segment_by)
        return keys.append_column("shard", pa.array(shards, pa.int32())).append_column(
            "row_group", pa.array(groups, pa.int32()))

    def _flush(self) -> None:
        if not self.pending_segments:
            return
        if self.writer is None:
            self.shard += 1
            self.writer = pq.ParquetWriter(self.directory / shard_name(self.shard),
                                           self.schema)
        rows = pa.concat_tables(self.pending)
        self.writer.write_table(rows, row_group_size=rows.num_rows)
        self.in_shard += self.pending_segments
        self.group += 1
        self.pending, self.pending_segments = [], 0
        if self.in_shard >= SEGMENTS_PER_SHARD:
            self._close_shard()

    def _close_shard(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer, self.in_shard, self.group = None, 0, 0

    def close(self) -> None:
        """Write what is pending."""
        self._flush()
        self._close_shard()


def write_segments(
    directory: Path, manifest: dict[str, Any], parts: Iterable[tuple[pa.Table, pa.Table]],
    fallback: pa.Table | None,
) -> Packaged:
    """Write ``parts`` (index rows, and the members of those of their segments that have
    a model) one at a time: members into shards and row groups that keep each segment
    whole, index rows with each segment's shard and row group (-1 without a model); then
    the manifest (with the versions of the libraries the members use; a manifest without
    ``classes`` gets the members' classes)."""
    segment_by = manifest["segment_by"]
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    shards = ShardWriter(directory, segment_by, classes="classes" not in manifest)
    index_writer: pq.ParquetWriter | None = None
    pending: list[pa.Table] = []  # index rows not written yet: row groups of a useful size
    segments = with_model = 0
    for index, members in parts:
        index = locate(index, shards.add(members), segment_by)
        if index_writer is None:
            index_writer = pq.ParquetWriter(directory / INDEX, index.schema)
        pending.append(index.cast(index_writer.schema))
        if sum(t.num_rows for t in pending) >= INDEX_ROWS_PER_GROUP:
            index_writer.write_table(pa.concat_tables(pending))
            pending = []
        segments += index.num_rows
        with_model += int(pc.sum(pc.greater_equal(index.column("shard"), 0)).as_py() or 0)
    shards.close()
    if index_writer is not None:
        if pending:
            index_writer.write_table(pa.concat_tables(pending))
        index_writer.close()
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
    return Packaged(directory, manifest, segments, with_model)


def locate(index: pa.Table, located: pa.Table | None, segment_by: list[str]) -> pa.Table:
    """The index with each segment's ``shard`` and ``row_group`` (-1: no model)."""
    if located is None:
        located = pa.table({**{c: index.column(c).slice(0, 0) for c in segment_by},
                            "shard": pa.array([], pa.int32()),
                            "row_group": pa.array([], pa.int32())})
    return locations(null_safe_join(index, located.select([*segment_by, "shard", "row_group"]),
                                    segment_by))


def read_index(directory: Path, columns: list[str] | None = None) -> pa.Table:
    """The model's index (only ``columns``, if given)."""
    return pq.read_table(Path(directory) / INDEX, columns=columns)


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


def _trained_metrics(index: pa.Table, segment_by: list[str], name: str) -> pa.Table:
    """The trained segments' keys and metric (as column ``name``)."""
    rows = index.filter(pc.equal(index.column("status"), "trained"))
    return rows.select([*segment_by, "metric"]).rename_columns([*segment_by, name])


def compare(challenger: Path, champion: Path) -> Comparison:
    """Compare two segmented models on the segments both trained."""
    manifest = json.loads((Path(challenger) / MANIFEST).read_text())
    segment_by, metric = manifest["segment_by"], manifest["metric"]
    wanted = [*segment_by, "status", "metric"]
    both = null_safe_join(_trained_metrics(read_index(challenger, wanted), segment_by, "new"),
                          _trained_metrics(read_index(champion, wanted), segment_by, "old"),
                          segment_by)
    new, old = float_values(both, "new"), float_values(both, "old")
    common = ~np.isnan(new) & ~np.isnan(old)
    new, old = new[common], old[common]
    losses = metrics.metric(metric).losses
    return Comparison(metric, int(common.sum()),
                      float(new.mean()) if len(new) else float("nan"),
                      float(old.mean()) if len(old) else float("nan"),
                      int((losses(new) < losses(old)).sum()))


def merge_segments(
    challenger: Path, champion: Path, directory: Path, labels: tuple[str, str],
    replace: bool = False,
) -> Packaged:
    """A model that takes, per segment, the better of the challenger and the champion
    (the challenger on ties and where only it trained; ``replace``: the challenger
    wherever it trained, as a retrain of chosen segments asks); the champion's rows
    where the challenger has none (a run of some segments); ``source`` records the
    origin."""
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
    wanted = [*segment_by, "status", "metric"]
    keep_old, take_new = from_champion(read_index(challenger, wanted),
                                       read_index(champion, wanted), segment_by, metric,
                                       replace)
    defaults = default_global(manifest), default_global(old_manifest)
    default = defaults[0] if defaults[0] is not None else defaults[1]
    fallback = merged_globals((Path(challenger), Path(champion)), (manifest, old_manifest),
                              (take_new, keep_old), default)
    classes = set(manifest.get("classes") or []) | set(old_manifest.get("classes") or [])
    manifest = manifest | {"classes": sorted_classes(dict.fromkeys(classes))
                           if manifest.get("classes") is not None else None,
                           "merged_from": list(labels),
                           "format_version": FORMAT_VERSION,
                           "global_model": default,
                           "libraries": _merged_libraries(
                               manifest.get("libraries"),
                               old_manifest.get("libraries") if keep_old.any() else None)}
    files = [f for d in (challenger, champion) for f in sorted(Path(d).glob(SHARDS))]
    schema = pa.unify_schemas([pq.read_schema(f) for f in files]) if files else None
    parts = itertools.chain(
        _merged_parts(Path(challenger), take_new, labels[0], segment_by, schema, defaults[0]),
        _merged_parts(Path(champion), keep_old, labels[1], segment_by, schema, defaults[1]))
    packaged = write_segments(directory, manifest, parts, fallback)
    for source, taken in ((challenger, True), (champion, keep_old.any())):
        carried = Path(source) / pretrained.CARRIED_FOLDER
        if taken and carried.is_dir():
            shutil.copytree(carried, packaged.directory / pretrained.CARRIED_FOLDER,
                            dirs_exist_ok=True)
    return packaged


def referred_globals(directory: Path, taken: np.ndarray, default: str | None) -> set[str]:
    """The global models the rows a merge takes from a model (``taken``, a mask over its
    index rows) refer to (a format-1 model's rows: its one global model)."""
    if not taken.any():
        return set()
    if GLOBAL not in pq.read_schema(Path(directory) / INDEX).names:
        return {default} if default is not None else set()
    names = read_index(directory, [GLOBAL]).column(GLOBAL).to_numpy(zero_copy_only=False)
    return {name for name in set(names[taken]) if name is not None}


def merged_globals(directories: tuple[Path, Path], manifests: tuple[dict, dict],
                   taken: tuple[np.ndarray, np.ndarray], default: str | None
                   ) -> pa.Table | None:
    """The global models of a merge: every one a taken segment refers to, and the
    ``default`` (which answers keys neither model saw); each once, the challenger's
    copy first."""
    wanted = {default} - {None}
    for directory, manifest, mask in zip(directories, manifests, taken, strict=True):
        wanted |= referred_globals(directory, mask, default_global(manifest))
    tables, kept = [], set()
    for directory, manifest in zip(directories, manifests, strict=True):
        path = directory / FALLBACK
        if not path.exists():
            continue
        table = pq.read_table(path)
        if GLOBAL not in table.column_names:
            table = named_global(table, default_global(manifest) or "global")
        names = table.column(GLOBAL).to_pylist()
        rows = [i for i, name in enumerate(names) if name in wanted - kept]
        kept |= {names[i] for i in rows}
        if rows:
            tables.append(table.take(rows))
    missing = wanted - kept
    if missing:
        raise ValueError(f"cannot merge: segments refer to global model(s) {sorted(missing)} "
                         "that neither model holds")
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def from_champion(new_index: pa.Table, old_index: pa.Table, segment_by: list[str],
                  metric: str, replace: bool) -> tuple[np.ndarray, np.ndarray]:
    """What a merge takes from each model, as masks over their index rows (in index
    order): the champion's rows it keeps (those the challenger has no row for, those
    the champion trained and the challenger did not, and unless ``replace`` those both
    trained where the champion's validation metric is better), and the challenger's
    rows it takes (all but those). The indexes need only the segment columns, status
    and metric."""
    def side(index: pa.Table, status: str, value: str, position: str) -> pa.Table:
        return index.select([*segment_by, "status", "metric"]).rename_columns(
            [*segment_by, status, value]).append_column(
            position, pa.array(np.arange(index.num_rows)))

    both = null_safe_join(side(old_index, "old_status", "old", "__old"),
                          side(new_index, "new_status", "new", "__new"), segment_by)

    def trained(status: str) -> np.ndarray:
        return pc.fill_null(pc.equal(both.column(status), "trained"), False).to_numpy(
            zero_copy_only=False)

    present = pc.is_valid(both.column("__new")).to_numpy(zero_copy_only=False)
    old_trained, new_trained = trained("old_status"), trained("new_status")
    keep = ~present | (old_trained & ~new_trained)
    if not replace:
        losses = metrics.metric(metric).losses
        better = losses(float_values(both, "old")) < losses(float_values(both, "new"))
        keep |= old_trained & new_trained & better
    keep_old = np.zeros(old_index.num_rows, dtype=bool)
    keep_old[both.column("__old").to_numpy()[keep]] = True
    take_new = np.ones(new_index.num_rows, dtype=bool)
    replaced = both.filter(pa.array(keep & present)).column("__new")
    take_new[replaced.to_numpy()] = False
    return keep_old, take_new


def _merged_parts(directory: Path, taken: np.ndarray, label: str, segment_by: list[str],
                  schema: pa.Schema | None, default: str | None
                  ) -> Iterator[tuple[pa.Table, pa.Table]]:
    """(index rows, members) of the rows a merge takes from one model (``taken``: a mask
    over its index rows, labelled ``label`` in ``source``; ``default``: its global model,
    which rows of a format-1 model refer to), one index row group and one shard row group
    at a time: the driver never holds the model's whole index or a whole shard (a few
    hundred segments' members at once)."""
    index = pq.ParquetFile(directory / INDEX)
    columns = [*segment_by, *INDEX_COLUMNS]
    shards: dict[int, pq.ParquetFile] = {}
    first = 0
    for number in range(index.num_row_groups):
        rows = index.read_row_group(number)
        chosen = taken[first:first + rows.num_rows]
        first += rows.num_rows
        rows = rows.filter(pa.array(chosen))
        if not rows.num_rows:
            continue
        rows = rows.set_column(rows.schema.get_field_index("source"), "source",
                               pa.repeat(pa.scalar(label, pa.string()), rows.num_rows))
        if "profile" not in rows.column_names:  # a model from before profiles
            rows = rows.append_column("profile", pa.nulls(rows.num_rows, pa.string()))
        if GLOBAL not in rows.column_names:  # format 1: its one global model
            rows = rows.append_column(GLOBAL, pa.repeat(pa.scalar(default, pa.string()),
                                                        rows.num_rows))
        place = ["shard", "row_group"]
        rows = rows.sort_by([(c, "ascending") for c in place])  # stable: index order within
        starts = segment_starts(rows, place)  # one run per shard row group
        for start, end in zip(starts, [*starts[1:], rows.num_rows], strict=True):
            here = rows.slice(start, end - start)
            shard, group = here.column("shard")[0].as_py(), here.column("row_group")[0].as_py()
            if shard < 0 or schema is None:
                yield here.select(columns), pa.table({})
                continue
            if shard not in shards:
                shards[shard] = pq.ParquetFile(directory / shard_name(shard))
            members = _split_by_keys(shards[shard].read_row_group(group), segment_by,
                                     here.select(segment_by))[0].cast(schema)
            yield here.select(columns), members


def _split_by_keys(table: pa.Table, segment_by: list[str], keys: pa.Table
                   ) -> tuple[pa.Table, pa.Table]:
    """The rows of ``table`` whose segment is one of ``keys``, and the others."""
    if not table.num_rows:
        return table, table
    listed = keys.append_column("__listed", pa.repeat(True, keys.num_rows))
    # the keys alone are joined (in the table's order): Arrow's join takes no list
    # columns, such as a reconciled hierarchy's shifts
    marked = null_safe_join(table.select(segment_by), listed, segment_by)
    inside = pc.is_valid(marked.column("__listed"))
    return table.filter(inside), table.filter(pc.invert(inside))
