"""What every stage's config is made of: a strict model (unknown keys refused, frozen), a
stage's Ray Serve options laid over its defaults, and the project root that relative paths
in the config resolve against. Plain pydantic: no Ray here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# A stage's Ray Serve deployment options, in serve.deployment's own names (num_replicas,
# autoscaling_config, ray_actor_options, max_ongoing_requests, max_queued_requests,
# health_check_period_s, ...): passed through to Serve, which validates them when the
# application is built. Only the values the service itself reads are read here.
ServeOptions = dict[str, Any]


def over_defaults(defaults: Mapping[str, Any]) -> Callable[[ServeOptions], ServeOptions]:
    """A validator that lays a stage's given options over its defaults: setting one option
    keeps the others, and `ray_actor_options` is merged key by key (num_cpus given, the
    default resources kept)."""

    def merged(given: ServeOptions) -> ServeOptions:
        options = {**defaults, **given}
        actor = {**defaults.get("ray_actor_options", {}), **given.get("ray_actor_options", {})}
        if actor:
            options["ray_actor_options"] = actor
        if "autoscaling_config" in given:  # Serve ignores num_replicas beside autoscaling
            options.pop("num_replicas", None)
        return options

    return merged


def deployment_field(defaults: ServeOptions, stage: str) -> Any:
    """A stage's `deployment` field: its Serve options, `defaults` until set."""
    return Field(
        defaults,
        description=f"Ray Serve deployment options of the {stage}, in serve.deployment's "
        "names, laid over its defaults (those of this field); Serve validates them.",
    )


def replica_bounds(options: Mapping[str, Any]) -> tuple[int, int]:
    """(fewest, most) replicas a stage runs: its autoscaling bounds, or its fixed count."""
    autoscaling = options.get("autoscaling_config")
    if autoscaling is not None:
        return int(autoscaling.get("min_replicas", 1)), int(autoscaling.get("max_replicas", 1))
    replicas = int(options.get("num_replicas", 1))
    return replicas, replicas


def most_replicas(options: Mapping[str, Any]) -> int:
    """The replicas a stage can run at most."""
    return replica_bounds(options)[1]


def actor_option(options: Mapping[str, Any], name: str) -> float:
    """One of `ray_actor_options`' resource amounts (num_cpus, num_gpus), 0 when unset."""
    return float(options.get("ray_actor_options", {}).get(name, 0) or 0)


def resolve_path(path: str) -> Path:
    """A config path as an absolute path (relative ones are under the project root)."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else PROJECT_ROOT / candidate
