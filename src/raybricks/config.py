"""Typed configuration, validated before any Spark or Ray work starts.

Unknown keys are errors. ``ClusterConfig`` describes where Ray runs; the job config of the
training stage builds on it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from datetime import date
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ByteSize, Field, PositiveInt, ValidationError

from raybricks.compat import (
    StrictModel,
    after_validator,
    before_model,
    before_validator,
    non_empty,
    validation_problems,
)
from raybricks.errors import ConfigError
from raybricks.files import check_template, is_template, key_names
from raybricks.metrics import DEFAULT_METRIC, METRICS

ClusterMode = Literal["auto", "spark", "address", "local"]


class ClusterConfig(StrictModel):
    """Where and how big the Ray cluster is.

    ``mode``: ``spark`` starts Ray on the Spark cluster's workers
    (``ray.util.spark.setup_ray_cluster``); ``address`` connects to a running Ray;
    ``local`` starts a plain single-machine Ray for quick development; ``auto`` picks
    ``address`` when an address is given (or ``RAY_ADDRESS`` is set), else ``spark``.
    Sizes left empty are derived from the Spark cluster. Memory sizes take bytes or
    strings such as ``"4GiB"``.
    """

    mode: ClusterMode = "auto"
    address: str | None = None
    max_worker_nodes: PositiveInt | None = None
    min_worker_nodes: int | None = Field(default=None, ge=0)
    num_cpus_worker_node: PositiveInt | None = None
    num_gpus_worker_node: int | None = Field(default=None, ge=0)
    memory_worker_node: ByteSize | None = None
    object_store_memory_worker_node: ByteSize | None = None
    num_cpus_head_node: int | None = Field(default=None, ge=0)
    num_gpus_head_node: int | None = Field(default=None, ge=0)
    memory_head_node: ByteSize | None = None
    object_store_memory_head_node: ByteSize | None = None
    num_cpus: PositiveInt | None = None
    temp_dir: str | None = None
    log_dir: str | None = None
    dashboard_host: str = "127.0.0.1"
    forward_env: list[str] = Field(default_factory=list)

    @after_validator
    def _check_consistency(self) -> ClusterConfig:
        if (
            self.min_worker_nodes is not None
            and self.max_worker_nodes is not None
            and self.min_worker_nodes > self.max_worker_nodes
        ):
            raise ValueError(
                f"cluster.min_worker_nodes={self.min_worker_nodes} is above "
                f"cluster.max_worker_nodes={self.max_worker_nodes}: make min <= max"
            )
        if self.mode == "address" and not self.address:
            raise ValueError(
                "cluster.mode=address needs cluster.address (e.g. 'ray://host:10001' or "
                "'host:6379')"
            )
        return self


class SparkConfig(StrictModel):
    """The Spark session raybricks starts when none is active (on Databricks the
    notebook's or job's session is used and these keys are ignored).

    ``master``: e.g. ``spark://host:7077``, ``yarn``, ``local-cluster[2,2,2048]``; empty:
    ``SPARK_MASTER``, ``PYSPARK_SUBMIT_ARGS``' ``--master``, spark-defaults.conf's
    ``spark.master``, else ``local[N]``. ``conf``: more Spark settings.
    """

    master: str | None = None
    conf: dict[str, str] = Field(default_factory=dict)


# --------------------------------------------------------------------------- job config

Task = Literal["regression", "binary", "multiclass", "forecast"]


#: Names of the members that per-segment selection adds beside the candidates.
RESERVED_NAMES = ("baseline", "global")
#: Task forecast blends the candidates whose backtest error is within 10% of the best's
#: (measured on two public datasets: docs/forecasting.md).
FORECAST_WITHIN = 0.1


class SourceConfig(StrictModel):
    """Where the training rows come from: a table name or a path, and a row filter. A path
    with ``{name}`` parts reads every matching file, each file's ``name`` key cut from its
    path (``raybricks.files``)."""

    table: str | None = None
    path: str | None = None
    format: Literal["parquet", "csv", "delta"] = "parquet"
    where: str | None = None
    #: a table or path of segment keys (its segment columns): only those segments of the
    #: source are trained, and the registered version keeps the champion's others
    segments: str | None = None
    #: with ``segments`` naming a monitoring table (``raybricks monitor --output``) or
    #: its MLflow run: only the segments whose latest status is one of these train
    statuses: list[Literal["ok", "degraded", "drifted", "new", "silent"]] | None = None

    @after_validator
    def _one_location(self) -> SourceConfig:
        if bool(self.table) == bool(self.path):
            raise ValueError("source needs exactly one of source.table or source.path")
        if self.statuses is not None and (self.segments is None or not self.statuses):
            raise ValueError("source.statuses picks segments of a monitoring table or run: "
                             "set source.segments to it (raybricks train "
                             "--segments-from-monitor RUN_OR_TABLE), and at least one status")
        if is_template(self.path):
            check_template(str(self.path), self.format)
        return self


class ValidationConfig(StrictModel):
    """How each segment is validated: random holdout, time-ordered holdout, k-fold, or
    (task forecast) a rolling-origin backtest of ``windows`` forecasts of the horizon,
    their origins ``step`` periods apart (default: the horizon)."""

    method: Literal["holdout", "time", "kfold", "backtest"] | None = None
    fraction: float = Field(default=0.2, gt=0, lt=1)
    folds: int = Field(default=3, ge=2, le=20)
    windows: int = Field(default=3, ge=1, le=100)
    step: PositiveInt | None = None
    metric: str | None = None


#: Date features of ``forecast.date_features`` (attributes of a pandas DatetimeIndex).
DATE_FEATURES = ("year", "quarter", "month", "week", "day", "dayofweek", "dayofyear",
                 "hour", "minute", "is_month_start", "is_month_end", "is_quarter_start",
                 "is_quarter_end", "is_year_start", "is_year_end")


def daily_or_finer(frequency: int | str) -> bool:
    """Whether ``frequency`` is of dates one day apart or less (D, B, h, ...)."""
    if not isinstance(frequency, str):
        return False
    import pandas as pd

    monday = pd.Timestamp("2024-01-01")
    return monday + pd.tseries.frequencies.to_offset(frequency) - monday <= pd.Timedelta(days=1)


class HolidaysConfig(StrictModel):
    """Holidays of ``forecast.holidays``: a ``country`` of the ``holidays`` package (US,
    GB, DE, ...) with an optional ``subdivision`` (a state or province), and/or extra
    ``dates`` (a sale, a strike). In each series' history, the periods from ``before``
    days before each holiday to ``after`` days after it are replaced by the same weekday
    and time of the nearest weeks around them, so that no model learns its weekly pattern
    or level from a holiday week; a future holiday is forecast as an ordinary day.
    """

    country: str | None = None
    subdivision: str | None = None
    dates: list[date] = Field(default_factory=list)
    before: int = Field(default=3, ge=0)
    after: int = Field(default=3, ge=0)

    @after_validator
    def _check(self) -> HolidaysConfig:
        if self.country is None and not self.dates:
            raise ValueError("forecast.holidays names no holidays: give a country (US, GB, "
                             "...) of the holidays package, or dates")
        if self.subdivision is not None and self.country is None:
            raise ValueError("forecast.holidays.subdivision needs a country")
        if self.country is not None:
            try:
                import holidays
            except ImportError:
                raise ValueError("forecast.holidays.country needs the holidays package: pip "
                                 "install 'raybricks[forecast]'") from None
            try:
                holidays.country_holidays(self.country, subdiv=self.subdivision)
            except NotImplementedError as error:
                raise ValueError(f"{error}: use a country code (and subdivision) of "
                                 "holidays.list_supported_countries()") from None
        return self


class HierarchyConfig(StrictModel):
    """``forecast.hierarchy``: the aggregate levels above the series (the segments), and
    how their forecasts are made to add up.

    ``levels``: each a list of columns whose values name an aggregate series, the sum of
    the segments' series sharing them (``[[region], [region, store]]``: a strict
    hierarchy; ``[[region], [family], [region, family]]``: grouped levels that cross).
    A column may be a segment column or another column with one value per segment (its
    region). A list of column names is shorthand for the strict chain from the top
    (``[region, store]`` = ``[[region], [region, store]]``). ``total``: also forecast
    the sum of every series. Every level is trained like the segments (same candidates,
    same selection, its own result row), then each forecast is reconciled with
    ``method``: ``bottom_up``, ``top_down`` (forecast proportions), ``middle_out`` (at
    ``middle_level``, a level's columns joined by ``/``), ``min_trace_ols``,
    ``min_trace_wls_struct`` or ``min_trace_shrink`` (MinTrace with the shrunk
    covariance of the backtest errors).
    """

    levels: list[list[str]]
    total: bool = True
    method: Literal["bottom_up", "top_down", "middle_out", "min_trace_ols",
                    "min_trace_wls_struct", "min_trace_shrink"] = "min_trace_shrink"
    middle_level: str | None = None
    #: set by training, not by users: the job's own segment columns (the bottom level),
    #: once ``segment_by`` names every level's series (``level`` and every key column)
    segments: list[str] | None = None

    @after_validator
    def _check(self) -> HierarchyConfig:
        if not self.levels or any(not level for level in self.levels):
            raise ValueError("forecast.hierarchy.levels is empty or has an empty level: "
                             "list each aggregate level's columns, e.g. [[region], "
                             "[region, store]]")
        names = [level_name(level) for level in self.levels]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"forecast.hierarchy.levels lists {repeated} more than once")
        strict = self.method in ("top_down", "middle_out")
        if strict and not is_chain(self.levels):
            raise ValueError(f"forecast.hierarchy.method {self.method} needs a strict "
                             "hierarchy (each level adds columns to the one above it, "
                             "e.g. [[region], [region, store]]); with grouped levels use "
                             "bottom_up or a min_trace method")
        if self.method == "middle_out" and self.middle_level not in names:
            raise ValueError(f"forecast.hierarchy.method middle_out needs middle_level, one "
                             f"of the levels {names}")
        if self.method != "middle_out" and self.middle_level is not None:
            raise ValueError("forecast.hierarchy.middle_level is for method middle_out")
        return self


def level_name(columns: list[str]) -> str:
    """An aggregate level's name in the ``level`` column: its columns joined by ``/``."""
    return "/".join(columns)


def is_chain(levels: list[list[str]]) -> bool:
    """The levels are a strict hierarchy: each adds columns to the one before it."""
    return all(len(b) > len(a) and b[:len(a)] == a for a, b in zip(levels, levels[1:],
                                                                  strict=False))


def one_column(value: object) -> object:
    """A list of columns given as one name (``segment_by: store``): that one."""
    return [value] if isinstance(value, str) else value


class ForecastConfig(StrictModel):
    """Task forecast: what each series is forecast with.

    ``frequency``: a pandas offset alias of the time column (D, W, MS, H, ...), or an
    integer step for an integer time column. ``lags``, ``rolling`` (statistic -> windows,
    over the target lagged by ``rolling_lag``) and ``date_features`` are the features of
    the lag-model candidates (LightGBM, XGBoost, scikit-learn, CatBoost), which forecast
    recursively; ``transform`` applies to their target. ``exogenous``: columns known in
    the future (forecasts need their future values); ``gaps``: what a missing date, or an
    empty target, between a series' first and last values does (skip the series, or
    fill the target with zero or the previous value; empty periods before the first
    value and after the last are dropped); ``duplicates``: what a date with several rows
    in a series does (``sum``: their targets added, the default; ``mean``; ``last``: the
    last row's; ``skip`` the series);
    ``intervals``: levels (percent) of conformal prediction intervals, from the backtest's
    errors of each series' ensemble; ``strategy``: how lag models reach the horizon
    (``recursive``: one model, each forecast feeding the next step's lags; ``direct``:
    mlforecast's one model per step, forecasts up to the horizon only). ``static``:
    columns describing a series as a whole (store type, region; numbers or strings),
    features of the global model (``fallback: global``), which learns across series.
    ``holidays``: days taken out of each series' history (``HolidaysConfig``; a country
    code alone is shorthand for ``{country: ...}``). ``hierarchy``: aggregate levels
    forecast beside the series and reconciled with them (``HierarchyConfig``).
    ``output``: a table name or path; once the job has logged its model, every series'
    next ``horizon`` periods are written there in the same job, as ``raybricks forecast``
    writes them (with the interval bounds when trained with ``intervals``).
    """

    horizon: PositiveInt
    frequency: PositiveInt | str
    season_length: PositiveInt | None = None
    lags: list[PositiveInt] | None = None
    rolling: dict[Literal["mean", "std", "min", "max"], list[PositiveInt]] = Field(
        default_factory=dict)
    rolling_lag: PositiveInt = 1
    date_features: list[str] = Field(default_factory=list)
    exogenous: list[str] = Field(default_factory=list)
    static: list[str] = Field(default_factory=list)
    transform: Literal["none", "difference", "log1p", "standardize"] = "none"
    gaps: Literal["skip", "zero", "forward"] = "skip"
    duplicates: Literal["skip", "sum", "mean", "last"] = "sum"
    intervals: list[float] = Field(default_factory=list)
    strategy: Literal["recursive", "direct"] = "recursive"
    holidays: HolidaysConfig | None = None
    hierarchy: HierarchyConfig | None = None
    output: str | None = None

    @before_validator("holidays")
    def _holidays_shorthand(cls, value: object) -> object:
        return {"country": value} if isinstance(value, str) else value

    @before_validator("exogenous", "static")
    def _one_column_shorthand(cls, value: object) -> object:
        return one_column(value)

    @before_validator("hierarchy")
    def _chain_shorthand(cls, value: object) -> object:
        if isinstance(value, list) and value and all(isinstance(c, str) for c in value):
            return {"levels": [value[:i + 1] for i in range(len(value))]}
        return {"levels": value} if isinstance(value, list) else value

    @after_validator
    def _check(self) -> ForecastConfig:
        outside = [level for level in self.intervals if not 0 < level < 100]
        if outside:
            raise ValueError(f"forecast.intervals {outside} are not levels between 0 and "
                             "100 (percent), such as [80, 95]")
        if isinstance(self.frequency, str):
            import pandas as pd

            try:
                pd.tseries.frequencies.to_offset(self.frequency)
            except ValueError:
                raise ValueError(
                    f"forecast.frequency={self.frequency!r} is not a pandas frequency: use "
                    "an offset alias (D, W, MS, h, ...) or an integer step") from None
        unknown = sorted(set(self.date_features) - set(DATE_FEATURES))
        if unknown:
            raise ValueError(f"forecast.date_features {unknown} unknown; allowed: "
                             f"{list(DATE_FEATURES)}")
        if self.date_features and not isinstance(self.frequency, str):
            raise ValueError("forecast.date_features need a date time column: an integer "
                             "frequency has no dates")
        if self.lags is not None and not self.lags:
            raise ValueError("forecast.lags is empty: list lags, or omit it for the default")
        if self.output is not None and self.exogenous:
            raise ValueError(
                f"forecast.output: a model with exogenous columns {self.exogenous} needs "
                "their future values to forecast; leave output out and score a table of "
                "the future rows with raybricks score")
        if self.output is not None and not self.output.strip():
            raise ValueError("forecast.output is empty: a table name or a path")
        if self.holidays is not None and not daily_or_finer(self.frequency):
            raise ValueError(f"forecast.holidays need a daily or finer frequency (D, B, h, "
                             f"...) of dates; frequency is {self.frequency!r}")
        return self

    @property
    def seasonality(self) -> int:
        """The season length: as configured, else from the frequency (1 when unknown)."""
        if self.season_length:
            return self.season_length
        if not isinstance(self.frequency, str):
            return 1
        import pandas as pd

        name = pd.tseries.frequencies.to_offset(self.frequency).name.upper()
        base = name.split("-")[0]
        for prefix, length in (("W", 52), ("QS", 4), ("Q", 4), ("MS", 12), ("ME", 12),
                               ("M", 12), ("D", 7), ("B", 5), ("H", 24)):
            if base.startswith(prefix):
                return length
        return 1

    @property
    def lag_list(self) -> list[int]:
        """The lags: as configured, else 1 to the season length (at most 14) and the
        season length."""
        if self.lags:
            return sorted(set(self.lags))
        season = self.seasonality
        return sorted({*range(1, min(season, 14) + 1), season})


class RangeSpace(StrictModel):
    """A numeric search range; ``log`` samples on a log scale, ``int`` rounds."""

    low: float
    high: float
    log: bool = False
    int: bool = False

    @after_validator
    def _ordered(self) -> RangeSpace:
        if not self.low < self.high:
            raise ValueError(f"search range low={self.low} must be below high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"a log search range needs low > 0, got low={self.low}")
        return self


class ResourcesConfig(StrictModel):
    """Ray resources for one fitting task of a candidate."""

    num_cpus: float = Field(default=1, gt=0)
    num_gpus: float = Field(default=0, ge=0)


class CandidateConfig(StrictModel):
    """One candidate model kind, fitted for every segment.

    ``kind``: lightgbm | xgboost | catboost | sklearn (``estimator``: import path of an
    estimator class or a factory returning one) | function (``function``: import path of
    ``fit(X, y, params) -> estimator with predict``) | the import path of a
    ``raybricks.kinds.ModelKind`` subclass. ``search`` maps a parameter to a
    list of values (grid) or a range; ``trials`` caps the number of sampled settings;
    ``search_method`` (grid | random | bayes) says how the space is searched (unset: the
    grid when the space is only lists and ``trials`` is unset, random draws otherwise).
    """

    name: str = Field(min_length=1)
    kind: str
    params: dict[str, object] = Field(default_factory=dict)
    search: dict[str, list | RangeSpace] = Field(default_factory=dict)
    trials: PositiveInt | None = None
    search_method: Literal["grid", "random", "bayes"] | None = None
    estimator: str | None = None
    function: str | None = None
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)

    @after_validator
    def _check(self) -> CandidateConfig:
        from raybricks import kinds

        try:
            kind = kinds.resolve(self.kind)
        except ValueError as exc:
            prefix = f"kind {self.kind!r} "
            reason = str(exc)
            reason = f" {reason[len(prefix):]}" if reason.startswith(prefix) else f": {reason}"
            raise ValueError(f"models[{self.name}].kind={self.kind!r}{reason}") from exc
        kind.check_config(self)
        for key, space in self.search.items():
            if isinstance(space, list) and not space:
                raise ValueError(
                    f"models[{self.name}].search.{key} is empty: give at least one value"
                )
        check_search_method(self)
        return self


def check_search_method(candidate: CandidateConfig) -> None:
    """``search_method`` against the space: grid needs lists only and no ``trials``; any
    method needs a ``search`` space; bayes needs optuna (the ``bayes`` extra)."""
    method, where = candidate.search_method, f"models[{candidate.name}]"
    if method is None:
        return
    if not candidate.search:
        raise ValueError(f"{where}.search_method={method} needs a search space: add "
                         "search (parameter: list of values or {low, high}), or drop "
                         "search_method")
    if method == "grid":
        ranges = sorted(k for k, v in candidate.search.items() if not isinstance(v, list))
        if ranges:
            raise ValueError(f"{where}.search_method=grid needs lists of values, but "
                             f"{ranges} are ranges: list the values, or use random or bayes")
        if candidate.trials is not None:
            raise ValueError(f"{where}.search_method=grid fits every combination: drop "
                             "trials, or use search_method random or bayes")
    if method == "bayes":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise ValueError(missing_optuna(candidate.name)) from None


def missing_optuna(name: str) -> str:
    """The error when a bayes search meets an environment without optuna."""
    return (f"models[{name}].search_method=bayes needs optuna, which is not installed: "
            "pip install raybricks[bayes] (on Databricks: %pip install raybricks[bayes]; "
            "Runtime ML 16.4 and 17.3 ship optuna, 15.4 does not)")


class EnsembleConfig(StrictModel):
    """How a segment's candidates become its model: the best one, the mean of the top
    ``top_k``, or a mean weighted by inverse validation error (default: ``weighted`` for
    task forecast, whose short backtests pick a winner noisily; ``best`` otherwise);
    members of a blend are those within ``within`` of the best."""

    method: Literal["best", "mean", "weighted"] | None = None
    top_k: PositiveInt = 3
    #: Blend only members whose validation error is at most this share above the best's
    #: (0.1: within 10%; a large value such as 100 keeps all ``top_k``). Default: 0.1 for
    #: task forecast (docs/forecasting.md); no limit for the other tasks.
    within: float | None = Field(default=None, ge=0)
    #: A blend or model with a local candidate replaces the reference (the global model,
    #: or the naive baseline where it beats the global model by the same rule) only when
    #: it beats it by more than this many standard errors of the paired loss differences
    #: on the validation rows (0: by any amount). Only where they compete
    #: (``selection: all``); docs/training.md.
    margin: float = Field(default=1.0, ge=0)
    #: The reference's share of the weight when a local model or blend replaces it (0:
    #: the winner alone, or a top-k blend as ranked, which may hold the global model at
    #: its rank's weight; 1: the reference alone). Default: 0.5 for the table tasks
    #: (validation wins are partly luck and partly a period that does not last;
    #: docs/training.md), 0 for task forecast, whose naive reference is weaker
    #: (docs/forecasting.md).
    shrink: float | None = Field(default=None, ge=0, le=1)


class TrainingConfig(StrictModel):
    """The engine's knobs: large-segment threshold, retries, resume, output location."""

    large_segment_rows: PositiveInt = 1_000_000
    large_segment_workers: PositiveInt = 2
    #: Ray Train restarts a large segment's workers this often after a lost worker (or an
    #: error in the fit), resuming from the last checkpoint; Tune trials are retried too.
    large_segment_max_failures: int = Field(default=2, ge=0)
    #: boosting rounds between a large segment's checkpoints (0: only the finished model)
    large_segment_checkpoint_rounds: int = Field(default=25, ge=0)
    max_retries: int = Field(default=3, ge=0)
    segment_timeout_s: float | None = Field(default=None, gt=0)
    #: Where the packed tasks run: ``ray`` (Ray on the Spark cluster), ``spark`` (Spark's
    #: own tasks: Spark Connect, serverless, small jobs) or ``auto`` (see
    #: ``raybricks.pipeline.choose_executor``).
    executor: Literal["auto", "ray", "spark"] = "auto"
    output_dir: str = ".raybricks/runs"
    run_id: str | None = None
    resume: bool = False
    progress: bool = True


class DataConfig(StrictModel):
    """How the Spark table moves to Ray (see ``raybricks.data``)."""

    strategy: Literal["auto", "chunks", "parquet", "arrow"] = "auto"
    max_block_rows: PositiveInt = 200_000
    staging_dir: str | None = None


class RegistryConfig(StrictModel):
    name: str = "raybricks_model"
    alias: str = "champion"
    promote: Literal["if_better", "always", "merge", "replace"] = "if_better"


class TrackingConfig(StrictModel):
    experiment: str = "raybricks"


def check_selection(config: JobConfig) -> None:
    """``source.segments``: a run of some segments registers a version that keeps the
    champion's others (``registry.promote: replace``, its default then, or ``merge``)."""
    registry = config.registry
    if registry.promote in ("if_better", "always"):
        if "promote" in registry.model_fields_set:
            raise ValueError(
                f"source.segments trains only the listed segments: registry.promote="
                f"{registry.promote} would make a version of those alone the champion; use "
                "replace (each retrained segment replaces the champion's; the default with "
                "source.segments) or merge (the better of the two per segment)")
        registry.promote = "replace"
    if not config.source.segments.strip():
        raise ValueError("source.segments is empty: a table name or a path")
    if config.forecast is not None and config.forecast.hierarchy is not None:
        raise ValueError("source.segments with forecast.hierarchy: the levels are "
                         "reconciled together, retrain the whole hierarchy")


class JobConfig(StrictModel):
    """A whole training job. See the README's config reference for every key."""

    source: SourceConfig
    segment_by: list[str] = non_empty()
    target: str
    features: list[str] | None = None
    time_column: str | None = None
    task: Task = "regression"
    forecast: ForecastConfig | None = None
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    models: list[CandidateConfig] = non_empty()
    ensemble: EnsembleConfig = Field(default_factory=EnsembleConfig)
    refit: bool = True
    min_rows: int = 30
    fallback: Literal["global", "none"] = "none"
    # a retrain of listed segments (source.segments): the champion's global model is
    # kept (the retrained segments compare and blend with it) or refitted on the whole
    # source; docs/operations.md
    global_model: Literal["keep", "refit"] = "keep"
    selection: Literal["all", "local_only"] = "all"  # task forecast: local_only
    global_segment_features: bool = False
    seed: int = 42
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    def gpu_candidates(self) -> dict[str, float]:
        """The GPUs a fitting task of each candidate that asks for some holds."""
        return {c.name: c.resources.num_gpus for c in self.models if c.resources.num_gpus > 0}

    @before_model
    def _forecast_defaults(cls, data: object) -> object:
        """Task forecast ranks the local candidates only unless told otherwise: the naive
        forecasts win short backtests far more often than they win the future
        (docs/benchmarks.md)."""
        if isinstance(data, dict) and data.get("task") == "forecast":
            return {"selection": "local_only"} | data
        return data

    @before_validator("ensemble")
    def _ensemble_shorthand(cls, value: object) -> object:
        return {"method": value} if isinstance(value, str) else value

    @before_validator("segment_by", "features")
    def _one_column_shorthand(cls, value: object) -> object:
        return one_column(value)

    @after_validator
    def _check(self) -> JobConfig:
        if self.min_rows < 2:
            raise ValueError(f"min_rows={self.min_rows} must be at least 2")
        metric = self.validation.metric or DEFAULT_METRIC[self.task]
        if metric not in METRICS:
            raise ValueError(
                f"validation.metric={metric!r} is unknown; allowed: {sorted(METRICS)}"
            )
        if not METRICS[metric].fits(self.task):
            fitting = sorted(name for name, m in METRICS.items() if m.fits(self.task))
            raise ValueError(
                f"validation.metric={metric!r} does not fit task={self.task!r}; use one of "
                f"{fitting}"
            )
        if self.validation.metric is None:
            self.validation.metric = metric
        if self.validation.method is None:
            self.validation.method = "backtest" if self.task == "forecast" else "holdout"
        if self.ensemble.method is None:
            self.ensemble.method = "weighted" if self.task == "forecast" else "best"
        if self.ensemble.within is None and self.task == "forecast":
            self.ensemble.within = FORECAST_WITHIN
        if (self.validation.method == "backtest") != (self.task == "forecast"):
            raise ValueError("validation.method=backtest is the validation of task forecast, "
                             "and task forecast validates by backtest only")
        if self.task == "forecast":
            check_forecast(self)
        elif self.forecast is not None:
            raise ValueError("a forecast section needs task: forecast")
        else:
            check_table_kinds(self)
        if self.features is not None:
            if not self.features:
                raise ValueError("features is empty: list features, or omit it for all")
            clash = {self.target} & set(self.features)
            if clash:
                raise ValueError(f"target {self.target!r} is listed among features: remove it")
            keys = set(self.segment_by) & set(self.features)
            if keys:
                raise ValueError(f"segment columns {sorted(keys)} are listed among features")
        if self.target in self.segment_by:
            raise ValueError(f"target {self.target!r} is also a segment column")
        if is_template(self.source.path) and self.target in key_names(str(self.source.path)):
            raise ValueError(f"target {self.target!r} is a {{key}} of source.path: the target "
                             "is a column of the files")
        if self.source.segments is not None:
            check_selection(self)
        if self.validation.method == "time" and not self.time_column:
            raise ValueError("validation.method=time needs time_column")
        names = [m.name for m in self.models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate candidate names in models: {duplicates}")
        reserved = sorted(set(names) & set(RESERVED_NAMES))
        if reserved:
            raise ValueError(f"candidate name(s) {reserved} are reserved for the naive baseline "
                             "and the global model: rename the candidate(s)")
        return self

    @property
    def metric(self) -> str:
        return self.validation.metric or DEFAULT_METRIC[self.task]

    def config_hash(self) -> str:
        """A short stable hash of the config (used to tag runs and versions)."""
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> JobConfig:
        """Read a YAML job config, apply ``key.sub=value`` overrides, validate it all."""
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {str(path)!r} not found") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys")
        return cls.from_dict(apply_overrides(data, overrides or []))

    @classmethod
    def from_dict(cls, data: dict) -> JobConfig:
        """Validate a dict, turning pydantic's errors into one ConfigError per problem."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, data, cls)) from None


def check_table_kinds(self: JobConfig) -> None:
    """Tasks regression, binary and multiclass train table kinds only: a series kind
    (``kinds.ForecastKind``: statsforecast, a user's) forecasts series."""
    from raybricks import kinds

    series = [model.name for model in self.models
              if issubclass(kinds.resolve(model.kind), kinds.ForecastKind)]
    if series:
        raise ValueError(f"candidate(s) {series} are of a kind that forecasts series: they "
                         f"need task: forecast (task {self.task} trains table kinds such as "
                         "lightgbm, xgboost, sklearn, catboost)")


def check_forecast(self: JobConfig) -> None:
    """The forecast section against the rest of a task forecast job."""
    from raybricks import kinds

    if self.forecast is None:
        raise ValueError("task forecast needs a forecast section: at least "
                         "forecast.horizon and forecast.frequency")
    if not self.time_column:
        raise ValueError("task forecast needs time_column: the date of each row")
    if self.features is not None:
        raise ValueError("task forecast builds its own features: list columns known in "
                         "the future under forecast.exogenous instead of features")
    for section in ("exogenous", "static"):
        listed = getattr(self.forecast, section)
        taken = {self.target, self.time_column, *self.segment_by} & set(listed)
        if taken:
            raise ValueError(f"forecast.{section} lists {sorted(taken)}, which are the "
                             "target, the time column or segment columns")
    both = set(self.forecast.exogenous) & set(self.forecast.static)
    if both:
        raise ValueError(f"{sorted(both)} are listed both as forecast.exogenous (values "
                         "change over time) and forecast.static (one value per series)")
    for model in self.models:
        kinds.forecaster_kind(model.kind).check_forecast_config(model, self.forecast)
    lag_models = [model for model in self.models
                  if issubclass(kinds.forecaster_kind(model.kind), kinds.lags.LagsKind)]
    if self.fallback == "global" and not lag_models:
        raise ValueError("fallback: global for task forecast needs a candidate of a table "
                         "kind (lightgbm, xgboost, sklearn or catboost): the global model is "
                         "one lag model over every series, fitted as the first such candidate")
    if self.fallback != "global" and (self.forecast.static or self.global_segment_features):
        raise ValueError("forecast.static and global_segment_features are features of the "
                         "global model, which learns across series (a series' own models "
                         "see one value): set fallback: global")
    if self.refit is False:
        raise ValueError("task forecast refits every member on the whole series: "
                         "refit: false is not available")
    if self.forecast.intervals and self.validation.windows < 2:
        raise ValueError("forecast.intervals are calibrated on the backtest's errors: they "
                         "need validation.windows of at least 2 (more for wide levels)")
    if self.forecast.hierarchy is not None:
        check_hierarchy(self)


#: The column of a hierarchical forecast naming each series' level.
LEVEL_COLUMN = "level"


def check_hierarchy(self: JobConfig) -> None:
    """``forecast.hierarchy`` against the rest of the job."""
    forecast = self.forecast
    if forecast.exogenous or forecast.static:
        raise ValueError("forecast.hierarchy does not take forecast.exogenous or "
                         "forecast.static yet: the aggregate series have no such columns, "
                         "and the forecasts are reconciled when trained (without future "
                         "values to come)")
    if forecast.hierarchy.segments is not None:  # as training stored it: checked then
        return
    columns = {c for level in forecast.hierarchy.levels for c in level}
    clash = {LEVEL_COLUMN, self.target, self.time_column} & (columns | set(self.segment_by))
    if clash:
        raise ValueError(f"forecast.hierarchy: {sorted(clash)} cannot name a level or a "
                         f"segment: {LEVEL_COLUMN!r} is the column the forecasts name their "
                         "level in, and the target and time column are not levels")
    if any(set(level) >= set(self.segment_by) for level in forecast.hierarchy.levels):
        raise ValueError("forecast.hierarchy: a level holding every segment column is the "
                         "segments themselves; list only the levels above them")


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) to a nested dict."""
    data = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        *path, last = key.strip().split(".")
        node: Any = data
        for part in path:
            node = override_section(node, part, item)
        node[entry_index(node, last, item) if isinstance(node, list) else last] = \
            yaml.safe_load(raw)
    return data


def override_section(node: Any, part: str, item: str) -> Any:
    """The section ``part`` of ``node`` that ``--set item`` goes into (made where missing);
    in a list (``models``), its entry named ``part``, or at index ``part``."""
    node = node[entry_index(node, part, item)] if isinstance(node, list) else \
        node.setdefault(part, {})
    if not isinstance(node, (dict, list)):
        raise ConfigError(f"--set {item!r}: {part!r} is not a section")
    return node


def entry_index(entries: list, part: str, item: str) -> int:
    """Which entry of a list ``part`` names for ``--set item``: by its ``name``, or its
    index."""
    names = [entry.get("name") if isinstance(entry, dict) else None for entry in entries]
    if part in names:
        return names.index(part)
    if part.isdigit() and int(part) < len(entries):
        return int(part)
    raise ConfigError(f"--set {item!r}: no entry {part!r} here: give an entry's name "
                      f"({', '.join(str(n) for n in names)}) or its index, 0 to "
                      f"{len(entries) - 1}")


def format_validation_error(exc: ValidationError, data: object = None,
                            model: type | None = None) -> str:
    """One line per problem: the key path, what is wrong, and the bad value (``model``:
    the config model validated, whose keys an unknown one is matched with)."""
    lines = ["invalid job config:"]
    for path, message, value in validation_problems(exc, data, model):
        shown = "" if value is None or isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  {path or '(top level)'}: {message}{shown}")
    return "\n".join(lines)
