"""The segmented model as an MLflow pyfunc ("models from code": the file
``raybricks/segmented_model.py`` itself, with the model directory of
``raybricks.packaging`` as its artifact and a copy of ``raybricks.kinds`` as its code):
its requirements, its signature, logging it.
``RegistryError`` is defined here, the lowest module of ``raybricks.tracking`` that
raises it."""

from __future__ import annotations

import importlib.metadata
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from raybricks import kinds, segmented_model
from raybricks.compat import log_model_location
from raybricks.errors import RaybricksError
from raybricks.packaging import Packaged
from raybricks.segmented_model import SegmentStore, prediction_type


class RegistryError(RaybricksError):
    """Tracking or registration failed; nothing half-registered was left behind."""


def model_requirements(libraries: Iterable[str]) -> list[str]:
    """Exactly what the pyfunc imports, at the versions it was trained with: MLflow, NumPy,
    pandas, PyArrow and the model ``libraries`` (the manifest's, as packaging recorded
    them). MLflow's version is the module's: a Databricks cluster has only the
    mlflow-skinny distribution."""
    import mlflow

    names = ["numpy", "pandas", "pyarrow", *sorted(libraries)]
    return [f"mlflow=={mlflow.__version__}"] + [
        f"{name}=={importlib.metadata.version(name)}" for name in names]


def signature_for(store: SegmentStore, example: pd.DataFrame):
    """Inputs: segment columns and features (types from the example; with integer
    features, every column ``Any``, see ``nullable_integers``); output: the prediction;
    params: ``probabilities``, ``intervals``."""
    from mlflow.models import ModelSignature, infer_signature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import AnyType

    columns = example[store.segment_by + store.features]
    integers = nullable_integers(columns, store.features)
    inferred = infer_signature(columns.astype({c: "float64" for c in integers})).inputs
    inputs = Schema([ColSpec(AnyType(), spec.name) if integers else spec
                     for spec in inferred.inputs])
    outputs = Schema([ColSpec(prediction_type(store.manifest), "prediction")])
    params = ParamSchema([ParamSpec("probabilities", "boolean", False),
                          ParamSpec("intervals", "boolean", False)])
    return ModelSignature(inputs, outputs, params)


def nullable_integers(example: pd.DataFrame, features: list[str]) -> list[str]:
    """The integer features, declared ``Any`` in the signature: MLflow refuses nulls in a
    ``long`` column (pandas holds them as float64 or ``Int64``) and refuses int64 in a
    ``double`` one, so no one type lets consumers send both; the model reads any number
    (missing as NaN) itself. Then every column is ``Any``: MLflow 2.x (DBR 15.4's 2.19)
    rebuilds an ``Any`` column with a new index and a typed one with the input's, so a
    frame whose index is not 0..n-1 (a filtered frame) came back with rows doubled; the
    model checks the columns and key types itself (``missing_columns``,
    ``segment_keys``)."""
    return [c for c in features if pd.api.types.is_integer_dtype(example[c].dtype)]


def log_segmented_model(packaged: Packaged, example: pd.DataFrame | None, name: str):
    """Log the directory as the pyfunc (models from code); returns MLflow's ModelInfo."""
    import mlflow

    store = SegmentStore(packaged.directory)
    if example is None or example.empty:
        raise RegistryError("no input example: the training result has no rows to show")
    stored = packaged.manifest["kinds"]
    extra = [r for kind in stored for r in kinds.resolve(kind).requirements]
    with tempfile.TemporaryDirectory(prefix="raybricks-code-") as code:
        return mlflow.pyfunc.log_model(
            **log_model_location(name),
            python_model=segmented_model.__file__,
            code_paths=kinds.ship(stored, Path(code)),
            artifacts={"segments": str(packaged.directory)},
            signature=signature_for(store, example),
            input_example=example[store.segment_by + store.features],
            pip_requirements=model_requirements(packaged.manifest["libraries"]) + extra,
            model_config={"cache_segments": segmented_model.DEFAULT_CACHE_SEGMENTS},
        )
