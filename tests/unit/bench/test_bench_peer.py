"""The peer server's command line and the service config that points at it."""

from __future__ import annotations

from app.config import parse_config
from bench.peer import (
    PEER_GGUF,
    PEER_MODEL,
    engine_timings,
    peer_generator,
    server_argv,
    timings_report,
)
from bench.suite import BF16_WEIGHTS, QUALITY_PLANS


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
    assert pipeline.overrides == naive.overrides == {}
    # The peer lab's vLLM side is make run's bf16 reader, where make run serves INT8 on AMX.
    assert baseline.overrides == BF16_WEIGHTS
    assert pipeline.sweep == baseline.sweep == "default"
    assert naive.sweep == "naive"  # make run's top 5, uncompressed
    assert pipeline.questions == naive.questions == baseline.questions


LOG = """llama_perf_context_print: prompt eval time =    1205.21 ms /   584 tokens (    2.06 ms
llama_perf_context_print:        eval time =     276.46 ms /     3 runs   (   92.15 ms per token
INFO:     127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 200 OK
llama_perf_context_print: prompt eval time =    8000.00 ms /   500 tokens (   16.00 ms
llama_perf_context_print:        eval time =    1000.00 ms /    10 runs   (  100.00 ms per token
llama_perf_context_print: prompt eval time =    6000.00 ms /   420 tokens (   14.29 ms
llama_perf_context_print:        eval time =    3000.00 ms /    30 runs   (  100.00 ms per token
"""


def test_engine_timings_read_each_request_from_the_log() -> None:
    timings = engine_timings(LOG)
    assert timings[1] == {"prompt_tokens": 500, "prompt_ms": 8000.0, "decode_tokens": 10,
                          "decode_ms": 1000.0}  # fmt: skip
    assert len(timings) == 3
    report = timings_report({"run": timings})
    assert "| run | 2 | 66 [" in report  # the warm-up left out; 62.5 and 70 tokens/s
    assert "| 100.0 [100.0, 100.0]" in report
