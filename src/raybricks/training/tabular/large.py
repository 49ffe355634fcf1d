"""Large segments: data-parallel training (XGBoost, LightGBM) with Ray Train.

A segment with more rows than ``training.large_segment_rows`` is not trained inside a
packed task. Its rows are split (the same validation split as any segment) in one task,
and each candidate whose kind trains data-parallel (``ModelKind.data_parallel``: the
``xgboost`` and ``lightgbm`` kinds) is fitted with the kind's Ray Train trainer across
``training.large_segment_workers`` workers, evaluated on the validation rows, ensembled
as configured, and refitted on all rows when ``refit`` is on. Candidates of other kinds
are not fitted for large segments (the result row says so); with no data-parallel
candidate at all, the segment is trained in one task like any other. The results land in
the same tables as every other segment.

A data-parallel candidate with a ``search`` space is tuned first with Ray Tune: one trial per
setting (the same grid or seeded random draws as small segments; with ``search_method:
bayes``, ``trials`` settings asked of Optuna's seeded TPE sampler through Ray Tune's
``OptunaSearch``), each a single-worker fit on the training rows that reports the
validation loss after every boosting round, with the ASHA scheduler stopping the poor
trials early; the best setting is then fitted data-parallel as above.

A lost worker does not lose a fit: rank 0 reports the booster as a Ray Train checkpoint
every ``training.large_segment_checkpoint_rounds`` rounds, and Ray Train restarts the
workers (up to ``training.large_segment_max_failures`` times), which continue boosting
the checkpoint's booster for the remaining rounds. Tune trials are retried as often, from
their start.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from raybricks import kinds, metrics
from raybricks.compat import train_scaling, tune_report, tune_run_config
from raybricks.config import CandidateConfig, JobConfig
from raybricks.kinds import prepare_features
from raybricks.results import Outcome
from raybricks.segmented_model import MemberModel
from raybricks.training import recipe
from raybricks.training.plan import Plan, needs_gpus, on_device, segment_rows, stable_seed
from raybricks.training.recipe import Chosen, Unit
from raybricks.training.search import (
    DEFAULT_TRIALS,
    bayes_sampler,
    sequential,
    startup_trials,
    suggest,
    trial_settings,
)
from raybricks.training.selection import (
    Evaluation,
    SegmentResult,
    Skip,
    keyed_members,
    member_row,
    members_table,
    result_for_error,
    results_table,
    summarize,
)
from raybricks.training.tabular import segment as seg

log = logging.getLogger(__name__)

LABEL = "__label__"
MODEL_FILE = "model.bin"
ROUND_FILE = "round"


def data_parallel(candidate: CandidateConfig) -> bool:
    """Whether the candidate's kind trains data-parallel with Ray Train."""
    return kinds.resolve(candidate.kind).data_parallel


def train_large_segments(refs, large_keys, plan: Plan, config: JobConfig, run_dir: Path):
    """Train every large segment; write its result row and members like the engine does."""

    for block_ref, keys in zip(refs, large_keys, strict=True):
        for key in keys:
            log.info("large segment %s: data-parallel training with Ray Train", key)
            try:
                row, members = train_large_segment(block_ref, key, plan, config, run_dir)
            except Exception as exc:  # noqa: BLE001 - a bad segment never stops the job
                row, members = result_for_error(exc, key), []
            Outcome.of(
                results_table([row], plan),
                members_table(keyed_members(plan, key, members), plan),
            ).write(run_dir, f"part-large-{uuid.uuid4().hex[:10]}")


def train_one_segment(block: pa.Table, plan: Plan, key: tuple):
    """Ray task body: a large segment without boosting candidates, trained in one task."""

    return seg.train_segment(segment_rows(block, plan, key), key, plan)


def split_segment(block: pa.Table, plan: Plan, key: tuple):
    """Ray task body: the segment's training rows, validation rows, and what the driver
    needs (model metadata, splits' targets, baseline, and the evaluations and members of
    what competes beside the candidates: the baseline and the global model; or only
    ``skip``, the reason it cannot be trained)."""

    try:
        prep = seg.prepare(segment_rows(block, plan, key), plan, key)
    except Skip as skip:
        return None, None, {"skip": str(skip)}
    train, valid = prep.splits[0]
    table = pa.Table.from_pandas(prep.X.assign(**{LABEL: prep.y}), preserve_index=False)
    holdout = dataclasses.replace(prep, splits=[(train, valid)])
    pool = [seg.evaluate(holdout, c, plan, key) for c in plan.pool]
    if plan.global_members:
        pool.append(seg.evaluate_global(holdout, plan, key))
    info = {
        "meta": prep.meta,
        "n_rows": prep.n_rows,
        "y_valid": prep.y[valid],
        "baseline": seg.baseline(holdout, plan),
        "pool": pool,  # refitted on all rows where the plan says so, as any member
        "pool_members": {e.candidate.name: seg.member_rows(prep, [(e, 1.0)], plan, key)
                         for e in pool if e.error is None},
        "profile": seg.segment_profile(holdout, plan),
    }
    return table.take(train), table.take(valid), info


