"""Settings that only the ingress reads, changed on a running application without a restart.

They go in the serve config's `user_config` of the RagIngress deployment, in the shape of
`args:` (the same keys, the same validation):

    deployments:
      - name: RagIngress
        user_config:
          ingress: {max_in_flight_requests: 8, rate_limit: {requests_per_s: 5, burst: 20}}
          generator: {default_max_tokens: 64}

`serve deploy` of a config whose only change is this block reconfigures the running
ingress replicas in place (Serve calls `RagIngress.reconfigure`): no replica of any stage
restarts and no request is dropped. Each user_config replaces the previous one: it is
applied to the `args:` the application was built with, so `{}` restores them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.config import ConfigError, RagAppConfig, parse_config

# Dotted keys under `args:` that the ingress alone reads, so a new value needs no other
# stage to restart. A mapping value (rate_limit) is replaced whole.
TUNABLE_KEYS = frozenset(
    {
        "ingress.request_timeout_s",
        "ingress.max_in_flight_requests",
        "ingress.retry_after_s",
        "ingress.rate_limit",
        "ingress.max_question_chars",
        "compression.timeout_s",
        "citations.timeout_s",
        "generator.default_max_tokens",
        "generator.max_tokens_limit",
    }
)


def tuned(base: RagAppConfig, user_config: Mapping[str, Any] | None) -> RagAppConfig:
    """`base` with the values of `user_config` (nested like `args:`) applied and the whole
    tree validated again; ConfigError naming any key that is not an ingress-only setting,
    or any value the config tree refuses."""
    overrides = _flatten(user_config or {})
    outside = sorted(set(overrides) - TUNABLE_KEYS)
    if outside:
        raise ConfigError(
            f"user_config of RagIngress may set only {', '.join(sorted(TUNABLE_KEYS))}; "
            f"not {', '.join(outside)} (change those in `args:`, which restarts the stages)"
        )
    args = base.model_dump()
    for dotted, value in overrides.items():
        section, name = dotted.split(".")
        args[section][name] = value
    return parse_config(args)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys down to a tunable key (whose value is kept whole) or a leaf."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and dotted not in TUNABLE_KEYS:
            flat.update(_flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat
