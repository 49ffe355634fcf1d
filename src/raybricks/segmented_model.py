"""Predicting with stored per-segment models, importing nothing from raybricks.

Every fitted model is stored in its library's own format, as its kind
(``raybricks.kinds``) serialized it; each member's kind loads and predicts it. Beside the
bytes, a small JSON ``meta`` says how to build the feature matrix: the feature order,
the categories of each categorical feature, the task and the class labels. The manifest
records the versions of the model libraries the members were trained with; loading the
pyfunc where other versions are installed warns once (``LibraryVersionWarning``).

This module is what consumers of the registered model run: MLflow logs this very file as
the model's code ("models from code") with a copy of ``raybricks.kinds`` beside it (as
``raybricks_kinds``), so it depends only on mlflow, numpy, pandas, pyarrow and the model
libraries (imported lazily, per kind). Imported as part of raybricks, it does not import
mlflow.
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import importlib.util
import json
import os
import sys
import warnings
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import pyarrow as pa

if __name__ == "raybricks.segmented_model":
    from raybricks import kinds
else:  # the registered model's code: its copy of raybricks.kinds, shipped beside this file
    try:
        import raybricks_kinds as kinds
    except ImportError:  # MLflow validating the model as raybricks logs it
        from raybricks import kinds


CLASSIFICATION = kinds.CLASSIFICATION
prepare_features = kinds.prepare_features
_MODULES = {"scikit-learn": "sklearn"}  # import names that differ from the distribution's


def provide_raybricks_kinds() -> None:
    """Where raybricks is not installed, make ``raybricks.kinds`` this model's copy of it:
    a user's kind imports its base class from there."""
    if "raybricks.kinds" in sys.modules:
        return
    try:
        installed = importlib.util.find_spec("raybricks") is not None
    except ImportError:
        installed = False
    if not installed:
        package = sys.modules.setdefault("raybricks", type(sys)("raybricks"))
        package.kinds = kinds
        sys.modules.setdefault("raybricks.kinds", kinds)


class LibraryVersionWarning(UserWarning):
    """A model library's installed version differs from the one the model was trained with."""


def installed_version(library: str) -> str | None:
    """The installed version of a model library, or None when it is not installed."""
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:  # installed under another name?
        module = _MODULES.get(library, library)
        if importlib.util.find_spec(module) is None:
            return None
        return getattr(__import__(module), "__version__", None)


def trained_versions(recorded: str | list[str]) -> list[str]:
    """A manifest's versions of one library: one, or several after a merge."""
    return [recorded] if isinstance(recorded, str) else list(recorded)


def library_version_problem(manifest: dict[str, Any], model_uri: str | None = None
                            ) -> str | None:
    """One line naming each model library whose installed version differs from the
    training version(s) in the manifest, and the fix; None when all match."""
    differing = []
    for library, recorded in sorted(manifest.get("libraries", {}).items()):
        trained = trained_versions(recorded)
        installed = installed_version(library)
        if any(version != installed for version in trained):
            here = f"installed here: {installed}" if installed else "not installed here"
            differing.append(f"{library} {' and '.join(trained)} ({here})")
    if not differing:
        return None
    uri = repr(model_uri) if model_uri else "model_uri"
    return (f"this segmented model was trained with {', '.join(differing)}; models saved by "
            "one version may fail to load or predict differently under another: install the "
            "model's requirements (pip install -r the file that "
            f"mlflow.pyfunc.get_model_dependencies({uri}) returns)")


