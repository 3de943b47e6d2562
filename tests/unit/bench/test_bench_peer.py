"""The peer server's command line and the service config that points at it."""

from __future__ import annotations

from app.config import parse_config
from bench.peer import PEER_GGUF, PEER_MODEL, peer_generator, server_argv
from bench.suite import QUALITY_PLANS


def test_the_server_listens_on_loopback_with_the_given_threads() -> None:
    argv = server_argv(8123, 2)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--n_threads") + 1] == "2"
    assert argv[argv.index("--n_threads_batch") + 1] == "2"
    assert argv[argv.index("--model") + 1] == str(PEER_GGUF)


def test_the_peer_overrides_make_a_valid_openai_generator() -> None:
    overrides = peer_generator("http://127.0.0.1:8123/v1")
    config = parse_config({"generator": {"engine": overrides["generator.engine"],
                                         "openai": overrides["generator.openai"]}})  # fmt: skip
    assert config.generator.engine == "openai"
    assert config.generator.openai is not None
    assert config.generator.openai.model == PEER_MODEL


def test_the_peer_plans_differ_from_make_run_only_where_they_say() -> None:
    pipeline, naive = QUALITY_PLANS["peer-pipeline"], QUALITY_PLANS["peer-naive"]
    baseline = QUALITY_PLANS["default-bf16"]
    assert pipeline.peer and naive.peer and not baseline.peer
    assert pipeline.overrides == baseline.overrides == {}
    assert naive.overrides == {"compression.default_method": "none"}
    assert pipeline.questions == naive.questions == baseline.questions
