"""What differs between the dependency versions raybricks supports, in one place.

raybricks runs on the packages Databricks Runtime ML ships (15.4 LTS: pydantic 1.10,
Ray 2.37, Spark 3.5, threadpoolctl 2.2, ...) and on the newest releases. Each difference
between those versions is bridged here, under a name that says what it does, so the rest
of the code is written once against one API. (``segmented_model`` bridges its own: the
registered model never imports raybricks.)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pydantic

PYDANTIC_V1 = pydantic.VERSION.startswith("1.")

# --------------------------------------------------------------------------- pydantic
# The config is written against pydantic 2's API. On pydantic 1.10 (DBR 15.4 ML) the same
# classes are built with 1.10's equivalents, and StrictModel offers the 2.x methods the
# code and notebooks use (model_dump, model_validate, model_copy, model_fields_set).

if PYDANTIC_V1:

    class StrictModel(pydantic.BaseModel):
        """A config section: unknown keys are rejected, values validated on assignment."""

        class Config:
            extra = "forbid"
            validate_assignment = True

        @classmethod
        def model_validate(cls, data: Any) -> Any:
            return cls.parse_obj(data)

        def model_dump(self, mode: str = "python", **options: Any) -> dict[str, Any]:
            return json.loads(self.json(**options)) if mode == "json" else self.dict(**options)

        def model_copy(self, update: dict[str, Any] | None = None) -> Any:
            return self.copy(update=update)

        @property
        def model_fields_set(self) -> set[str]:
            return set(self.__fields_set__)

    def after_validator(check: Callable) -> Any:
        """``check(self) -> self`` run once the fields are valid."""

        def run(cls: type, values: dict[str, Any]) -> dict[str, Any]:
            check(_FieldView(values))
            return values

        return pydantic.root_validator(skip_on_failure=True, allow_reuse=True)(run)

    def before_validator(*fields: str) -> Callable:
        """``convert(cls, value) -> value`` run on each of the fields' raw input."""
        return lambda convert: pydantic.validator(*fields, pre=True, allow_reuse=True)(convert)

    def before_model(convert: Callable) -> Any:
        """``convert(cls, data) -> data`` run on a model's raw input."""
        return pydantic.root_validator(pre=True, allow_reuse=True)(convert)

    def non_empty(**constraints: Any) -> Any:
        """A list field that needs at least one item."""
        return pydantic.Field(min_items=1, **constraints)

    class _FieldView:
        """Attribute access to a model's validated values (pydantic 1 validates dicts)."""

        def __init__(self, values: dict[str, Any]) -> None:
            self.__dict__.update(values)

else:

    class StrictModel(pydantic.BaseModel):
        """A config section: unknown keys are rejected, values validated on assignment."""

        model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)

    def after_validator(check: Callable) -> Any:
        """``check(self) -> self`` run once the fields are valid."""
        return pydantic.model_validator(mode="after")(check)

    def before_validator(*fields: str) -> Callable:
        """``convert(cls, value) -> value`` run on each of the fields' raw input."""
        return lambda convert: pydantic.field_validator(*fields, mode="before")(
            classmethod(convert))

    def before_model(convert: Callable) -> Any:
        """``convert(cls, data) -> data`` run on a model's raw input."""
        return pydantic.model_validator(mode="before")(classmethod(convert))

    def non_empty(**constraints: Any) -> Any:
        """A list field that needs at least one item."""
        return pydantic.Field(min_length=1, **constraints)


def validation_problems(exc: pydantic.ValidationError, data: Any, model: type | None = None
                        ) -> list[tuple[str, str, Any]]:
    """(key path, message, offending value or None) per problem, for both pydantic majors;
    an unknown key with the closest key ``model`` takes there."""
    from raybricks.kinds.base import did_you_mean

    problems = []
    for error in exc.errors():
        loc = [part for part in error["loc"] if part != "__root__"]
        kind = error["type"]
        if kind in ("extra_forbidden", "value_error.extra"):
            hint = did_you_mean(str(loc[-1]), known_keys(model, loc[:-1]), n=1) \
                if loc and model else ""
            message = (f"unknown key ({hint or 'check the spelling; see the config reference'})")
        else:
            message = error["msg"].removeprefix("Value error, ")
        value = None if kind in ("missing", "value_error.missing") else error.get(
            "input", _value_at(data, loc))
        problems.append((".".join(str(part) for part in loc), message, value))
    return problems


def known_keys(model: type, path: list) -> list[str]:
    """The keys the config model ``model`` takes at ``path`` (its sections' and lists'
    models followed); none where the path leaves the models."""
    import typing

    for part in path:
        if isinstance(part, int):
            continue  # an item of a list: its model is the list's
        fields = (model.__fields__ if PYDANTIC_V1 else model.model_fields)
        if part not in fields:
            return []
        field = fields[part]
        annotation = field.type_ if PYDANTIC_V1 else field.annotation  # v1: the items
        inner = [annotation]
        while inner and not (isinstance(inner[0], type)
                             and issubclass(inner[0], pydantic.BaseModel)):
            inner = [*inner[1:], *typing.get_args(inner[0])]
        if not inner:
            return []
        model = inner[0]
    return list(model.__fields__ if PYDANTIC_V1 else model.model_fields)


def _value_at(data: Any, loc: list) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


# --------------------------------------------------------------------------- Ray
# Ray 2.37 (every supported runtime) has the per-worker-loop XGBoost / LightGBM trainers
# under ``.v2`` and Tune trials report through ``ray.train``; newer Ray moved both.