class Features:
    """``prepare_features`` of one frame, made once for every member that reads the same
    features (the members of a segment do)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame
        self.made: list[tuple[list, dict, pd.DataFrame]] = []

    def of(self, meta: dict[str, Any]) -> pd.DataFrame:
        features, categorical = meta["features"], meta.get("categorical", {})
        for known, categories, prepared in self.made:
            if known == features and categories == categorical:
                return prepared
        prepared = prepare_features(self.frame, meta)
        self.made.append((features, categorical, prepared))
        return prepared


class MemberModel:
    """One fitted model: ``predict`` gives values (regression) or an (n, k) matrix of
    class probabilities (classification). Its kind loads it when first asked for
    (``model``: a series answered from its stored forecast never loads its members)."""

    def __init__(self, kind: str, payload: bytes, meta: dict[str, Any]) -> None:
        if kind not in kinds.BUILTIN:
            provide_raybricks_kinds()
        self.kind = kinds.resolve(kind)
        self.meta = meta
        self.task = meta["task"]
        self.n_classes = len(meta.get("classes") or [])
        self.payload = payload

    @functools.cached_property
    def model(self) -> Any:
        """The fitted model, loaded by its kind from the stored payload (then let go)."""
        model = self.kind.load(self.payload, self.meta)
        self.payload = None
        return model

    def predict(self, frame: pd.DataFrame, features: Features | None = None) -> np.ndarray:
        """``features``: the rows' ``prepare_features``, shared with the other members."""
        prepared = (features or Features(frame)).of(self.meta)
        raw = self.kind.predict_loaded(self.model, prepared, self.meta)
        return self._shape(np.asarray(raw, dtype="float64"))

    def _shape(self, raw: np.ndarray) -> np.ndarray:
        if self.task not in CLASSIFICATION:
            return raw.reshape(-1)
        if raw.ndim == 1:  # probability of the positive class
            raw = np.column_stack([1.0 - raw, raw])
        if raw.shape[1] < self.n_classes:  # classes absent from a training split
            trained = self.meta.get("trained_classes", list(range(raw.shape[1])))
            full = np.zeros((raw.shape[0], self.n_classes))
            full[:, trained] = raw
            raw = full
        return raw


def align_classes(raw: np.ndarray, classes: list, to: list) -> np.ndarray:
    """Class probabilities over ``classes`` as probabilities over ``to`` (classes missing
    from ``classes`` get 0; rows renormalised, uniform where nothing is left)."""
    position = {c: i for i, c in enumerate(classes)}
    out = np.zeros((raw.shape[0], len(to)))
    for j, c in enumerate(to):
        if c in position:
            out[:, j] = raw[:, position[c]]
    total = out.sum(axis=1, keepdims=True)
    return np.where(total > 0, out / np.where(total > 0, total, 1), 1.0 / len(to))


