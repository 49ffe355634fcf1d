"""Pretrained forecasters (``kind: chronos``, ``kind: timesfm``) on tiny random-weight
models of the real architectures (``tests/pretrained_models.py``), loaded from folders as
a user's weights are: batches answer as one series at a time, backtests see nothing
after their origin, the context length holds, the model's quantiles give ordered
intervals, and a job with them beside the statistical candidates, the global fallback
and intervals registers a model that carries the weights once and answers, through plain
MLflow, what the training tasks stored and what only the model can say."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

pytest.importorskip("chronos")
pytest.importorskip("timesfm")

from raybricks import kinds, tracking  # noqa: E402
from raybricks.config import CandidateConfig  # noqa: E402
from raybricks.data import to_ray_dataset  # noqa: E402
from raybricks.errors import ConfigError  # noqa: E402
from raybricks.kinds import pretrained  # noqa: E402
from raybricks.kinds.forecasting import conformal_offsets, interval_neighbours  # noqa: E402
from raybricks.pipeline import check_job  # noqa: E402
from raybricks.results import TRAINED  # noqa: E402
from raybricks.scoring import forecast  # noqa: E402
from raybricks.segmented_model import SegmentModel, SegmentStore  # noqa: E402
from raybricks.training import train_segments  # noqa: E402
from raybricks.training.forecast.series import windows  # noqa: E402
from tests.pretrained_models import BUILDERS, KINDS  # noqa: E402
from tests.test_forecast import (  # noqa: E402
    FAST,
    HORIZON,
    forecast_job,
    plan_for,
    predict_without_raybricks,
    stores,
)

pytestmark = pytest.mark.foundation


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """Each tiny model's folder, by name (bolt, chronos2, timesfm)."""
    root = tmp_path_factory.mktemp("weights")
    return {name: build(root / name) for name, build in BUILDERS.items()}


def kind_of(name: str, folder, **params) -> pretrained.PretrainedKind:
    candidate = CandidateConfig(name=name, kind=KINDS[name],
                                params={"model": str(folder), **params})
    return kinds.forecaster(candidate)


