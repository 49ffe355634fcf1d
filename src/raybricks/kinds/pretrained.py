"""``kind: chronos`` and ``kind: timesfm``: pretrained forecasters, zero-shot.

Nothing is fitted per series. In each backtest window a task forecasts every series of
its block in batches from the values before the window's origin (the last
``context_length`` of them), and the same batch call makes each series' forecast of the
horizon after its whole history. A series' stored member is that context and forecast
(with the model's quantiles) plus a reference to the weights (their source and SHA-256):
the registered model answers the stored periods without the model, and loads it, once per
process, only to forecast further or with new exogenous values.

``params``: ``model`` (a Hugging Face id, or a folder: a Unity Catalog Volume, ``/dbfs``
or ``dbfs:/`` path, a local folder), ``context_length`` (512), ``batch_size`` (64),
``device`` (``auto``: the GPU where the task holds one), ``intervals`` (``conformal``, or
``quantiles``: the model's own quantiles where the job's levels fall inside them) and
``store`` (``copy``: the registered model carries the weights once per version;
``reference``: their source and checksum only).

Stored half: numpy and pandas here; torch and the model's package only when a member
has to forecast beyond what it stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from .base import holds_gpus
from .forecasting import TARGET, ForecastKind, ForecastSpec

#: The settings a pretrained candidate's ``params`` take, with their defaults.
SETTINGS: dict[str, Any] = {"model": None, "context_length": 512, "batch_size": 64,
                            "device": "auto", "intervals": "conformal", "store": "copy"}
INTERVALS = ("conformal", "quantiles")
STORES = ("copy", "reference")
#: Where a registered model keeps the weights it carries: one folder per SHA-256.
CARRIED_FOLDER = "pretrained"

#: Weights folders carried by the registered models this process loaded, by SHA-256.
CARRIED: dict[str, Path] = {}
#: Loaded pipelines, one per (kind, weights folder, device) in this process.
_LOADED: dict[tuple[str, str, str], Any] = {}
_DIGESTS: dict[tuple, str] = {}
#: Hugging Face ids resolved to their downloaded folder in this process (asked once).
_DOWNLOADED: dict[str, Path] = {}
_LOCK = threading.Lock()


# --------------------------------------------------------------------------- weights


def weights_folder(source: str) -> Path:
    """A local folder holding the weights ``source`` names: a folder as it is
    (``dbfs:/...`` read through ``/dbfs``), else a Hugging Face id, downloaded once per
    machine into the Hugging Face cache (``huggingface_hub.snapshot_download``) and
    remembered by the process."""
    found = known_folder(source)
    if found is not None:
        return found
    if local_path(source).is_absolute() or source.startswith((".", "~")) or source.count("/") != 1:
        raise FileNotFoundError(
            f"pretrained weights {source!r}: no such folder, and not a Hugging Face id "
            "(owner/name): give a folder holding the model's files (a Unity Catalog "
            "Volume such as /Volumes/main/models/chronos-bolt-small) or a hub id such as "
            "amazon/chronos-bolt-small")
    from huggingface_hub import snapshot_download  # the hub is asked once per process

    _DOWNLOADED[source] = Path(snapshot_download(source))
    return _DOWNLOADED[source]


def known_folder(source: str) -> Path | None:
    """``weights_folder`` without asking the hub: the local folder, or the folder this
    process downloaded the hub id to; None otherwise."""
    path = local_path(source)
    return path if path.is_dir() else _DOWNLOADED.get(source)


def local_path(source: str) -> Path:
    """``source`` as a path on this machine (``dbfs:/...`` read through ``/dbfs``)."""
    if source.startswith("dbfs:/"):
        return Path("/dbfs" + source[len("dbfs:"):])
    return Path(os.path.expanduser(source))


def folder_digest(folder: Path) -> str:
    """The SHA-256 of a weights folder: of every file's relative path and bytes, in path
    order (hidden files left out); remembered per process while the files are unchanged."""
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(folder).parts))
    stamp = (str(folder), *((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if stamp not in _DIGESTS:
        digest = hashlib.sha256()
        for path in files:
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 22), b""):
                    digest.update(chunk)
        _DIGESTS[stamp] = digest.hexdigest()
    return _DIGESTS[stamp]


def provide(directory: Path) -> None:
    """Make the weights a registered model carries (``directory``'s ``pretrained``
    folder) known to its members."""
    carried = Path(directory) / CARRIED_FOLDER
    if carried.is_dir():
        CARRIED.update({p.name: p for p in carried.iterdir() if p.is_dir()})


def located(weights: dict[str, str]) -> Path:
    """The folder of a member's weights (``{"source", "sha256"}``): the copy its
    registered model carries, else its source, checked against the checksum."""
    carried = CARRIED.get(weights["sha256"])
    if carried is not None and carried.is_dir():  # (a model deleted since is not)
        return carried
    folder = weights_folder(weights["source"])
    found = folder_digest(folder)
    if found != weights["sha256"]:
        raise ValueError(
            f"the weights at {weights['source']} are not those the model was trained with "
            f"(SHA-256 {found[:12]}... where {weights['sha256'][:12]}... was recorded): "
            "put the trained weights back there, or train with store: copy so that the "
            "registered model carries them")
    return folder


def device_of(setting: str) -> str:
    """``auto``: the first GPU where torch sees one, else the CPU; otherwise as set."""
    if setting != "auto":
        return setting
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------- requests


class Request:
    """One forecast to make: a series' values before its origin (the last
    ``context_length``), and its exogenous values before (``past``) and over (``future``)
    the periods forecast."""

    __slots__ = ("context", "future", "past")

    def __init__(self, context: np.ndarray, past: dict[str, np.ndarray] | None = None,
                 future: dict[str, np.ndarray] | None = None) -> None:
        self.context, self.past, self.future = context, past, future


def requests_of(frame: pd.DataFrame, origin: int, horizon: int, context_length: int,
                exogenous: list[str]) -> Request:
    """The request of a forecast of ``horizon`` periods from ``origin`` (a row of
    ``frame``: ``y`` and the exogenous columns): nothing at or after the origin but the
    exogenous values of the periods forecast."""
    start = max(origin - context_length, 0)
    context = frame[TARGET].to_numpy(dtype="float64")[start:origin]
    if not exogenous:
        return Request(context)
    values = {c: frame[c].to_numpy(dtype="float64") for c in exogenous}
    return Request(context, {c: v[start:origin] for c, v in values.items()},
                   {c: v[origin:origin + horizon] for c, v in values.items()})


class Forecasts:
    """A batch's forecasts: points (n x horizon) and quantiles (n x horizon x levels),
    each series' quantiles in increasing order."""

    def __init__(self, points: np.ndarray, quantiles: np.ndarray, levels: list[float]
                 ) -> None:
        self.points = np.asarray(points, dtype="float64")
        self.quantiles = np.sort(np.asarray(quantiles, dtype="float64"), axis=-1)
        self.levels = [float(v) for v in levels]


