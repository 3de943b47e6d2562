"""Request and response bodies of the HTTP API (no serving logic here)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from pipeline.messages import (
    COLLECTION_NAME_PATTERN,
    DEFAULT_COLLECTION,
    AnswerStyle,
    CompressionPolicy,
    RetrievalMode,
    RetrievalQueryMode,
)
from prepare.methods import known_method, method_names

# A registered compression method's name; the OpenAPI document lists the registry's names
# (the playground reads its menu from there).
MethodName = Annotated[
    str,
    AfterValidator(known_method),
    Field(json_schema_extra=lambda schema: schema.update(enum=list(method_names()))),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CompressionOptions(_Strict):
    method: MethodName | None = Field(
        None, description="Overrides the default method (prepare.methods' registry)."
    )
    rate: float | None = Field(None, gt=0, le=1, description="Fraction of context tokens kept.")
    target_tokens: int | None = Field(None, ge=1, description="Context tokens to keep.")
    policy: CompressionPolicy | None = Field(
        None,
        description="'always', or 'auto': compress only when the predicted prefill saving "
        "exceeds the compression's own predicted cost.",
    )
    reuse: bool | None = Field(
        None,
        description="Lay the prompt out for the prefix cache: a follow-up continues the "
        "prompts its conversation sent before, and, where compression.reuse.path_passages "
        "allows, passages the generator likely still holds from earlier requests go first "
        "and whole, only the rest compressed. Unset: compression.reuse.enabled (on).",
    )

    @model_validator(mode="after")
    def _one_target(self) -> CompressionOptions:
        if self.rate is not None and self.target_tokens is not None:
            raise ValueError("give rate or target_tokens, not both")
        return self


class RetrievalOptions(_Strict):
    mode: RetrievalMode | None = Field(
        None,
        description="'dense' (embeddings, FAISS), 'lexical' (BM25) or 'hybrid' (both, fused "
        "by weighted reciprocal rank fusion); unset: the configured default.",
    )
    dense_weight: float | None = Field(
        None, ge=0, le=100, description="hybrid: the dense ranking's weight."
    )
    lexical_weight: float | None = Field(
        None, ge=0, le=100, description="hybrid: the BM25 ranking's weight."
    )

    @model_validator(mode="after")
    def _a_weight(self) -> RetrievalOptions:
        if self.dense_weight == 0 and self.lexical_weight == 0:
            raise ValueError("dense_weight and lexical_weight must not both be 0")
        return self


class RagOptions(_Strict):
    collection: str | None = Field(
        None,
        pattern=COLLECTION_NAME_PATTERN,
        description=f"The collection to answer from; unset: '{DEFAULT_COLLECTION}', the "
        "shipped corpus.",
    )
    top_k: int | None = Field(None, ge=1, description="Chunks to retrieve.")
    retrieval: RetrievalOptions | None = Field(
        None, description="How chunks are ranked: dense, lexical or hybrid, and the weights."
    )
    compression: CompressionOptions | None = None
    include_context: bool = Field(
        False, description="Return the (compressed) context the model saw, for evaluation."
    )
    answer_style: AnswerStyle | None = Field(
        None,
        description="'short': the answer span only; 'explained': a few sentences. Each has "
        "its own static system prompt.",
    )
    retrieval_query: RetrievalQueryMode | None = Field(
        None,
        description="How a follow-up is retrieved: 'last' (the question alone), 'join' (the "
        "recent user turns joined) or 'rewrite' (a standalone question by the generator).",
    )
    citations: bool | None = Field(
        None, description="Attribute the answer's sentences to source sentences."
    )


class HistoryTurn(_Strict):
    role: Literal["user", "assistant"]
    content: str


class RagQueryRequest(RagOptions):
    question: str = Field(..., description="The question to answer from the collection.")
    history: list[HistoryTurn] = Field(
        default_factory=list,
        description="The conversation so far, oldest first: earlier questions and answers, "
        "text only. The oldest turns are cut to the history token budget.",
    )
    max_tokens: int | None = Field(None, ge=1, description="Longest answer, in tokens.")
    temperature: float | None = Field(None, ge=0, le=2)
    stream: bool = False


class Source(BaseModel):
    id: str
    doc_id: str
    title: str
    score: float


class CachedSegments(BaseModel):
    system: int = Field(description="From the static system prompt.")
    history: int = Field(description="From the earlier turns of the conversation.")
    passages: int = Field(description="From the retrieved passages.")
    question: int = Field(description="From the question and the chat template's tail.")


class RagUsage(BaseModel):
    prompt_tokens: int
    cached_prompt_tokens: int
    context_tokens_before: int
    context_tokens_after: int
    completion_tokens: int
    reused_passages: int = Field(
        0,
        description="With compression.reuse: passages laid out first and whole because the "
        "generator likely still held them (a prediction; cached_prompt_tokens is the fact).",
    )
    reused_passage_tokens: int = Field(0, description="Those passages' tokens.")
    continued_turns: int = Field(
        0,
        description="With compression.reuse: earlier questions sent as the generator saw them "
        "(their sources included), so the prompt continues the ones before it.",
    )
    cached_prompt_tokens_by_segment: CachedSegments | None = Field(
        None,
        description="cached_prompt_tokens by the part of the prompt they came from, in the "
        "prompt's order (a prefix cache serves a prefix).",
    )


class ContextPassage(BaseModel):
    id: str
    text: str


class Timings(BaseModel):
    """Milliseconds. `retrieve` and `compress` are the stages' own work; `queue` is the time
    calls waited before a stage began them (routing queue, transport in) and `network` the
    rest of their round trips; `ttft` and `total` are measured from the request's arrival."""

    retrieve: float
    compress: float
    rewrite: float = 0.0
    attribute: float = 0.0
    queue: float = 0.0
    network: float = 0.0
    ttft: float
    total: float