class SegmentModel:
    """A segment's ensemble: the weighted mean of its members' predictions. Members of a
    kind that ``uses_fallback`` predict with ``fallback`` (the global model)."""

    def __init__(self, members: list[tuple[MemberModel, float]],
                 fallback: SegmentModel | None = None,
                 reconciliation: list[float] | None = None) -> None:
        self.members = members
        self.meta = members[0][0].meta
        self.fallback = fallback
        self.reconciliation = (None if reconciliation is None
                               else np.asarray(reconciliation, dtype="float64"))

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]], fallback: SegmentModel | None = None
                  ) -> SegmentModel:
        """Build from stored rows with ``kind``, ``payload``, ``meta`` (JSON), ``weight``
        (and, in a reconciled hierarchy, ``reconciliation``)."""
        return cls(
            [
                (MemberModel(row["kind"], row["payload"], json.loads(row["meta"])), row["weight"])
                for row in rows
            ],
            fallback,
            rows[0].get("reconciliation"),
        )

    def _member_predict(self, member: MemberModel, frame: pd.DataFrame,
                        features: Features) -> np.ndarray:
        if not member.kind.uses_fallback:
            return member.predict(frame, features)
        if self.fallback is None:
            raise ValueError("a member uses the global model, which this model does not have")
        if member.model is not None:  # a series' history, continued by the global model
            return member.kind.continue_series(member.model, self.fallback.members[0][0],
                                               features.of(member.meta), member.meta)
        raw = self.fallback.predict_raw(frame)
        if self.meta["task"] not in CLASSIFICATION:
            return raw
        return align_classes(raw, self.fallback.meta["classes"], self.meta["classes"])

    def continued_member(self) -> int | None:
        """Task forecast: the position of the member whose series history the global
        model continues."""
        return next((position for position, (member, _) in enumerate(self.members)
                     if member.kind.uses_fallback and member.model is not None), None)

    def made_in_bulk(self) -> bool:
        """Whether a member's forecasts are made with other series' (``SegmentStore.
        made_in_bulk``): one the global model continues, or one whose kind forecasts many
        stored series at once."""
        return (self.continued_member() is not None and self.fallback is not None) or any(
            getattr(member.kind, "forecasts_many", False) for member, _ in self.members)

    def predict_raw(self, frame: pd.DataFrame, made: dict[int, np.ndarray] | None = None,
                    features: Features | None = None) -> np.ndarray:
        """The members' weighted mean (``made``: some members' predictions of the rows,
        by position, made with other series' in bulk: ``SegmentStore.made_in_bulk``); a
        series' rows of the periods its own forecast covers answered from it
        (``stored``)."""
        features, made = features or Features(frame), made or {}
        mean = self.stored(frame)
        if mean is None:
            mean = self.blended(made[position] if position in made
                                else self._member_predict(member, frame, features)
                                for position, (member, _) in enumerate(self.members))
        if self.reconciliation is None:
            return mean
        return mean + self.reconciled_shift(frame, features)

    def blended(self, predictions: Iterable[np.ndarray]) -> np.ndarray:
        """The members' ``predictions`` (in the members' order) weighted."""
        total = sum(weight for _, weight in self.members)
        return sum(values * (weight / total)
                   for values, (_, weight) in zip(predictions, self.members, strict=True))

    def stored(self, frame: pd.DataFrame) -> np.ndarray | None:
        """A series stored with its own forecast of its horizon (``SeriesMeta.base``, the
        members' answer made when they were fitted): that forecast at the rows' periods,
        when every row is one of them; None otherwise (the members answer)."""
        base = (self.meta.get("forecast") or {}).get("base")
        if base is None or not len(frame):
            return None
        steps, _ = kinds.forecasting.row_steps(frame, self.meta, len(base))
        if not steps.all():
            return None
        return np.asarray(base, dtype="float64")[steps - 1]

    def forecast_next(self, times: pd.Index) -> np.ndarray:
        """Task forecast, a series without exogenous columns: its forecasts of ``times``,
        the periods right after its history in order, as ``predict_raw`` answers rows
        of those dates; each member forecasts them at once (``forecast_loaded``)
        without rows, except a member of the global model, which continues the series
        from rows as ``predict_raw`` does."""
        future = pd.DataFrame({kinds.forecasting.TIME: times})

        def forecast(member: MemberModel) -> np.ndarray:
            if member.kind.uses_fallback:
                rows = pd.DataFrame({member.meta["features"][0]: times})
                return self._member_predict(member, rows, Features(rows))
            raw = member.kind.forecast_loaded(member.model, future, member.meta)
            return np.asarray(raw, dtype="float64").reshape(-1)

        return self.blended(forecast(member) for member, _ in self.members)

    def reconciled_shift(self, frame: pd.DataFrame, features: Features | None = None
                         ) -> np.ndarray:
        """A reconciled hierarchy's series: what makes each row's forecast add up with
        the other levels' (the reconciled minus this series' own forecast, per period
        after its history; 0 outside the reconciled horizon)."""
        prepared = (features or Features(frame)).of(self.meta)
        steps, _ = kinds.forecasting.row_steps(prepared, self.meta)
        shift = np.zeros(len(steps))
        inside = (steps > 0) & (steps <= len(self.reconciliation))
        shift[inside] = self.reconciliation[steps[inside] - 1]
        return shift

    def predict_intervals(self, frame: pd.DataFrame, levels: list[float],
                          made: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """Forecasts and their interval bounds: columns ``prediction`` and
        ``interval_columns(levels)`` (NaN where the series has no intervals)."""
        features = Features(frame)
        point = self.predict_raw(frame, made, features)
        bounds = kinds.forecasting.interval_bounds(point, features.of(self.meta), self.meta,
                                                   levels)
        return np.column_stack([point, bounds])

    def predict(self, frame: pd.DataFrame, probabilities: bool = False,
                made: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """Values for regression; class labels (or probabilities) for classification."""
        raw = self.predict_raw(frame, made)
        if self.meta["task"] not in CLASSIFICATION or probabilities:
            return raw
        classes = np.asarray(self.meta["classes"], dtype=object)
        return classes[np.argmax(raw, axis=1)]


# --------------------------------------------------------------------------- the store

#: The newest model directory format this module reads (and packaging writes). 2: a
#: version may hold several global models (``fallback.parquet``'s ``global`` column);
#: each index row names the one its segment was trained with (``global``).
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
INDEX = "index.parquet"
#: The global models a version holds (each member row's ``global`` column names its
#: model; a model of format 1 holds one, without the column).
FALLBACK = "fallback.parquet"
#: The index's and the fallback file's column naming a global model (format 2).
GLOBAL = "global"
MEMBER_COLUMNS = ("kind", "payload", "meta", "weight")
#: A reconciled hierarchy's member column: its series' forecast shift per period ahead.
RECONCILIATION = "reconciliation"
DEFAULT_CACHE_SEGMENTS = 2048
NO_INTERVALS = ("this model has no prediction intervals: train it with forecast.intervals "
                "(levels such as [80, 95])")


SHARDS = "models-*.parquet"  # every shard's file


def shard_name(shard: int) -> str:
    """The file of the members' shard number ``shard``."""
    return f"models-{shard:05d}.parquet"


def default_global(manifest: dict[str, Any]) -> str | None:
    """The global model that answers keys the model has never seen (and, in a model of
    format 1, every segment): the manifest's ``global_model``; a format-1 model's one
    global model is named after its training run."""
    if "global_model" in manifest:
        return manifest["global_model"]
    if not manifest.get("has_fallback", True):
        return None
    return str(manifest.get("training_run") or "global")


def read_globals(directory: Path, manifest: dict[str, Any]) -> dict[str, list[dict]]:
    """Every global model of a segmented model directory: its name -> its member rows."""
    import pyarrow.parquet as pq

    path = Path(directory) / FALLBACK
    if not path.exists():
        return {}
    table = pq.read_table(path)
    if GLOBAL not in table.column_names:  # format 1: one global model
        return {default_global(manifest) or "global": table.to_pylist()}
    found: dict[str, list[dict]] = {}
    for row in table.to_pylist():
        found.setdefault(row[GLOBAL], []).append(row)
    return found


def key_tuples(table, segment_by: list[str]) -> list[tuple]:
    """The segment key of every row of an Arrow table, as tuples."""
    return list(zip(*(table.column(c).to_pylist() for c in segment_by), strict=True))


class KeyIndex:
    """A table with one row per segment key, looked up by batches of keys: a hash join
    built on the batch (Arrow builds on the join's right side, so a lookup costs the
    batch plus one pass over the index, not a hash of the whole index). A null key
    matches a null key, as segments group them (Arrow's join alone never matches nulls):
    each key column is joined as a null flag and the column with its nulls filled, the
    index's join columns made once."""

    def __init__(self, table: pa.Table, segment_by: list[str]) -> None:
        self.segment_by = list(segment_by)
        self.columns = [c for c in table.column_names if c not in self.segment_by]
        self.fills = {c: _first_value(table.column(c)) for c in self.segment_by}
        self.table = _with_join_keys(table, self.fills)

    def __len__(self) -> int:
        return self.table.num_rows

    def lookup(self, keys: pa.Table) -> pa.Table:
        """``keys`` (every row, in order) with the index's other columns of the same key
        (nulls where the index has none)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        fills = {c: self.fills[c] if self.fills[c] is not None else _first_value(keys.column(c))
                 for c in self.segment_by}
        asked = _with_join_keys(keys.append_column(POSITION, pa.array(np.arange(keys.num_rows))),
                                fills)
        table = self.table
        for c, fill in fills.items():  # the index has no value to fill with, the keys do
            if self.fills[c] is None and fill is not None:
                table = table.append_column(f"__key_{c}", pc.fill_null(table.column(c), fill))
        joins = [name for c, fill in fills.items()
                 for name in (f"__null_{c}", *([f"__key_{c}"] if fill is not None else []))]
        found = table.drop_columns(self.segment_by).join(
            asked, keys=joins, join_type="right outer").sort_by(POSITION)
        return found.select([*keys.column_names, *self.columns])


POSITION = "__position"


def null_safe_join(left: pa.Table, right: pa.Table, segment_by: list[str]) -> pa.Table:
    """``left`` (every row, in order) with the other columns of the ``right`` row of the
    same segment key (nulls where none); a null key matches a null key."""
    return KeyIndex(right, segment_by).lookup(left)


def locations(found: pa.Table) -> pa.Table:
    """Looked-up index rows with ``shard`` and ``row_group`` -1 where there is no model."""
    import pyarrow.compute as pc

    for name in ("shard", "row_group"):
        found = found.set_column(found.schema.get_field_index(name), name,
                                 pc.fill_null(found.column(name), -1))
    return found


def _first_value(column: pa.ChunkedArray) -> pa.Scalar | None:
    import pyarrow.compute as pc

    known = pc.drop_null(column)
    return known[0] if len(known) else None


def _with_join_keys(table: pa.Table, fills: dict[str, pa.Scalar | None]) -> pa.Table:
    """Per key column, a null flag, and (when there is a value to fill with) the column
    with its nulls filled."""
    import pyarrow.compute as pc

    for column, fill in fills.items():
        table = table.append_column(f"__null_{column}", pc.is_null(table.column(column)))
        if fill is not None:
            table = table.append_column(f"__key_{column}",
                                        pc.fill_null(table.column(column), fill))
    return table


def missing_columns(columns, segment_by: list[str], features: list[str]) -> str | None:
    """What is wrong when input columns lack the segment columns or features, else None."""
    missing = [c for c in segment_by + features if c not in columns]
    if not missing:
        return None
    return (f"input is missing column(s) {missing}: the model needs the segment columns "
            f"{segment_by} and the features {features}{column_hints(missing, columns)}")


def column_hints(missing: list[str], columns) -> str:
    """For the missing columns, those of ``columns`` they likely are (the same name in
    another case, else the closest names): `` ('x': did you mean 'X'? ...)``, or ''."""
    columns, hints = list(columns), []
    for name in missing:
        hint = kinds.did_you_mean(name, columns, shown=repr)  # the shipped copy, if consumed
        if hint:
            hints.append(f"{name!r}: {hint}")
    return f" ({'; '.join(hints)} names are matched exactly)" if hints else ""


def prediction_type(manifest: dict[str, Any]) -> str:
    """The type of the ``prediction`` column (a name MLflow and Spark SQL both read):
    double for regression, the class labels' type for classification."""
    classes = manifest.get("classes") or []
    if manifest["task"] not in CLASSIFICATION or not classes:
        return "double"
    first = classes[0]
    return ("boolean" if isinstance(first, bool) else "long" if isinstance(first, int)
            else "double" if isinstance(first, float) else "string")


class SegmentStore:
    """Every segment's model in a directory of Parquet shards, loaded on demand.

    ``manifest.json`` says what the model is (segment columns, features, task, classes);
    ``index.parquet`` has one row per segment of the training run (key columns, status,
    and the shard file and row group holding its members, -1 when it has no model);
    ``models-NNNNN.parquet`` hold the members, each segment inside one row group;
    ``fallback.parquet`` the global model, if one was trained. Segments are read when a
    prediction needs them and kept in a least-recently-used cache of ``cache_segments``.
    """

    def __init__(self, directory: str | os.PathLike, cache_segments: int = DEFAULT_CACHE_SEGMENTS):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.directory = Path(directory)
        self.manifest = json.loads((self.directory / MANIFEST).read_text())
        kinds.pretrained.provide(self.directory)  # the weights it carries, if any
        self.segment_by: list[str] = self.manifest["segment_by"]
        self.features: list[str] = self.manifest["features"]
        self.task: str = self.manifest["task"]
        # Arrow columns, looked up with a hash join: a few bytes per segment, where
        # Python objects would take hundreds (a million segments' index is ~30 MB)
        names = pq.read_schema(self.directory / INDEX).names
        index = pq.read_table(self.directory / INDEX, columns=[
            *self.segment_by, "status", "shard", "row_group",
            *([GLOBAL] if GLOBAL in names else [])])
        if GLOBAL not in names:  # format 1: every segment refers to the one global model
            index = index.append_column(GLOBAL, pa.nulls(index.num_rows, pa.string()))
        self.key_schema = pa.schema([index.schema.field(c) for c in self.segment_by])
        self.index = KeyIndex(index, self.segment_by)
        self.cache_segments = max(int(cache_segments), 1)
        self._cache: OrderedDict[tuple, SegmentModel] = OrderedDict()
        # each segment answers with the global model it was trained with (a merged
        # version holds every one its segments refer to), loaded when first asked for;
        # keys never seen, with the version's default
        self._global_rows = read_globals(self.directory, self.manifest)
        self._globals: dict[str, SegmentModel] = {}
        self.default_global = default_global(self.manifest)
        self.fallback: SegmentModel | None = None
        if self.default_global is not None:
            self.fallback = self.global_model(self.default_global)

    def __len__(self) -> int:
        return len(self.index)

    def locate(self, keys: pa.Table) -> pa.Table:
        """Per key (typed as the index's, in order): its ``status`` (null: unknown),
        ``shard`` and ``row_group`` (-1: no model) and ``global``, the global model it
        refers to (null: the default)."""
        return locations(self.index.lookup(keys)).select(["status", "shard", "row_group",
                                                          GLOBAL])

    @property
    def global_names(self) -> list[str]:
        """The names of the global models this model holds."""
        return sorted(self._global_rows)

    def global_model(self, name: str | None) -> SegmentModel | None:
        """The global model ``name`` (None: the version's default), loaded once; None
        where the model holds none of that name (a member that needs it says so when it
        predicts)."""
        if name is None:
            return self.fallback
        if name not in self._globals and name in self._global_rows:
            self._globals[name] = SegmentModel.from_rows(self._global_rows[name])
        return self._globals.get(name)

    def models(self, keys: list[tuple], where: pa.Table) -> dict[tuple, SegmentModel]:
        """The models of these segments (those that have one, ``where`` says: ``locate``),
        from cache or shards."""
        import pyarrow.parquet as pq

        found, wanted, refers = {}, {}, {}
        for key, shard, group, name in zip(keys, where.column("shard").to_pylist(),
                                           where.column("row_group").to_pylist(),
                                           where.column(GLOBAL).to_pylist(), strict=True):
            if key in self._cache:
                self._cache.move_to_end(key)
                found[key] = self._cache[key]
            elif shard >= 0:
                wanted.setdefault((shard, group), set()).add(key)
                refers[key] = name
        for (shard, group), needed in sorted(wanted.items()):
            path = self.directory / shard_name(shard)
            rows = pq.ParquetFile(path).read_row_group(group).to_pylist()
            members: dict[tuple, list[dict]] = {}
            for row in rows:
                key = tuple(row[c] for c in self.segment_by)
                if key in needed:
                    members.setdefault(key, []).append(row)
            for key, member_rows in members.items():
                found[key] = self._remember(key, SegmentModel.from_rows(
                    member_rows, self.global_model(refers[key])))
        return found

    def _remember(self, key: tuple, model: SegmentModel) -> SegmentModel:
        self._cache[key] = model
        while len(self._cache) > self.cache_segments:
            self._cache.popitem(last=False)
        return model

    def segment_keys(self, frame: pd.DataFrame) -> tuple[pa.Table, np.ndarray]:
        """The distinct segment keys of the rows (typed as in training) and, per row, the
        position of its key among them."""
        import pyarrow as pa

        keys = frame[self.segment_by]
        codes = keys.groupby(self.segment_by, dropna=False, sort=False).ngroup().to_numpy()
        _, first = np.unique(codes, return_index=True)
        distinct = keys.iloc[first]
        try:
            typed = pa.Table.from_pandas(distinct, preserve_index=False).cast(self.key_schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise ValueError(
                f"segment columns {self.segment_by} cannot be read as the model's key types "
                f"({self.key_schema}): {exc}"
            ) from exc
        return typed, codes

    def predict(self, frame: pd.DataFrame, probabilities: bool = False,
                intervals: bool = False) -> Prediction:
        """One prediction per row, in input order, for rows of any mix of segments;
        ``intervals``: with a forecasting model's interval bounds."""
        problem = missing_columns(frame.columns, self.segment_by, self.features)
        if problem:
            raise ValueError(problem)
        frame = dated(frame.reset_index(drop=True), self.manifest)
        typed, codes = self.segment_keys(frame)
        keys, where = key_tuples(typed, self.segment_by), self.locate(typed)
        order = np.argsort(codes, kind="stable")
        cuts = np.searchsorted(codes[order], np.arange(len(keys) + 1))
        models = self.models(keys, where)
        statuses = where.column("status").to_pylist()
        referred = where.column(GLOBAL).to_pylist()
        status = np.empty(len(frame), dtype=object)
        levels = (self.manifest.get("forecast") or {}).get("intervals") or []
        if intervals and not levels:
            raise ValueError(NO_INTERVALS)
        outputs = Outputs(len(frame), self.task, self.manifest.get("classes"), probabilities,
                          levels if intervals else [])
        unscored = 0
        forecasts = bool(self.manifest.get("forecast"))  # a series needs its own history
        segments = [(key, order[cuts[position]:cuts[position + 1]])
                    for position, key in enumerate(keys)]
        made = self.made_in_bulk(segments, models, frame) if forecasts else {}
        for position, (key, rows) in enumerate(segments):
            status[rows] = statuses[position] or "unknown"
            model = models.get(key) or (None if forecasts
                                        else self.global_model(referred[position]))
            if model is None:
                unscored += len(rows)
                continue
            outputs.put(rows, model, rows_of(frame, rows), made.get(key))
        if unscored:
            warnings.warn(
                f"{unscored} row(s) of segments without a model (unknown, skipped or failed "
                "in training) got a null prediction: " + (
                    "a forecast needs the series' history" if forecasts
                    else "the model has no global fallback"),
                stacklevel=2,
            )
        return Prediction(outputs.result(), status)


    def made_in_bulk(self, segments: list[tuple[tuple, np.ndarray]],
                     models: dict[tuple, SegmentModel], frame: pd.DataFrame
                     ) -> dict[tuple, dict[int, np.ndarray]]:
        """Task forecast: members' forecasts of the rows of many series made at once, per
        series and member position (``segments``: each key and its rows; a series
        answered from its stored forecast needs none): the global model continuing
        every series that chose it (``GlobalKind.continue_many_series``) and the members
        whose kind forecasts many stored series at once (``forecast_many``: pretrained
        models, in batches). A batch that fails is left out: each series then forecasts
        alone, and reports its error."""
        waiting = [(key, models[key], rows_of(frame, rows)) for key, rows in segments
                   if key in models and models[key].made_in_bulk()]
        waiting = [(key, model, rows) for key, model, rows in waiting
                   if model.stored(rows) is None]
        found: dict[tuple, dict[int, np.ndarray]] = {}
        for key, position, values in [*continued_series(waiting), *forecast_many(waiting)]:
            found.setdefault(key, {})[position] = values
        return found


def continued_series(waiting: list[tuple[tuple, SegmentModel, pd.DataFrame]]
                     ) -> list[tuple[tuple, int, np.ndarray]]:
    """The global model's forecasts of the rows of every waiting series that continues
    it, made for all of them at once (none where fewer than two series do)."""
    by_global: dict[int, list] = {}  # per global model, the series it continues
    for key, model, rows in waiting:
        position = model.continued_member()
        if position is not None and model.fallback is not None:
            member = model.members[position][0]
            features = prepare_features(rows, member.meta)
            by_global.setdefault(id(model.fallback), []).append(
                (key, position, member, model.fallback, (member.model, features, member.meta)))
    found = []
    for wanted in by_global.values():
        if len(wanted) < 2:
            continue
        try:
            made = wanted[0][2].kind.continue_many_series(
                [request for *_, request in wanted], wanted[0][3].members[0][0])
        except Exception:  # noqa: BLE001 - each series alone says what is wrong
            continue
        found += [(key, position, values)
                  for (key, position, *_), values in zip(wanted, made, strict=True)]
    return found


def forecast_many(waiting: list[tuple[tuple, SegmentModel, pd.DataFrame]]
                  ) -> list[tuple[tuple, int, np.ndarray]]:
    """The forecasts of the rows of every waiting series' members whose kind forecasts
    many stored series at once (``ForecastKind.forecast_many``), per kind in one call."""
    by_kind: dict[type, list] = {}
    for key, model, rows in waiting:
        for position, (member, _) in enumerate(model.members):
            if not getattr(member.kind, "forecasts_many", False):
                continue
            try:
                steps, future = kinds.forecasting.future_of(
                    prepare_features(rows, member.meta), member.meta)
            except Exception:  # noqa: BLE001 - the member alone says what is wrong
                continue
            if future is not None:
                by_kind.setdefault(member.kind, []).append((key, position, member, future, steps))
    found = []
    for kind, wanted in by_kind.items():
        try:
            paths = kind.forecast_many([(m.model, future, m.meta) for _, _, m, future, _ in wanted])
        except Exception:  # noqa: BLE001 - each series alone says what is wrong
            continue
        found += [(key, position, kinds.forecasting.placed(path, steps))
                  for (key, position, _, _, steps), path in zip(wanted, paths, strict=True)]
    return found


def rows_of(frame: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """``frame.iloc[rows]``; a slice where the rows are a run in order (a segment's rows
    usually are: scoring lays rows out by segment), which costs no copy."""
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows) and (np.diff(rows) == 1).all():
        return frame.iloc[rows[0]:rows[-1] + 1]
    return frame.iloc[rows]


def dated(frame: pd.DataFrame, manifest: dict[str, Any]) -> pd.DataFrame:
    """A forecasting model's rows with a time column of Python dates (Spark's DATE as
    pandas reads it) as timestamps, converted once for every segment of the frame (each
    segment's features would convert their own: ``prepare_features``)."""
    column = (manifest.get("forecast") or {}).get("time_column")
    if column not in frame.columns or frame[column].dtype != object:
        return frame
    present = frame[column].dropna()
    if not len(present) or not isinstance(present.iloc[0], datetime.date) or isinstance(
            present.iloc[0], datetime.datetime):
        return frame
    return frame.assign(**{column: pd.to_datetime(frame[column])})


@dataclass
class Prediction:
    """Predictions in input order, and each row's segment status in the model
    (trained, skipped, failed or unknown: the last three scored by the fallback, if any)."""

    values: pd.Series | pd.DataFrame
    status: np.ndarray


class Outputs:
    """Collects per-segment predictions into one output in input order."""

    def __init__(self, n: int, task: str, classes: list | None, probabilities: bool,
                 levels: list[float] | None = None) -> None:
        self.classify = task in CLASSIFICATION
        self.probabilities = self.classify and probabilities
        self.classes = list(classes or [])
        self.levels = list(levels or [])
        if self.levels:
            self.values = np.full((n, 1 + 2 * len(self.levels)), np.nan)
        elif self.probabilities:
            self.values = np.full((n, len(self.classes)), np.nan)
        else:
            self.values = np.full(n, None if self.classify else np.nan, dtype=object
                                  if self.classify else "float64")

    def put(self, rows: np.ndarray, model: SegmentModel, frame: pd.DataFrame,
            made: dict[int, np.ndarray] | None = None) -> None:
        if self.levels:
            self.values[rows] = model.predict_intervals(frame, self.levels, made)
            return
        predicted = model.predict(frame, probabilities=self.probabilities, made=made)
        if not self.probabilities:
            self.values[rows] = predicted
            return
        columns = [self.classes.index(c) for c in model.meta["classes"]]
        block = np.zeros((len(rows), len(self.classes)))
        block[:, columns] = predicted
        self.values[rows] = block

    def result(self) -> pd.Series | pd.DataFrame:
        if self.levels:
            columns = ["prediction", *kinds.forecasting.interval_columns(self.levels)]
            return pd.DataFrame(self.values, columns=columns)
        if self.probabilities:
            return pd.DataFrame(self.values, columns=[str(c) for c in self.classes])
        values = self.values
        if self.classify:
            values = pd.Series(values).infer_objects().to_numpy()
        return pd.Series(values, name="prediction")


# --------------------------------------------------------------------------- the pyfunc

if __name__ != "raybricks.segmented_model":  # run by MLflow as the logged model's code
    import mlflow
    from mlflow.pyfunc import PythonModel

    class SegmentedModel(PythonModel):
        """The MLflow pyfunc: ``predict(frame)`` scores rows of any mix of segments.

        ``params={"probabilities": True}`` gives class probabilities (classification);
        ``params={"intervals": True}`` a forecasting model's interval bounds beside the
        prediction (``lo_<level>``, ``hi_<level>``).
        ``model_config={"cache_segments": N}`` bounds how many segments stay loaded.
        """

        def load_context(self, context) -> None:
            config = context.model_config or {}
            self.store = SegmentStore(
                context.artifacts["segments"],
                int(config.get("cache_segments", DEFAULT_CACHE_SEGMENTS)),
            )
            problem = library_version_problem(self.store.manifest)
            if problem:  # once per load: members load lazily, per segment, later
                warnings.warn(problem, LibraryVersionWarning, stacklevel=2)

        def predict(self, context, model_input: pd.DataFrame, params: dict | None = None):
            params = params or {}
            frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(
                model_input)
            return self.store.predict(frame, bool(params.get("probabilities", False)),
                                      bool(params.get("intervals", False))).values

    mlflow.models.set_model(SegmentedModel())