def boosting_trainer(library: str, name: str) -> type:
    """Ray Train's data-parallel trainer ``name`` of ``ray.train.<library>`` that runs a
    per-worker training loop."""
    import importlib

    for module in (f"ray.train.{library}", f"ray.train.{library}.v2"):  # newest first
        try:
            trainer = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if "train_loop_per_worker" in _parameters(trainer):
            return trainer
    raise ImportError(f"this Ray has no per-worker-loop {name}: raybricks needs Ray >= 2.37")


def train_scaling(**options: Any) -> Any:
    """Ray Train's ``ScalingConfig`` whose coordinator holds no CPU.

    Ray 2.37's trainer reserves a CPU for its coordinator beside the workers' (two workers
    on a two-CPU cluster then wait forever); newer Ray's coordinator needs none and refuses
    ``trainer_resources``.
    """
    import ray.train

    try:
        return ray.train.ScalingConfig(trainer_resources={"CPU": 0}, **options)
    except DeprecationWarning:
        return ray.train.ScalingConfig(**options)


def lightgbm_network_params() -> dict[str, Any]:
    """LightGBM's network settings for this Ray Train worker."""
    try:
        from ray.train.lightgbm import get_network_params
    except ImportError:  # Ray 2.37
        from ray.train.lightgbm.v2 import get_network_params
    return get_network_params()


def tune_report(metrics: dict[str, Any]) -> None:
    """Report a Tune trial's intermediate result."""
    from ray import tune

    report = getattr(tune, "report", None)
    if report is None:  # Ray 2.37: trials report through ray.train
        import ray.train

        report = ray.train.report
    report(metrics)


def tune_run_config(max_failures: int = 0, **options: Any) -> Any:
    """A ``RunConfig`` for ``tune.Tuner`` (``ray.tune.RunConfig``, or Ray 2.37's train one)
    whose trials are retried ``max_failures`` times (newer Ray wants Tune's own
    ``FailureConfig`` there, which Ray 2.37 does not have)."""
    import ray.train
    from ray import tune

    run_config = getattr(tune, "RunConfig", ray.train.RunConfig)
    failure_config = getattr(tune, "FailureConfig", ray.train.FailureConfig)
    return run_config(failure_config=failure_config(max_failures=max_failures), **options)


# --------------------------------------------------------------------------- Spark


def arrow_schema(spark_schema: Any) -> Any:
    """The Arrow schema of a Spark schema, timestamps in UTC (Spark 3.5 and 4.0 do that by
    default; newer Spark asks for the time zone)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if "timezone" in _parameters(to_arrow_schema):
        return to_arrow_schema(spark_schema, timezone="UTC")
    return to_arrow_schema(spark_schema)


# --------------------------------------------------------------------------- threadpoolctl


def thread_limiter() -> Callable[[int], Any]:
    """``limit(n)``: a context manager capping BLAS/OpenMP threads at ``n``.

    threadpoolctl 3 scans the loaded libraries once (``ThreadpoolController``); 2.2 (DBR
    15.4 and 16.4 ML) has only ``threadpool_limits``, which scans on every call.
    """
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        from threadpoolctl import threadpool_limits

        return lambda threads: threadpool_limits(limits=threads)
    controller = ThreadpoolController()
    return lambda threads: controller.limit(limits=threads)


def _parameters(function: Callable) -> set[str]:
    import inspect

    return set(inspect.signature(function).parameters)


# --------------------------------------------------------------------------- MLflow
# MLflow 3 names a logged model (``name=``) and registers it by model id; MLflow 2.x (DBR
# 15.4 and 16.4 ML) logs it at an ``artifact_path`` of the run and registers that.


def log_model_location(name: str) -> dict[str, str]:
    """The keyword that names a model in ``mlflow.pyfunc.log_model``."""
    import mlflow.pyfunc

    keyword = "name" if "name" in _parameters(mlflow.pyfunc.log_model) else "artifact_path"
    return {keyword: name}


def model_version_source(model_uri: str) -> dict[str, str]:
    """Keywords for ``MlflowClient.create_model_version`` beyond the source: MLflow 3's
    ``model_id`` for a logged model's ``models:/m-...`` URI."""
    from mlflow import MlflowClient

    if model_uri.startswith("models:/m-") and "model_id" in _parameters(
            MlflowClient.create_model_version):
        return {"model_id": model_uri.removeprefix("models:/")}
    return {}


def log_run_metrics(metrics: dict[str, float]) -> None:
    """Log metrics on the active run itself.

    MLflow 3.0's fluent ``log_metrics`` writes a metric once per model logged in the run,
    with the same key, time and value; with two models in a run (a merge promotion) the
    SQL store's unique index refuses the second row. The client call links no models.
    """
    import time

    import mlflow
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    mlflow.MlflowClient().log_batch(
        mlflow.active_run().info.run_id,
        metrics=[Metric(key, float(value), now, 0) for key, value in metrics.items()])


@contextlib.contextmanager
def resumed_run(run_id: str) -> Iterator[Any]:
    """``mlflow.start_run(run_id=...)`` of an existing run whatever experiment the caller
    made active with ``mlflow.set_experiment`` (a notebook's, another job's): MLflow 2
    and 3 refuse to resume a run of any other experiment ("active experiment ID does not
    match environment run ID"). The caller's active experiment, which MLflow keeps in
    ``mlflow.tracking.fluent._active_experiment_id``, is as it was afterwards."""
    import mlflow
    from mlflow.tracking import fluent

    active = getattr(fluent, "_active_experiment_id", None)
    fluent._active_experiment_id = None
    try:
        with mlflow.start_run(run_id=run_id) as run:
            yield run
    finally:
        fluent._active_experiment_id = active
