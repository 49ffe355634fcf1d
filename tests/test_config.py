"""Job config: typed, complete validation with errors that name the key and the fix."""

from __future__ import annotations

import pytest

from raybricks.config import JobConfig, apply_overrides
from raybricks.errors import ConfigError

BASE = {
    "source": {"table": "sales"},
    "segment_by": ["store"],
    "target": "y",
    "models": [{"name": "lgbm", "kind": "lightgbm"}],
}


def with_(**changes):
    return BASE | changes


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (with_(models=[{"name": "m", "kind": "lgbm"}]), "kind='lgbm' is unknown"),
        (with_(validation={"metric": "rmse"}, task="binary"), "does not fit task='binary'"),
        (with_(validation={"metric": "rsme"}), "validation.metric='rsme' is unknown"),
        (with_(features=["y", "x"]), "target 'y' is listed among features"),
        (with_(models=[{"name": "a", "kind": "xgboost"}, {"name": "a", "kind": "lightgbm"}]),
         "duplicate candidate names"),
        (with_(models=[{"name": "a", "kind": "xgboost", "search": {"max_depth": []}}]),
         "search.max_depth is empty"),
        (with_(min_rows=1), "min_rows=1 must be at least 2"),
        (with_(models=[{"name": "r", "kind": "sklearn"}]), "needs estimator"),
        (with_(validaton={"method": "time"}), "validaton: unknown key"),
        (with_(validation={"method": "time"}), "needs time_column"),
        (with_(models=[{"name": "a", "kind": "xgboost",
                        "search": {"eta": {"low": 0, "high": 1, "log": True}}}]), "low > 0"),
        (with_(source={"table": "t", "path": "/p"}), "exactly one of source.table"),
        (with_(ensemble="median"), "ensemble.method"),
        (with_(models=[]), "models"),
        (with_(models=[{"name": "ets", "kind": "statsforecast", "estimator": "AutoETS"}]),
         "'ets'] are of a kind that forecasts series: they need task: forecast"),
    ],
)
def test_bad_configs_are_refused_with_the_key_named(config, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        JobConfig.from_dict(config)


def test_defaults_and_shorthands():
    config = JobConfig.from_dict(with_(ensemble="weighted", task="multiclass"))
    assert config.ensemble.method == "weighted" and config.ensemble.top_k == 3
    assert config.metric == "logloss"
    assert JobConfig.from_dict(BASE).metric == "rmse"
    assert JobConfig.from_dict(BASE).config_hash() == JobConfig.from_dict(BASE).config_hash()
    assert JobConfig.from_dict(BASE).config_hash() != config.config_hash()
    one = JobConfig.from_dict(with_(segment_by="store", features="x"))  # one column: a name
    assert one.segment_by == ["store"] and one.features == ["x"]
    assert one.config_hash() == JobConfig.from_dict(
        with_(segment_by=["store"], features=["x"])).config_hash()
    series = JobConfig.from_dict(with_(task="forecast", time_column="day", fallback="global",
                                       forecast={"horizon": 7, "frequency": "D",
                                                 "exogenous": "promo", "static": "kind"}))
    assert series.forecast.exogenous == ["promo"] and series.forecast.static == ["kind"]


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "job.yml"
    path.write_text(
        "source: {table: sales}\nsegment_by: [store]\ntarget: y\n"
        "models:\n  - {name: lgbm, kind: lightgbm, params: {n_estimators: 50}}\n"
    )
    config = JobConfig.load(path, ["validation.fraction=0.3", "cluster.max_worker_nodes=2",
                                   "segment_by=[store, item]"])
    assert config.validation.fraction == 0.3
    assert config.cluster.max_worker_nodes == 2
    assert config.segment_by == ["store", "item"]
    assert config.models[0].params == {"n_estimators": 50}
    # a candidate by its name or its index
    tuned = JobConfig.load(path, ["models.lgbm.params.num_leaves=7",
                                  "models.0.params.n_estimators=80"])
    assert tuned.models[0].params == {"n_estimators": 80, "num_leaves": 7}
    with pytest.raises(ConfigError, match=r"no entry 'xgb' here: give an entry's name "
                                          r"\(lgbm\) or its index, 0 to 0"):
        JobConfig.load(path, ["models.xgb.params.max_depth=3"])
    with pytest.raises(ConfigError, match="must look like key.sub=value"):
        JobConfig.load(path, ["validation.fraction"])
    with pytest.raises(ConfigError, match="not found"):
        JobConfig.load(tmp_path / "missing.yml")
    with pytest.raises(ConfigError, match=r"validation.fraction: .*less than 1 \(got 1.5\)"):
        JobConfig.load(path, ["validation.fraction=1.5"])


def test_overrides_do_not_touch_the_input():
    data = {"a": {"b": 1}}
    assert apply_overrides(data, ["a.b=2", "a.c=x"]) == {"a": {"b": 2, "c": "x"}}
    assert data == {"a": {"b": 1}}


def test_shipped_job_configs_are_valid():
    from pathlib import Path

    configs = sorted(Path(__file__).parent.parent.joinpath("jobs").glob("*.yml"))
    assert configs
    for path in configs:
        assert JobConfig.load(path).models


def test_invalid_sklearn_settings_are_refused_before_any_cluster():
    from raybricks import kinds
    from raybricks.config import CandidateConfig

    def check_candidate(candidate):
        kinds.of(candidate).check()

    ridge = {"name": "ridge", "kind": "sklearn", "estimator": "sklearn.linear_model.Ridge"}
    check_candidate(CandidateConfig(**ridge, search={"alpha": {"low": 0.01, "high": 10}}))
    with pytest.raises(ConfigError, match=r"models\[ridge\]: \{'alpha': -1\} is not a valid"):
        check_candidate(CandidateConfig(**ridge, params={"alpha": -1}))
    with pytest.raises(ConfigError, match="'solver': 'fastest'.*solver"):
        check_candidate(CandidateConfig(**ridge, search={"solver": ["auto", "fastest"]}))


def documented_configs() -> list:
    """Every YAML block of the README and docs/, named by file and position."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        blocks = re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)
        found += [pytest.param(block, id=f"{doc.name}-{i}") for i, block in enumerate(blocks)]
    return found


@pytest.mark.parametrize("block", documented_configs())
def test_every_config_the_docs_show_is_valid(block):
    """A whole job as shown; a fragment (a section or two) over a minimal job of its task,
    a forecast one when it shows a forecast section or forecasting kinds. A user's own
    kind (``mypkg``) is the only thing allowed to be missing."""
    import yaml

    from raybricks import kinds

    shown = yaml.safe_load(block)
    assert isinstance(shown, dict)
    forecasting = "forecast" in shown or any(
        not model["kind"].startswith("mypkg.")
        and issubclass(kinds.resolve(model["kind"]), kinds.ForecastKind)
        for model in shown.get("models", []))
    base = BASE | ({"task": "forecast", "time_column": "day",
                    "models": [{"name": "snaive", "kind": "statsforecast",
                                "estimator": "SeasonalNaive"}],
                    "forecast": {"horizon": 7, "frequency": "D"}} if forecasting else {})
    merged = base | shown
    if forecasting:
        merged["forecast"] = base["forecast"] | shown.get("forecast", {})
    try:
        JobConfig.from_dict(merged)
    except ConfigError as exc:
        if "cannot import 'mypkg." not in str(exc):
            raise
