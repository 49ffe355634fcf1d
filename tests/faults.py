"""Data and a user model (kind=function) that inject real faults into chosen segments.

A segment's fault is the value of its ``fault`` column (a feature the model reads):
``ok`` fits a linear model on x1; ``raise`` raises; ``kill`` kills its worker process with
SIGKILL, as the kernel's or Ray's out-of-memory killer does; ``hang`` sleeps for an hour;
``memory`` asks for more memory than any machine has; ``wait`` blocks until the file
``params["release"]`` exists; ``barrier`` blocks until ``params["parties"]`` jobs have
each left a file in ``params["barrier"]`` (so concurrent jobs surely overlap).

The lost-worker kinds of Ray Train are in ``wrappedkinds`` (this module is shipped with
models as a kind=function module and must import without raybricks' own kinds).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import make_pipeline

WAIT_LIMIT_S = 300  # a waiting fit gives up (and fails its segment) after this


def stores(faults: dict[str, str], regular: int = 4, rows: int = 40, seed: int = 0
           ) -> pd.DataFrame:
    """``regular`` plain stores plus one store per entry of ``faults`` (name -> fault)."""
    rng = np.random.default_rng(seed)
    names = [(f"s{i}", "ok") for i in range(regular)] + list(faults.items())
    frames = []
    for store, fault in names:
        x1 = rng.normal(size=rows)
        frames.append(pd.DataFrame({"store": store, "x1": x1, "fault": fault,
                                    "y": 2 * x1 + rng.normal(scale=0.1, size=rows)}))
    return pd.concat(frames, ignore_index=True)


def fit_with_faults(X: pd.DataFrame, y: np.ndarray, params: dict):
    """A LinearRegression on x1, or the segment's fault (see the module docstring)."""

    fault = str(X["fault"].iloc[0])
    if fault == "raise":
        raise ValueError("this segment's data breaks the model")
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hang":
        time.sleep(3600)
    if fault == "memory":
        np.empty(2**52, dtype=np.uint8)  # 4 PiB: MemoryError from the allocator
    if fault == "wait":
        release = Path(params["release"])
        (release.parent / "waiting").touch()
        _wait_for(lambda: release.exists())
    if fault == "barrier":
        barrier = Path(params["barrier"])
        (barrier / params["party"]).touch()
        _wait_for(lambda: len(list(barrier.iterdir())) >= params["parties"])
    x1_only = ColumnTransformer([("x1", "passthrough", ["x1"])])
    return make_pipeline(x1_only, LinearRegression()).fit(X, y)


def _wait_for(condition) -> None:
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("waited too long")
        time.sleep(0.2)
