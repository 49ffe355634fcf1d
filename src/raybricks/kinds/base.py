"""The model-kind protocol: everything raybricks knows about one model library.

A kind is a ``ModelKind`` subclass. Its *stored* half (class methods ``load``,
``predict_loaded``, ``model_input``) is what the registered model runs to predict: it may
import only numpy, pandas, this package and the kind's own library, because consumers of
the registered model have no raybricks. Its *training* half (instance methods, one
instance per candidate of the job config) checks parameters, fits, predicts with the
fitted model, serializes, and optionally trains data-parallel with Ray Train; it imports
raybricks and Ray lazily, inside the methods.

This module and the built-in kinds are shipped with every registered model as the
package ``raybricks_kinds``, so keep their top-level imports to numpy and pandas.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import inspect
import pickle
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Required, TypedDict

import numpy as np
import pandas as pd

CLASSIFICATION = ("binary", "multiclass")


# --------------------------------------------------------------------------- stored meta


class SeriesMeta(TypedDict, total=False):
    """``meta["forecast"]`` of a series member: its frequency (a pandas frequency, or an
    integer step) and exogenous columns; the last period of its history (ISO date or
    integer) and how many periods after it it answers (``limit``); its ensemble's
    conformal interval offsets (``{"levels": [...], "offsets": [[...], ...]}``) when the
    job asked for intervals; its ensemble's signed backtest errors (``residuals``:
    windows x horizon, actual minus forecast) when it is reconciled in a hierarchy; its
    own forecast of the horizon after its history (``base``: as its members answer it,
    made in the task that fitted them; what reconciliation starts from, and what the
    model answers for those periods) when its next periods need only their dates (no
    exogenous or static columns), or why that forecast failed (``base_error``). The
    global model's own meta has the first two only."""

    frequency: Required[str | int]
    exogenous: Required[list[str]]
    last: str | int
    limit: int
    intervals: dict[str, Any]
    residuals: list[list[float]]
    base: list[float]
    base_error: str


class MemberMeta(TypedDict, total=False):
    """A stored member's ``meta``: the models table's JSON column, what every kind's stored
    half reads besides the payload. ``features``: the model's inputs in order;
    ``categorical``: each categorical feature's training categories; ``task``; ``fill``:
    the training medians of the numeric features (table members); ``classes``: the
    segment's classes (classification) and ``trained_classes`` those its model was
    trained on, when fewer; ``forecast``: a series member's ``SeriesMeta``. Keys are
    written in this order, the optional ones only when set (``member_meta``)."""

    features: Required[list[str]]
    categorical: Required[dict[str, list[str]]]
    task: Required[str]
    fill: dict[str, float]
    classes: list
    trained_classes: list
    forecast: SeriesMeta


#: ``MemberMeta``'s optional keys, in their stored order.
OPTIONAL_META = ("fill", "classes", "trained_classes", "forecast")


def member_meta(features: list[str], task: str, categorical: dict[str, list] | None = None,
                **optional: Any) -> MemberMeta:
    """A member's meta, keys in the stored order (the one place it is built): ``optional``
    takes ``OPTIONAL_META``'s keys; one that is None is left out."""
    unknown = set(optional) - set(OPTIONAL_META)
    if unknown:
        raise TypeError(f"member meta has no key(s) {sorted(unknown)}")
    meta: MemberMeta = {"features": list(features), "categorical": dict(categorical or {}),
                        "task": task}
    for key in OPTIONAL_META:
        if optional.get(key) is not None:
            meta[key] = optional[key]
    return meta


# --------------------------------------------------------------------------- inputs