def worker_shard(config: dict) -> pd.DataFrame:
    """This worker's share of the training rows (every world_size-th row from its rank).

    The rows come from object references rather than a Ray Dataset: dataset ingest needs
    CPUs that the training workers hold, which stalls small clusters.
    """
    import ray
    import ray.train

    context = ray.train.get_context()
    table = pa.concat_tables(ray.get(config["tables"]))
    rows = np.arange(context.get_world_rank(), table.num_rows, context.get_world_size())
    return table.take(rows).to_pandas()


def report_model(model: Callable[[], bytes], progress: dict[str, int]) -> None:
    """Report the model so far with ``progress`` (rank 0 carries the model and its round
    as a checkpoint); every worker calls this after the same rounds.

    Reporting after every boosting round, as Ray's callbacks do, costs a synchronisation
    each round; every ``training.large_segment_checkpoint_rounds`` rounds and once at the
    end is all this path needs.
    """
    import ray.train

    with tempfile.TemporaryDirectory() as directory:
        if ray.train.get_context().get_world_rank() == 0:
            (Path(directory) / MODEL_FILE).write_bytes(model())
            (Path(directory) / ROUND_FILE).write_text(str(progress["round"]))
            ray.train.report(progress, checkpoint=ray.train.Checkpoint.from_directory(directory))
        else:
            ray.train.report(progress)


def resume_point() -> tuple[int, bytes | None]:
    """The rounds done and the model of the fit's last checkpoint ((0, None) on a first
    start; after Ray Train restarted the workers, where the lost ones were)."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0, None
    with checkpoint.as_directory() as directory:
        return (int((Path(directory) / ROUND_FILE).read_text()),
                (Path(directory) / MODEL_FILE).read_bytes())


class Checkpoints:
    """A kind's ``after_round``: counts the rounds from ``start`` and reports the model as a
    checkpoint every ``every`` rounds (0: never) before the last."""

    def __init__(self, start: int, rounds: int, every: int) -> None:
        self.start, self.done, self.rounds, self.every = start, start, rounds, every

    def __call__(self, model: Callable[[], bytes]) -> None:
        self.done += 1
        if self.every and self.done % self.every == 0 and self.done < self.rounds:
            report_model(model, self.progress())

    def progress(self) -> dict[str, int]:
        """What every report carries: the rounds done, and the round this start began at."""
        return {"round": self.done, "start": self.start}


def resumable(kind: Any) -> bool:
    """Whether the kind's ``fit_shard`` continues a model and reports its rounds."""
    return {"init", "after_round"} <= set(inspect.signature(kind.fit_shard).parameters)


def _train_worker(config: dict) -> None:
    """Ray Train worker loop: the kind's fit on this worker's shard of the training rows,
    continued from the last checkpoint when Ray Train restarted the workers."""
    frame = worker_shard(config)
    kind = kinds.of(config["candidate"])
    features = prepare_features(frame, config["meta"])
    rounds = config["rounds"]
    start, payload = resume_point()
    checkpoints = Checkpoints(start, rounds, config["every"])
    if start < rounds:  # (a kind without checkpoints reports none: it starts over)
        resume = {"init": payload, "after_round": checkpoints} if resumable(kind) else {}
        payload = kind.fit_shard(features, frame[LABEL], on_device(kind, config["params"]),
                                 rounds - start, **resume)
    checkpoints.done = rounds
    report_model(lambda: payload, checkpoints.progress())


def fit_data_parallel(
    candidate: CandidateConfig, tables: list, meta: dict, plan: Plan, config: JobConfig,
    storage: Path,
) -> bytes:
    """Fit one candidate across the cluster with Ray Train on the rows of ``tables``
    (object references to Arrow tables); returns the native model bytes."""
    import ray.train

    kind = kinds.of(candidate)
    params, rounds = kind.native_params(candidate.params, plan.task,
                                        len(meta.get("classes") or []))
    params["seed"] = stable_seed(plan.seed, candidate.name, "large")
    training = config.training
    loop_config = {"params": params, "rounds": rounds, "meta": meta, "tables": tables,
                   "candidate": candidate, "every": training.large_segment_checkpoint_rounds}
    scaling = train_scaling(
        num_workers=training.large_segment_workers,
        resources_per_worker=task_resources(candidate),
        use_gpu=needs_gpus(candidate),
    )
    run = ray.train.RunConfig(
        storage_path=str(storage.resolve()), name=f"{candidate.name}-{uuid.uuid4().hex[:8]}",
        # a lost worker: Ray Train restarts the workers, which resume from the checkpoint
        failure_config=ray.train.FailureConfig(max_failures=training.large_segment_max_failures),
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1))
    trainer = kind.ray_trainer()(
        _train_worker, train_loop_config=loop_config, scaling_config=scaling, run_config=run)
    result = trainer.fit()
    if result.metrics.get("start"):
        log.warning("%s: Ray Train restarted its workers after a failure; the fit resumed "
                    "from its checkpoint at round %d of %d", candidate.name,
                    result.metrics["start"], rounds)
    with result.checkpoint.as_directory() as directory:
        return (Path(directory) / MODEL_FILE).read_bytes()


