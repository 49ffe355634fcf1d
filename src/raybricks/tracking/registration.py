"""Registration and promotion: the job's model becomes a version of ``registry.name`` with
the alias ``challenger``, and ``registry.promote`` (always, if_better, merge) decides
whether it becomes the champion. The aliases move last: a failure before that removes
the versions the call created. ``register_run`` is the retry from a logged run."""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from raybricks import segmented_model
from raybricks.compat import log_run_metrics, model_version_source, resumed_run
from raybricks.config import JobConfig
from raybricks.errors import key_text
from raybricks.packaging import Packaged, compare, merge_segments
from raybricks.tracking.model import RegistryError, log_segmented_model
from raybricks.tracking.target import configure_tracking

log = logging.getLogger(__name__)

CHALLENGER = "challenger"
MERGED_MODEL_NAME = "merged_model"


@dataclass
class Publication:
    """What publishing a training result did in MLflow."""

    run_id: str
    experiment_id: str
    model_uri: str  # the logged model
    name: str
    version: str | None  # the challenger version (None: nothing registered)
    champion_version: str | None
    decision: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """What a person wants to read after a job: run, version, the promotion."""
        lines = [f"MLflow run {self.run_id} (experiment {self.experiment_id})"]
        if self.version is None:
            lines.append(f"not registered: {self.decision.get('decision')}")
            return "\n".join(lines)
        lines.append(f"registered {self.name} version {self.version} (alias {CHALLENGER})")
        decision = self.decision
        text = f"promotion ({decision['rule']}): {decision['decision']}"
        if "reason" in decision:
            text += f", {decision['reason']}"
        comparison = decision.get("comparison")
        if comparison:
            text += (f"; {comparison['metric']} on {comparison['common_segments']} common "
                     f"segments: challenger {comparison['challenger_mean']:.4g} vs champion "
                     f"{comparison['champion_mean']:.4g}")
        lines.append(text)
        lines.append(f"champion: {self.name} version {self.champion_version}")
        return "\n".join(lines)


def _client():
    from mlflow import MlflowClient

    return MlflowClient()


def version_for_alias(name: str, alias: str):
    """The version holding the alias, or None (also when the model does not exist)."""
    from mlflow.exceptions import MlflowException

    try:
        return _client().get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def register(model_uri: str, name: str, run_id: str, tags: dict[str, str], role: str,
             created: list | None = None, description: str | None = None):
    """Register the logged model as a version, once: a version of this run and role that
    already exists is returned as it is. A failure leaves no version behind. New versions
    are appended to ``created`` (for the caller's roll-back)."""
    from mlflow.exceptions import MlflowException

    client = _client()
    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if "ALREADY_EXISTS" not in str(exc.error_code):
            raise
    for existing in client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'"):
        if existing.tags.get("raybricks.role") == role:
            log.info("run %s is already registered as %s version %s", run_id, name,
                     existing.version)
            return existing
    version = None
    try:
        version = client.create_model_version(
            name, model_uri, run_id=run_id, tags=tags | {"raybricks.role": role},
            description=description,
            **model_version_source(model_uri),
        )
        if version.status != "READY":
            raise RegistryError(f"version {version.version} of {name} is {version.status}")
    except Exception:
        if version is not None:
            _delete_quietly(name, version.version)
        raise
    if created is not None:
        created.append(str(version.version))
    return version


def _delete_quietly(name: str, version: str) -> None:
    try:
        _client().delete_model_version(name, version)
    except Exception as exc:  # noqa: BLE001 - report the first error, not this one
        log.warning("could not remove half-registered %s version %s: %s", name, version, exc)


def download_segments(name: str, version: str, directory: Path) -> Path:
    """A registered version's segmented model directory."""
    import mlflow

    path = mlflow.artifacts.download_artifacts(
        artifact_uri=f"models:/{name}/{version}", dst_path=str(directory)
    )
    return Path(path) / "artifacts" / "segments"


def download_files(name: str, version: str, files: list[str], directory: Path) -> Path:
    """Some files of a registered version's segmented model directory (not its shards)."""
    from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository

    repository = ModelsArtifactRepository(f"models:/{name}/{version}")
    directory.mkdir(parents=True, exist_ok=True)
    for file in files:
        try:
            repository.download_artifacts(f"artifacts/segments/{file}", str(directory))
        except Exception as exc:  # noqa: BLE001 - a model without this file
            log.debug("%s version %s has no %s: %s", name, version, file, exc)
    return directory / "artifacts" / "segments"


