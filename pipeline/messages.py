"""What the stages of the request path send each other, as plain typed values.

ingress --(question, top_k)--> retriever --Retrieval--> ingress --(Retrieval, plan)-->
compressor --PreparedPrompt--> ingress --GenerationRequest--> generator --batches of
GenerationEvent--> ingress.

No web framework and no Ray here: these values cross Ray Serve hops (pickled), feed the
pipeline in plain asyncio, and are what unit tests build by hand. Request-level failures a
stage detects (a bad top_k, a prompt that cannot fit) travel as `StageError` values, so they
reach the ingress intact; infrastructure failures (overload, a dead replica) are exceptions of
`pipeline.stages`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

# A compression method's name: one registered in prepare.methods ("none", "sentences", ...).
CompressionMethod = str
CompressionPolicy = Literal["always", "auto"]
COMPRESSION_POLICIES: tuple[CompressionPolicy, ...] = ("always", "auto")
# short: the answer span only; explained: a few sentences. Each has its own static system
# prompt, so both are held by the prefix cache.
AnswerStyle = Literal["short", "explained"]
ANSWER_STYLES: tuple[AnswerStyle, ...] = ("short", "explained")
# How a follow-up becomes the text retrieval searches for: the last user message alone,
# the recent user turns joined, or a standalone question rewritten by the generator.
RetrievalQueryMode = Literal["last", "join", "rewrite"]
RETRIEVAL_QUERY_MODES: tuple[RetrievalQueryMode, ...] = ("last", "join", "rewrite")
# How the retriever ranks chunks: by embedding (FAISS), by words (BM25), or both fused.
RetrievalMode = Literal["dense", "lexical", "hybrid"]
RETRIEVAL_MODES: tuple[RetrievalMode, ...] = ("dense", "lexical", "hybrid")
# The collection a query searches when it names none: the shipped corpus
# (retriever.index_path), read-only; users' own collections are created over the API.
DEFAULT_COLLECTION = "default"
# A collection's name: lower-case letters, digits, '-' and '_', at most 63 characters (it is
# a folder name, and appears in URLs).
COLLECTION_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"


@dataclass(frozen=True, slots=True)
class StageError:
    """A request a stage refuses, as data: the ingress maps it to an HTTP status once."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """How one request wants its chunks ranked; a field left None takes the retriever's
    configured default (retriever.hybrid)."""

    mode: RetrievalMode | None = None
    dense_weight: float | None = None
    lexical_weight: float | None = None
    # The collection to search; None is the shipped corpus (DEFAULT_COLLECTION).
    collection: str | None = None


DEFAULT_SEARCH = SearchOptions()


@dataclass(frozen=True, slots=True)
class Turn:
    """One earlier message of the conversation, text only."""

    role: Literal["user", "assistant"]
    content: str


@dataclass(frozen=True)
class Conversation:
    """What the prompt is built from besides the sources: the current question, the earlier
    turns (oldest first) and the answer style, which picks the static system prompt."""

    question: str
    history: tuple[Turn, ...] = ()
    answer_style: AnswerStyle = "explained"


@dataclass(frozen=True, slots=True)
class StageTiming:
    """When a stage began its work on one call (Unix seconds) and how long the work took.

    The caller subtracts both from its own round trip to tell queueing and transport apart
    from the stage's work (`pipeline.rag.HopTiming`).
    """

    started_at_s: float
    own_ms: float


@dataclass(frozen=True)
class CompressionPlan:
    """How much context to keep: a `rate` (fraction of tokens) or an absolute target."""

    method: CompressionMethod
    rate: float = 0.5
    target_tokens: int | None = None
    # "always", or "auto": only when the cost model predicts that compressing pays.
    policy: CompressionPolicy = "always"
    # Lay a follow-up out for the prefix cache: it continues the prompts its conversation
    # sent before (prepare.continuation).
    reuse: bool = False

    def target_for(self, tokens_before: int) -> int:
        if self.target_tokens is not None:
            return min(self.target_tokens, tokens_before)
        return min(tokens_before, max(1, math.ceil(self.rate * tokens_before)))


@dataclass(frozen=True, slots=True)
class EmbeddedTexts:
    """Texts embedded by the retriever's model: one unit vector a row, and the tokens read."""

    vectors: np.ndarray
    tokens: int


@dataclass(frozen=True, slots=True)
class RetrievedChunk:
    """One search hit. `row` is its position in the index the retriever searched; the
    compressor finds the chunk's sentences and their embeddings by it."""

    chunk_id: str
    doc_id: str
    title: str
    text: str
    score: float
    row: int


@dataclass(frozen=True, slots=True)
class Retrieval:
    """The retriever's answer: the question's unit vector and the best chunks, best first."""

    question_embedding: np.ndarray
    chunks: tuple[RetrievedChunk, ...]
    index_version: str
    timing: StageTiming
    # The collection searched: with `index_version`, the one version folder every later
    # stage of this request reads (the compressor's sentence store among them).
    collection: str = DEFAULT_COLLECTION


@dataclass(frozen=True, slots=True)
class CompressionDecision:
    """What the `auto` policy predicted for one request, and whether it compressed."""

    compress: bool
    predicted_saving_ms: float
    predicted_cost_ms: float


@dataclass(frozen=True, slots=True)
class PromptSource:
    """A source as the model saw it: the chunk's identity and its (compressed) text."""

    chunk_id: str
    doc_id: str
    title: str
    text: str
    score: float