# --------------------------------------------------------------------------- the kinds


class PretrainedKind(ForecastKind):
    """A pretrained forecaster (subclasses: ``ChronosKind``, ``TimesFMKind``): the
    stored half forecasts a member's stored context with the loaded pipeline
    (``forecast_batch``); the training half backtests and forecasts every series of a
    block in batches."""

    extra = "foundation"
    #: Whether the model's forecasts may use exogenous columns (Chronos-2 does).
    covariates: ClassVar[bool] = False

    # -- what a subclass supplies

    @classmethod
    def load_pipeline(cls, folder: Path, device: str) -> Any:
        """The model of a weights folder, loaded on ``device``."""
        raise NotImplementedError

    @classmethod
    def forecast_batch(cls, pipeline: Any, requests: list[Request], horizon: int,
                       batch_size: int) -> Forecasts:
        """The forecasts of ``requests``, ``batch_size`` series at a time."""
        raise NotImplementedError

    @classmethod
    def takes_covariates(cls, pipeline: Any) -> bool:
        """Whether this loaded model forecasts with exogenous columns."""
        return cls.covariates

    # -- loading, once per process

    @classmethod
    def pipeline(cls, folder: Path, device: str = "auto", threads: int | None = None) -> Any:
        """The model of ``folder`` on ``device``, loaded once per process; ``threads``:
        torch's CPU threads for what follows (the task's CPUs)."""
        import torch

        if threads:
            torch.set_num_threads(max(int(threads), 1))
        device = device_of(device)
        key = (cls.__name__, str(folder), device)
        with _LOCK:
            if key not in _LOADED:
                _LOADED[key] = cls.load_pipeline(Path(folder), device)
            return _LOADED[key]

    # -- the stored half

    forecasts_many = True

    @classmethod
    def forecast_loaded(cls, model: dict[str, Any], future: pd.DataFrame,
                        meta: dict[str, Any]) -> np.ndarray:
        return cls.forecast_many([(model, future, meta)])[0]

    @classmethod
    def forecast_many(cls, requests: list[tuple[dict[str, Any], pd.DataFrame, dict[str, Any]]]
                      ) -> list[np.ndarray]:
        """Each series' stored forecast where it covers its future (without exogenous
        values); the others forecast from their stored contexts, in batches, one call per
        model (weights and settings) for the longest future asked, each cut to its own
        (with exogenous values, per length of future)."""
        found: list[np.ndarray | None] = [None] * len(requests)
        waiting: dict[tuple, list[int]] = {}
        for position, (model, future, meta) in enumerate(requests):
            path = model.get("path")
            if not meta["forecast"]["exogenous"] and path is not None and len(
                    future) <= len(path):
                found[position] = np.asarray(path[:len(future)], dtype="float64")
            else:
                settings = model["settings"]  # exogenous values: one length a batch
                waiting.setdefault((model["weights"]["sha256"], settings["batch_size"],
                                    settings["device"],
                                    len(future) if meta["forecast"]["exogenous"] else 0),
                                   []).append(position)
        for (_, batch_size, device, _), positions in waiting.items():
            model = requests[positions[0]][0]
            pipeline = cls.pipeline(located(model["weights"]), device)
            horizon = max(len(requests[p][1]) for p in positions)
            asked = []
            for p in positions:
                stored, future, meta = requests[p]
                exogenous = meta["forecast"]["exogenous"]
                asked.append(Request(
                    np.asarray(stored["context"], dtype="float64"), stored.get("past"),
                    {c: future[c].to_numpy(dtype="float64") for c in exogenous}
                    if exogenous else None))
            points = cls.forecast_batch(pipeline, asked, horizon, batch_size).points
            for row, p in enumerate(positions):
                found[p] = points[row, :len(requests[p][1])]
        return found

    # -- the training half

    @classmethod
    def settings(cls, params: dict[str, Any]) -> dict[str, Any]:
        """The candidate's ``params`` over the defaults (``SETTINGS``), checked."""
        unknown = sorted(set(params) - set(SETTINGS))
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; a {cls.name} candidate takes "
                             f"{sorted(SETTINGS)}")
        found = SETTINGS | dict(params)
        if not found["model"]:
            raise ValueError(f"needs params.model: a Hugging Face id or a folder of the "
                             f"model's files ({cls.example})")
        if found["intervals"] not in INTERVALS or found["store"] not in STORES:
            raise ValueError(f"intervals is one of {list(INTERVALS)} and store one of "
                             f"{list(STORES)} (got {found['intervals']!r}, "
                             f"{found['store']!r})")
        for name in ("context_length", "batch_size"):
            if not isinstance(found[name], int) or found[name] < 1:
                raise ValueError(f"{name} is a positive integer (got {found[name]!r})")
        return found

    #: A model the error messages name.
    example: ClassVar[str] = ""

    @classmethod
    def check_config(cls, candidate) -> None:
        try:
            cls.settings(dict(candidate.params))
        except ValueError as exc:
            raise ValueError(f"models[{candidate.name}] of kind {cls.name}: {exc}") from None

    @classmethod
    def check_forecast_config(cls, candidate, forecast) -> None:
        if forecast.exogenous and not cls.covariates:
            raise ValueError(
                f"models[{candidate.name}]: kind {cls.name} {cls.no_covariates} (the job has "
                f"forecast.exogenous {list(forecast.exogenous)}): leave it out of this job, "
                "or drop the exogenous columns")

    #: Why the kind forecasts without exogenous columns.
    no_covariates: ClassVar[str] = "forecasts without exogenous columns"

    def check(self) -> None:
        """The package imports, the weights are there (a hub id downloaded now, once),
        and they load."""
        from raybricks.errors import ConfigError

        name = f"models[{self.candidate.name}]"
        try:
            settings = self.settings(dict(self.candidate.params))
            self.pipeline(weights_folder(settings["model"]), "cpu")
        except ImportError as exc:
            raise ConfigError(f"{name}: kind {self.name} needs {self.library} ({exc}): "
                              "pip install 'raybricks[foundation]'") from exc
        except Exception as exc:  # noqa: BLE001 - a missing folder, a failed download
            raise ConfigError(f"{name}: the pretrained model cannot be loaded: {exc}") from exc

    def weights(self) -> dict[str, str]:
        """Where this candidate's weights come from: their source and SHA-256 (what the
        run records and each member refers to) and how the registered model keeps them."""
        settings = self.settings(dict(self.candidate.params))
        return {"source": str(settings["model"]),
                "sha256": folder_digest(weights_folder(settings["model"])),
                "store": settings["store"]}

    def warm_up(self) -> None:
        settings = self.settings(dict(self.candidate.params))
        self.pipeline(weights_folder(settings["model"]), self.device(settings))

    def device(self, settings: dict[str, Any]) -> str:
        """The device this task forecasts on: ``settings["device"]``, where ``auto`` is
        the GPU when the candidate asks for GPUs and the task holds one, else the CPU."""
        if settings["device"] != "auto":
            return settings["device"]
        return "cuda" if holds_gpus(self.candidate) else "cpu"

    def device_params(self, device: str) -> dict[str, Any]:
        return {"device": device}

    def made(self, params: dict[str, Any], requests: list[Request], horizon: int,
             threads: int) -> Forecasts:
        """The forecasts of ``requests`` with this candidate's model, in this task."""
        settings = self.settings(params)
        pipeline = self.pipeline(weights_folder(settings["model"]), self.device(settings),
                                 threads)
        if any(r.future for r in requests) and not self.takes_covariates(pipeline):
            raise ValueError(f"{settings['model']} {self.no_covariates}: drop "
                             "forecast.exogenous, or use a model that takes them")
        return self.forecast_batch(pipeline, requests, horizon, settings["batch_size"])

    def backtest_many(self, params: dict[str, Any], frames: list[pd.DataFrame],
                      origins: list[list[int]], seeds: list[int], threads: int,
                      spec: ForecastSpec) -> list[np.ndarray]:
        """Every window of every series forecast in batches, each from the values
        before its origin."""
        settings = self.settings(params)
        requests = [requests_of(frame, origin, spec.horizon, settings["context_length"],
                                spec.exogenous)
                    for frame, cuts in zip(frames, origins, strict=True) for origin in cuts]
        points = self.made(params, requests, spec.horizon, threads).points
        ends = np.cumsum([len(cuts) for cuts in origins])
        return [points[end - len(cuts):end].reshape(-1)
                for end, cuts in zip(ends, origins, strict=True)]

    def backtest(self, params, frame, origins, seed, threads, spec) -> np.ndarray:
        return self.backtest_many(params, [frame], [origins], [seed], threads, spec)[0]

    def fit_each(self, params: dict[str, Any], frames: list[pd.DataFrame], seeds: list[int],
                 threads: int, spec: ForecastSpec) -> list[dict[str, Any]]:
        """Each series' stored member: its context, and without exogenous columns its
        forecast of the horizon after its history with the model's quantiles."""
        settings = self.settings(params)
        length, exogenous = settings["context_length"], spec.exogenous
        requests = [requests_of(frame, len(frame), spec.horizon, length, exogenous)
                    for frame in frames]
        found = None if exogenous else self.made(params, requests, spec.horizon, threads)
        weights = self.weights()
        stored = {key: settings[key] for key in ("context_length", "batch_size")}
        members = []
        for position, request in enumerate(requests):
            member = {"context": request.context.astype("float32"), "past": request.past,
                      "weights": {"source": weights["source"], "sha256": weights["sha256"]},
                      "settings": stored | {"device": "auto"}}
            if found is not None:
                member |= {"path": found.points[position],
                           "quantiles": found.quantiles[position], "levels": found.levels}
            members.append(member)
        return members

    def fit_series(self, params, history, seed, threads, spec) -> dict[str, Any]:
        return self.fit_each(params, [history], [seed], threads, spec)[0]

    def own_intervals(self, params: dict[str, Any], model: dict[str, Any],
                      levels: list[float]) -> list[list[float]] | None:
        """Interval offsets (``interval_columns`` order x horizon) from the model's own
        quantiles around its forecast, where the candidate asks for them
        (``intervals: quantiles``) and every level falls inside the quantiles the model
        gives (linear between them); None otherwise (conformal intervals then)."""
        if self.settings(params)["intervals"] != "quantiles" or model.get("path") is None:
            return None
        offered = np.asarray(model["levels"])
        wanted = [(100 - level) / 200 for level in levels]
        if min(wanted) < offered.min() - 1e-9:
            return None
        quantiles, path = np.asarray(model["quantiles"]), np.asarray(model["path"])

        def at(q: float) -> np.ndarray:
            return np.array([np.interp(q, offered, row) for row in quantiles]) - path

        lows = [at(q) for q in reversed(wanted)]  # widest first
        highs = [at(1 - q) for q in wanted]
        return [np.round(v, 10).tolist() for v in [*lows, *highs]]


class ChronosKind(PretrainedKind):
    """Amazon's Chronos models (``chronos-forecasting``): Chronos-Bolt, and Chronos-2,
    which also forecasts with exogenous columns."""

    name = "chronos"
    library = "chronos-forecasting"
    covariates = True
    example = "amazon/chronos-bolt-small, amazon/chronos-2"
    no_covariates = "forecasts without exogenous columns (Chronos-2 takes them)"

    @classmethod
    def load_pipeline(cls, folder: Path, device: str) -> Any:
        import torch
        from chronos import BaseChronosPipeline

        return BaseChronosPipeline.from_pretrained(str(folder), device_map=device,
                                                   torch_dtype=torch.float32)

    @classmethod
    def takes_covariates(cls, pipeline: Any) -> bool:
        return is_chronos_2(pipeline)

    @classmethod
    def check_forecast_config(cls, candidate, forecast) -> None:
        """Exogenous columns with a Chronos-Bolt refused (its ``config.json`` names its
        pipeline): a local one's when the config is read, a hub id's once ``check`` has
        downloaded it, before any cluster starts (``pipeline.check_job``)."""
        source = str(dict(candidate.params).get("model") or "")
        folder = known_folder(source) if source else None
        config = folder / "config.json" if folder is not None else None
        if forecast.exogenous and config is not None and config.is_file() and json.loads(
                config.read_text()).get("chronos_pipeline_class") != "Chronos2Pipeline":
            raise ValueError(
                f"models[{candidate.name}]: {source} is not a Chronos-2 model and "
                f"{cls.no_covariates} (the job has forecast.exogenous "
                f"{list(forecast.exogenous)}): use amazon/chronos-2, or drop the columns")

    @classmethod
    def forecast_batch(cls, pipeline, requests, horizon, batch_size) -> Forecasts:
        import torch

        levels = list(pipeline.quantiles)
        points, quantiles = [], []
        for start in range(0, len(requests), batch_size):
            batch = requests[start:start + batch_size]
            if is_chronos_2(pipeline):
                inputs = [{"target": r.context, "past_covariates": r.past,
                           "future_covariates": r.future} if r.future else r.context
                          for r in batch]
                found, mean = pipeline.predict_quantiles(
                    inputs, prediction_length=horizon, quantile_levels=levels,
                    batch_size=batch_size)
                found, mean = torch.stack([q[0] for q in found]), torch.stack(
                    [m[0] for m in mean])
            else:  # the first argument positionally: its name differs between releases
                found, mean = pipeline.predict_quantiles(
                    [torch.tensor(r.context, dtype=torch.float32) for r in batch],
                    prediction_length=horizon, quantile_levels=levels)
            points.append(mean.float().cpu().numpy())
            quantiles.append(found.float().cpu().numpy())
        return Forecasts(np.concatenate(points), np.concatenate(quantiles), levels)


