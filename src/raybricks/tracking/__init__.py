"""MLflow: one run per job, one registered segmented model version, the alias gate.

* ``target``: where MLflow points (tracking and registry URIs, the experiment);
* ``run``: logging the job's run; ``publish(result, config)``, the whole job's
  publication (the run, the model, then registration and promotion);
* ``registration``: registering the version, the promotion rule (``registry.promote``)
  and ``register_run``, the retry from a logged run;
* ``model``: the segmented model as an MLflow pyfunc, logged by both of the above.

Imports go one way: ``run`` -> ``registration`` -> ``model``; ``target`` imports none.
"""

from raybricks.tracking.model import RegistryError
from raybricks.tracking.registration import Publication, champion_global, register_run
from raybricks.tracking.run import publish
from raybricks.tracking.target import (
    TrackingTarget,
    check_registry_name,
    configure_tracking,
    experiment_id,
    tracking_target,
)

__all__ = [
    "Publication",
    "RegistryError",
    "TrackingTarget",
    "champion_global",
    "check_registry_name",
    "configure_tracking",
    "experiment_id",
    "publish",
    "register_run",
    "tracking_target",
]