def champion_global(name: str, alias: str) -> tuple[str, list[dict[str, Any]]] | None:
    """The global model that answers keys ``name@alias`` has never seen: its name and
    member rows (None: no such version, or one without a global model). Reads the
    version's manifest and global models only, never its shards."""
    configure_tracking()
    current = version_for_alias(name, alias)
    if current is None:
        return None
    with tempfile.TemporaryDirectory(prefix="raybricks-global-") as tmp:
        here = download_files(name, str(current.version),
                              [segmented_model.MANIFEST, segmented_model.FALLBACK], Path(tmp))
        if not (here / segmented_model.MANIFEST).exists():
            return None
        manifest = json.loads((here / segmented_model.MANIFEST).read_text())
        default = segmented_model.default_global(manifest)
        found = segmented_model.read_globals(here, manifest).get(default)
    if not found:
        return None
    return default, [{k: v for k, v in row.items() if k != segmented_model.GLOBAL}
                     for row in found]


def record_decision(decision: dict[str, Any]) -> None:
    """The promotion decision on the active run: ``promotion.json`` and a tag."""
    import mlflow

    mlflow.log_dict(decision, "promotion.json")
    mlflow.set_tag("raybricks.promotion", decision["decision"])


def _alias_version(name: str, alias: str) -> str | None:
    found = version_for_alias(name, alias)
    return str(found.version) if found else None


def retrains_some(config: JobConfig) -> bool:
    """A run of listed segments (``source.segments``), merged into the champion."""
    return config.source.segments is not None and config.registry.promote in (
        "merge", "replace")


def register_and_promote(
    config: JobConfig, model_uri: str, run_id: str, tags: dict[str, str], packaged: Packaged,
    workdir: Path, example: pd.DataFrame | None,
):
    """Register the challenger, decide the champion, then move the aliases: on any failure
    before the aliases move, the versions this call created are removed again. A retrain
    of listed segments registers one version, the merged one (its own model, of those
    segments alone, stays in the run)."""
    name, alias = config.registry.name, config.registry.alias
    created: list[str] = []
    try:
        current = version_for_alias(name, alias)
        if retrains_some(config) and current is not None:
            version, decision = merge_into(
                config, str(current.version), packaged, workdir, run_id, tags, example,
                created, f"run {run_id}")
            decision = {"rule": config.registry.promote, "challenger_version": None,
                        "previous_champion": str(current.version)} | decision
        else:
            version = register(model_uri, name, run_id, tags, "challenger", created)
            decision = promote(config, version, current, packaged, workdir, run_id, tags,
                               example, created)
    except Exception as exc:
        for number in reversed(created):
            _delete_quietly(name, number)
        raise RegistryError(
            f"registering {name} failed: {type(exc).__name__}: {exc}. No version was left "
            f"behind and no alias moved; the run {run_id} holds the model: retry with "
            f"raybricks.register_run({run_id!r}, config) or rerun the job"
        ) from exc
    client = _client()
    client.set_registered_model_alias(name, CHALLENGER, version.version)
    client.set_registered_model_alias(name, alias, decision["champion_version"])
    return version, decision


def promote(config: JobConfig, version, current, packaged: Packaged, workdir: Path,
            run_id: str, tags: dict[str, str], example: pd.DataFrame | None,
            created: list[str]) -> dict[str, Any]:
    """Apply ``registry.promote`` to the challenger ``version`` against ``current``, the
    version holding the alias before (None: none): the decision, its numbers and the
    champion-to-be (``merge`` and ``replace`` register the merged version here; the
    caller moves the aliases)."""

    name, rule = config.registry.name, config.registry.promote
    challenger = str(version.version)
    previous = str(current.version) if current else None
    decision: dict[str, Any] = {"rule": rule, "challenger_version": challenger,
                                "previous_champion": previous}
    if previous is None or previous == challenger or rule == "always":
        reason = "first version" if previous is None else rule
        return decision | {"decision": "promoted", "reason": reason,
                           "champion_version": challenger}
    if rule == "if_better":
        champion_dir = download_segments(name, previous, workdir / "champion")
        comparison = compare(packaged.directory, champion_dir)
        decision["comparison"] = comparison.as_dict()
        log_comparison(comparison)
        if comparison.not_worse:
            return decision | {"decision": "promoted", "reason": "not worse on common segments",
                               "champion_version": challenger}
        return decision | {"decision": "kept", "reason": "worse on common segments",
                           "champion_version": previous}
    _, merged = merge_into(config, previous, packaged, workdir, run_id, tags, example,
                           created, f"version {challenger}")
    return decision | merged


def log_comparison(comparison) -> None:
    log_run_metrics({"promotion_common_segments": comparison.common,
                     "promotion_challenger_mean": comparison.challenger,
                     "promotion_champion_mean": comparison.champion})