class CompressionDecisionInfo(BaseModel):
    """Why the `auto` policy did or did not compress this request."""

    requested_method: str
    compressed: bool
    predicted_saving_ms: float
    predicted_cost_ms: float


class CitationInfo(BaseModel):
    """An answer sentence and the source sentence that supports it. Spans are [start, end)
    character offsets into `answer` and into that source's passage (`context[].text`)."""

    answer_span: tuple[int, int]
    source_id: str
    source_span: tuple[int, int]
    score: float


class RetrievalQueryInfo(BaseModel):
    """What retrieval searched for: `mode` is what was applied."""

    mode: RetrievalQueryMode
    text: str
    rewrite_failed: bool = False


class RagQueryResponse(BaseModel):
    id: str
    answer: str
    sources: list[Source]
    collection: str = Field(DEFAULT_COLLECTION, description="The collection searched.")
    index_version: str = Field(
        "", description="The version of it that every stage of this request read."
    )
    citations: list[CitationInfo] | None = Field(
        None, description="Null when not asked for or when attribution was unavailable."
    )
    answer_style: AnswerStyle = "explained"
    retrieval_query: RetrievalQueryInfo | None = None
    history_turns_used: int = Field(0, description="Earlier turns that fit the prompt.")
    compression_method: str
    compression_decision: CompressionDecisionInfo | None = None
    degraded: str | None = Field(
        None,
        description="Why the context was sent uncompressed against the request's plan "
        "(compressor_timeout, compressor_unavailable, compressor_overloaded, ...).",
    )
    context_truncated: bool
    finish_reason: str | None
    usage: RagUsage
    timings_ms: Timings
    tpot_ms: float | None
    context: list[ContextPassage] | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(_Strict):
    """The OpenAI chat request, minus what a RAG answer cannot honour (n > 1, tools, ...)."""

    model: str
    messages: list[ChatMessage] = Field(
        ...,
        min_length=1,
        description="The conversation; the last message is the question. System messages "
        "are ignored: the system prompt is the service's own (it is what the prefix cache "
        "holds).",
    )
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="Only one choice is generated.")
    user: str | None = None
    rag: RagOptions | None = Field(None, description="Retrieval and compression options.")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "rag-serve"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
