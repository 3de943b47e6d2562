"""generation.vllm_engine.VllmEngine: vLLM's engine outputs as typed events, the sampling
parameters it builds, and how the engine's failures become ErrorEvents.

The engine client is a fake shaped like vLLM's `EngineClient` (AsyncLLM); its outputs are
shaped like `RequestOutput`/`CompletionOutput` in DELTA mode. The real `SamplingParams` is
used, so vLLM is imported once for the module (about 8 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from generation.vllm_engine import VllmEngine
from pipeline.messages import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    TokenEvent,
    TokenUsage,
)

MESSAGES = [
    {"role": "system", "content": "Answer from the sources."},
    {"role": "user", "content": "What is paged attention?"},
]


@pytest.fixture(scope="module")
def vllm() -> SimpleNamespace:
    """vLLM's types the engine uses, imported once for the module (slow)."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMClientError
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.exceptions import EngineDeadError

    return SimpleNamespace(
        SamplingParams=SamplingParams,
        VLLMClientError=VLLMClientError,
        RequestOutputKind=RequestOutputKind,
        EngineDeadError=EngineDeadError,
    )


class WordTokenizer:
    """A chat template that tags each message; one token id per whitespace word."""

    def apply_chat_template(
        self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool
    ) -> str:
        assert tokenize is False and add_generation_prompt is True
        rendered = " ".join(f"<{m['role']}> {m['content']}" for m in messages)
        return f"{rendered} <assistant>"

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        assert add_special_tokens is False
        return [len(word) for word in text.split()]


@dataclass
class Completion:  # vllm.outputs.CompletionOutput, in DELTA mode: only what is new
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    index: int = 0
    logprobs: list | None = None


@dataclass
class Output:  # vllm.outputs.RequestOutput
    outputs: list[Completion]
    finished: bool = False
    num_cached_tokens: int | None = None


def finished(text: str, token_ids: list[int], reason: str, cached: int | None) -> Output:
    return Output([Completion(text, token_ids, reason)], finished=True, num_cached_tokens=cached)


