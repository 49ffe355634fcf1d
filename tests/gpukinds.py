"""Kinds that record where they were fitted (the device raybricks told them, the GPUs
their Ray task held), for the GPU tests. Apart from ``userkinds`` (whose module is shipped
with models and must import without raybricks' own kinds)."""

from __future__ import annotations

import numpy as np

from raybricks.kinds import ModelKind, filled_input
from raybricks.kinds.xgboost import XGBoostKind


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