def merge_into(config: JobConfig, previous: str, packaged: Packaged, workdir: Path,
               run_id: str, tags: dict[str, str], example: pd.DataFrame | None,
               created: list[str], label: str) -> tuple[Any, dict[str, Any]]:
    """The run's model (``label``) merged with the champion (version ``previous``) as
    ``registry.promote`` says, registered: the merged version and the decision."""
    name = config.registry.name
    champion_dir = download_segments(name, previous, workdir / "champion")
    comparison = compare(packaged.directory, champion_dir)
    log_comparison(comparison)
    labels = (label, f"version {previous}")
    merged = merge_segments(packaged.directory, champion_dir,
                            workdir / "merged" / "segments", labels,
                            replace=config.registry.promote == "replace")
    info = log_segmented_model(merged, example, MERGED_MODEL_NAME)
    origins = pd.read_parquet(merged.directory / segmented_model.INDEX,
                              columns=[*config.segment_by, "source"])
    version = register(info.model_uri, name, run_id,
                       tags | {"raybricks.merged_from": ",".join(labels)}, "merged",
                       created, merge_description(config, origins, labels))
    return version, {"decision": "merged", "comparison": comparison.as_dict(),
                     "champion_version": str(version.version),
                     "segments_from": origins["source"].value_counts().to_dict()}


#: How many replaced segments a merged version's description names.
NAMED_SEGMENTS = 10


def merge_description(config: JobConfig, index: pd.DataFrame, labels: tuple[str, str]
                      ) -> str:
    """A merged version's description: which segments came from the run, why (the rule,
    and the run's list of segments where it trained only some), and a few of them."""
    new = index[index["source"] == labels[0]]
    keys = new[config.segment_by].astype(object).where(
        new[config.segment_by].notna(), None)
    named = "; ".join(key_text(row, config.segment_by)
                      for row in keys.head(NAMED_SEGMENTS).to_dict("records"))
    more = f" and {len(new) - NAMED_SEGMENTS} more" if len(new) > NAMED_SEGMENTS else ""
    rule = config.registry.promote
    source = config.source
    why = ("a new run of the job" if not source.segments
           else f"the segments listed in {source.segments} were retrained"
           if not source.statuses else f"the segments {' or '.join(source.statuses)} in "
           f"monitoring {source.segments} were retrained")
    how = ("each segment the run trained replaces the champion's" if rule == "replace"
           else "per segment, the better validation metric of the two")
    return (f"Merged ({rule}): {len(new)} of {len(index)} segments from {labels[0]} (this "
            f"run), the others from {labels[1]}; {why}; {how}. From this run: {named}{more}."
            " The index's source column says where each segment came from."
            + global_note(config))


def global_note(config: JobConfig) -> str:
    """What a merged version's description says of its global models."""
    if config.fallback != "global":
        return ""
    if config.source.segments is not None and config.global_model == "keep":
        return (" Global model: the champion's, kept (global_model: keep); the retrained "
                "segments were compared and blended with it, and every other segment and "
                "unseen key answers as before.")
    if config.source.segments is not None:
        return (" Global model: refitted on the whole source (global_model: refit); it "
                "serves the retrained segments and unseen keys, while the champion's "
                "segments keep the global model they were trained with.")
    return (" Each segment answers with the global model it was trained with (the index's "
            "global column); unseen keys with this run's.")


def register_run(run_id: str, config: JobConfig) -> Publication:
    """Register (again) the model a run logged, and apply the promotion rule: the retry
    after a failed registration. Idempotent: an existing version of the run is reused."""
    import mlflow

    configure_tracking()
    run = mlflow.get_run(run_id)
    model_uri = run.data.tags.get("raybricks.model_uri")
    if not model_uri:
        raise RegistryError(f"run {run_id} has no raybricks model (tag raybricks.model_uri)")
    name, alias = config.registry.name, config.registry.alias
    tags = {k: v for k, v in run.data.tags.items() if k.startswith("raybricks.")
            and k not in ("raybricks.model_uri", "raybricks.promotion")}
    with tempfile.TemporaryDirectory(prefix="raybricks-model-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp))
        packaged = Packaged(local / "artifacts" / "segments", {}, 0, 0)
        example = _example_of(local)
        with resumed_run(run_id):
            version, decision = register_and_promote(
                config, model_uri, run_id, tags, packaged, Path(tmp), example)
            record_decision(decision)
    return Publication(run_id, run.info.experiment_id, model_uri, name, str(version.version),
                       _alias_version(name, alias), decision)


def _example_of(model_dir: Path) -> pd.DataFrame | None:
    from mlflow.models import Model

    try:
        return Model.load(str(model_dir)).load_input_example(str(model_dir))
    except Exception:  # noqa: BLE001 - an example is optional for the retry
        return None
