"""The compressor stage's settings: compression (`compression:`, its methods, LLMLingua and
the `auto` policy's cost model), the static system prompts (`prompt:`) and citations
(`citations:`), with the compressor's replicas."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, AliasChoices, Field, model_validator

from pipeline.config_base import (
    PROJECT_ROOT,
    ServeOptions,
    StrictModel,
    deployment_field,
    over_defaults,
    resolve_path,
)
from pipeline.messages import AnswerStyle, CompressionPolicy
from prepare.cost_model import CompressionCostModel, CompressorCost, PrefillCost
from prepare.llmlingua_compressor import LLMLinguaOptions
from prepare.methods import get_method, known_method, method_names

# PreparationOptions is re-exported: the app config builds it from these settings.
from prepare.options import PREPARATION_DEFAULTS
from prepare.options import PreparationOptions as PreparationOptions
from prepare.preparation import LLMLinguaLoad
from prepare.prompt import DEFAULT_SYSTEM_PROMPT, SHORT_ANSWER_SYSTEM_PROMPT
from retrieval.models import resolve_model_reference

# Sentence selection takes tens of ms, LLMLingua seconds (one scorer, one at a time): 8 in
# the replica's threads and 32 queued; past that a request degrades to the uncompressed
# context rather than wait.
COMPRESSOR_SERVE_OPTIONS: ServeOptions = {
    "num_replicas": 1,
    "ray_actor_options": {"num_cpus": 0.5},
    "max_ongoing_requests": 8,
    "max_queued_requests": 32,
    "health_check_period_s": 5,
    "health_check_timeout_s": 10,
}
CompressorServeOptions = Annotated[
    ServeOptions, AfterValidator(over_defaults(COMPRESSOR_SERVE_OPTIONS))
]


class CompressorRouterConfig(StrictModel):
    kind: Literal["conversation_affinity", "power_of_two"] = Field(
        "conversation_affinity",
        description="How the ingress picks a compressor replica: conversation_affinity "
        "(deployments.conversation_router: every question of a conversation to the replica "
        "a hash of its opening question points at, while loads are balanced; each replica "
        "remembers only the turns it prepared, so with compression.reuse and 2+ compressor "
        "replicas a follow-up is continued only where its conversation was prepared), or "
        "power_of_two (Serve's default: the less loaded of two random replicas).",
    )
    imbalanced_threshold: float | None = Field(
        2.0,
        ge=0,
        # The generator router's name for the same bound; max_queue_gap until 2026-12-06.
        validation_alias=AliasChoices("imbalanced_threshold", "max_queue_gap"),
        description="conversation_affinity: queue-length gap past which load wins over "
        "affinity (None: affinity always wins), as generator.request_router's.",
    )


# Where `make setup` writes tiktoken's cl100k_base (LLMLingua asks for it on load), offline.
TIKTOKEN_CACHE_DIR = ".cache/tiktoken"


class LLMLinguaConfig(StrictModel):
    enabled: bool = Field(
        True, description="Load LLMLingua in the compressor (needed for the llmlingua methods)."
    )
    model: str = Field(
        ".models/smollm2-135m-instruct",
        description="Scorer model for LLMLingua (a causal LM) or LLMLingua-2 (a token "
        "classifier, e.g. microsoft/llmlingua-2-xlm-roberta-large-meetingbank).",
    )
    use_llmlingua2: bool = Field(False, description="Use LLMLingua-2 token classification.")
    device: str = Field("cpu", description="Device map for the scorer ('cpu', 'cuda').")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Scorer weights' dtype (bfloat16 pays only with AMX/AVX512-BF16)."
    )
    torch_threads: int = Field(1, ge=1, description="Intra-op threads for the scorer on CPU.")

    def to_load(self) -> LLMLinguaLoad | None:
        """What PromptPreparer.load needs to load the scorer; None when disabled."""
        if not self.enabled:
            return None
        return LLMLinguaLoad(
            model_path=resolve_model_reference(self.model, PROJECT_ROOT),
            options=LLMLinguaOptions(
                use_llmlingua2=self.use_llmlingua2,
            ),
            device=self.device,
            dtype=self.dtype,
            tiktoken_cache_dir=str(resolve_path(TIKTOKEN_CACHE_DIR)),
        )


class CompressorCostConfig(StrictModel):
    ms_per_token: float = Field(..., ge=0, description="Milliseconds per context token.")
    ms_per_chunk: float = Field(0.0, ge=0, description="Milliseconds per retrieved chunk.")


class CostModelConfig(StrictModel):
    """Coefficients of prepare.cost_model, fitted per generator and machine by
    `python -m bench.context_sweep`. The defaults are the fit for the reader `make run`
    serves (Qwen2.5-Coder-1.5B, fp32, on a 2-core AVX2 CPU): its prefill and sentence
    selection from docs/results/context-sentences-15b/cost_model.json, LLMLingua's own time
    (its SmolLM2 scorer, whatever the reader) from docs/results/context-llmlingua; a test
    holds them equal (tests/unit/prepare/test_prepare_shipped_cost_model.py). Refit on other
    hardware or for another reader (docs/configuration.md)."""

    prefill_ms_per_token: float = Field(
        37.3143, ge=0, description="Generator prefill milliseconds per uncached prompt token."
    )
    prefill_ms_per_token_squared: float = Field(
        0.0032097,
        ge=0,
        description="Quadratic term of prefill time (attention) per token squared.",
    )
    sentences: CompressorCostConfig = Field(
        CompressorCostConfig(ms_per_token=0.0122, ms_per_chunk=0.0),
        description="Sentence selection's own time.",
    )
    llmlingua: CompressorCostConfig = Field(
        CompressorCostConfig(ms_per_token=2.8682, ms_per_chunk=356.1),
        description="LLMLingua's own time.",
    )

    def to_model(self) -> CompressionCostModel:
        return CompressionCostModel(
            prefill=PrefillCost(self.prefill_ms_per_token, self.prefill_ms_per_token_squared),
            sentences=CompressorCost(self.sentences.ms_per_token, self.sentences.ms_per_chunk),
            llmlingua=CompressorCost(self.llmlingua.ms_per_token, self.llmlingua.ms_per_chunk),
        )


class ReuseConfig(StrictModel):
    """Reuse of earlier prompts' prefill: a follow-up continues the prompts its conversation
    sent before (prepare.continuation), so their KV blocks come from the prefix cache."""

    enabled: bool = Field(
        True,
        description="Default for requests that do not say (compression.reuse in the "
        "request): follow-ups continue the prompts before them; single questions go as "
        "without reuse (figures: docs/benchmarks.md, conversations).",
    )
    remembered_turns: int = Field(
        4096,
        ge=0,
        description="Questions whose user message (sources and question) each compressor "
        "replica remembers, so that a follow-up's prompt continues the prompts before it "
        "(prepare.continuation); least recently used forgotten first, 0: none. A follow-up "
        "prepared on another replica, or after its turn was forgotten, goes in the plain "
        "layout.",
    )


class CompressionConfig(StrictModel):
    timeout_s: float | None = Field(
        20.0,
        gt=0,
        description="Longest wait for the compressor stage; past it, or when the stage is "
        "at capacity or down, the request goes on with the uncompressed context cut to the "
        "token budget (`degraded` in the response). None waits for the request deadline.",
    )
    policy: CompressionPolicy = Field(
        "auto",
        description="'always' applies the method; 'auto' applies it only when the cost model "
        "predicts a larger prefill saving than the compression costs, per request.",
    )
    cost_model: CostModelConfig = CostModelConfig()
    default_method: Annotated[str, AfterValidator(known_method)] = Field(
        "sentences",
        description="Method used when a request names none, one of prepare.methods' "
        f"registry ({', '.join(method_names())}).",
    )
    rate: float = Field(0.5, gt=0, le=1, description="Fraction of context tokens to keep.")
    sentence_prefilter_rate: float = Field(
        PREPARATION_DEFAULTS.sentence_prefilter_rate,
        gt=0,
        le=1,
        description="What sentence selection keeps before LLMLingua runs.",
    )
    llmlingua: LLMLinguaConfig = LLMLinguaConfig()
    reuse: ReuseConfig = Field(ReuseConfig(), description="Reuse of earlier prompts' prefill.")
    deployment: CompressorServeOptions = deployment_field(COMPRESSOR_SERVE_OPTIONS, "compressor")
    request_router: CompressorRouterConfig = CompressorRouterConfig()

    @model_validator(mode="after")
    def _llmlingua_loaded(self) -> CompressionConfig:
        if get_method(self.default_method).needs_chunk_compressor and not self.llmlingua.enabled:
            raise ValueError(f"default_method {self.default_method!r} needs llmlingua.enabled")
        return self


class PromptConfig(StrictModel):
    system_prompt: str = Field(
        DEFAULT_SYSTEM_PROMPT,
        description="Static system prompt of the 'explained' answer style; keep it identical "
        "across requests and longer than one KV block (128 tokens on CPU, 16 on GPU) so the "
        "prefix cache can hold it.",
    )
    short_system_prompt: str = Field(
        SHORT_ANSWER_SYSTEM_PROMPT,
        description="Static system prompt of the 'short' answer style (the answer span "
        "only); as long as one KV block too, so it is cached like the other.",
    )
    answer_style: AnswerStyle = Field(
        "explained",
        description="Answer style when a request names none: 'short' (the answer span only) "
        "or 'explained' (a few sentences).",
    )

    def system_prompts(self) -> dict[AnswerStyle, str]:
        return {"explained": self.system_prompt, "short": self.short_system_prompt}


class CitationConfig(StrictModel):
    enabled: bool = Field(
        True,
        description="Attribute each answer sentence to the source sentence that supports "
        "it (in the compressor, after generation); requests can turn it off.",
    )
    min_score: float = Field(
        0.45,
        ge=0,
        le=1,
        description="Least support score ((1-w) cosine + w lexical overlap) of a citation.",
    )
    lexical_weight: float = Field(
        0.5, ge=0, le=1, description="w: the weight of lexical overlap in the score."
    )
    timeout_s: float = Field(
        2.0, gt=0, description="Past this the answer goes out without citations."
    )
