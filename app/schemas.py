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
        description="Lay a follow-up's prompt out for the prefix cache: it continues the "
        "prompts its conversation sent before, so their KV blocks are reused. Unset: "
        "compression.reuse.enabled (on).",
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
    include_obfuscation: bool | None = Field(None, description="Accepted and ignored.")


class JsonSchemaSpec(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(..., pattern=r"^[A-Za-z0-9_-]{1,64}$", description="The schema's name.")
    description: str | None = None
    json_schema: dict[str, Any] = Field(
        default_factory=dict, alias="schema", description="A JSON Schema the answer must fit."
    )
    strict: bool | None = Field(
        None, description="Accepted; the answer always fits the schema (guided decoding)."
    )


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]

# OpenAI's limits: at most 4 stop sequences, 20 alternatives per token.
MAX_STOP_SEQUENCES = 4
MAX_TOP_LOGPROBS = 20
# Answers one request may ask for (n): each is a generation on the same prompt.
MAX_CHOICES = 8
MAX_LOGIT_BIAS_ENTRIES = 1024


class SamplingFields(_Strict):
    """OpenAI's sampling fields, shared by the chat and Responses APIs, with vLLM's
    semantics (an unset field keeps the model's generation-config default)."""

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling mass.")
    seed: int | None = Field(
        None, ge=-(2**63), lt=2**64, description="With temperature > 0, repeatable draws."
    )


class ChatCompletionRequest(SamplingFields):
    """OpenAI's chat request. Every standard field is accepted: the sampling fields go to
    the engine, `response_format` to its guided decoding, `n` draws that many answers from
    one retrieval and one prompt; `user`, `metadata`, `store` and the like are accepted and
    ignored; `tools` and audio are refused (docs/api.md has the table)."""

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
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="Answers to the one prompt.")
    stop: str | list[str] | None = Field(
        None, description=f"Up to {MAX_STOP_SEQUENCES} strings where the answer ends."
    )
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(
        None, description="Token id (as a string) to a bias in [-100, 100]."
    )
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = Field(
        None, description="Refused unless empty: the service's tool is its own retrieval."
    )
    tool_choice: str | dict[str, Any] | None = Field(
        None, description="'none' or 'auto' without tools; anything else is refused."
    )
    parallel_tool_calls: bool | None = Field(None, description="Accepted and ignored.")
    functions: list[dict[str, Any]] | None = Field(None, description="Refused (tools).")
    function_call: str | dict[str, Any] | None = Field(None, description="Refused (tools).")
    audio: dict[str, Any] | None = Field(None, description="Refused: text only.")
    modalities: list[str] | None = Field(None, description="Only ['text'].")
    prediction: dict[str, Any] | None = Field(None, description="Refused.")
    web_search_options: dict[str, Any] | None = Field(None, description="Refused.")
    user: str | None = Field(None, description="Accepted and ignored.")
    metadata: dict[str, str] | None = Field(None, description="Accepted and ignored.")
    store: bool | None = Field(None, description="Accepted and ignored: nothing is stored.")
    service_tier: str | None = Field(None, description="Accepted and ignored.")
    reasoning_effort: str | None = Field(None, description="Accepted and ignored.")
    verbosity: str | None = Field(None, description="Accepted and ignored.")
    prompt_cache_key: str | None = Field(None, description="Accepted and ignored.")
    safety_identifier: str | None = Field(None, description="Accepted and ignored.")
    rag: RagOptions | None = Field(None, description="Retrieval and compression options.")


class TextJsonSchemaFormat(_Strict):
    """The Responses API's `text.format` for a schema (flat: name and schema beside type)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["json_schema"]
    name: str = Field(..., pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


TextFormatField = Annotated[
    TextFormat | JsonObjectFormat | TextJsonSchemaFormat, Field(discriminator="type")
]


class ResponseTextOptions(_Strict):
    format: TextFormatField | None = None
    verbosity: str | None = Field(None, description="Accepted and ignored.")


class ResponsesRequest(SamplingFields):
    """OpenAI's Responses API request, stateless: `input` is the conversation (a string,
    or message items, oldest first, the last the user's question); `instructions` are
    ignored like system messages, since the system prompt is the service's own. `seed` is
    an extension (vLLM's), as on the chat endpoint. Tools, stored responses and
    `previous_response_id` are refused (docs/api.md has the table)."""

    model: str
    input: str | list[dict[str, Any]] = Field(..., description="The question, or message items.")
    instructions: str | None = Field(None, description="Ignored: the system prompt is fixed.")
    max_output_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    text: ResponseTextOptions | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    store: bool | None = Field(None, description="Only false: responses are not stored.")
    previous_response_id: str | None = Field(None, description="Refused: stateless.")
    conversation: str | dict[str, Any] | None = Field(None, description="Refused: stateless.")
    background: bool | None = Field(None, description="Only false.")
    tools: list[dict[str, Any]] | None = Field(None, description="Refused unless empty.")
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = Field(None, description="Accepted and ignored.")
    max_tool_calls: int | None = Field(None, description="Accepted and ignored.")
    prompt: dict[str, Any] | None = Field(None, description="Refused: no stored prompts.")
    include: list[str] | None = Field(None, description="Accepted; sources are always included.")
    reasoning: dict[str, Any] | None = Field(None, description="Accepted and ignored.")
    truncation: str | None = Field(None, description="Accepted and ignored.")
    metadata: dict[str, str] | None = Field(None, description="Accepted and ignored.")
    user: str | None = Field(None, description="Accepted and ignored.")
    service_tier: str | None = Field(None, description="Accepted and ignored.")
    stream_options: dict[str, Any] | None = Field(None, description="Accepted and ignored.")
    prompt_cache_key: str | None = Field(None, description="Accepted and ignored.")
    prompt_cache_retention: str | None = Field(None, description="Accepted and ignored.")
    prompt_cache_options: dict[str, Any] | None = Field(None, description="Accepted and ignored.")
    context_management: list[dict[str, Any]] | dict[str, Any] | None = Field(
        None, description="Accepted and ignored."
    )
    safety_identifier: str | None = Field(None, description="Accepted and ignored.")
    rag: RagOptions | None = Field(None, description="Retrieval and compression options.")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "rag-serve"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
