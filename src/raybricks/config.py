"""Typed configuration, validated before any Spark or Ray work starts.

Unknown keys are errors. ``ClusterConfig`` describes where Ray runs; the job config of the
training stage builds on it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, PositiveInt, model_validator


class StrictModel(BaseModel):
    """A config section: unknown keys are rejected, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


ClusterMode = Literal["auto", "spark", "address", "local"]


class ClusterConfig(StrictModel):
    """Where and how big the Ray cluster is.

    ``mode``: ``spark`` starts Ray on the Spark cluster's workers
    (``ray.util.spark.setup_ray_cluster``); ``address`` connects to a running Ray;
    ``local`` starts a plain single-machine Ray for quick development; ``auto`` picks
    ``address`` when an address is given (or ``RAY_ADDRESS`` is set), else ``spark``.
    Sizes left empty are derived from the Spark cluster. Memory sizes take bytes or
    strings such as ``"4GiB"``.
    """

    mode: ClusterMode = "auto"
    address: str | None = None
    max_worker_nodes: PositiveInt | None = None
    min_worker_nodes: int | None = Field(default=None, ge=0)
    num_cpus_worker_node: PositiveInt | None = None
    num_gpus_worker_node: int | None = Field(default=None, ge=0)
    memory_worker_node: ByteSize | None = None
    object_store_memory_worker_node: ByteSize | None = None
    num_cpus_head_node: int | None = Field(default=None, ge=0)
    num_gpus_head_node: int | None = Field(default=None, ge=0)
    memory_head_node: ByteSize | None = None
    object_store_memory_head_node: ByteSize | None = None
    num_cpus: PositiveInt | None = None
    temp_dir: str | None = None
    log_dir: str | None = None
    forward_env: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_consistency(self) -> ClusterConfig:
        if (
            self.min_worker_nodes is not None
            and self.max_worker_nodes is not None
            and self.min_worker_nodes > self.max_worker_nodes
        ):
            raise ValueError(
                f"cluster.min_worker_nodes={self.min_worker_nodes} is above "
                f"cluster.max_worker_nodes={self.max_worker_nodes}: make min <= max"
            )
        if self.mode == "address" and not self.address:
            raise ValueError(
                "cluster.mode=address needs cluster.address (e.g. 'ray://host:10001' or "
                "'host:6379')"
            )
        return self
