"""What every stage's config is made of: a strict model (unknown keys refused, frozen), how a
stage is replicated and what each replica reserves from Ray, and the project root that
relative paths in the config resolve against. Plain pydantic: no Ray here."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AutoscalingConfig(StrictModel):
    min_replicas: int = Field(1, ge=0, description="Fewest replicas kept running.")
    max_replicas: int = Field(1, ge=1, description="Most replicas autoscaling may start.")
    target_ongoing_requests: float = Field(
        2.0, gt=0, description="Ongoing requests per replica that autoscaling aims for."
    )
    upscale_delay_s: float = Field(
        30.0, ge=0, description="How long load must stay high before replicas are added."
    )
    downscale_delay_s: float = Field(
        600.0, ge=0, description="How long load must stay low before replicas are removed."
    )
    look_back_period_s: float = Field(
        30.0, gt=0, description="Window over which the ongoing requests are averaged."
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        return self


class ReplicaConfig(StrictModel):
    """How one stage is replicated and what each replica reserves from Ray."""

    num_replicas: int = Field(1, ge=1, description="Fixed replica count (without autoscaling).")
    autoscaling: AutoscalingConfig | None = Field(
        None, description="Autoscaling bounds; when set, num_replicas is ignored."
    )
    num_cpus: float = Field(
        0.25, ge=0, description="Logical CPUs each replica reserves (a scheduling label)."
    )
    num_gpus: float = Field(0, ge=0, description="GPUs (or fractions) each replica reserves.")
    max_ongoing_requests: int = Field(
        16, ge=1, description="Requests one replica works on at once."
    )
    max_queued_requests: int = Field(
        64,
        ge=-1,
        description="Requests each caller (ingress replica) may queue for this stage before "
        "it gets backpressure (HTTP 503 with Retry-After); -1 for no limit.",
    )
    max_replicas_per_node: int | None = Field(
        None,
        ge=1,
        description="At most this many replicas on one node; 1 spreads the replicas over "
        "nodes, so losing a node leaves the others serving.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each replica needs, to pin a stage to nodes "
        "started with them (e.g. {node_a: 0.01} with `ray start --resources`).",
    )
    health_check_period_s: float = Field(
        5.0, gt=0, description="How often Serve calls the replica's check_health."
    )
    health_check_timeout_s: float = Field(
        10.0, gt=0, description="A health check slower than this fails the replica."
    )


def most_replicas(replica: ReplicaConfig) -> int:
    """The replicas a stage can run at most: its fixed count, or its autoscaling maximum."""
    if replica.autoscaling is not None:
        return replica.autoscaling.max_replicas
    return replica.num_replicas


def resolve_path(path: str) -> Path:
    """A config path as an absolute path (relative ones are under the project root)."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else PROJECT_ROOT / candidate
