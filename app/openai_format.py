"""The OpenAI chat-completions face of the pipeline: the question in, `chat.completion` out.

Bodies and chunks are the `openai` package's own types, so what the official client parses
is what is built here. The last message is the question, the user and assistant messages
before it the conversation; the system prompt is the service's own (it is what the prefix
cache holds), so client system (and developer) messages are ignored, and `rag` says how
many were. Sources ride along in an extra `sources` field, the RAG figures and the
citations in `rag`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from openai.types import CompletionUsage
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionTokenLogprob,
)
from openai.types.chat import chat_completion as completion_types
from openai.types.chat import chat_completion_chunk as chunk_types
from openai.types.chat.chat_completion_token_logprob import TopLogprob
from openai.types.completion_usage import PromptTokensDetails
from sse_starlette import ServerSentEvent

from app import sampling
from app.errors import ApiError, bad_request, error_body
from app.rag_format import DONE, Renderer, response_model, sources_of, sse_event
from app.schemas import ChatCompletionRequest, ChatMessage
from pipeline.messages import Sampling, TokenEvent, TokenLogprob, Turn
from pipeline.rag import (
    AnswerChoice,
    DoneEvent,
    FailedEvent,
    PipelineEvent,
    RagQuery,
    RagResult,
    SourcesEvent,
)


@dataclass(frozen=True)
class ChatConversation:
    question: str
    history: tuple[Turn, ...]
    # Each history turn's index in `messages`.
    positions: tuple[int, ...]
    ignored_system_messages: int


IGNORED_ROLES = ("system", "developer")


def conversation_of(body: ChatCompletionRequest) -> ChatConversation:
    """The last message (a user's) as the question, the user and assistant messages before
    it as the history; system and developer messages are counted and left out."""
    last = len(body.messages) - 1
    if body.messages[last].role != "user":
        raise bad_request("the last message must be the user's question", param="messages")
    history: list[Turn] = []
    positions: list[int] = []
    ignored = 0
    for index, message in enumerate(body.messages[:last]):
        if message.role in IGNORED_ROLES:
            ignored += 1
        elif message.role in ("user", "assistant"):
            history.append(Turn(message.role, text_of(message)))
            positions.append(index)
        else:
            raise bad_request(
                f"messages.{index}: role {message.role!r} is not supported (no tools here)",
                param=f"messages.{index}.role",
            )
    return ChatConversation(text_of(body.messages[last]), tuple(history), tuple(positions), ignored)


def sampling_of(body: ChatCompletionRequest) -> Sampling:
    """The request's sampling and output fields, checked (app.sampling)."""
    return sampling.sampling_of(
        top_p=body.top_p,
        stop=body.stop,
        seed=body.seed,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=body.logit_bias,
        logprobs=body.logprobs,
        top_logprobs=body.top_logprobs,
        output=sampling.output_format_of(body.response_format),
    )


def text_of(message: ChatMessage) -> str:
    """A message's text: string content or its text parts."""
    if isinstance(message.content, str):
        return message.content
    parts = message.content or []
    return " ".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")


def usage_of(result: RagResult) -> CompletionUsage:
    """The prompt once (every choice read the same prompt), the completions of all choices."""
    usage = result.usage
    completion_tokens = usage.completion_tokens + sum(
        choice.completion_tokens for choice in result.extra_choices
    )
    return CompletionUsage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=usage.prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
    )


def logprobs_of(tokens: tuple[TokenLogprob, ...]) -> list[ChatCompletionTokenLogprob]:
    return [
        ChatCompletionTokenLogprob(
            token=token.token,
            logprob=token.logprob,
            bytes=list(token.token.encode()),
            top_logprobs=[
                TopLogprob(token=text, logprob=value, bytes=list(text.encode()))
                for text, value in token.top
            ],
        )
        for token in tokens
    ]


def completion_body(
    result: RagResult,
    model: str,
    created: int,
    ignored_system: int = 0,
    with_logprobs: bool = False,
) -> dict:
    first = AnswerChoice(0, result.answer, result.finish_reason, 0, result.logprobs)
    choices = [
        completion_types.Choice(
            index=choice.index,
            message=ChatCompletionMessage(role="assistant", content=choice.text),
            finish_reason=_finish_reason(choice.finish_reason),
            logprobs=(
                completion_types.ChoiceLogprobs(content=logprobs_of(choice.logprobs))
                if with_logprobs
                else None
            ),
        )
        for choice in (first, *result.extra_choices)
    ]
    completion = ChatCompletion(
        id=f"chatcmpl-{result.request_id}",
        object="chat.completion",
        created=created,
        model=model,
        choices=choices,
        usage=usage_of(result),
        sources=[source.model_dump() for source in sources_of(result.prepared)],
        rag=_rag_extras(result, ignored_system),
    )
    return completion.model_dump(exclude_unset=True)