def prepare_features(frame: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """The feature frame every kind starts from: the model's features in its order,
    numbers as float64 (NaN for missing or infinite), categoricals with exactly the
    training categories (unseen values -> NaN)."""
    categorical: dict[str, list] = meta.get("categorical", {})
    features = meta["features"]
    plain = [
        c for c in features
        if c not in categorical and pd.api.types.is_numeric_dtype(frame[c].dtype)
        and not pd.api.types.is_datetime64_any_dtype(frame[c].dtype)
    ]
    if len(plain) == len(features):  # the common case: one bulk conversion
        values = frame[plain].to_numpy(dtype="float64", na_value=np.nan, copy=True)
        values[np.isinf(values)] = np.nan  # infinite values count as missing
        return pd.DataFrame(values, columns=plain, index=frame.index)
    columns = {}
    for name in features:
        values = frame[name]
        if name in categorical:
            columns[name] = pd.Categorical(
                values.astype("object").where(values.notna(), None), categories=categorical[name]
            )
        else:
            columns[name] = to_float(values)
    return pd.DataFrame(columns, index=frame.index)


def to_float(values: pd.Series) -> np.ndarray:
    """Numbers, booleans, decimals and datetimes (as epoch seconds) as float64."""
    if pd.api.types.is_datetime64_any_dtype(values):
        if hasattr(values.array, "as_unit"):  # as below, without the Python objects:
            ticks = values.array.as_unit("ns").asi8  # nanoseconds since the epoch, UTC
            return np.where(values.isna().to_numpy(), np.nan, ticks / 10**9)
        stamps = pd.to_datetime(values, utc=True)
        seconds = (stamps - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
        return seconds.to_numpy(dtype="float64", na_value=np.nan)
    if values.dtype == object:
        present = values.dropna()
        if len(present) and isinstance(present.iloc[0], datetime.date):  # Spark DATE
            return to_float(pd.Series(pd.to_datetime(values), index=values.index))
        values = pd.to_numeric(values, errors="coerce")
    floats = pd.Series(values).astype("float64").to_numpy(na_value=np.nan, copy=True)
    floats[np.isinf(floats)] = np.nan  # infinite values count as missing
    return floats


def frame_input(features: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """The feature frame as it is (NaN for missing, pandas categoricals)."""
    return features


def filled_input(features: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame | np.ndarray:
    """Missing numbers filled with the training medians (``meta["fill"]``): a plain float
    matrix when there are no categoricals, else a frame whose categoricals are plain
    objects (for a one-hot encoder)."""
    fill = meta.get("fill", {})
    categorical = list(meta.get("categorical", {}))
    if not categorical:
        matrix = features.to_numpy(dtype="float64", na_value=np.nan)
        missing = np.isnan(matrix)
        if missing.any():
            medians = np.array([fill.get(c, 0.0) for c in features.columns])
            matrix = np.where(missing, medians, matrix)
        return matrix
    present = {k: v for k, v in fill.items() if k in features.columns}
    if present and features[list(present)].isna().to_numpy().any():
        features = features.fillna(present)
    return features.astype({c: "object" for c in categorical})


# --------------------------------------------------------------------------- imports


@functools.cache
def import_object(path: str) -> Any:
    """Import ``package.module.name``; a clear error (ConfigError inside raybricks) when
    it does not exist."""
    module_name, _, attribute = path.rpartition(".")
    module = None
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        hint = did_you_mean(attribute, [n for n in dir(module) if not n.startswith("_")],
                            shown=f"{module_name}.{{}}".format) if module is not None else ""
        message = (f"cannot import {path!r} ({exc}): "
                   + (hint or "give a full import path such as sklearn.linear_model.Ridge"))
        try:
            from raybricks.errors import ConfigError
        except ImportError:  # a consumer of the registered model
            raise ImportError(message) from exc
        raise ConfigError(message) from exc


@functools.cache
def accepted_parameters(factory: Any) -> frozenset[str]:
    """The keyword parameters a class or factory accepts (looked up once)."""
    try:
        return frozenset(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return frozenset()


def likely_names(name: str, names: Iterable[str], n: int = 2) -> list[str]:
    """The ``names`` a misspelt ``name`` likely meant: the same name in another case, else
    the closest (case aside); what raybricks' "did you mean" messages offer."""
    import difflib

    lowered: dict[str, str] = {}
    for known in names:
        lowered.setdefault(known.lower(), known)
    same = [known for known in names if known.lower() == name.lower()]
    return same or [lowered[m] for m in difflib.get_close_matches(
        name.lower(), list(lowered), n=n, cutoff=0.75)]


def did_you_mean(name: str, names: Iterable[str], n: int = 2,
                 shown: Callable[[str], str] = str) -> str:
    """``did you mean A or B?`` with the ``names`` a misspelt ``name`` likely meant (each
    as ``shown`` writes it), or '' when none is close."""
    likely = likely_names(name, names, n=n)
    return f"did you mean {' or '.join(map(shown, likely))}?" if likely else ""


def candidate_settings(candidate: Any) -> list[dict[str, Any]]:
    """The settings a kind's ``check`` validates: the candidate's ``params``, then each
    value of its search space over them (a list value by value, a range at both ends)."""
    settings = [dict(candidate.params)]
    for name, space in candidate.search.items():
        values = space if isinstance(space, list) else [space.low, space.high]
        if not isinstance(space, list) and space.int:
            values = [int(round(v)) for v in values]
        settings += [candidate.params | {name: value} for value in values]
    return settings


def unknown_parameters(candidate: Any, unknown: set[str], known: set[str], library: str,
                       reference: str) -> Exception:
    """The ConfigError for the parameters of ``candidate`` that ``library`` does not take,
    each with the closest names it does (``known``)."""
    from raybricks.errors import ConfigError

    named = []
    for name in sorted(unknown):
        hint = did_you_mean(name, sorted(known))
        named.append(f"{name} ({hint})" if hint else name)
    return ConfigError(f"models[{candidate.name}]: {library} has no parameter "
                       f"{', '.join(named)}: correct its name in params or search "
                       f"({reference})")


def check_settings(candidate: Any, configure: Callable[[dict[str, Any]], None],
                   refused: type[Exception], library: str, reference: str) -> None:
    """Each setting of ``candidate`` (``candidate_settings``) through ``configure`` (a
    booster on made-up rows): the library's ``refused`` error is a ConfigError naming the
    setting and the library's reason (without the C++ source line it may name); any other
    error needs the data, and the fit will tell."""
    import re

    from raybricks.errors import ConfigError, first_line

    for setting in candidate_settings(candidate):
        try:
            configure(setting)
        except refused as exc:
            why = re.sub(r"\s+at \S+, line \d+\s*\.?$", "", first_line(exc))
            raise ConfigError(f"models[{candidate.name}]: {setting} is not a valid setting "
                              f"of {library}: {why}: correct it in params or search "
                              f"({reference})") from None
        except Exception:  # noqa: BLE001, S112 - needs the data: the fit will tell
            continue


def boosting_params(params: dict[str, Any], defaults: dict[str, Any], task: str,
                    n_classes: int, drop: tuple[str, ...] = ("n_jobs", "random_state",
                                                            "verbose", "verbosity"),
                    ) -> tuple[dict[str, Any], int]:
    """Scikit-learn style boosting parameters as the native API takes them: the rounds
    (``n_estimators``) apart, scikit-learn-only keys dropped, ``defaults`` under the
    user's values, ``num_class`` for multiclass."""
    params = dict(params)
    rounds = int(params.pop("n_estimators", 100))
    for name in drop:
        params.pop(name, None)
    params = defaults | params
    if task == "multiclass":
        params["num_class"] = n_classes
    return params, rounds


def holds_gpus(candidate: Any) -> bool:
    """Whether the candidate asks for GPUs (``resources.num_gpus``) and this Ray task (or
    Ray Train worker) holds some: where a kind fits on the GPU."""
    if candidate.resources.num_gpus <= 0:
        return False
    import ray

    return bool(ray.is_initialized() and ray.get_gpu_ids())


# --------------------------------------------------------------------------- the protocol


class StoredKind:
    """What every kind has, table kinds (``ModelKind``) and series kinds
    (``forecasting.ForecastKind``) alike, which are siblings over it: a name, the library
    whose format stores its models, the stored half's ``load`` and ``predict_loaded``
    (class methods, no raybricks needed), and the training half's checks and
    ``serialize`` (an instance per candidate: ``self.candidate`` is its config)."""

    #: What ``kind:`` says in the job config (a user's kind: its import path).
    name: ClassVar[str] = ""
    #: The distribution whose format stores the fitted models (its version is recorded in
    #: the model and pinned in the model's requirements); None: nothing to pin.
    library: ClassVar[str | None] = None
    #: A user's kind: whether the registered model carries a copy of the kind's module
    #: (which then must import only raybricks.kinds and installed libraries); False when
    #: the module is installed where the model is used (name it in ``requirements``).
    shipped: ClassVar[bool] = True
    #: Extra pip requirements of the registered model (``library`` is pinned anyway).
    requirements: ClassVar[tuple[str, ...]] = ()
    #: Whether the member predicts with the segmented model's global (fallback) model.
    uses_fallback: ClassVar[bool] = False
    #: The raybricks extra that installs ``library`` where a runtime lacks it (e.g.
    #: serverless environments: ``raybricks submit --serverless`` adds it); None: none.
    extra: ClassVar[str | None] = None

    def __init__(self, candidate: Any) -> None:
        self.candidate = candidate

    @classmethod
    def libraries(cls) -> tuple[str, ...]:
        """Every distribution the stored members need (``library``, if any)."""
        return (cls.library,) if cls.library else ()

    # -- the stored half: what the registered model runs

    @classmethod
    def load(cls, payload: bytes, meta: dict[str, Any]) -> Any:
        """A stored model from the bytes ``serialize`` made."""
        return pickle.loads(payload)  # noqa: S301 - the model's own trusted payload

    @classmethod
    def predict_loaded(cls, model: Any, features: pd.DataFrame, meta: dict[str, Any]
                       ) -> np.ndarray:
        """A loaded model's values for ``prepare_features``' frame of the rows asked."""
        raise NotImplementedError(f"kind {cls.name!r} does not implement predict_loaded")

    # -- the training half

    @classmethod
    def check_config(cls, candidate: Any) -> None:
        """Raise ValueError when the candidate lacks a key this kind needs (run while the
        job config is parsed)."""

    def check(self) -> None:
        """Before any cluster starts: raise ConfigError for what cannot work (a missing
        import, an invalid parameter)."""

    def warm_up(self) -> None:
        """Import the library and user code, so a fresh worker's imports are not timed as
        a fit."""

    def serialize(self, model: Any) -> bytes:
        """The fitted model as bytes that ``load`` reads."""
        return pickle.dumps(model, protocol=5)


class ModelKind(StoredKind):
    """One model library as raybricks uses it for tables (rows of features, a target).

    Subclass it, set ``name`` and ``library``, and override what differs from the
    defaults (which suit any scikit-learn-style estimator that pickles). Stored half
    (class methods, no raybricks needed): ``load``, ``predict_loaded``, ``model_input``.
    Training half (an instance per candidate: ``self.candidate`` is its config):
    ``check``, ``warm_up``, ``fit``, ``predict``, ``serialize``; and, with
    ``data_parallel = True``, ``native_params``, ``ray_trainer``, ``fit_shard`` and
    ``fit_reporting`` for segments too large for one task.
    """

    #: Whether the kind trains data-parallel with Ray Train (the four methods below).
    data_parallel: ClassVar[bool] = False
    #: What the library's fit and predict take, made from ``prepare_features``' frame:
    #: ``frame_input`` (as it is) or ``filled_input`` (medians filled), or your own.
    model_input: ClassVar[Callable[[pd.DataFrame, dict], Any]] = staticmethod(frame_input)
    #: Parameters that fit the library for absolute error (LightGBM's ``objective: l1``):
    #: added to a regression candidate whose validation metric is an absolute error
    #: (mae) and whose params and search set none of them. Empty: left as given.
    absolute_error: ClassVar[dict[str, Any]] = {}

    @classmethod
    def predict_loaded(cls, model: Any, features: pd.DataFrame, meta: dict[str, Any]
                       ) -> np.ndarray:
        """A loaded model's values, or class probabilities (one column, or one per class
        it was trained on) for ``prepare_features``' frame."""
        data = cls.model_input(features, meta)
        if meta["task"] in CLASSIFICATION:
            return np.asarray(model.predict_proba(data), dtype="float64")
        return np.asarray(model.predict(data), dtype="float64")

    def fit(self, params: dict[str, Any], X: Any, y: np.ndarray, task: str, seed: int,
            threads: int, meta: dict[str, Any]) -> Any:
        """A model fitted on ``X`` (``model_input`` of the training rows) and ``y``
        (values, or class codes 0..k-1), with ``threads`` threads."""
        raise NotImplementedError(f"kind {self.name!r} does not implement fit")

    def device_params(self, device: str) -> dict[str, Any]:
        """The parameters that make the library fit on ``device`` (``"cuda"``), added
        under the candidate's own params to every fit made in a Ray task that holds the
        candidate's GPUs (``resources.num_gpus``), and only there. The stored model must
        still load and predict on a CPU-only host. Default ``{}``: fits on the CPU."""
        return {}

    def predict(self, model: Any, X: Any, task: str) -> np.ndarray:
        """A fitted model's values, or (n, k) class probabilities, for ``X``."""
        if task in CLASSIFICATION:
            return np.asarray(model.predict_proba(X), dtype="float64")
        return np.asarray(model.predict(X), dtype="float64").reshape(-1)

    def row_predictor(self, model: Any, meta: dict[str, Any]
                      ) -> Callable[[np.ndarray], np.ndarray]:
        """A fitted regression model as a function of a few rows of numeric features
        (float64, ``meta["features"]`` in order, NaN for missing): what lag models'
        recursion calls for each series at each step, one row at a time. Override it
        where the library has a cheaper call for a few rows than ``predict`` (LightGBM's
        booster); it must give ``predict``'s values."""
        columns = meta["features"]
        return lambda rows: self.predict(
            model, self.model_input(pd.DataFrame(rows, columns=columns), meta), "regression")

    # -- data-parallel training (data_parallel = True)

    def native_params(self, params: dict[str, Any], task: str, n_classes: int
                      ) -> tuple[dict[str, Any], int]:
        """Scikit-learn style parameters -> the library's own, and the number of rounds."""
        raise NotImplementedError

    def ray_trainer(self) -> type:
        """Ray Train's trainer class that runs ``fit_shard`` on every worker."""
        raise NotImplementedError

    def fit_shard(self, features: pd.DataFrame, label: pd.Series, params: dict[str, Any],
                  rounds: int, init: bytes | None = None,
                  after_round: Callable[[Callable[[], bytes]], None] | None = None
                  ) -> bytes:
        """Inside a Ray Train worker: train on this worker's rows together with the other
        workers; the model's bytes (as ``serialize`` would make them).

        Optional, for checkpoints (a kind without them restarts a lost fit from round 0):
        ``init``, a model's bytes to continue boosting (``rounds`` more rounds);
        ``after_round(model)`` called after every round with a function returning the
        model's bytes so far."""
        raise NotImplementedError

    def fit_reporting(self, train: tuple[pd.DataFrame, pd.Series],
                      valid: tuple[pd.DataFrame, pd.Series], params: dict[str, Any],
                      rounds: int, task: str, report: Callable[[float], None]) -> None:
        """One single-worker fit that calls ``report(validation loss)`` after every
        round (a Ray Tune trial; the scheduler may stop it early)."""
        raise NotImplementedError