@dataclass(frozen=True, slots=True)
class Citation:
    """One answer sentence attributed to the source sentence that supports it.

    Offsets are character offsets, end exclusive: `answer_*` into the (cleaned) answer,
    `source_*` into the source's text as the model saw it (`PromptSource.text`).
    """

    answer_start: int
    answer_end: int
    source_id: str
    source_start: int
    source_end: int
    score: float


@dataclass(frozen=True, slots=True)
class Attribution:
    """The compressor's citations for one answer, and when and how long it took."""

    citations: tuple[Citation, ...]
    timing: StageTiming


@dataclass(frozen=True, slots=True)
class RetrievalQuery:
    """What retrieval searched for: `mode` is what was applied ("last" without history;
    "join" also when a rewrite was asked but failed, which `rewrite_failed` says)."""

    mode: RetrievalQueryMode
    text: str
    rewrite_failed: bool = False


# The parts of a prompt in the order it holds them (prepare.prompt's layout); the last is
# everything after the passages: the question and the chat template's tail.
PromptSegment = Literal["system", "history", "passages", "question"]
PROMPT_SEGMENTS: tuple[PromptSegment, ...] = ("system", "history", "passages", "question")


@dataclass(frozen=True, slots=True)
class PromptLayout:
    """How many tokens each part of a prompt holds, counted by the serving tokenizer with the
    chat template's markers (exact to a token or two at a part's edge, where the tokenizer
    may merge across it)."""

    system: int
    history: int
    passages: int

    def cached_by_segment(self, cached_tokens: int) -> dict[PromptSegment, int]:
        """Which parts the engine's cached tokens came from: a prefix cache serves a prefix,
        so they fill the parts in order; whatever lies past the passages is the question's."""
        split: dict[PromptSegment, int] = {}
        left = max(0, cached_tokens)
        parts = (self.system, self.history, self.passages)
        for segment, tokens in zip(PROMPT_SEGMENTS[:-1], parts, strict=True):
            split[segment] = min(left, tokens)
            left -= split[segment]
        split["question"] = left
        return split


@dataclass(frozen=True)
class PreparedPrompt:
    """The generator's input and what compression and the token budget did to get there.

    `degraded` names why the plan was not followed ("compressor_timeout",
    "compressor_unavailable", ...) when the ingress fell back to the uncompressed context.
    """

    messages: list[dict[str, str]]
    sources: tuple[PromptSource, ...]
    method: str
    context_tokens_before: int
    context_tokens_after: int
    compress_ms: float
    truncated: bool
    timing: StageTiming
    decision: CompressionDecision | None = None
    degraded: str | None = None
    # Earlier turns that made it into the prompt (the oldest are cut to the history budget).
    history_turns: int = 0
    # Earlier questions sent as the generator saw them, sources included (plan.reuse), so
    # the prompt continues the one before it (prepare.continuation).
    continued_turns: int = 0
    # The chunk id of the passage that opens the prompt past the system prompt: a single
    # question's first source, or a continued follow-up's first source of its first turn
    # ("" where the prompt opens with something else: a history sent as text, no sources).
    opening_passage: str = ""
    # Token counts of the prompt's parts (None where a prompt was built without them).
    layout: PromptLayout | None = None


# What the answer must be: free text, any JSON object, or JSON that fits a schema.
OutputKind = Literal["text", "json_object", "json_schema"]


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """Structured output, enforced by the engine's guided decoding. `schema` is the JSON
    Schema of a `json_schema` answer (a dict), None otherwise."""

    kind: OutputKind = "text"
    schema: dict | None = None

    @property
    def is_json(self) -> bool:
        return self.kind != "text"


@dataclass(frozen=True, slots=True)
class Sampling:
    """How tokens are drawn beyond `temperature` and `max_tokens`, with vLLM's
    `SamplingParams` semantics; the defaults change nothing. `top_logprobs` counts the
    alternatives returned per token besides the sampled one (with `logprobs`)."""

    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token id, bias) pairs: a tuple, so that the request stays hashable and frozen.
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    output: OutputFormat = OutputFormat()

    def set_fields(self) -> dict[str, object]:
        """The fields vLLM and OpenAI name alike, those a request set (unset ones keep the
        model's defaults): top_p, stop, seed and the two penalties."""
        fields: dict[str, object] = {}
        if self.top_p is not None:
            fields["top_p"] = self.top_p
        if self.stop:
            fields["stop"] = list(self.stop)
        if self.seed is not None:
            fields["seed"] = self.seed
        if self.presence_penalty:
            fields["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty:
            fields["frequency_penalty"] = self.frequency_penalty
        return fields


DEFAULT_SAMPLING = Sampling()


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One chat completion. The field is `messages` because Ray Serve LLM's
    PrefixCacheAffinityRouter reads the prompt from an argument's `messages`."""

    messages: list[dict[str, str]]
    max_tokens: int
    temperature: float
    request_id: str
    # What a request router may route on (generation.routing): the identity of the prompt's
    # opening past the system prompt, "" when it has none worth keeping together.
    routing_key: str = ""
    sampling: Sampling = DEFAULT_SAMPLING


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log probability, and the most likely alternatives (with
    `Sampling.top_logprobs`), as (token, logprob) pairs."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """Newly generated text (one or more tokens); with `Sampling.logprobs`, each token's log
    probability (the engine's tokens: the text may since have been cleaned)."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class TokenUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """The last event of a completed generation."""

    reason: str | None
    usage: TokenUsage


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """The engine refused or failed the request; nothing follows."""

    error: StageError


GenerationEvent = TokenEvent | FinishEvent | ErrorEvent