def sse_chunks(
    query: RagQuery, model: str, created: int, include_usage: bool, ignored_system: int = 0
) -> Renderer:
    writer = _ChunkWriter(f"chatcmpl-{query.request_id}", created, model, query.sampling.logprobs)

    async def render(events: AsyncIterator[PipelineEvent]) -> AsyncIterator[ServerSentEvent]:
        async for event in events:
            if isinstance(event, TokenEvent):
                delta = chunk_types.ChoiceDelta(content=event.text)
                yield writer.chunk(delta, logprobs=event.logprobs)
            elif isinstance(event, SourcesEvent):
                sources = [source.model_dump() for source in sources_of(event.prepared)]
                delta = chunk_types.ChoiceDelta(role="assistant", content="")
                yield writer.chunk(delta, sources=sources)
            elif isinstance(event, DoneEvent):
                for done in writer.finish(event.result, include_usage, ignored_system):
                    yield done
            elif isinstance(event, FailedEvent):
                error = ApiError.from_stage(event.error)
                yield sse_event(json.dumps(error_body(error, query.request_id)))
                break
        yield DONE

    return render


@dataclass(frozen=True)
class _ChunkWriter:
    """The `chat.completion.chunk` events of one streamed completion."""

    chunk_id: str
    created: int
    model: str
    with_logprobs: bool

    def chunk(
        self,
        delta: chunk_types.ChoiceDelta,
        finish_reason=None,
        index: int = 0,
        logprobs: tuple[TokenLogprob, ...] | None = None,
        **extra,
    ) -> ServerSentEvent:
        """One choice's delta; `extra` are the chunk's own extra fields (sources, rag)."""
        choice = chunk_types.Choice(index=index, delta=delta, finish_reason=finish_reason)
        if self.with_logprobs and logprobs is not None:
            choice.logprobs = chunk_types.ChoiceLogprobs(content=logprobs_of(logprobs))
        return self._event(choices=[choice], **extra)

    def finish(
        self, result: RagResult, include_usage: bool, ignored_system: int
    ) -> Iterator[ServerSentEvent]:
        """The chunks after the last token: the other choices, each whole (they were drawn
        beside the first), the first's finish with the RAG figures, and the usage if asked."""
        for choice in result.extra_choices:
            delta = chunk_types.ChoiceDelta(role="assistant", content=choice.text)
            reason = _finish_reason(choice.finish_reason)
            yield self.chunk(delta, reason, choice.index, choice.logprobs)
        yield self.chunk(
            chunk_types.ChoiceDelta(),
            _finish_reason(result.finish_reason),
            rag=_rag_extras(result, ignored_system),
        )
        if include_usage:
            yield self._event(choices=[], usage=usage_of(result))

    def _event(self, **fields) -> ServerSentEvent:
        body = ChatCompletionChunk(
            id=self.chunk_id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            **fields,
        )
        return sse_event(body.model_dump_json(exclude_unset=True))


def _finish_reason(reason: str | None):
    # OpenAI's finish reasons; vLLM's "abort" has no counterpart and reads as a stop.
    return reason if reason in ("stop", "length", "content_filter") else "stop"


def _rag_extras(result: RagResult, ignored_system: int) -> dict:
    shown = response_model(result)
    return {
        "citations": (
            None if shown.citations is None else [c.model_dump() for c in shown.citations]
        ),
        "answer_style": shown.answer_style,
        "retrieval_query": shown.retrieval_query and shown.retrieval_query.model_dump(),
        "history_turns_used": shown.history_turns_used,
        "ignored_system_messages": ignored_system,
        "compression_method": shown.compression_method,
        "degraded": shown.degraded,
        "context_tokens_before": shown.usage.context_tokens_before,
        "context_tokens_after": shown.usage.context_tokens_after,
        "cached_prompt_tokens_by_segment": (
            segments.model_dump()
            if (segments := shown.usage.cached_prompt_tokens_by_segment) is not None
            else None
        ),
        "context_truncated": shown.context_truncated,
        "timings_ms": shown.timings_ms.model_dump(),
        "tpot_ms": shown.tpot_ms,
        "context": None if shown.context is None else [c.model_dump() for c in shown.context],
    }