def noisy_series(count: int = 9, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [40 + 10 * np.sin(np.arange(n) / 3.0) + rng.normal(size=n)
            for n in range(40, 40 + 25 * count, 25)]


@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_batch_answers_as_one_series_at_a_time(weights, name):
    kind = kind_of(name, weights[name])
    pipeline = kind.pipeline(weights[name], "cpu", 1)
    requests = [pretrained.Request(values) for values in noisy_series()]
    together = kind.forecast_batch(pipeline, requests, HORIZON, 4)  # batches of 4
    alone = [kind.forecast_batch(pipeline, [r], HORIZON, 4) for r in requests]
    assert together.points.shape == (len(requests), HORIZON)
    assert together.quantiles.shape == (len(requests), HORIZON, len(together.levels))
    np.testing.assert_allclose(together.points, np.concatenate([a.points for a in alone]),
                               rtol=1e-4, atol=1e-4)
    assert (np.diff(together.quantiles, axis=-1) >= 0).all()  # ordered, even at random
    assert np.isfinite(together.points).all()


def test_a_task_forecasts_on_its_own_cpus(weights):
    """torch's threads are the task's CPUs (``plan.threads``), set for each batch."""
    import torch

    kind = kind_of("bolt", weights["bolt"])
    requests = [pretrained.Request(values) for values in noisy_series(3)]
    for threads in (1, 2):
        kind.made(dict(kind.candidate.params), requests, HORIZON, threads)
        assert torch.get_num_threads() == threads


@pytest.mark.parametrize("name", list(BUILDERS))
def test_backtest_windows_see_nothing_after_their_origin(weights, name, tmp_path):
    kind = kind_of(name, weights[name], context_length=64)
    frame = stores()
    plan = plan_for(frame, tmp_path, models=FAST)
    spec = plan.forecast
    frames = [pd.DataFrame({"ds": g.day.to_numpy(), "y": g.sales.to_numpy(dtype="float64")})
              for _, g in frame.groupby("store")][:4]
    origins = [windows(len(f), spec) for f in frames]
    made = kind.backtest_many({"model": str(weights[name]), "context_length": 64}, frames,
                              origins, [0] * 4, 1, spec)
    for position, (f, cuts) in enumerate(zip(frames, origins, strict=True)):
        assert made[position].shape == (len(cuts) * HORIZON,)
        for window, origin in enumerate(cuts):
            changed = f.assign(y=np.where(np.arange(len(f)) >= origin, 1e6, f.y))
            again = kind.backtest({"model": str(weights[name]), "context_length": 64},
                                  changed, [origin], 0, 1, spec)
            found = made[position][window * HORIZON:(window + 1) * HORIZON]
            np.testing.assert_allclose(again, found, rtol=1e-4, atol=1e-3)
            # a value inside the context does change it (the check above could fail)
            earlier = f.assign(y=np.where(np.arange(len(f)) == origin - 1, 1e3, f.y))
            moved = kind.backtest({"model": str(weights[name]), "context_length": 64},
                                  earlier, [origin], 0, 1, spec)
            assert not np.allclose(moved, found, rtol=1e-4, atol=1e-3)
            # ... and one before the context does not
            before = f.assign(y=np.where(np.arange(len(f)) < origin - 64, 1e3, f.y))
            np.testing.assert_allclose(kind.backtest(
                {"model": str(weights[name]), "context_length": 64}, before, [origin], 0, 1,
                spec), found, rtol=1e-4, atol=1e-3)


def test_model_intervals_come_from_its_quantiles_where_they_reach(weights):
    chronos2 = kind_of("chronos2", weights["chronos2"], intervals="quantiles")
    params = dict(chronos2.candidate.params)
    frame = pd.DataFrame({"y": noisy_series()[3]})
    spec = plan_for(stores(), "/tmp", models=FAST).forecast
    model = chronos2.fit_series(params, frame, 0, 1, spec)
    offsets = np.asarray(chronos2.own_intervals(params, model, [80, 95]))
    levels = np.asarray(model["levels"])
    quantiles, path = np.asarray(model["quantiles"]), np.asarray(model["path"])
    # lo_95, lo_80, hi_80, hi_95: the 2.5%, 10%, 90% and 97.5% quantiles minus the path
    for row, q in zip(offsets, (0.025, 0.1, 0.9, 0.975), strict=True):
        expected = [np.interp(q, levels, quantiles[step]) - path[step]
                    for step in range(HORIZON)]
        np.testing.assert_allclose(row, expected, atol=1e-8)
    assert (np.diff(offsets, axis=0) >= -1e-9).all()  # nested
    # Chronos-Bolt's quantiles stop at 10% and 90%: 95% is left to conformal intervals
    bolt = kind_of("bolt", weights["bolt"], intervals="quantiles")
    bolt_params = dict(bolt.candidate.params)
    bolt_model = bolt.fit_series(bolt_params, frame, 0, 1, spec)
    assert bolt.own_intervals(bolt_params, bolt_model, [80, 95]) is None
    assert bolt.own_intervals(bolt_params, bolt_model, [80]) is not None
    # without intervals: quantiles, conformal (the default)
    assert kind_of("chronos2", weights["chronos2"]).own_intervals(
        {"model": params["model"]}, model, [80]) is None


def test_bad_settings_are_clear_errors_before_training(weights, tmp_path):
    def job(models, **forecast):
        return forecast_job(tmp_path, models=models, forecast={
            "horizon": HORIZON, "frequency": "D", **forecast})

    with pytest.raises((ConfigError, ValueError), match="needs params.model"):
        job([{"name": "c", "kind": "chronos"}])
    with pytest.raises((ConfigError, ValueError), match="unknown setting"):
        job([{"name": "c", "kind": "chronos", "params": {"model": "x/y", "temperature": 1}}])
    with pytest.raises((ConfigError, ValueError), match="needs JAX"):
        job([{"name": "t", "kind": "timesfm", "params": {"model": str(weights["timesfm"])}}],
            exogenous=["promo"])
    missing = job([{"name": "c", "kind": "chronos",
                    "params": {"model": str(tmp_path / "nowhere")}}])
    with pytest.raises(ConfigError, match="Unity Catalog"):
        check_job(missing, register=False)


def test_a_hub_chronos_bolt_with_exogenous_columns_is_refused_before_training(
        weights, tmp_path, monkeypatch):
    """A hub id's model is known once ``check_job`` has downloaded it (here from the
    Hugging Face cache, offline): Chronos-Bolt with exogenous columns is refused there,
    before any cluster starts; Chronos-2 passes."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    for name in ("bolt", "chronos2"):
        stored = cache / f"models--tests--{name}"
        shutil.copytree(weights[name], stored / "snapshots" / ("0" * 40))
        (stored / "refs").mkdir()
        (stored / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(pretrained, "_DOWNLOADED", {})
    forecast = {"horizon": HORIZON, "frequency": "D", "exogenous": ["promo"]}
    bolt = forecast_job(tmp_path, models=[{"name": "bolt", "kind": "chronos",
                                           "params": {"model": "tests/bolt"}}],
                        forecast=forecast)  # not known yet: the config parses
    with pytest.raises(ConfigError, match="tests/bolt is not a Chronos-2 model"):
        check_job(bolt, register=False)
    check_job(forecast_job(tmp_path, models=[{"name": "c2", "kind": "chronos", "params": {
        "model": "tests/chronos2"}}], forecast=forecast), register=False)


def promo_frame(seed: int = 4) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frames = []
    for s in range(3):
        promo = (rng.random(100) < 0.3).astype(float)
        frames.append(pd.DataFrame({"store": f"p{s}", "day": pd.date_range(
            "2024-01-01", periods=100), "sales": 20 + 10 * promo + rng.normal(size=100),
            "promo": promo}))
    return pd.concat(frames, ignore_index=True)


def test_chronos_2_forecasts_with_exogenous_columns_bolt_is_refused(weights, tmp_path):
    data = promo_frame()
    forecast = {"horizon": HORIZON, "frequency": "D", "exogenous": ["promo"]}
    with pytest.raises((ConfigError, ValueError), match="not a Chronos-2 model"):
        forecast_job(tmp_path, models=[{"name": "bolt", "kind": "chronos",
                                        "params": {"model": str(weights["bolt"])}}],
                     forecast=forecast)
    spec = plan_for(data, tmp_path, models=FAST, forecast=forecast).forecast
    kind = kind_of("chronos2", weights["chronos2"])
    params = dict(kind.candidate.params)
    frame = data[data.store == "p0"].rename(columns={"sales": "y", "day": "ds"})[
        ["ds", "y", "promo"]].reset_index(drop=True)
    origin = len(frame) - HORIZON
    found = kind.backtest(params, frame, [origin], 0, 1, spec)
    later = frame.assign(y=np.where(np.arange(len(frame)) >= origin, 1e6, frame.y))
    np.testing.assert_allclose(kind.backtest(params, later, [origin], 0, 1, spec), found,
                               rtol=1e-4, atol=1e-3)  # the target after the origin: unseen
    flipped = frame.assign(promo=np.where(np.arange(len(frame)) >= origin, 1 - frame.promo,
                                          frame.promo))
    assert not np.allclose(kind.backtest(params, flipped, [origin], 0, 1, spec), found,
                           rtol=1e-4, atol=1e-3)  # the known future promotions: read
    # stored: the context and past promotions; the next periods' promotions come with rows
    model = kind.fit_series(params, frame, 0, 1, spec)
    assert "path" not in model and len(model["past"]["promo"]) == len(model["context"])
    future = pd.DataFrame({"ds": pd.date_range(frame.ds.iloc[-1], periods=HORIZON + 1)[1:],
                           "promo": [1.0, 0.0] * 3 + [1.0]})
    meta = {"forecast": {"exogenous": ["promo"]}}
    served = kinds.resolve("chronos").forecast_loaded(model, future, meta)
    direct = kind.forecast_batch(kind.pipeline(weights["chronos2"], "cpu"), [
        pretrained.Request(frame.y.to_numpy(), {"promo": frame.promo.to_numpy()},
                           {"promo": future.promo.to_numpy()})], HORIZON, 64).points[0]
    np.testing.assert_allclose(served, direct, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def trained(ray_on_spark, spark, weights, tmp_path_factory):
    """A job as users run it: the statistical, lag and pretrained candidates together,
    ``fallback: global``, intervals at 80 and 95%, the default ensemble and shrink;
    TimesFM's weights kept by reference, the Chronos ones copied."""
    data = stores()
    models = [
        {"name": "lgbm", "kind": "lightgbm",
         "params": {"n_estimators": 20, "num_leaves": 7, "min_child_samples": 5}},
        *FAST,
        {"name": "bolt", "kind": "chronos", "params": {"model": str(weights["bolt"])}},
        {"name": "chronos2", "kind": "chronos",
         "params": {"model": str(weights["chronos2"]), "intervals": "quantiles"}},
        {"name": "timesfm", "kind": "timesfm",
         "params": {"model": str(weights["timesfm"]), "store": "reference"}},
    ]
    config = forecast_job(tmp_path_factory.mktemp("runs"), models=models, fallback="global",
                          registry={"name": "tests.pretrained.model"},
                          forecast={"horizon": HORIZON, "frequency": "D",
                                    "rolling": {"mean": [7]}, "intervals": [80, 95]})
    check_job(config)
    result = train_segments(to_ray_dataset(spark.createDataFrame(data), ["store"]), config)
    return data, result, tracking.publish(result, config)


@pytest.mark.topology  # also on executors in their own JVMs
def test_pretrained_candidates_are_backtested_and_stored_like_the_others(trained, weights):
    data, result, _ = trained
    segments = result.segments.set_index("store")
    assert (segments.status == TRAINED).all(), segments.reason
    for name in ("bolt", "chronos2", "timesfm"):
        assert segments[f"{name}_mase"].notna().all()  # judged on the same windows
    members = result.models().to_pandas()
    stored = members[members.kind.isin(["chronos", "timesfm"])]
    print("chosen:", segments.chosen.value_counts().to_dict())
    assert len(stored) > 0  # some series blend a pretrained member (else nothing is tested)
    for _, row in stored.iterrows():
        model = pickle.loads(row.payload)
        meta = json.loads(row.meta)
        history = data[data.store == row.store].sales.to_numpy()
        assert len(model["context"]) == min(len(history), 512)
        np.testing.assert_allclose(model["context"], history[-len(model["context"]):],
                                   rtol=1e-6)
        assert len(model["path"]) == HORIZON and len(meta["forecast"]["base"]) == HORIZON
        assert model["weights"]["sha256"] == pretrained.folder_digest(weights[row.candidate])


@pytest.mark.topology  # also on executors in their own JVMs
def test_the_registered_model_carries_the_weights_once_and_answers_beyond_them(
        trained, weights, tmp_path):
    data, result, publication = trained
    run = mlflow.get_run(publication.run_id)
    for name in ("bolt", "chronos2", "timesfm"):
        assert run.data.tags[f"raybricks.pretrained.{name}.sha256"] == \
            pretrained.folder_digest(weights[name])
    local = mlflow.artifacts.download_artifacts(publication.model_uri)
    carried = sorted(p.name for p in (
        Path(local) / "artifacts" / "segments" / "pretrained").iterdir())
    assert carried == sorted(pretrained.folder_digest(weights[n]) for n in ("bolt", "chronos2"))

    last = data.groupby("store").day.max()
    stores_asked = sorted(data.store.unique())
    rows = pd.DataFrame([{"store": s, "day": last[s] + pd.Timedelta(days=step)}
                         for s in stores_asked for step in range(1, 2 * HORIZON + 1)])
    members = result.models().to_pandas()
    fallback = SegmentModel.from_rows(result.fallback) if result.fallback else None
    expected = np.concatenate([
        SegmentModel.from_rows(members[members.store == s].to_dict("records"), fallback)
        .predict(rows[rows.store == s]) for s in stores_asked])
    # the copied Chronos weights gone from where they were trained: the model's copy serves
    moved = {n: weights[n].with_name(weights[n].name + "-moved") for n in ("bolt", "chronos2")}
    for name, target in moved.items():
        shutil.move(weights[name], target)
    try:
        output = predict_without_raybricks(publication.model_uri, rows, tmp_path,
                                           {"intervals": True})
    finally:
        for name, target in moved.items():
            shutil.move(target, weights[name])
    np.testing.assert_allclose(output.prediction.to_numpy(), expected, rtol=1e-5, atol=1e-5)
    assert np.isfinite(output.prediction).all()  # the second week: the models forecast it
    first_week = output[(rows.day <= rows.store.map(last) + pd.Timedelta(days=HORIZON))
                        .to_numpy()]
    assert (first_week.lo_95 <= first_week.lo_80).all()
    assert (first_week.hi_80 <= first_week.hi_95).all()


@pytest.mark.topology  # also on executors in their own JVMs
def test_forecast_command_and_spark_udf_answer_the_same_two_weeks(trained, spark, tmp_path):
    """``raybricks forecast`` beyond the stored week (the models forecast it in the Spark
    tasks) and MLflow's own ``spark_udf`` give the same forecasts."""
    data = trained[0]
    output, uri = str(tmp_path / "forecasts"), "models:/tests.pretrained.model@champion"
    forecast(uri, output, horizon=2 * HORIZON, spark=spark)
    written = spark.read.parquet(output)
    udf = mlflow.pyfunc.spark_udf(spark, uri, result_type="double", env_manager="local")
    by_udf = written.withColumn("udf", udf("store", "day")).select(
        "store", "prediction", "udf").toPandas()
    assert len(by_udf) == 2 * HORIZON * data.store.nunique()
    assert by_udf.prediction.notna().all()
    np.testing.assert_allclose(by_udf.udf.to_numpy(), by_udf.prediction.to_numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.topology  # also on executors in their own JVMs
def test_scoring_forecasts_the_series_of_a_call_together_once_per_model(
        trained, monkeypatch, tmp_path):
    """Rows beyond the stored horizon of many series: one batched call per pretrained
    model, not one per series; the same forecasts as each series alone."""
    data, result, publication = trained
    local = Path(mlflow.artifacts.download_artifacts(publication.model_uri, dst_path=str(
        tmp_path)))
    store = SegmentStore(local / "artifacts" / "segments")
    last = data.groupby("store").day.max()
    rows = pd.DataFrame([{"store": s, "day": last[s] + pd.Timedelta(days=step)}
                         for s in sorted(last.index) for step in (2, HORIZON + 3)])
    members = result.models().to_pandas()
    using = {kind: members[members.kind == kind].store.nunique()
             for kind in ("chronos", "timesfm")}
    calls = []
    for cls in (pretrained.ChronosKind, pretrained.TimesFMKind):
        original = cls.forecast_batch.__func__

        def counted(klass, pipeline, requests, horizon, batch_size, original=original):
            calls.append((klass.name, len(requests)))
            return original(klass, pipeline, requests, horizon, batch_size)

        monkeypatch.setattr(cls, "forecast_batch", classmethod(counted))
    together = store.predict(rows).values.to_numpy()
    models_used = members[members.kind.isin(["chronos", "timesfm"])].groupby(
        "candidate").store.nunique()
    assert sorted(n for _, n in calls) == sorted(models_used.tolist())  # one call a model
    assert sum(using.values()) > 0
    alone = np.concatenate([store.predict(rows[rows.store == s]).values.to_numpy()
                            for s in sorted(last.index)])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-5)


def test_weights_kept_by_reference_are_checked_against_their_checksum(weights, tmp_path):
    timesfm = kind_of("timesfm", weights["timesfm"], store="reference")
    params = dict(timesfm.candidate.params)
    spec = plan_for(stores(), tmp_path, models=FAST).forecast
    model = timesfm.fit_series(params, pd.DataFrame({"y": noisy_series()[2]}), 0, 1, spec)
    meta = {"forecast": {"exogenous": []}}
    future = pd.DataFrame({"ds": pd.date_range("2030-01-01", periods=2 * HORIZON)})
    kind = kinds.resolve("timesfm")
    ahead = kind.forecast_loaded(model, future, meta)  # beyond the path: the model runs
    assert len(ahead) == 2 * HORIZON and np.isfinite(ahead).all()
    np.testing.assert_allclose(ahead[:HORIZON], model["path"], rtol=1e-4, atol=1e-4)
    tampered = dict(model, weights=dict(model["weights"], sha256="0" * 64))
    with pytest.raises(ValueError, match="not those the model was trained with"):
        kind.forecast_loaded(tampered, future, meta)


def test_quantile_intervals_against_the_conformal_ones(ray_on_spark, spark, weights,
                                                       tmp_path):
    """One Chronos-2 per series: with ``intervals: quantiles`` the stored offsets are its
    quantiles around its forecast; with the default, conformal offsets of its backtest
    errors; both nested around the same forecast."""
    data = stores()[lambda f: f.store.isin(["season0", "noise1", "season2"])]
    found = {}
    for method in ("quantiles", "conformal"):
        config = forecast_job(tmp_path / method, models=[
            {"name": "chronos2", "kind": "chronos",
             "params": {"model": str(weights["chronos2"]), "intervals": method}}],
            forecast={"horizon": HORIZON, "frequency": "D", "intervals": [80, 95]})
        result = train_segments(to_ray_dataset(spark.createDataFrame(data), ["store"]),
                                config)
        members = result.models().to_pandas().set_index("store")
        found[method] = {s: json.loads(members.loc[s, "meta"])["forecast"]
                         for s in members.index}
        assert (result.segments.status == TRAINED).all()
    kind = kind_of("chronos2", weights["chronos2"])
    spec = plan_for(data, tmp_path, models=FAST).forecast
    for store in found["quantiles"]:
        quantile, conformal = found["quantiles"][store], found["conformal"][store]
        assert quantile["base"] == pytest.approx(conformal["base"])
        assert quantile["intervals"]["method"] == "quantiles"
        assert "method" not in conformal["intervals"]
        q, c = (np.asarray(x["intervals"]["offsets"]) for x in (quantile, conformal))
        assert q.shape == c.shape == (4, HORIZON)
        for offsets in (q, c):
            assert (np.diff(offsets, axis=0) >= -1e-9).all()
        assert not np.allclose(q, c)
        # the conformal ones: of the backtest's absolute errors, recomputed here
        frame = pd.DataFrame({"y": data[data.store == store].sales.to_numpy(dtype="float64")})
        origins = windows(len(frame), spec)
        forecasts = kind.backtest({"model": str(weights["chronos2"])}, frame, origins, 0, 1,
                                  spec)
        actual = np.concatenate([frame.y.to_numpy()[o:o + HORIZON] for o in origins])
        errors = np.abs(actual - forecasts).reshape(-1, HORIZON)
        np.testing.assert_allclose(c, conformal_offsets(errors, [80, 95], interval_neighbours(
            HORIZON)), rtol=1e-4, atol=1e-4)


#: A forecasting job whose Chronos candidate asks for a GPU, on a local Ray of two CPUs
#: and two GPUs that do not exist (Ray schedules by the numbers it is given).
GPU_JOB = """
    import json, sys
    import pandas as pd
    import pyarrow as pa
    import ray
    from raybricks.cluster import ray_cluster
    from raybricks.config import ClusterConfig
    from raybricks.data import SegmentedDataset, cut_into_blocks, sort_by_segment
    from raybricks.training import train_segments
    from tests.test_forecast import FAST, forecast_job, stores

    frame = stores()
    table = sort_by_segment(pa.Table.from_pandas(frame, preserve_index=False), ["store"])
    blocks, segments = cut_into_blocks(table, ["store"], 400)
    models = [*FAST, {"name": "bolt", "kind": "tests.wrappedkinds.RecordingChronos",
                      "params": {"model": sys.argv[2]}, "resources": {"num_gpus": 1}}]
    config = forecast_job(sys.argv[1], models=models)
    with ray_cluster(ClusterConfig(mode="local", num_cpus=2, num_gpus_head_node=2),
                     gpus=config.gpu_candidates()):
        dataset = SegmentedDataset([ray.put(b) for b in blocks], ["store"], "arrow",
                                   table.num_rows, table.schema, segments)
        result = train_segments(dataset, config)
    print("statuses", json.dumps(result.segments.status.value_counts().to_dict()))
    print("scored", int(result.segments["bolt_mase"].notna().sum()))
"""


@pytest.mark.heavy
def test_a_gpu_candidate_forecasts_on_the_gpu_its_task_holds(weights, tmp_path):
    from tests.test_gpu import run

    fits = tmp_path / "fits.jsonl"
    done = run(GPU_JOB.replace('sys.argv[2]', repr(str(weights["bolt"]))), tmp_path,
               RAYBRICKS_TEST_FITS=str(fits))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines()
                 if line.startswith(("statuses ", "scored ")))
    assert json.loads(lines["statuses"]) == {"trained": 13}
    assert int(lines["scored"]) == 13
    loads = [json.loads(line) for line in fits.read_text().splitlines()]
    in_tasks = [f for f in loads if f["gpu_ids"]]
    assert in_tasks and all(f["device"] == "cuda" for f in in_tasks)
    # one load per process (on the device its tasks use), not per series or block
    processes = [f["candidate"] for f in in_tasks]
    assert len(processes) == len(set(processes))


