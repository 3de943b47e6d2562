"""The one typed configuration tree of the RAG application, composed from each stage's own.

`serve_config.yaml` passes it through the application's `args:`; unknown keys are rejected,
and each field says what it does. Each stage's settings live in its own folder
(`retrieval/config.py`, `prepare/config.py`, `generation/config.py`, `corpus/config.py`);
this module adds the ingress's and the conversation's, and the checks that span stages.
Relative paths are resolved against the project root (`pipeline.config_base`), so the same
file works from `serve run` and `serve deploy`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError, model_validator

from corpus.config import CollectionsConfig
from generation.config import GeneratorConfig
from pipeline.config_base import (
    ServeOptions,
    StrictModel,
    deployment_field,
    most_replicas,
    over_defaults,
)
from pipeline.conversation import ConversationSettings
from pipeline.messages import RetrievalQueryMode
from prepare.config import (
    PREPARATION_DEFAULTS,
    CitationConfig,
    CompressionConfig,
    PreparationOptions,
    PromptConfig,
)
from prepare.prompt import REWRITE_SYSTEM_PROMPT
from retrieval.config import RetrieverConfig

# An ingress replica holds well above what it admits (ingress.max_in_flight_requests), so
# that a request over capacity reaches it and is refused at once with the API's own error.
INGRESS_SERVE_OPTIONS: ServeOptions = {
    "num_replicas": 1,
    "ray_actor_options": {"num_cpus": 0.1},
    "max_ongoing_requests": 256,
    "max_queued_requests": 64,
    "health_check_period_s": 5,
    "health_check_timeout_s": 10,
}
IngressServeOptions = Annotated[ServeOptions, AfterValidator(over_defaults(INGRESS_SERVE_OPTIONS))]


class ConversationConfig(StrictModel):
    retrieval_query: RetrievalQueryMode = Field(
        "join",
        description="What a follow-up is retrieved by when a request names nothing: 'last' "
        "(the last user message alone), 'join' (the recent user turns joined) or 'rewrite' "
        "(a standalone question rewritten by the generator, one short generation).",
    )
    join_user_turns: int = Field(
        2, ge=0, description="Earlier user turns joined to the question by 'join'."
    )
    history_max_tokens: int = Field(
        PREPARATION_DEFAULTS.history_max_tokens,
        ge=0,
        description="Earlier turns kept in the prompt, in serving-tokenizer tokens; the "
        "oldest are cut first.",
    )
    max_turns: int = Field(
        32, ge=0, description="Most earlier turns a request may send (400 past it)."
    )
    max_turn_chars: int = Field(
        8000, ge=1, description="Longest earlier turn accepted, in characters (400 past it)."
    )
    rewrite_system_prompt: str = Field(
        REWRITE_SYSTEM_PROMPT,
        description="Static system prompt of the rewrite (one KV block or more, so cached).",
    )

    def to_settings(self) -> ConversationSettings:
        return ConversationSettings(
            join_user_turns=self.join_user_turns,
            rewrite_system_prompt=self.rewrite_system_prompt,
        )


class RateLimitConfig(StrictModel):
    requests_per_s: float = Field(..., gt=0, description="Sustained requests per second.")
    burst: int = Field(..., ge=1, description="Requests allowed at once after a quiet spell.")


class IngressConfig(StrictModel):
    max_question_chars: int = Field(2000, ge=1, description="Longest question accepted.")
    max_body_bytes: int = Field(
        262_144, ge=1024, description="Largest request body; larger ones get 413 unread."
    )
    request_timeout_s: float = Field(120.0, gt=0, description="Whole-request deadline.")
    max_in_flight_requests: int | None = Field(
        None,
        ge=1,
        description="Requests one ingress replica lets into the pipeline at once; the next "
        "gets 503 with Retry-After at once. Unset: what the generator replicas hold "
        "(running + queued, at their most replicas) divided over the ingress replicas.",
    )
    retry_after_s: float = Field(
        1.0, ge=0, description="Retry-After on 503s for overload and unavailable stages."
    )
    rate_limit: RateLimitConfig | None = Field(
        None,
        description="Per API key (per client address without keys), per ingress replica: "
        "past it, 429 with Retry-After. Unset: no limit.",
    )
    deployment: IngressServeOptions = deployment_field(INGRESS_SERVE_OPTIONS, "ingress")


class RagAppConfig(StrictModel):
    """Everything the RAG application can be told; `serve_config.yaml` `args:` fills it."""

    retriever: RetrieverConfig = RetrieverConfig()
    compression: CompressionConfig = CompressionConfig()
    generator: GeneratorConfig = GeneratorConfig()
    prompt: PromptConfig = PromptConfig()
    conversation: ConversationConfig = ConversationConfig()
    citations: CitationConfig = CitationConfig()
    ingress: IngressConfig = IngressConfig()
    collections: CollectionsConfig = CollectionsConfig()

    @model_validator(mode="after")
    def _gate_below_ingress_capacity(self) -> RagAppConfig:
        limit = self.ingress.max_in_flight_requests
        if limit is not None and limit >= self.ingress.deployment["max_ongoing_requests"]:
            raise ValueError(
                "ingress.max_in_flight_requests must be below "
                "ingress.deployment.max_ongoing_requests"
            )
        return self

    def preparation_options(self) -> PreparationOptions:
        """What the compressor's and the ingress's prompt preparers are tuned by."""
        return PreparationOptions(
            sentence_prefilter_rate=self.compression.sentence_prefilter_rate,
            history_max_tokens=self.conversation.history_max_tokens,
        )

    def in_flight_limit(self) -> int:
        """Requests one ingress replica admits: as configured, else what the generator
        replicas hold (running + queued, at their most replicas) over the ingress replicas."""
        if self.ingress.max_in_flight_requests is not None:
            return self.ingress.max_in_flight_requests
        generator = self.generator.deployment
        queued = max(0, generator["max_queued_requests"])
        capacity = most_replicas(generator) * (generator["max_ongoing_requests"] + queued)
        ingress_replicas = most_replicas(self.ingress.deployment)
        limit = max(1, -(-capacity // ingress_replicas))
        return max(1, min(limit, self.ingress.deployment["max_ongoing_requests"] - 1))


class ConfigError(ValueError):
    """The application config is invalid; the message names each offending key."""


def parse_config(args: dict[str, Any] | None) -> RagAppConfig:
    """Validate `args` into a RagAppConfig, or raise ConfigError naming every bad key."""
    try:
        return RagAppConfig.model_validate(args or {})
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise ConfigError(f"invalid RAG application config: {problems}") from None


def _describe(error: Any) -> str:
    location = ".".join(str(part) for part in error["loc"]) or "(root)"
    if error["type"] == "extra_forbidden":
        return f"unknown key '{location}'"
    return f"'{location}': {error['msg']}"
