"""app.tuning: the ingress-only settings a user_config may change, and ApiState.retune."""

from __future__ import annotations

import pytest
from app_fakes import make_state

from app.config import ConfigError, RagAppConfig, RateLimitConfig
from app.tuning import TUNABLE_KEYS, tuned


def test_a_user_config_sets_ingress_only_settings_over_the_built_config():
    base = RagAppConfig()

    config = tuned(
        base,
        {
            "ingress": {
                "max_in_flight_requests": 4,
                "rate_limit": {"requests_per_s": 2, "burst": 5},
            },
            "generator": {"default_max_tokens": 16, "max_tokens_limit": 64},
            "compression": {"timeout_s": 2.0},
        },
    )

    assert config.ingress.max_in_flight_requests == 4
    assert config.ingress.rate_limit == RateLimitConfig(requests_per_s=2, burst=5)
    assert (config.generator.default_max_tokens, config.generator.max_tokens_limit) == (16, 64)
    assert config.compression.timeout_s == 2.0
    # Everything else is the built config's.
    assert (
        config.retriever == base.retriever and config.generator.model_id == base.generator.model_id
    )


def test_an_empty_user_config_restores_the_built_config():
    base = RagAppConfig()

    assert tuned(base, {}) == base
    assert tuned(base, None) == base


@pytest.mark.parametrize(
    ("user_config", "named"),
    [
        ({"generator": {"max_model_len": 4096}}, "generator.max_model_len"),
        ({"retriever": {"default_top_k": 3}}, "retriever.default_top_k"),
        ({"ingress": {"deployment": {"num_replicas": 2}}}, "ingress.deployment.num_replicas"),
        ({"ingres": {"retry_after_s": 2}}, "ingres.retry_after_s"),
    ],
)
def test_a_key_another_stage_reads_is_refused_by_name(user_config, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        tuned(RagAppConfig(), user_config)


def test_a_bad_value_is_refused_by_the_config_trees_own_validation():
    with pytest.raises(ConfigError, match="max_tokens_limit"):
        tuned(RagAppConfig(), {"generator": {"default_max_tokens": 64, "max_tokens_limit": 32}})


def test_every_tunable_key_exists_in_the_config_tree():
    dumped = RagAppConfig().model_dump()

    for dotted in TUNABLE_KEYS:
        section, name = dotted.split(".")
        assert name in dumped[section], dotted


def test_retune_changes_the_gate_rate_limit_and_timeouts_of_a_live_state():
    state = make_state(in_flight_limit=8)
    state.gate.try_enter()

    state.retune(
        tuned(
            state.config,
            {
                "ingress": {
                    "max_in_flight_requests": 2,
                    "rate_limit": {"requests_per_s": 1, "burst": 1},
                },
                "compression": {"timeout_s": 3.0},
                "citations": {"timeout_s": 0.5},
            },
        )
    )

    assert state.gate.limit == 2 and state.gate.in_flight == 1  # the request inside stays
    assert state.rate_limiter is not None
    assert state.rate_limiter.acquire("k") is None and state.rate_limiter.acquire("k") is not None
    assert state.pipeline._compressor_timeout_s == 3.0
    assert state.pipeline._attribution_timeout_s == 0.5
    assert state.config.ingress.max_in_flight_requests == 2

    state.retune(tuned(RagAppConfig(), {}))

    assert state.rate_limiter is None
    assert state.gate.limit == RagAppConfig().in_flight_limit()
