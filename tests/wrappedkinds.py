"""Test kinds built over raybricks' own kinds: kinds that record where they were fitted
(the device raybricks told them, the GPUs their Ray task held), for the GPU tests, and
kinds whose Ray Train worker waits to be killed mid-fit. Apart from ``userkinds`` and
``faults`` (modules shipped with models, which must import without raybricks' kinds)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from raybricks.kinds import ModelKind, filled_input
from raybricks.kinds.lightgbm import LightGBMKind
from raybricks.kinds.pretrained import ChronosKind
from raybricks.kinds.xgboost import XGBoostKind
from tests.faults import _wait_for


def record_fit(candidate: str, device: str, tree_method: str | None = None) -> None:
    """Append where a fit ran (the device it was told, the GPUs its Ray task held) to
    ``$RAYBRICKS_TEST_FITS``, when set."""
    import json
    import os

    import ray

    path = os.environ.get("RAYBRICKS_TEST_FITS")
    if path:
        record = {"candidate": candidate, "device": device, "tree_method": tree_method,
                  "gpu_ids": [str(i) for i in ray.get_gpu_ids()]}
        with open(path, "a") as file:
            file.write(json.dumps(record) + "\n")


class WhereFitted(ModelKind):
    """Least squares that keeps where it was fitted in its stored model: the device
    raybricks told it (``device_params``) and the GPUs its Ray task held."""

    name = "tests.gpukinds.WhereFitted"
    model_input = staticmethod(filled_input)

    def device_params(self, device):
        return {"device": device}

    def fit(self, params, X, y, task, seed, threads, meta):
        import ray

        design = np.column_stack([np.ones(len(X)), X])
        device = params.get("device", "cpu")
        record_fit(self.candidate.name, device)
        return {"coef": np.linalg.lstsq(design, y, rcond=None)[0].tolist(), "device": device,
                "gpu_ids": [str(i) for i in ray.get_gpu_ids()]}

    def predict(self, model, X, task):
        return model["coef"][0] + np.asarray(X) @ np.asarray(model["coef"][1:])

    def serialize(self, model) -> bytes:
        import json

        return json.dumps(model).encode()

    @classmethod
    def load(cls, payload, meta):
        import json

        return json.loads(payload)

    @classmethod
    def predict_loaded(cls, model, features, meta):
        return model["coef"][0] + cls.model_input(features, meta) @ np.asarray(model["coef"][1:])


class RecordingXGBoost(XGBoostKind):
    """The xgboost kind, recording the device XGBoost's estimator was given."""

    name = "tests.gpukinds.RecordingXGBoost"

    def fit(self, params, X, y, task, seed, threads, meta):
        import warnings

        with warnings.catch_warnings():  # no GPU here: XGBoost falls back to the CPU
            warnings.simplefilter("ignore", UserWarning)
            model = super().fit(params, X, y, task, seed, threads, meta)
        given = model.get_params()
        record_fit(self.candidate.name, given["device"] or "cpu", given["tree_method"])
        return model


class LostWorker:
    """A data-parallel kind whose rank-0 Ray Train worker, on the fit's first start, writes
    its pid to ``params["pid_file"]`` after round ``params["stop_after"]`` (make it a
    checkpoint round) and waits there to be killed; a start resuming from a checkpoint
    writes the rounds it still fits to ``params["resumed_file"]``. Otherwise the kind."""

    OWN = ("pid_file", "resumed_file", "stop_after")

    def native_params(self, params, task, n_classes):
        params = {name: value for name, value in params.items() if name not in self.OWN}
        return super().native_params(params, task, n_classes)

    def fit_shard(self, features, label, params, rounds, init=None, after_round=None):
        import ray.train

        own = self.candidate.params
        if ray.train.get_context().get_world_rank() != 0:
            pass
        elif init is not None:
            Path(own["resumed_file"]).write_text(str(rounds))
        else:
            after_round = _stop_after(after_round, own["stop_after"], Path(own["pid_file"]))
        return super().fit_shard(features, label, params, rounds, init, after_round)


class LostWorkerXGBoost(LostWorker, XGBoostKind):
    name = "tests.wrappedkinds.LostWorkerXGBoost"


class LostWorkerLightGBM(LostWorker, LightGBMKind):
    name = "tests.wrappedkinds.LostWorkerLightGBM"


def _stop_after(after_round, stop_after: int, pid_file: Path):
    done = 0

    def wrapped(model) -> None:
        nonlocal done
        after_round(model)
        done += 1
        if done == stop_after:
            pid_file.write_text(str(os.getpid()))
            _wait_for(lambda: False)  # until killed

    return wrapped


class RecordingChronos(ChronosKind):
    """``kind: chronos`` that records the device each load was asked for (with the GPUs
    its Ray task held) and loads on the CPU: the tests' GPUs are Ray's numbers only."""

    @classmethod
    def load_pipeline(cls, folder, device):
        record_fit(f"chronos in {os.getpid()}", device)
        return super().load_pipeline(folder, "cpu")