def _tune_trial(config: dict, candidate: CandidateConfig, task: str, meta: dict,
                train_rows: pa.Table, valid_rows: pa.Table) -> None:
    """Ray Tune trial: fit one setting on the training rows, reporting the validation loss
    after every boosting round (so ASHA can stop it early)."""
    train, valid = train_rows.to_pandas(), valid_rows.to_pandas()
    kind = kinds.of(candidate)
    params, rounds = kind.native_params(candidate.params | config["setting"], task,
                                        len(meta.get("classes") or []))
    kind.fit_reporting((prepare_features(train, meta), train[LABEL]),
                       (prepare_features(valid, meta), valid[LABEL]), on_device(kind, params),
                       rounds, task, lambda loss: tune_report({"loss": loss}))


def task_resources(candidate: CandidateConfig) -> dict[str, float]:
    """The Ray resources of one of the candidate's workers or trials (its GPUs too)."""
    resources = {"CPU": candidate.resources.num_cpus}
    if needs_gpus(candidate):
        resources["GPU"] = candidate.resources.num_gpus
    return resources


def tune_candidate(candidate: CandidateConfig, train_ref, valid_ref, meta: dict, plan: Plan,
                   storage: Path, max_failures: int = 0) -> dict[str, Any]:
    """Search the candidate's space on a large segment with Ray Tune and ASHA (the grid or
    random settings, or Optuna's TPE sampler through ``OptunaSearch`` for bayes); returns
    the best setting (scikit-learn style parameters). A trial whose worker is lost is run
    again from its start, up to ``max_failures`` times."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    seed = stable_seed(plan.seed, candidate.name, "tune")
    _, rounds = kinds.of(candidate).native_params(candidate.params, plan.task,
                                                   len(meta.get("classes") or []))
    trainable = tune.with_resources(
        # with_parameters hands the trials the tables behind the references
        tune.with_parameters(_tune_trial, candidate=candidate, task=plan.task, meta=meta,
                             train_rows=train_ref, valid_rows=valid_ref),
        task_resources(candidate),
    )
    scheduler = ASHAScheduler(max_t=max(rounds, 1), grace_period=max(rounds // 10, 1),
                              reduction_factor=2)
    if sequential(candidate):
        space, searcher = {}, bayes_searcher(candidate, seed)
        samples = candidate.trials or DEFAULT_TRIALS
    else:
        space = {"setting": tune.grid_search(trial_settings(candidate, seed))}
        searcher, samples = None, 1
    tuner = tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler,
                                    search_alg=searcher, num_samples=samples),
        run_config=tune_run_config(storage_path=str(storage.resolve()), verbose=0,
                                  name=f"tune-{candidate.name}-{uuid.uuid4().hex[:8]}",
                                  max_failures=max_failures),
    )
    best = tuner.fit().get_best_result(metric="loss", mode="min", scope="last")
    return best.config["setting"]


def bayes_searcher(candidate: CandidateConfig, seed: int):
    """Ray Tune's ``OptunaSearch`` over the candidate's space (``search.suggest``: each
    trial's config holds its ``setting``), with the seeded TPE sampler of small segments;
    at most as many trials at once as TPE's random start, so the later ones are asked
    knowing the scores of the earlier ones."""
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    sampler = bayes_sampler(candidate, seed)
    searcher = OptunaSearch(space=functools.partial(_trial_setting, candidate=candidate),
                            metric="loss", mode="min", sampler=sampler)
    trials = candidate.trials or DEFAULT_TRIALS
    return ConcurrencyLimiter(searcher, max_concurrent=startup_trials(trials))


def _trial_setting(trial: Any, candidate: CandidateConfig) -> dict[str, Any]:
    """OptunaSearch's define-by-run space (a partial of it pickles with the searcher's
    state): the trial's setting, as the grid's trials hold theirs."""
    return {"setting": suggest(trial, candidate)}


def predict_rows(kind: str, payload: bytes, meta: dict, table: pa.Table) -> np.ndarray:
    """Ray task body: a stored model's predictions for the validation rows."""
    return MemberModel(kind, payload, meta).predict(table.to_pandas())


