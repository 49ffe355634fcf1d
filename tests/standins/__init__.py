"""Stand-ins for Databricks-only modules, importable under their real names.

``install()`` makes ``import pyspark.databricks...`` find the ``pyspark_databricks``
directory here (a finder on ``sys.meta_path``; pyspark itself is untouched) and
``uninstall()`` undoes it. Ray workers get it as a worker process setup hook of a Ray
job of their own (see ``ray_job_with_standins``), so it never reaches other tests' workers.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.abc
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "pyspark.databricks"
OVERLAY = Path(__file__).parent / "pyspark_databricks"


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``pyspark.databricks`` in OVERLAY (its submodules then follow its path)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != PACKAGE:
            return None
        return importlib.util.spec_from_file_location(
            fullname, OVERLAY / "__init__.py", submodule_search_locations=[str(OVERLAY)]
        )


def install() -> None:
    """Make ``pyspark.databricks.sql.chunk`` importable in this process."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def uninstall() -> None:
    """Undo ``install``, forgetting the stand-in modules already imported."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    pyspark = sys.modules.get("pyspark")
    if pyspark is not None and hasattr(pyspark, "databricks"):
        delattr(pyspark, "databricks")


@contextlib.contextmanager
def ray_job_with_standins() -> Iterator[None]:
    """Reconnect this driver to its Ray cluster as a new job whose workers run ``install``
    at start (and install it here too); afterwards reconnect as before.

    Ray workers are processes of their job; a new job with a worker process setup hook
    gets fresh workers, so the stand-ins stay out of the session job's workers.
    """
    import ray
    import ray.cloudpickle

    context = ray.get_runtime_context()
    address, runtime_env = context.gcs_address, copy.deepcopy(dict(context.runtime_env))
    ray.shutdown()
    try:
        # shipped by value: the workers cannot import this package when the hook runs
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        try:
            _reconnect(address, {**copy.deepcopy(runtime_env),
                                 "worker_process_setup_hook": install})
        finally:
            ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        install()
        yield
    finally:
        uninstall()
        ray.shutdown()
        _reconnect(address, runtime_env)


def _reconnect(address: str, runtime_env: dict) -> None:
    """Connect this driver to Ray as a new job.

    Ray Data of some releases (2.37 among them) keeps its stats actor's handle across
    ``ray.shutdown()``, and the next connection cannot use it ("Can't find actor"):
    forget it, Ray Data fetches it again.
    """
    import ray

    ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    with contextlib.suppress(ImportError, AttributeError):
        from ray.data._internal.stats import StatsManager

        if hasattr(StatsManager, "_stats_actor_handle"):
            StatsManager._stats_actor_handle = None
