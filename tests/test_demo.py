"""The demo's own code path on a few routes: table, Ray, training, registry, scoring."""

from __future__ import annotations

import pytest

from raybricks import flights_demo as demo


# heavy: the demo runs on the lock's versions (make demo); ~57 s
@pytest.mark.heavy
def test_demo_trains_registers_scores_and_promotes_on_a_second_run(ray_on_spark, spark,
                                                                  capsys):
    from mlflow import MlflowClient

    routes = "origin = 'EWR' and dest in ('BOS', 'ORD', 'LAX', 'MSP')"
    overrides = [f"source.where=month <= 10 and {routes}",
                 "registry.name=tests.demo.route_delay", "tracking.experiment=tests-demo"]
    assert demo.run(overrides=overrides) == 0
    first = capsys.readouterr().out
    assert "routes: 4 trained, 0 skipped, 0 failed" in first
    assert "promotion (if_better): promoted, first version" in first
    held_out = spark.table(demo.HOLDOUT_TABLE).count()
    scored = spark.table(demo.SCORED_TABLE)
    assert scored.count() == held_out  # every held-out flight, known route or not
    statuses = {r["segment_status"] for r in scored.select("segment_status").collect()}
    assert statuses == {"trained", "unknown"}
    assert scored.where("prediction is null").count() == 0  # the fallback covers the rest

    assert demo.run(overrides=overrides) == 0  # again: the second version meets the gate
    second = capsys.readouterr().out
    assert "promotion (if_better): promoted, not worse on common segments" in second
    client = MlflowClient()
    champion = client.get_model_version_by_alias("tests.demo.route_delay", "champion")
    assert str(champion.version) == "2"
    assert spark.sparkContext._jsc is not None  # the session's Spark is left running