def is_chronos_2(pipeline: Any) -> bool:
    """Whether a loaded Chronos pipeline is Chronos-2's (which takes covariates and
    dicts of inputs), not Chronos-Bolt's."""
    return type(pipeline).__name__ == "Chronos2Pipeline"


class TimesFMKind(PretrainedKind):
    """Google's TimesFM 2.5 (``timesfm``), any size of its architecture: the size is
    read from the weights."""

    name = "timesfm"
    library = "timesfm"
    example = "google/timesfm-2.5-200m-pytorch"
    no_covariates = ("forecasts without exogenous columns here (TimesFM's covariate mode "
                     "needs JAX, which no Databricks runtime ships)")

    @classmethod
    def load_pipeline(cls, folder: Path, device: str) -> Any:
        import torch
        from safetensors.torch import load_file
        from timesfm.timesfm_2p5 import timesfm_2p5_torch

        tensors = load_file(str(folder / "model.safetensors"))
        module_class = type("SizedTimesFM", (timesfm_2p5_torch.TimesFM_2p5_200M_torch_module,),
                            {"config": timesfm_definition(tensors)})
        module = module_class()
        module.load_state_dict(tensors, strict=True)
        module.device, module.device_count = torch.device(device), 1
        module.to(module.device).eval()
        model = timesfm_2p5_torch.TimesFM_2p5_200M_torch.__new__(
            timesfm_2p5_torch.TimesFM_2p5_200M_torch)
        model.model, model.torch_compile = module, False
        model.compiled_for = None
        return model

    @classmethod
    def forecast_batch(cls, pipeline, requests, horizon, batch_size) -> Forecasts:
        import torch
        from timesfm import ForecastConfig

        patch, limit = pipeline.model.p, pipeline.model.config.context_limit
        context = max(len(r.context) for r in requests)
        context = -(-max(context, patch) // patch) * patch
        wanted = (min(context, limit // 2), horizon, min(batch_size, len(requests)))
        if pipeline.compiled_for != wanted:
            pipeline.compile(ForecastConfig(
                max_context=wanted[0], max_horizon=horizon, per_core_batch_size=wanted[2],
                normalize_inputs=True, use_continuous_quantile_head=True,
                force_flip_invariance=True, infer_is_positive=False,
                fix_quantile_crossing=True))
            pipeline.compiled_for = wanted
        with torch.no_grad():  # forecast() pads the list it is given: a copy
            points, found = pipeline.forecast(horizon, [r.context for r in requests])
        return Forecasts(points[:len(requests)], found[:len(requests), :, 1:],
                         pipeline.model.config.quantiles)


def timesfm_definition(tensors: dict[str, Any]) -> Any:
    """TimesFM 2.5's definition at the size of these weights (the released 200M model's,
    or a smaller one of the same architecture): widths from the layers' shapes, layers
    counted, heads from the width of the attention's query norm."""
    import dataclasses

    from timesfm.timesfm_2p5.timesfm_2p5_base import TimesFM_2p5_200M_Definition

    base = TimesFM_2p5_200M_Definition()
    layers = len({key.split(".")[1] for key in tensors if key.startswith("stacked_xf.")})
    tokenizer = tensors["tokenizer.hidden_layer.weight"].shape
    width = tensors["tokenizer.output_layer.weight"].shape[0]
    hidden = tensors["stacked_xf.0.ff0.weight"].shape[0]
    head = next(v.shape[0] for k, v in tensors.items()
                if k.startswith("stacked_xf.0.") and "query_ln" in k)
    projection = tensors["output_projection_point.hidden_layer.weight"].shape[0]
    spread = tensors["output_projection_quantiles.hidden_layer.weight"].shape[0]
    stacked = base.stacked_transformers
    return dataclasses.replace(
        base,
        tokenizer=dataclasses.replace(base.tokenizer, hidden_dims=tokenizer[0],
                                      output_dims=width),
        stacked_transformers=dataclasses.replace(stacked, num_layers=layers,
                                                 transformer=dataclasses.replace(
                                                     stacked.transformer, model_dims=width,
                                                     hidden_dims=hidden,
                                                     num_heads=width // head)),
        output_projection_point=dataclasses.replace(
            base.output_projection_point, input_dims=width, hidden_dims=projection),
        output_projection_quantiles=dataclasses.replace(
            base.output_projection_quantiles, input_dims=width, hidden_dims=spread))
