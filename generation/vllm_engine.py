"""Chat completions straight from vLLM's engine client, as typed events.

The prompt is rendered with the model's own chat template and tokenizer, handed to
`AsyncLLM.generate` as token ids, and the engine's `RequestOutput`s (DELTA kind: only the new
text each time) become `TokenEvent`s and one `FinishEvent`. Nothing is encoded as
server-sent events and parsed back on the way. Sampling defaults come from the model's
generation config, as vLLM's OpenAI server applies them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

from pipeline.log import get_logger
from pipeline.messages import (
    ErrorEvent,
    FinishEvent,
    GenerationEvent,
    GenerationRequest,
    Sampling,
    StageError,
    TokenEvent,
    TokenLogprob,
    TokenUsage,
)

logger = get_logger(__name__)

# The generation-config fields vLLM's chat endpoint takes as defaults (temperature and
# max_tokens come from the request).
_DEFAULTED_FIELDS = ("repetition_penalty", "top_p", "top_k", "min_p", "stop_token_ids")


class VllmEngine:
    """`on_dead` is called (once) when the engine is found dead: vLLM's own server exits its
    process then, and so should whatever hosts this engine, to be replaced at once."""

    def __init__(
        self,
        engine_client: Any,
        tokenizer: Any,
        max_model_len: int,
        on_dead: Callable[[], None] = lambda: None,
    ) -> None:
        self._client = engine_client
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._on_dead = on_dead
        self._dead = False
        defaults = engine_client.model_config.get_diff_sampling_param()
        self._sampling_defaults = {k: defaults[k] for k in _DEFAULTED_FIELDS if k in defaults}

    @classmethod
    def from_engine_client(
        cls, engine_client: Any, on_dead: Callable[[], None] = lambda: None
    ) -> VllmEngine:
        return cls(
            engine_client,
            engine_client.get_tokenizer(),
            int(engine_client.model_config.max_model_len),
            on_dead,
        )

    def prompt_token_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        prompt_ids = self.prompt_token_ids(request.messages)
        too_long = self._context_exceeded(len(prompt_ids), request.max_tokens)
        if too_long is not None:
            yield ErrorEvent(too_long)
            return
        try:
            params = SamplingParams(
                # What the request set wins over the model's generation-config defaults.
                **{**self._sampling_defaults, **sampling_kwargs(request.sampling)},
                temperature=request.temperature,
                max_tokens=request.max_tokens,
                output_kind=RequestOutputKind.DELTA,
            )
        except (ValueError, VLLMClientError) as exc:
            yield ErrorEvent(StageError(400, str(exc), code="invalid_generation_request"))
            return
        # The engine rejects a request id it already holds; a client may reuse its own.
        engine_request_id = f"{request.request_id}-{uuid.uuid4().hex[:8]}"
        completion_tokens = 0
        try:
            async for output in self._client.generate(
                {"prompt_token_ids": prompt_ids}, params, engine_request_id
            ):
                completion = output.outputs[0]
                completion_tokens += len(completion.token_ids)
                logprobs = (
                    self._logprobs(completion, request.sampling.top_logprobs)
                    if request.sampling.logprobs
                    else ()
                )
                if completion.text or logprobs:
                    yield TokenEvent(completion.text, logprobs)
                if output.finished:
                    usage = TokenUsage(
                        len(prompt_ids), completion_tokens, int(output.num_cached_tokens or 0)
                    )
                    yield FinishEvent(completion.finish_reason, usage)
        except (ValueError, VLLMClientError) as exc:
            yield ErrorEvent(StageError(400, str(exc), code="invalid_generation_request"))
        except EngineDeadError:
            yield self._engine_dead(request.request_id)

    def _context_exceeded(self, prompt_tokens: int, max_tokens: int) -> StageError | None:
        """The 400 for a prompt and max_tokens that do not fit the model's context, if so."""
        if prompt_tokens + max_tokens <= self._max_model_len:
            return None
        return StageError(
            400,
            f"the prompt ({prompt_tokens} tokens) and max_tokens={max_tokens} "
            f"exceed the model's {self._max_model_len}-token context",
            param="max_tokens",
            code="context_length_exceeded",
        )

    def _engine_dead(self, request_id: str) -> ErrorEvent:
        """Log the dead engine, report it (`on_dead`, once), and the 503 its request ends in."""
        logger.error("the vLLM engine is dead (request %s)", request_id)
        self._died()
        return ErrorEvent(
            StageError(
                503,
                "the generation engine failed; its replica is being replaced",
                "service_unavailable",
                code="engine_dead",
            )
        )

    def _logprobs(self, completion: Any, top: int) -> tuple[TokenLogprob, ...]:
        """The new tokens' log probabilities in OpenAI's terms (none unless asked for)."""
        if not completion.logprobs:
            return ()
        return tuple(
            self._token_logprob(token_id, candidates, top)
            for token_id, candidates in zip(completion.token_ids, completion.logprobs, strict=False)
        )

    def _token_logprob(self, token_id: int, candidates: Any, top: int) -> TokenLogprob:
        ranked = sorted(candidates.items(), key=lambda item: item[1].rank or 0)
        alternatives = tuple(
            (self._token_text(tid, lp), max(lp.logprob, -9999.0)) for tid, lp in ranked[:top]
        )
        chosen = candidates[token_id]
        return TokenLogprob(
            self._token_text(token_id, chosen), max(chosen.logprob, -9999.0), alternatives
        )

    def _token_text(self, token_id: int, logprob: Any) -> str:
        if logprob.decoded_token is not None:
            return str(logprob.decoded_token)
        return str(self._tokenizer.decode([token_id]))

    async def check_health(self) -> None:
        try:
            await self._client.check_health()
        except Exception:
            self._died()
            raise

    def _died(self) -> None:
        if not self._dead:
            self._dead = True
            self._on_dead()


def sampling_kwargs(sampling: Sampling) -> dict[str, Any]:
    """`SamplingParams` keyword arguments for what a request set beyond the defaults (an
    unset field keeps the model's generation-config default, as vLLM's server does)."""
    from vllm.sampling_params import StructuredOutputsParams

    kwargs: dict[str, Any] = sampling.set_fields()
    if sampling.logit_bias:
        kwargs["logit_bias"] = dict(sampling.logit_bias)
    if sampling.logprobs:
        kwargs["logprobs"] = sampling.top_logprobs
    # Asked for compact JSON (a grammar that allows any whitespace lets a small reader
    # write blank lines until max_tokens); the answers recorded on the CPU build still
    # held newlines and indentation, so this is a request, not a bound on length.
    output = sampling.output
    if output.kind == "json_object":
        kwargs["structured_outputs"] = StructuredOutputsParams(
            json_object=True, disable_any_whitespace=True
        )
    elif output.kind == "json_schema":
        kwargs["structured_outputs"] = StructuredOutputsParams(
            json=output.schema, disable_any_whitespace=True
        )
    return kwargs
