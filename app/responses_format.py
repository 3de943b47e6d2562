"""The Responses API face of the pipeline: `input` in, a `response` object out.

Retrieval is what OpenAI's file search is, so a response's output holds a
`file_search_call` item (the search text and each source chunk: its id, title, score and
the text the model saw) and then the assistant `message`, whose citations are
`file_citation` annotations (the source chunk, at the end of the answer sentence it
supports). Bodies and events are the `openai` package's own types. Stateless: nothing is
stored, so `previous_response_id` and `store: true` are refused (app.api).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from openai.types.responses import (
    Response,
    ResponseFileSearchToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseUsage,
)
from openai.types.responses import response_file_search_tool_call as search_types
from openai.types.responses import response_output_text as text_types
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from sse_starlette import ServerSentEvent

from app import sampling
from app.errors import ApiError, bad_request, error_body
from app.openai_format import IGNORED_ROLES, ChatConversation
from app.rag_format import response_model, sources_of
from app.schemas import JsonObjectFormat, ResponsesRequest, TextJsonSchemaFormat
from pipeline.messages import OutputFormat, PreparedPrompt, Sampling, TokenEvent, TokenLogprob, Turn
from pipeline.rag import (
    DoneEvent,
    FailedEvent,
    PipelineEvent,
    RagQuery,
    RagResult,
    RetrievalQuery,
    SourcesEvent,
)

# Input content parts that carry text; a part of any other type (an image, a file) is refused.
TEXT_PARTS = ("input_text", "output_text", "text")
# Output items a client sends back from an earlier response: ours carry no conversation.
SKIPPED_ITEMS = ("file_search_call", "reasoning")


def check_refused(body: ResponsesRequest) -> None:
    sampling.check_tools(body.tools, body.tool_choice)
    if body.previous_response_id is not None:
        raise sampling.unsupported(
            "previous_response_id", "responses are not stored; send the conversation as input"
        )
    if body.conversation is not None:
        raise sampling.unsupported("conversation", "responses are not stored")
    if body.store:
        raise sampling.unsupported("store", "responses are not stored; send store: false")
    if body.background:
        raise sampling.unsupported("background", "responses are answered in the request")
    if body.prompt is not None:
        raise sampling.unsupported("prompt", "there are no stored prompts")


def conversation_of(body: ResponsesRequest) -> ChatConversation:
    """The last message (a user's) as the question, the user and assistant messages before
    it as the history; `instructions` and system or developer messages are counted."""
    ignored = 1 if body.instructions else 0
    if isinstance(body.input, str):
        return ChatConversation(body.input, (), (), ignored)
    messages: list[tuple[int, str, str]] = []
    for index, item in enumerate(body.input):
        kind = item.get("type", "message")
        if kind in SKIPPED_ITEMS:
            continue
        if kind != "message":
            raise sampling.unsupported(f"input.{index}.type", f"{kind!r} items (no tools here)")
        role = item.get("role")
        if role in IGNORED_ROLES:
            ignored += 1
        elif role in ("user", "assistant"):
            messages.append((index, role, _text_of(item.get("content"), index)))
        else:
            raise bad_request(f"input.{index}.role: {role!r} is not a role", f"input.{index}.role")
    if not messages or messages[-1][1] != "user":
        raise bad_request("the last message must be the user's question", param="input")
    history = tuple(Turn(role, text) for _, role, text in messages[:-1])  # type: ignore[arg-type]
    positions = tuple(index for index, _, _ in messages[:-1])
    return ChatConversation(messages[-1][2], history, positions, ignored)


def _text_of(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"input.{index}.content must be text or parts", f"input.{index}.content")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise sampling.unsupported(f"input.{index}.content", f"{kind!r} parts (text only)")
        texts.append(str(part.get("text", "")))
    return " ".join(texts)


def sampling_of(body: ResponsesRequest) -> Sampling:
    text_format = body.text.format if body.text else None
    output = OutputFormat()
    if isinstance(text_format, JsonObjectFormat):
        output = OutputFormat("json_object")
    elif isinstance(text_format, TextJsonSchemaFormat):
        schema = sampling.checked_schema(text_format.json_schema, "text.format")
        output = OutputFormat("json_schema", schema)
    return sampling.sampling_of(
        top_p=body.top_p,
        seed=body.seed,
        logprobs=body.top_logprobs is not None,
        top_logprobs=body.top_logprobs,
        output=output,
    )


class ResponseBuilder:
    """The response object of one request, as it stands at each point of its stream."""

    def __init__(self, query: RagQuery, body: ResponsesRequest, created: int) -> None:
        self.query = query
        self.body = body
        self.created = created
        self.id = f"resp_{query.request_id}"
        self.search_id = f"fs_{query.request_id}"
        self.message_id = f"msg_{query.request_id}"

    def search_call(
        self, prepared: PreparedPrompt, search: RetrievalQuery
    ) -> ResponseFileSearchToolCall:
        return ResponseFileSearchToolCall(
            id=self.search_id,
            type="file_search_call",
            status="completed",
            queries=[search.text],
            results=[
                search_types.Result(
                    file_id=source.chunk_id,
                    filename=source.title,
                    score=source.score,
                    text=source.text,
                    attributes={"doc_id": source.doc_id},
                )
                for source in prepared.sources
            ],
        )

    def message(
        self, text: str, status: str, result: RagResult | None = None
    ) -> ResponseOutputMessage:
        parts = [] if status == "in_progress" else [self.text_part(text, result)]
        return ResponseOutputMessage(
            id=self.message_id, type="message", role="assistant", status=status, content=parts
        )

    def text_part(self, text: str, result: RagResult | None) -> ResponseOutputText:
        annotations = list(annotations_of(result)) if result is not None else []
        logprobs = None
        if self.query.sampling.logprobs and result is not None:
            logprobs = [_logprob(token) for token in result.logprobs]
        return ResponseOutputText(
            type="output_text", text=text, annotations=annotations, logprobs=logprobs
        )

    def response(self, status: str, output: list[Any], result: RagResult | None = None) -> Response:
        body = self.body
        text_format: dict[str, Any] = {"type": "text"}
        if body.text and body.text.format is not None:
            text_format = body.text.format.model_dump(by_alias=True, exclude_none=True)
        response = Response(
            id=self.id,
            object="response",
            created_at=self.created,
            model=body.model,
            status=status,
            output=output,
            parallel_tool_calls=False,
            tool_choice="none",
            tools=[],
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            temperature=self.query.temperature,
            top_p=body.top_p,
            text={"format": text_format},
            store=False,
            usage=usage_of(result) if result is not None else None,
            incomplete_details=(
                {"reason": "max_output_tokens"}
                if result is not None and result.finish_reason == "length"
                else None
            ),
        )
        if result is not None:
            response.rag = rag_extras(result)  # type: ignore[attr-defined]
        return response

    def completed(self, result: RagResult) -> Response:
        status = "incomplete" if result.finish_reason == "length" else "completed"
        output = [
            self.search_call(result.prepared, result.retrieval_query),
            self.message(result.answer, status, result),
        ]
        return self.response(status, output, result)


def annotations_of(result: RagResult) -> Iterator[text_types.AnnotationFileCitation]:
    titles = {source.chunk_id: source.title for source in result.prepared.sources}
    for citation in result.citations or ():
        yield text_types.AnnotationFileCitation(
            type="file_citation",
            file_id=citation.source_id,
            filename=titles.get(citation.source_id, citation.source_id),
            index=citation.answer_end,
        )


def _logprob(token: TokenLogprob) -> text_types.Logprob:
    return text_types.Logprob(
        token=token.token,
        logprob=token.logprob,
        bytes=list(token.token.encode()),
        top_logprobs=[
            text_types.LogprobTopLogprob(token=text, logprob=value, bytes=list(text.encode()))
            for text, value in token.top
        ],
    )


def usage_of(result: RagResult) -> ResponseUsage:
    usage = result.usage
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=usage.cached_tokens, cache_write_tokens=0
        ),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
    )


def rag_extras(result: RagResult) -> dict[str, Any]:
    """The RAG figures beside the response, as on the chat endpoint's `rag`."""
    shown = response_model(result)
    return {
        "citations": None if shown.citations is None else [c.model_dump() for c in shown.citations],
        "sources": [source.model_dump() for source in sources_of(result.prepared)],
        "compression_method": shown.compression_method,
        "context_tokens_before": shown.usage.context_tokens_before,
        "context_tokens_after": shown.usage.context_tokens_after,
        "timings_ms": shown.timings_ms.model_dump(),
        "tpot_ms": shown.tpot_ms,
        "degraded": shown.degraded,
    }


def response_body(result: RagResult, builder: ResponseBuilder) -> dict[str, Any]:
    return builder.completed(result).model_dump(exclude_none=True)


def sse_events(builder: ResponseBuilder):
    """The typed event stream: created, in_progress, the file search item, the message item
    and its text part with a delta per token batch, the annotations, then completed."""
    numbers = iter(range(1_000_000))

    def event(kind: str, **fields: Any) -> ServerSentEvent:
        payload = {"type": kind, "sequence_number": next(numbers), **fields}
        return ServerSentEvent(data=json.dumps(payload), event=kind)

    def dumped(model: Any) -> dict[str, Any]:
        return model.model_dump(exclude_none=True)

    async def render(events: AsyncIterator[PipelineEvent]) -> AsyncIterator[ServerSentEvent]:
        started = dumped(builder.response("in_progress", []))
        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)
        text = ""
        where = {"item_id": builder.message_id, "output_index": 1, "content_index": 0}
        async for item in events:
            if isinstance(item, SourcesEvent):
                search = dumped(builder.search_call(item.prepared, item.retrieval_query))
                yield event("response.output_item.added", output_index=0, item=search)
                yield event("response.output_item.done", output_index=0, item=search)
                message = dumped(builder.message("", "in_progress"))
                yield event("response.output_item.added", output_index=1, item=message)
                part = {"type": "output_text", "text": "", "annotations": []}
                yield event("response.content_part.added", part=part, **where)
            elif isinstance(item, TokenEvent):
                text += item.text
                logprobs = [dumped(_logprob(token)) for token in item.logprobs]
                yield event(
                    "response.output_text.delta", delta=item.text, logprobs=logprobs, **where
                )
            elif isinstance(item, DoneEvent):
                result = item.result
                for index, annotation in enumerate(annotations_of(result)):
                    yield event(
                        "response.output_text.annotation.added",
                        annotation_index=index,
                        annotation=dumped(annotation),
                        **where,
                    )
                yield event("response.output_text.done", text=result.answer, logprobs=[], **where)
                part = dumped(builder.text_part(result.answer, result))
                yield event("response.content_part.done", part=part, **where)
                done = builder.completed(result)
                yield event(
                    "response.output_item.done", output_index=1, item=dumped(done.output[1])
                )
                kind = "response.completed" if done.status == "completed" else "response.incomplete"
                yield event(kind, response=dumped(done))
            elif isinstance(item, FailedEvent):
                error = ApiError.from_stage(item.error)
                body = error_body(error, builder.query.request_id)["error"]
                yield event(
                    "error", code=body["code"], message=body["message"], param=body["param"]
                )
                break

    return render
