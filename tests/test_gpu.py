"""GPU candidates, on a Ray whose nodes declare GPUs that do not exist (Ray schedules by
the numbers it is given, as with real ones): where each candidate was fitted, what its
library was told, and the refusals of a job whose Ray has no GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from raybricks.cluster import SparkCapacity, ray_on_spark_arguments, require_gpus, spark_gpus
from raybricks.config import ClusterConfig
from raybricks.errors import ClusterError

#: A job of CPU and GPU candidates, trained on a local Ray of two CPUs and two GPUs.
GPU_JOB = """
    import json, sys
    import pyarrow as pa
    import ray
    from raybricks.cluster import ray_cluster
    from raybricks.config import ClusterConfig, JobConfig
    from raybricks.data import SegmentedDataset, cut_into_blocks, sort_by_segment
    from raybricks.training import train_segments
    from tests import helpers

    def dataset(frame):
        table = sort_by_segment(pa.Table.from_pandas(frame, preserve_index=False), ["store"])
        blocks, segments = cut_into_blocks(table, ["store"], 400)
        return SegmentedDataset([ray.put(b) for b in blocks], ["store"], "arrow",
                                table.num_rows, table.schema, segments)

    models = [
        {"name": "cpu", "kind": "tests.wrappedkinds.WhereFitted"},
        {"name": "gpu", "kind": "tests.wrappedkinds.WhereFitted", "resources": {"num_gpus": 1}},
        {"name": "xgb", "kind": "tests.wrappedkinds.RecordingXGBoost",
         "params": {"n_estimators": 5}, "resources": {"num_gpus": 1}},
    ]
    def job(chosen):
        return JobConfig.from_dict({
            "source": {"table": "unused"}, "segment_by": ["store"], "target": "y",
            "features": ["x1", "x2"], "models": chosen, "min_rows": 20,
            "ensemble": "mean", "selection": "local_only",
            "training": {"output_dir": sys.argv[1], "progress": False},
        })

    cluster = ClusterConfig(mode="local", num_cpus=2, num_gpus_head_node=2)
    with ray_cluster(cluster, gpus=job(models).gpu_candidates()):
        for name, chosen in [("mixed", models), ("gpu_only", models[1:])]:
            result = train_segments(dataset(helpers.shops()), job(chosen))
            segments, members = result.segments, result.models().to_pandas()
            print(name, json.dumps({
                "statuses": segments["status"].value_counts().to_dict(),
                "scored": {c["name"]: int(segments[f"{c['name']}_rmse"].notna().sum())
                           for c in chosen},
                "members": sorted(set(members["candidate"])),
                "stored": [json.loads(p) for k, p in zip(members["kind"], members["payload"])
                           if k.endswith("WhereFitted")],
            }))