@pytest.mark.topology  # also on executors in their own JVMs
def test_a_merged_version_carries_the_weights_its_series_need(trained, weights, tmp_path):
    """``registry.promote: merge`` (after the other tests: it moves the champion): the
    merged version carries the copied weights, and answers as the version before."""
    data, result, first = trained
    config = forecast_job(tmp_path, models=[{"name": "ets", "kind": "statsforecast",
                                             "estimator": "AutoETS"}],
                          registry={"name": "tests.pretrained.model", "promote": "merge"},
                          forecast={"horizon": HORIZON, "frequency": "D",
                                    "intervals": [80, 95]})
    merged = tracking.publish(result, config)
    assert merged.champion_version not in (None, first.version)
    uri = f"models:/tests.pretrained.model/{merged.champion_version}"
    local = Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "m")))
    carried = sorted(p.name for p in (local / "artifacts" / "segments" / "pretrained")
                     .iterdir())
    assert carried == sorted(pretrained.folder_digest(weights[n]) for n in ("bolt", "chronos2"))
    last = data.groupby("store").day.max()
    rows = pd.DataFrame([{"store": s, "day": last[s] + pd.Timedelta(days=step)}
                         for s in sorted(last.index) for step in (1, HORIZON + 2)])
    before = mlflow.pyfunc.load_model(f"models:/tests.pretrained.model/{first.version}")
    after = mlflow.pyfunc.load_model(uri)
    np.testing.assert_allclose(after.predict(rows).to_numpy(),
                               before.predict(rows).to_numpy(), rtol=1e-9)