@dataclass
class FakeEngineClient:
    outputs: list[Output] = field(default_factory=list)
    error: BaseException | None = None
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    max_model_len: int = 64
    unhealthy: bool = False
    calls: list[tuple[Any, Any, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.model_config = SimpleNamespace(
            max_model_len=self.max_model_len,
            get_diff_sampling_param=lambda: dict(self.sampling_defaults),
        )

    def get_tokenizer(self) -> WordTokenizer:
        return WordTokenizer()

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Output]:
        self.calls.append((prompt, params, request_id))
        for output in self.outputs:
            yield output
        if self.error is not None:
            raise self.error

    async def check_health(self) -> None:
        if self.unhealthy:
            raise RuntimeError("engine dead")


def request(max_tokens: int = 16, temperature: float = 0.7, request_id: str = "req-1"):
    return GenerationRequest(MESSAGES, max_tokens, temperature, request_id)


def stream(client: FakeEngineClient, generation: GenerationRequest | None = None) -> list:
    engine = VllmEngine.from_engine_client(client)

    async def drain() -> list:
        return [event async for event in engine.stream(generation or request())]

    return asyncio.run(drain())


def prompt_length() -> int:
    return len(VllmEngine.from_engine_client(FakeEngineClient()).prompt_token_ids(MESSAGES))


def test_the_prompt_is_rendered_with_the_chat_template_and_sent_as_token_ids(vllm):
    client = FakeEngineClient(outputs=[finished("", [], "stop", 0)])

    stream(client)

    [(prompt, _, _)] = client.calls
    tokenizer = WordTokenizer()
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt == {"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}


def test_outputs_become_tokens_then_a_finish_with_the_usage(vllm):
    client = FakeEngineClient(
        outputs=[
            Output([Completion("Hello", [11])]),
            Output([Completion("", [12])]),  # a token that completes no text yet
            Output([Completion(" world", [13, 14])]),
            finished("!", [15], "length", cached=8),
        ]
    )

    events = stream(client)

    assert events == [
        TokenEvent("Hello"),
        TokenEvent(" world"),
        TokenEvent("!"),
        FinishEvent("length", TokenUsage(prompt_length(), 5, 8)),
    ]


def test_no_cached_token_count_means_zero(vllm):
    events = stream(FakeEngineClient(outputs=[finished("Hi", [1], "stop", cached=None)]))

    assert events[-1] == FinishEvent("stop", TokenUsage(prompt_length(), 1, 0))


def test_sampling_defaults_come_from_the_generation_config_and_the_rest_from_the_request(
    vllm,
):
    client = FakeEngineClient(
        outputs=[finished("", [], "stop", 0)],
        sampling_defaults={
            "repetition_penalty": 1.1,
            "top_p": 0.8,
            "top_k": 20,
            "min_p": 0.05,
            "temperature": 0.3,  # the request's temperature wins
            "max_tokens": 999,  # and its max_tokens
        },
    )

    stream(client, request(max_tokens=12, temperature=0.7))

    [(_, params, _)] = client.calls
    assert isinstance(params, vllm.SamplingParams)
    assert (params.repetition_penalty, params.top_p, params.top_k) == (1.1, 0.8, 20)
    assert params.min_p == pytest.approx(0.05)
    assert params.temperature == 0.7
    assert params.max_tokens == 12
    assert params.output_kind == vllm.RequestOutputKind.DELTA


def test_without_defaults_vllms_own_sampling_defaults_apply(vllm):
    client = FakeEngineClient(outputs=[finished("", [], "stop", 0)])

    stream(client, request(max_tokens=3, temperature=0.5))

    [(_, params, _)] = client.calls
    plain = vllm.SamplingParams(temperature=0.5, max_tokens=3)
    assert (params.top_p, params.top_k, params.repetition_penalty) == (
        plain.top_p,
        plain.top_k,
        plain.repetition_penalty,
    )


def test_a_prompt_and_answer_that_exceed_the_context_are_refused_without_the_engine(vllm):
    length = prompt_length()
    client = FakeEngineClient(max_model_len=length + 10)

    events = stream(client, request(max_tokens=11))

    [event] = events
    assert isinstance(event, ErrorEvent)
    error = event.error
    assert (error.status, error.param, error.code) == (400, "max_tokens", "context_length_exceeded")
    assert str(length) in error.message
    assert client.calls == []


def test_a_prompt_and_answer_that_exactly_fill_the_context_are_generated(vllm):
    length = prompt_length()
    client = FakeEngineClient(outputs=[finished("Hi", [1], "stop", 0)], max_model_len=length + 10)

    events = stream(client, request(max_tokens=10))

    assert isinstance(events[-1], FinishEvent)
    assert len(client.calls) == 1


@pytest.mark.parametrize("kind", ["ValueError", "VLLMClientError"])
def test_an_engine_refusal_is_a_400_error_event_after_the_tokens_before_it(vllm, kind):
    error = ValueError("bad logits") if kind == "ValueError" else vllm.VLLMClientError("bad")
    client = FakeEngineClient(outputs=[Output([Completion("Hi", [1])])], error=error)

    events = stream(client)

    assert events[0] == TokenEvent("Hi")
    [refusal] = events[1:]
    assert isinstance(refusal, ErrorEvent)
    assert (refusal.error.status, refusal.error.code) == (400, "invalid_generation_request")
    assert refusal.error.message == str(error)


def test_a_dead_engine_is_a_503_error_event(vllm):
    client = FakeEngineClient(error=vllm.EngineDeadError())

    [event] = stream(client)

    assert isinstance(event, ErrorEvent)
    error = event.error
    assert (error.status, error.type, error.code) == (503, "service_unavailable", "engine_dead")


def test_other_engine_failures_propagate(vllm):
    client = FakeEngineClient(error=RuntimeError("kernel crashed"))

    with pytest.raises(RuntimeError, match="kernel crashed"):
        stream(client)


def test_engine_request_ids_are_unique_per_call_even_for_the_same_request_id(vllm):
    client = FakeEngineClient(outputs=[finished("", [], "stop", 0)])

    for _ in range(3):
        stream(client, request(request_id="client-id"))

    ids = [request_id for _, _, request_id in client.calls]
    assert len(set(ids)) == 3
    assert all(request_id.startswith("client-id") for request_id in ids)


def test_the_health_check_asks_the_engine():
    healthy = VllmEngine.from_engine_client(FakeEngineClient())
    dead = VllmEngine.from_engine_client(FakeEngineClient(unhealthy=True))

    assert asyncio.run(healthy.check_health()) is None
    with pytest.raises(RuntimeError, match="engine dead"):
        asyncio.run(dead.check_health())


def test_a_dead_engine_is_reported_once_to_whoever_hosts_it(vllm):
    deaths: list[str] = []
    engine = VllmEngine.from_engine_client(
        FakeEngineClient(error=vllm.EngineDeadError(), unhealthy=True),
        on_dead=lambda: deaths.append("dead"),
    )

    async def twice() -> None:
        for _ in range(2):
            [event async for event in engine.stream(request())]
        with pytest.raises(RuntimeError):
            await engine.check_health()

    asyncio.run(twice())

    assert deaths == ["dead"]


def test_a_failed_health_check_reports_the_death_and_a_healthy_one_does_not():
    deaths: list[str] = []
    healthy = VllmEngine.from_engine_client(
        FakeEngineClient(), on_dead=lambda: deaths.append("healthy")
    )
    dead = VllmEngine.from_engine_client(
        FakeEngineClient(unhealthy=True), on_dead=lambda: deaths.append("dead")
    )

    asyncio.run(healthy.check_health())
    with pytest.raises(RuntimeError):
        asyncio.run(dead.check_health())

    assert deaths == ["dead"]


def test_a_requests_sampling_becomes_vllms_sampling_params(vllm):
    from pipeline.messages import OutputFormat, Sampling

    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    sampling = Sampling(
        top_p=0.8, stop=("END",), seed=3, presence_penalty=0.5, frequency_penalty=0.25,
        logit_bias=((5, -100.0),), logprobs=True, top_logprobs=2,
        output=OutputFormat("json_schema", schema),
    )  # fmt: skip
    client = FakeEngineClient(
        outputs=[finished("{}", [2], "stop", 0)], sampling_defaults={"top_p": 0.95, "top_k": 20}
    )
    generation = GenerationRequest(MESSAGES, 16, 0.7, "req-1", sampling=sampling)

    stream(client, generation)

    params = client.calls[0][1]
    assert (params.top_p, params.top_k, params.stop, params.seed) == (0.8, 20, ["END"], 3)
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, 0.25)
    assert params.logit_bias == {5: -100.0}
    assert params.logprobs == 2
    assert params.structured_outputs.json == schema


def test_unset_sampling_keeps_the_models_defaults(vllm):
    client = FakeEngineClient(
        outputs=[finished("ok", [2], "stop", 0)], sampling_defaults={"top_p": 0.95}
    )

    stream(client)

    params = client.calls[0][1]
    assert (params.top_p, params.seed, params.stop, params.logprobs) == (0.95, None, [], None)
    assert params.structured_outputs is None


def test_logprobs_of_each_token_with_its_alternatives_by_rank(vllm):
    from vllm.logprobs import Logprob

    from pipeline.messages import Sampling, TokenLogprob

    candidates = [
        {7: Logprob(-0.5, 2, "b"), 9: Logprob(-0.1, 1, "a")},
        {4: Logprob(-0.2, 1, "c"), 9: Logprob(-1.5, 2, "a")},
    ]
    output = finished("bc", [7, 4], "stop", 0)
    output.outputs[0].logprobs = candidates
    client = FakeEngineClient(outputs=[output])
    sampling = Sampling(logprobs=True, top_logprobs=1)

    events = stream(client, GenerationRequest(MESSAGES, 16, 0.0, "r", sampling=sampling))

    assert events[0] == TokenEvent(
        "bc", (TokenLogprob("b", -0.5, (("a", -0.1),)), TokenLogprob("c", -0.2, (("c", -0.2),)))
    )


def test_a_sampling_value_vllm_refuses_is_a_400_before_generation(vllm):
    from pipeline.messages import Sampling

    client = FakeEngineClient(outputs=[finished("x", [1], "stop", 0)])
    generation = GenerationRequest(MESSAGES, 16, 0.7, "r", sampling=Sampling(top_p=1.5))

    [event] = stream(client, generation)

    assert isinstance(event, ErrorEvent) and event.error.status == 400
    assert client.calls == []