"""


def run(code: str, tmp_path, **env: str) -> subprocess.CompletedProcess:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in [root, os.environ.get("PYTHONPATH", "")] if p)
    inherited = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own Ray
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=root,
                          env=inherited | {"PYTHONPATH": path, "RAY_AUTH_MODE": "disabled"} | env)


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory):
    """Both jobs' summaries by name, and every fit's record (candidate, device, GPUs)."""
    tmp = tmp_path_factory.mktemp("gpu")
    fits = tmp / "fits.jsonl"
    done = run(GPU_JOB, tmp, RAYBRICKS_TEST_FITS=str(fits))
    assert done.returncode == 0, done.stderr[-3000:]
    runs = dict(line.split(" ", 1) for line in done.stdout.splitlines()
                if line.startswith(("mixed ", "gpu_only ")))
    return ({name: json.loads(summary) for name, summary in runs.items()},
            [json.loads(line) for line in fits.read_text().splitlines()])


@pytest.mark.heavy
def test_gpu_candidates_fit_in_tasks_holding_gpus_cpu_ones_in_tasks_holding_none(gpu_runs):
    runs, fits = gpu_runs
    by_candidate = {name: [f for f in fits if f["candidate"] == name]
                    for name in ("cpu", "gpu", "xgb")}
    assert all(by_candidate.values())
    assert all(f["gpu_ids"] and f["device"] == "cuda" for f in by_candidate["gpu"])
    assert all(not f["gpu_ids"] and f["device"] == "cpu" for f in by_candidate["cpu"])
    # XGBoost's estimator was given device=cuda with the hist tree method
    assert all(f["gpu_ids"] and (f["device"], f["tree_method"]) == ("cuda", "hist")
               for f in by_candidate["xgb"])


@pytest.mark.heavy
def test_selection_sees_every_candidate_and_stores_where_it_was_fitted(gpu_runs):
    runs, _ = gpu_runs
    mixed = runs["mixed"]
    trained = mixed["statuses"]["trained"]
    assert trained == 8  # the shops' eight regular stores; the others skipped
    # every candidate's validation score reached the segment's selection
    assert mixed["scored"] == {"cpu": trained, "gpu": trained, "xgb": trained}
    assert {"cpu", "gpu"} <= set(mixed["members"])  # ensemble: mean of the best ones
    stored = {(m["device"], bool(m["gpu_ids"])) for m in mixed["stored"]}
    assert stored == {("cpu", False), ("cuda", True)}  # the GPU one refitted on its task
    only = runs["gpu_only"]
    assert only["statuses"]["trained"] == 8
    assert {(m["device"], bool(m["gpu_ids"])) for m in only["stored"]} == {("cuda", True)}


def test_xgboost_model_fitted_for_cuda_predicts_on_a_cpu_host():
    import numpy as np
    import pandas as pd

    from raybricks.config import CandidateConfig
    from raybricks.kinds import of

    kind = of(CandidateConfig(name="xgb", kind="xgboost", resources={"num_gpus": 1}))
    X = pd.DataFrame({"a": np.arange(50.0), "b": np.arange(50.0) % 7})
    params = kind.device_params("cuda") | {"n_estimators": 5}
    model = kind.fit(params, X, X["a"].to_numpy(), "regression", 0, 1, {})  # here on CPU
    assert model.get_params()["device"] == "cuda"
    payload = kind.serialize(model)
    assert b"cuda" not in payload  # the stored model names no device
    loaded = type(kind).load(payload, {})
    predicted = type(kind).predict_loaded(loaded, X, {"task": "regression"})
    assert np.allclose(predicted, model.predict(X), atol=1e-5)


def capacity(**changes) -> SparkCapacity:
    base = {"local_mode": False, "workers": 2, "slots_per_worker": 4, "cores_per_worker": 4,
            "task_cpus": 1}
    return SparkCapacity(**(base | changes))


class Conf(dict):
    def get(self, key, default=None):
        return super().get(key, default)


def test_ray_on_spark_gets_the_gpus_spark_gives_its_executors():
    assert spark_gpus(Conf({"spark.executor.resource.gpu.amount": "4",
                            "spark.task.resource.gpu.amount": "0.5"})) == {
        "gpus_per_worker": 4, "task_gpus": 0.5}
    assert spark_gpus(Conf()) == {"gpus_per_worker": 0, "task_gpus": 0.0}
    # Spark's tasks need no GPU: Ray's worker node takes every GPU of its Spark worker
    args = ray_on_spark_arguments(ClusterConfig(), capacity(gpus_per_worker=4))
    assert args["num_gpus_worker_node"] == 4
    # Spark's tasks need one GPU each: one task's stays with Spark
    args = ray_on_spark_arguments(ClusterConfig(), capacity(gpus_per_worker=4, task_gpus=1))
    assert args["num_gpus_worker_node"] == 3
    # one GPU per worker, and Spark's tasks need it: Ray gets none
    args = ray_on_spark_arguments(ClusterConfig(), capacity(gpus_per_worker=1, task_gpus=1))
    assert args["num_gpus_worker_node"] == 0
    assert ray_on_spark_arguments(ClusterConfig(), capacity())["num_gpus_worker_node"] == 0
    # what the config says wins, unless Spark cannot have it
    args = ray_on_spark_arguments(ClusterConfig(num_gpus_worker_node=2),
                                  capacity(gpus_per_worker=4))
    assert args["num_gpus_worker_node"] == 2
    with pytest.raises(ClusterError, match="more than a Spark worker's GPUs"):
        ray_on_spark_arguments(ClusterConfig(num_gpus_worker_node=8),
                               capacity(gpus_per_worker=4))
    with pytest.raises(ClusterError, match="spark.task.resource.gpu.amount 0"):
        ray_on_spark_arguments(ClusterConfig(num_gpus_worker_node=1),
                               capacity(gpus_per_worker=1, task_gpus=1))


def test_gpu_job_refused_where_ray_would_have_no_gpu():
    require_gpus({}, 0, "anywhere")
    require_gpus({"gpu": 1}, 2, "a Ray of two GPUs per node")
    with pytest.raises(ClusterError, match=r"gpu: 1\).* has 0 GPU\(s\) per node"):
        require_gpus({"gpu": 1}, 0, "Ray")


def test_gpu_job_refused_before_ray_starts_on_a_spark_without_gpus(spark):
    from raybricks.cluster import _start_on_spark

    with pytest.raises(ClusterError, match="spark.executor.resource.gpu.amount=0"):
        _start_on_spark(ClusterConfig(mode="spark"), spark, {}, {"gpu": 1})


#: A GPU job refused by a local Ray without GPUs (before it starts) and by a Ray it is
#: connected to that has none (right after connecting).
REFUSALS = """
    import ray
    from raybricks.cluster import ray_cluster
    from raybricks.config import ClusterConfig
    from raybricks.errors import ClusterError
    try:
        with ray_cluster(ClusterConfig(mode="local", num_cpus=1), gpus={"gpu": 1}):
            pass
    except ClusterError as exc:
        print("LOCAL", ray.is_initialized(), exc)
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    try:
        with ray_cluster(ClusterConfig(mode="auto"), gpus={"gpu": 1}):
            pass
    except ClusterError as exc:
        print("ATTACHED", exc)
"""


def test_gpu_job_refused_by_a_ray_without_gpus(tmp_path):
    done = run(REFUSALS, tmp_path)
    assert "LOCAL False candidate(s) ask for GPUs" in done.stdout, done.stderr[-3000:]
    assert "ATTACHED candidate(s) ask for GPUs (resources.num_gpus: gpu: 1) but the Ray " \
        "cluster at" in done.stdout
