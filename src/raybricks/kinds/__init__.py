"""Model kinds: the protocol (``ModelKind``) and one module per library.

``kind:`` in a job config names a built-in kind below, or a user's ``ModelKind`` subclass
by import path (``mypkg.kinds.MyKind``). ``resolve`` is the one place a kind's name is
looked up; nothing else in raybricks compares kind names.

This package is also shipped with every registered model (as ``raybricks_kinds``): it
must import without the rest of raybricks.
"""

from __future__ import annotations

import functools
import importlib
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import lags, pretrained
from .base import (
    CLASSIFICATION,
    ModelKind,
    StoredKind,
    did_you_mean,
    filled_input,
    frame_input,
    import_object,
    prepare_features,
    to_float,
)
from .forecasting import ForecastKind

#: Built-in kinds: name -> "module:Class" in this package. One line per kind.
BUILTIN = {
    "lightgbm": "lightgbm:LightGBMKind",
    "xgboost": "xgboost:XGBoostKind",
    "sklearn": "sklearn:SklearnKind",
    "function": "function:FunctionKind",
    "catboost": "catboost:CatBoostKind",
    "baseline": "baseline:BaselineKind",
    "global": "pooled:GlobalKind",
    "statsforecast": "statsforecast:StatsForecastKind",
    "prophet": "prophet:ProphetKind",
    "chronos": "pretrained:ChronosKind",
    "timesfm": "pretrained:TimesFMKind",
}


def _import_builtin(entry: str) -> type[ModelKind]:
    module, _, attribute = entry.partition(":")
    return getattr(importlib.import_module(f".{module}", __name__), attribute)


# imported with the package (the modules import their libraries only when used): a
# registered model's copy of this package may be gone from disk by the time it predicts
_BUILTIN_CLASSES = {name: _import_builtin(entry) for name, entry in BUILTIN.items()}


@functools.cache
def resolve(kind: str) -> type[StoredKind]:
    """The class of a built-in kind by name, or of a user's kind by import path."""
    if kind in _BUILTIN_CLASSES:
        return _BUILTIN_CLASSES[kind]
    if kind.startswith(lags.PREFIX):  # a table kind forecasting on lags
        return lags.LagsKind.for_regressor(resolve(kind[len(lags.PREFIX):]))
    if "." not in kind:
        raise ValueError(
            f"kind {kind!r} is unknown; allowed: {list(BUILTIN)} or the import path of a "
            "ModelKind subclass (mypkg.kinds.MyKind)")
    found = import_object(kind)
    if not (isinstance(found, type) and hasattr(found, "load")
            and hasattr(found, "predict_loaded")):
        raise ValueError(f"kind {kind!r} is not a ModelKind subclass ({found!r})")
    if not found.name:  # stored members name their kind: its import path finds it again
        found.name = kind
    return found


def forecaster_kind(kind: str) -> type[ForecastKind]:
    """The kind that forecasts for a candidate of ``kind`` (task forecast): a forecasting
    kind itself, else the table kind fitted on lags (``lags:<kind>``)."""
    found = resolve(kind)
    if issubclass(found, ForecastKind):
        return found
    if found.uses_fallback:
        raise ValueError(f"kind {kind!r} cannot forecast: use lightgbm, xgboost, sklearn, "
                         "catboost, statsforecast, prophet, chronos, timesfm or your own "
                         "kind")
    return resolve(lags.PREFIX + kind)


def forecaster(candidate: Any) -> ForecastKind:
    """The forecasting kind of a candidate of task forecast, ready to fit series."""
    return forecaster_kind(candidate.kind)(candidate)


def of(candidate: Any) -> ModelKind:
    """The table kind of a candidate (its config), ready to check, fit and serialize
    (task forecast: ``forecaster``)."""
    return resolve(candidate.kind)(candidate)


#: The name of this package's copy inside a registered model.
SHIPPED_NAME = "raybricks_kinds"


def ship(stored: Iterable[str], directory: Path) -> list[str]:
    """What the registered model needs beside its code to load members of the ``stored``
    kinds, copied under ``directory``: this package (as ``raybricks_kinds``) and the module
    of each user's kind whose ``shipped`` is true (with its packages' ``__init__``
    files). Returns the paths to hand MLflow as ``code_paths``."""
    directory = Path(directory)
    here = Path(__file__).parent
    shutil.copytree(here, directory / SHIPPED_NAME,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    paths = {str(directory / SHIPPED_NAME)}
    for name in sorted(set(stored)):
        kind = resolve(name)
        kind = getattr(kind, "regressor", kind)  # lags:<kind>: the table kind's module
        if kind.__module__.startswith(f"{__name__}.") or not kind.shipped:
            continue
        module = sys.modules[kind.__module__]
        parts = kind.__module__.split(".")
        target = directory / "user" / Path(*parts[:-1])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(module.__file__, target / f"{parts[-1]}.py")
        for depth in range(1, len(parts)):  # the packages' __init__ files, empty if absent
            package = sys.modules[".".join(parts[:depth])]
            init = directory / "user" / Path(*parts[:depth]) / "__init__.py"
            if package.__file__:
                shutil.copy(package.__file__, init)
            else:
                init.touch()
        paths.add(str(directory / "user" / parts[0]) + ("" if len(parts) > 1 else ".py"))
    return sorted(paths)


__all__ = [
    "BUILTIN", "CLASSIFICATION", "ForecastKind", "ModelKind", "filled_input", "forecaster",
    "did_you_mean", "forecaster_kind", "frame_input", "import_object", "of",
    "prepare_features", "resolve",
    "pretrained", "ship", "StoredKind", "to_float",
]