def train_large_segment(
    block_ref, key: tuple, plan: Plan, config: JobConfig, run_dir: Path
) -> tuple[SegmentResult, list[dict[str, Any]]]:
    """One large segment: the recipe with Ray Train as the evaluator (``LargeSegment``),
    or, without a data-parallel candidate, one Ray task like any segment."""
    import ray

    if not any(data_parallel(c) for c in plan.candidates):
        gpus = max(c.resources.num_gpus for c in plan.candidates)
        return ray.get(ray.remote(num_gpus=gpus)(train_one_segment).remote(block_ref, plan,
                                                                            key))
    return recipe.train(LargeSegment(block_ref, key, plan, config, run_dir))


class LargeSegment(Unit):
    """A segment too large for one task, as the recipe trains it: split on a Ray task
    (``split_segment``: the training and validation rows in the object store, the
    baseline and the global model already scored), each data-parallel candidate searched
    with Ray Tune and fitted with Ray Train (the evaluator), the choice refitted with Ray
    Train on all rows. Candidates that do not train data-parallel are left out, noted."""

    def __init__(self, block_ref: Any, key: tuple, plan: Plan, config: JobConfig,
                 run_dir: Path) -> None:
        super().__init__(key, plan, self.fit_data_parallel, 0)
        self.block_ref, self.config, self.run_dir = block_ref, config, run_dir
        self.storage = run_dir / "ray_train"

    def prepare(self) -> tuple[Any, Any, dict[str, Any]]:
        import ray

        train_ref, valid_ref, info_ref = ray.remote(num_returns=3)(split_segment).remote(
            self.block_ref, self.plan, self.key)
        info = ray.get(info_ref)
        if "skip" in info:
            raise Skip(info["skip"])
        return train_ref, valid_ref, info

    def rows(self, prepared: tuple) -> int:
        return prepared[2]["n_rows"]

    def fit_data_parallel(self, prepared: tuple, candidate: CandidateConfig) -> Evaluation:
        """The evaluator: Ray Tune's search (with ``search``), then Ray Train's fit on the
        training rows, scored on the validation rows."""
        import ray

        if not data_parallel(candidate):
            return Evaluation(candidate, error="not data-parallel: left out of a large segment")
        train_ref, valid_ref, info = prepared
        meta, plan = info["meta"], self.plan
        try:
            if candidate.search:
                best = tune_candidate(candidate, train_ref, valid_ref, meta, plan,
                                      self.run_dir / "ray_tune",
                                      self.config.training.large_segment_max_failures)
                candidate = seg.replace_search(candidate, best)
            payload = fit_data_parallel(candidate, [train_ref], meta, plan, self.config,
                                        self.storage)
            predictions = ray.get(ray.remote(predict_rows).remote(candidate.kind, payload,
                                                                  meta, valid_ref))
            value = metrics.metric(plan.metric).score(info["y_valid"], predictions)
        except Exception as exc:  # noqa: BLE001 - one candidate failing is recorded
            return Evaluation(candidate, error=f"{type(exc).__name__}: {exc}")
        return Evaluation(candidate, candidate.params, value, predictions, [payload])

    def rivals(self, prepared: tuple) -> list[Evaluation]:
        return prepared[2]["pool"]

    def profile(self, prepared: tuple) -> dict[str, Any]:
        return prepared[2]["profile"]

    def select(self, prepared: tuple, row: SegmentResult, evaluations: list[Evaluation]
               ) -> Chosen:
        info = prepared[2]
        chosen = summarize(row, evaluations, info["y_valid"], info["baseline"], self.plan)
        skipped = [c.name for c in self.plan.candidates if not data_parallel(c)]
        if skipped:  # after the selection's own (summarize), if it wrote one
            row.reason = "; ".join([*([row.reason] if row.reason else []),
                                    f"large segment: not data-parallel, not fitted: {skipped}"])
        return chosen

    def members(self, prepared: tuple, chosen: Chosen) -> list[dict[str, Any]]:
        train_ref, valid_ref, info = prepared
        meta, members = info["meta"], []
        for evaluation, weight in chosen:
            if evaluation.candidate.name in info["pool_members"]:  # the baseline, the global
                stored = info["pool_members"][evaluation.candidate.name]
                if len(chosen) > 1 and not stored:  # the global model alone stores nothing
                    stored = [member_row(evaluation.candidate, 1.0, {}, b"", meta)]
                members += [member | {"weight": float(weight)} for member in stored]
                continue
            payload = (fit_data_parallel(evaluation.candidate, [train_ref, valid_ref], meta,
                                         self.plan, self.config, self.storage)
                       if self.plan.refit else evaluation.split_models[0])
            members.append(member_row(evaluation.candidate, weight, evaluation.params,
                                      payload, meta))
        return members
