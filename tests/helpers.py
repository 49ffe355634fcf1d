"""Small synthetic data sets for the training tests (and a user model for kind=function)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def shops(seed: int = 0) -> pd.DataFrame:
    """Eight regular stores plus one of each kind of troublesome segment."""
    rng = np.random.default_rng(seed)
    frames = []
    for store in range(8):
        n = 60 + 10 * store
        x1 = rng.normal(size=n)
        x2 = rng.normal(size=n)
        color = rng.choice(["red", "green", "blue"], n)
        y = 3 * x1 - x2 + (color == "red") * 2 + store + rng.normal(scale=0.1, size=n)
        x2[rng.random(n) < 0.1] = np.nan  # missing feature values
        frames.append(pd.DataFrame({"store": f"s{store}", "day": np.arange(n), "x1": x1,
                                    "x2": x2, "color": color, "y": y}))
    few = pd.DataFrame({"store": "few", "day": range(5), "x1": 1.0, "x2": 1.0,
                        "color": "red", "y": range(5)})
    constant = pd.DataFrame({"store": "constant", "day": range(40), "x1": rng.normal(size=40),
                             "x2": 0.0, "color": "red", "y": 7.0})
    no_feature = pd.DataFrame({"store": "no_feature", "day": range(40), "x1": np.nan,
                               "x2": np.nan, "color": None, "y": rng.normal(size=40)})
    data = pd.concat(frames + [few, constant, no_feature], ignore_index=True)
    data["color"] = data["color"].astype(object)
    return data


def classes(kinds: int, seed: int = 0) -> pd.DataFrame:
    """Four stores with a class label driven by x1 (kinds=2: binary)."""
    rng = np.random.default_rng(seed)
    frames = []
    for store in range(4):
        n = 120
        x1 = rng.normal(size=n)
        label = np.digitize(x1 + rng.normal(scale=0.3, size=n),
                            np.linspace(-1, 1, kinds - 1))
        frames.append(pd.DataFrame({"store": store, "x1": x1, "x2": rng.normal(size=n),
                                    "label": np.array(["no", "yes", "maybe"])[label]}))
    return pd.concat(frames, ignore_index=True)


def fit_or_explode(X, y, params):
    """A user model (kind=function) that refuses segments with huge x2."""
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LinearRegression
    from sklearn.pipeline import make_pipeline

    if np.nanmax(X["x2"].to_numpy()) > 1000:
        raise ValueError("x2 out of range for this model")
    numeric = ColumnTransformer([("numeric", SimpleImputer(), ["x1", "x2"])])
    return make_pipeline(numeric, LinearRegression()).fit(X, y)


def fit_or_die_once(X, y, params):
    """A user model whose first call kills its worker process (a lost worker); later
    calls, in the retried task, fit normally."""
    import os
    from pathlib import Path

    from sklearn.linear_model import LinearRegression

    marker = Path(params["marker"])
    if not marker.exists():
        marker.write_text("died once")
        os._exit(1)
    return LinearRegression().fit(X[["x1"]], y)


def fit_below_1000(X, y, params):
    """A user model (kind=function) that refuses series with values above 1000."""
    from sklearn.linear_model import LinearRegression

    if np.nanmax(np.asarray(y, dtype="float64")) > 1000:
        raise ValueError("values above 1000 refused")
    return LinearRegression().fit(X, y)


def fit_logging(X, y, params):
    """A user model (kind=function) that appends each setting it is fitted with to the
    file ``params["log"]`` (one JSON line per fit), then fits a ridge with ``alpha``."""
    import json
    from pathlib import Path

    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline

    setting = {k: v for k, v in params.items() if k != "log"}
    with Path(params["log"]).open("a") as log:
        log.write(json.dumps(setting) + "\n")
    return make_pipeline(SimpleImputer(), Ridge(alpha=params.get("alpha", 1.0))).fit(X, y)
