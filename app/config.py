"""The one typed configuration tree of the RAG application.

`serve_config.yaml` passes it through the application's `args:`; every tunable lives here,
unknown keys are rejected, and each field says what it does. Relative paths are resolved
against the project root, so the same file works from `serve run` and `serve deploy`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from pipeline.conversation import ConversationSettings
from pipeline.messages import (
    AnswerStyle,
    CompressionPolicy,
    RetrievalMode,
    RetrievalQueryMode,
)
from prepare.cost_model import CompressionCostModel, CompressorCost, PrefillCost
from prepare.llmlingua_compressor import LLMLinguaOptions
from prepare.methods import get_method, known_method, method_names
from prepare.preparation import LLMLinguaLoad
from prepare.prompt import (
    DEFAULT_SYSTEM_PROMPT,
    REWRITE_SYSTEM_PROMPT,
    SHORT_ANSWER_SYSTEM_PROMPT,
)
from retrieval.fusion import HybridParams, check_fusion_params
from retrieval.models import DEFAULT_EMBEDDING_MODEL, resolve_model_reference

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AutoscalingConfig(StrictModel):
    min_replicas: int = Field(1, ge=0, description="Fewest replicas kept running.")
    max_replicas: int = Field(1, ge=1, description="Most replicas autoscaling may start.")
    target_ongoing_requests: float = Field(
        2.0, gt=0, description="Ongoing requests per replica that autoscaling aims for."
    )
    upscale_delay_s: float = Field(
        30.0, ge=0, description="How long load must stay high before replicas are added."
    )
    downscale_delay_s: float = Field(
        600.0, ge=0, description="How long load must stay low before replicas are removed."
    )
    look_back_period_s: float = Field(
        30.0, gt=0, description="Window over which the ongoing requests are averaged."
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        return self


class ReplicaConfig(StrictModel):
    """How one stage is replicated and what each replica reserves from Ray."""

    num_replicas: int = Field(1, ge=1, description="Fixed replica count (without autoscaling).")
    autoscaling: AutoscalingConfig | None = Field(
        None, description="Autoscaling bounds; when set, num_replicas is ignored."
    )
    num_cpus: float = Field(
        0.25, ge=0, description="Logical CPUs each replica reserves (a scheduling label)."
    )
    num_gpus: float = Field(0, ge=0, description="GPUs (or fractions) each replica reserves.")
    max_ongoing_requests: int = Field(
        16, ge=1, description="Requests one replica works on at once."
    )
    max_queued_requests: int = Field(
        64,
        ge=-1,
        description="Requests each caller (ingress replica) may queue for this stage before "
        "it gets backpressure (HTTP 503 with Retry-After); -1 for no limit.",
    )
    max_replicas_per_node: int | None = Field(
        None,
        ge=1,
        description="At most this many replicas on one node; 1 spreads the replicas over "
        "nodes, so losing a node leaves the others serving.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each replica needs, to pin a stage to nodes "
        "started with them (e.g. {node_a: 0.01} with `ray start --resources`).",
    )
    health_check_period_s: float = Field(
        5.0, gt=0, description="How often Serve calls the replica's check_health."
    )
    health_check_timeout_s: float = Field(
        10.0, gt=0, description="A health check slower than this fails the replica."
    )


# Each stage has its own defaults; setting one field of a stage's `deployment` keeps the rest.
class RetrieverReplicaConfig(ReplicaConfig):
    num_cpus: float = Field(0.2, ge=0, description="Logical CPUs each retriever reserves.")


class CompressorReplicaConfig(ReplicaConfig):
    num_cpus: float = Field(0.5, ge=0, description="Logical CPUs each compressor reserves.")
    max_ongoing_requests: int = Field(8, ge=1, description="Requests one replica works on.")


class GeneratorReplicaConfig(ReplicaConfig):
    num_cpus: float = Field(
        0, ge=0, description="CPUs of the replica actor itself; vLLM's bundles hold the rest."
    )
    max_ongoing_requests: int = Field(32, ge=1, description="Requests one replica works on.")


class IngressReplicaConfig(ReplicaConfig):
    num_cpus: float = Field(0.1, ge=0, description="Logical CPUs each ingress reserves.")
    max_ongoing_requests: int = Field(
        256,
        ge=1,
        description="Requests one ingress replica holds, refused ones included: keep it well "
        "above ingress.max_in_flight_requests, so that a request over capacity reaches the "
        "ingress and is refused at once with the API's own error.",
    )


class EmbeddingConfig(StrictModel):
    model: str = Field(
        DEFAULT_EMBEDDING_MODEL,
        description="Sentence-transformers model: a local folder, a hub id, or "
        "'python-package:<module>' for a model shipped in a Python package.",
    )
    device: str = Field("cpu", description="Torch device for the embedder ('cpu', 'cuda').")
    batch_size: int = Field(32, ge=1, description="Questions embedded together per batch.")
    batch_wait_timeout_ms: float = Field(
        5.0, ge=0, description="How long the retriever waits to fill an embedding batch."
    )
    torch_threads: int = Field(1, ge=1, description="Intra-op threads for the embedder.")


class HybridRetrievalConfig(StrictModel):
    """How the retriever ranks chunks: by embedding, by words (BM25), or both fused by
    weighted reciprocal rank fusion, score = sum_i w_i / (rrf_k + rank_i). Measured on SQuAD
    dev by `python -m bench.retrieval_modes` (docs/quality.md, "Hybrid retrieval")."""

    mode: RetrievalMode = Field(
        "hybrid",
        description="Default ranking: 'dense' (FAISS), 'lexical' (BM25) or 'hybrid' (both, "
        "fused). lexical and hybrid need an index built with its lexical part: set here, "
        "the retriever refuses to start without one; left to this default, it retrieves "
        "densely and logs a warning (an index built before the lexical part existed).",
    )
    dense_weight: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="Weight of the dense ranking in hybrid."
    )
    lexical_weight: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="Weight of the BM25 ranking in hybrid."
    )
    rrf_k: float = Field(
        60.0,
        ge=0,
        allow_inf_nan=False,
        description="RRF's rank offset: larger flattens the gap between first and later ranks.",
    )
    candidates: int = Field(
        50,
        ge=1,
        description="Rows each ranker contributes to the fusion (top_k is used when larger).",
    )

    @model_validator(mode="after")
    def _a_weight(self) -> HybridRetrievalConfig:
        check_fusion_params((self.dense_weight, self.lexical_weight), self.rrf_k)
        return self

    @property
    def dense_fallback(self) -> bool:
        """Whether an index without a lexical part may fall back to dense: only when the
        mode is the default, never when the config names it."""
        return "mode" not in self.model_fields_set

    def to_params(self) -> HybridParams:
        """The retriever's settings (retrieval.fusion.HybridParams)."""
        return HybridParams(
            mode=self.mode,
            dense_weight=self.dense_weight,
            lexical_weight=self.lexical_weight,
            rrf_k=self.rrf_k,
            candidates=self.candidates,
        )


class RetrieverConfig(StrictModel):
    index_path: str = Field("indexes/default", description="Folder written by retrieval.build.")
    use_gpu_index: bool = Field(
        False, description="Move the FAISS index to the GPUs when faiss sees any."
    )
    nprobe: int | None = Field(None, ge=1, description="IVF lists searched per query.")
    ef_search: int | None = Field(None, ge=1, description="HNSW search breadth.")
    default_top_k: int = Field(5, ge=1, description="Chunks retrieved when a request names none.")
    max_top_k: int = Field(20, ge=1, description="Largest top_k a request may ask for.")
    embedding: EmbeddingConfig = EmbeddingConfig()
    hybrid: HybridRetrievalConfig = Field(
        HybridRetrievalConfig(),
        description="Dense, lexical (BM25) or hybrid ranking, and the fusion's settings.",
    )
    deployment: RetrieverReplicaConfig = RetrieverReplicaConfig()

    @model_validator(mode="after")
    def _top_k(self) -> RetrieverConfig:
        if self.default_top_k > self.max_top_k:
            raise ValueError("default_top_k must not exceed max_top_k")
        return self


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
    rank_method: Literal["longllmlingua", "llmlingua"] = Field(
        "longllmlingua", description="Question-aware LongLLMLingua or plain LLMLingua."
    )
    condition_compare: bool = Field(
        False,
        description="Score each segment twice (with and without the question) to rank tokens "
        "by the question's effect: twice the scorer time. See docs/benchmarks.md.",
    )
    iterative_size: int | None = Field(
        None,
        ge=16,
        description="Tokens LLMLingua scores per forward pass; unset sizes it to each chunk, "
        "the only setting where LLMLingua 0.2.2 keeps the asked rate on chunk-sized contexts.",
    )
    device: str = Field("cpu", description="Device map for the scorer ('cpu', 'cuda').")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Scorer weights' dtype (bfloat16 pays only with AMX/AVX512-BF16)."
    )
    torch_threads: int = Field(1, ge=1, description="Intra-op threads for the scorer on CPU.")
    tiktoken_cache_dir: str = Field(
        ".cache/tiktoken", description="Offline tiktoken cache holding cl100k_base."
    )

    def to_load(self) -> LLMLinguaLoad | None:
        """What PromptPreparer.load needs to load the scorer; None when disabled."""
        if not self.enabled:
            return None
        return LLMLinguaLoad(
            model_path=resolve_model_reference(self.model, PROJECT_ROOT),
            options=LLMLinguaOptions(
                use_llmlingua2=self.use_llmlingua2,
                rank_method=self.rank_method,
                condition_compare=self.condition_compare,
                iterative_size=self.iterative_size,
            ),
            device=self.device,
            dtype=self.dtype,
            tiktoken_cache_dir=str(resolve_path(self.tiktoken_cache_dir)),
        )


class CompressorCostConfig(StrictModel):
    ms_per_token: float = Field(..., ge=0, description="Milliseconds per context token.")
    ms_per_chunk: float = Field(0.0, ge=0, description="Milliseconds per retrieved chunk.")


class CostModelConfig(StrictModel):
    """Coefficients of prepare.cost_model, fitted per generator and machine by
    `python -m bench.context_sweep`; the defaults were fitted on the 2-core CPU default
    (SmolLM2-135M fp32 generator, SmolLM2-135M LLMLingua scorer; docs/benchmarks.md)."""

    prefill_ms_per_token: float = Field(
        1.3992, ge=0, description="Generator prefill milliseconds per uncached prompt token."
    )
    prefill_ms_per_token_squared: float = Field(
        0.0002266,
        ge=0,
        description="Quadratic term of prefill time (attention) per token squared.",
    )
    sentences: CompressorCostConfig = Field(
        CompressorCostConfig(ms_per_token=0.0084),
        description="Sentence selection's own time (the CPU profile's fit, docs/benchmarks.md).",
    )
    llmlingua: CompressorCostConfig = Field(
        CompressorCostConfig(ms_per_token=3.7543, ms_per_chunk=116.96),
        description="LLMLingua's own time.",
    )

    def to_model(self) -> CompressionCostModel:
        return CompressionCostModel(
            prefill=PrefillCost(self.prefill_ms_per_token, self.prefill_ms_per_token_squared),
            sentences=CompressorCost(self.sentences.ms_per_token, self.sentences.ms_per_chunk),
            llmlingua=CompressorCost(self.llmlingua.ms_per_token, self.llmlingua.ms_per_chunk),
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
        "always",
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
    target_tokens: int | None = Field(
        None, ge=1, description="Absolute context-token target; overrides rate when set."
    )
    sentence_prefilter_rate: float = Field(
        0.5, gt=0, le=1, description="What sentence selection keeps before LLMLingua runs."
    )
    llmlingua: LLMLinguaConfig = LLMLinguaConfig()
    deployment: CompressorReplicaConfig = CompressorReplicaConfig()

    @model_validator(mode="after")
    def _llmlingua_loaded(self) -> CompressionConfig:
        if get_method(self.default_method).needs_chunk_compressor and not self.llmlingua.enabled:
            raise ValueError(f"default_method {self.default_method!r} needs llmlingua.enabled")
        return self


class PacedEngineConfig(StrictModel):
    """A null engine for measuring the chain itself (bench.overhead): no model, tokens at a
    fixed pace."""

    ttft_ms: float = Field(50.0, ge=0, description="Time to the first token.")
    tpot_ms: float = Field(5.0, ge=0, description="Time between later tokens.")


class OpenAIEngineConfig(StrictModel):
    """An OpenAI-compatible server outside Ray as the generator (TGI, TensorRT-LLM's OpenAI
    frontend, SGLang, a vLLM fleet). Its API key, if it needs one, comes from the
    environment (RAG_GENERATOR_API_KEY, app.settings), never from this file."""

    base_url: str = Field(
        ...,
        pattern=r"^https?://",
        description="The server's base URL up to and including /v1, e.g. "
        "http://vllm.internal:8000/v1.",
    )
    model: str | None = Field(
        None, description="The model's name on that server; unset: generator.model_id."
    )
    tokenizer: str | None = Field(
        None,
        description="Local folder (or 'python-package:<module>') holding the served model's "
        "tokenizer and chat template: token budgets and prompt-token counts use it. Unset: "
        "generator.model_source.",
    )
    connect_timeout_s: float = Field(
        5.0, gt=0, description="Longest wait to connect; past it the request gets a 503."
    )
    read_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Longest wait for the next streamed chunk, the first included (the "
        "server's queue and prefill); past it the request gets a 504.",
    )
    max_connections: int = Field(
        64, ge=1, description="Connections each generator replica keeps open to the server."
    )


class RequestRouterConfig(StrictModel):
    kind: Literal["power_of_two", "prefix_cache_affinity"] = Field(
        "power_of_two",
        description="How the ingress picks a generator replica: Serve's default (the less "
        "loaded of two random replicas), or Ray Serve LLM's PrefixCacheAffinityRouter "
        "(the replica that already served the longest prefix, while loads are balanced).",
    )
    imbalanced_threshold: float | None = Field(
        2.0,
        ge=0,
        description="prefix_cache_affinity: queue-length gap past which load wins over "
        "prefix affinity. None (never) sends every request to one replica here, since all "
        "prompts share the long system prompt.",
    )
    match_rate_threshold: float = Field(
        0.1, ge=0, le=1, description="prefix_cache_affinity: least prefix match that counts."
    )


class GeneratorConfig(StrictModel):
    engine: Literal["vllm", "openai", "paced"] = Field(
        "vllm",
        description="vllm (inside Ray, Ray Serve LLM); openai: an OpenAI-compatible server "
        "outside Ray (see `openai`); paced: the null engine of bench.overhead.",
    )
    openai: OpenAIEngineConfig | None = Field(
        None, description="The external server, for engine: openai."
    )
    paced: PacedEngineConfig = PacedEngineConfig()
    stream_batching_interval_ms: float = Field(
        50.0,
        ge=0,
        description="The generator sends its first token at once, then what accumulated at "
        "most every this many ms (one Ray object per batch, not per token); 0 sends each "
        "token on its own. Chosen with bench.overhead (docs/benchmarks.md).",
    )
    cpu_binding: list[str] | None = Field(
        None,
        description="engine vllm, CPU only: cores for each replica's vLLM threads, by replica rank "
        "(VLLM_CPU_OMP_THREADS_BIND), e.g. ['1', '0'] so two replicas do not share a core. "
        "Unset: vLLM's default binding.",
    )
    request_router: RequestRouterConfig = RequestRouterConfig()
    model_id: str = Field("smollm2-135m-instruct", description="Name clients use as `model`.")
    model_source: str = Field(
        ".models/smollm2-135m-instruct", description="Local model folder or hub id for vLLM."
    )
    max_model_len: int = Field(
        2048,
        ge=256,
        description="Context window vLLM allocates (engine: openai: the external server's "
        "window, which the token budget must not exceed).",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="engine vllm: passed to vLLM as engine arguments (enable_prefix_caching, "
        "quantization, speculative_config, dtype, ...). max_model_len is set from the field above.",
    )
    accelerator_type: str | None = Field(
        None,
        description="engine vllm: Ray accelerator type for GPU replicas (e.g. 'L4', 'H100').",
    )
    placement_bundles: list[dict[str, float]] | None = Field(
        None,
        description="engine vllm: placement-group bundles for one replica. On CPU: [{CPU: 1}] "
        "and no accelerator_type; on GPU leave unset to get one bundle per tensor-parallel GPU.",
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description="engine vllm: environment of the vLLM replica (e.g. KV cache size).",
    )
    default_max_tokens: int = Field(128, ge=1, description="Answer length when none is asked.")
    max_tokens_limit: int = Field(512, ge=1, description="Largest max_tokens a request may ask.")
    default_temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature.")
    deployment: GeneratorReplicaConfig = GeneratorReplicaConfig()

    @model_validator(mode="after")
    def _limits(self) -> GeneratorConfig:
        if self.engine == "vllm" and self.deployment.max_replicas_per_node is not None:
            raise ValueError(
                "generator.deployment.max_replicas_per_node cannot be used with vLLM, whose "
                "replicas hold placement groups (Ray Serve refuses both); spread generator "
                "replicas by their bundles' resources instead"
            )
        if self.engine == "openai" and self.openai is None:
            raise ValueError("generator.engine 'openai' needs generator.openai.base_url")
        if self.engine != "vllm" and self.request_router.kind != "power_of_two":
            raise ValueError(
                "generator.request_router.kind prefix_cache_affinity needs engine 'vllm' "
                "(Ray Serve LLM's router reads its replicas' prefix trees)"
            )
        if "max_model_len" in self.engine_kwargs:
            raise ValueError("set generator.max_model_len, not engine_kwargs.max_model_len")
        if self.max_tokens_limit >= self.max_model_len:
            raise ValueError("max_tokens_limit must be smaller than max_model_len")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError("default_max_tokens must not exceed max_tokens_limit")
        return self

    def tokenizer_source(self) -> str:
        """Where the served model's tokenizer is: the model folder, or for an external
        server the folder named by `openai.tokenizer` when set."""
        if self.engine == "openai" and self.openai is not None and self.openai.tokenizer:
            return self.openai.tokenizer
        return self.model_source

    def served_model_name(self) -> str:
        """The model's name on the engine (for an external server, `openai.model`)."""
        if self.engine == "openai" and self.openai is not None and self.openai.model:
            return self.openai.model
        return self.model_id


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
    margin_tokens: int = Field(16, ge=0, description="Slack kept free in the context window.")

    def system_prompts(self) -> dict[AnswerStyle, str]:
        return {"explained": self.system_prompt, "short": self.short_system_prompt}


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
        512,
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
    rewrite_max_tokens: int = Field(48, ge=1, description="Longest rewritten question.")
    rewrite_timeout_s: float = Field(
        10.0, gt=0, description="Past this the rewrite is dropped and the turns are joined."
    )

    def to_settings(self) -> ConversationSettings:
        return ConversationSettings(
            join_user_turns=self.join_user_turns,
            rewrite_system_prompt=self.rewrite_system_prompt,
            rewrite_max_tokens=self.rewrite_max_tokens,
            rewrite_timeout_s=self.rewrite_timeout_s,
        )


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
    readiness_refresh_s: float = Field(
        2.0, gt=0, description="How often the ingress asks Serve which stages are running."
    )
    readiness_timeout_s: float = Field(
        5.0, gt=0, description="Longest wait for that answer before keeping the last one."
    )
    deployment: IngressReplicaConfig = IngressReplicaConfig()


class WriterReplicaConfig(ReplicaConfig):
    num_cpus: float = Field(0.1, ge=0, description="Logical CPUs the writer reserves.")
    max_ongoing_requests: int = Field(
        32, ge=1, description="Calls (job submissions, status reads) one writer takes at once."
    )

    @model_validator(mode="after")
    def _one_writer(self) -> WriterReplicaConfig:
        if self.num_replicas != 1 or self.autoscaling is not None:
            raise ValueError("the collection writer runs exactly one replica: one writer at a time")
        return self


class CollectionsConfig(StrictModel):
    """Users' own collections: created, filled and emptied over the API, each a series of
    immutable index versions that every replica switches to on its next query."""

    enabled: bool = Field(
        True, description="Serve /v1/collections and /v1/jobs (and the writer behind them)."
    )
    root: str = Field(
        "indexes/collections",
        description="Folder of every collection's versions. With replicas on several "
        "nodes, a filesystem they all mount (NFS, a shared PVC).",
    )
    chunk_tokens: int = Field(200, ge=8, description="Chunk size for new documents.")
    overlap_tokens: int = Field(40, ge=0, description="Tokens shared by neighbouring chunks.")
    keep_versions: int = Field(
        3, ge=1, description="Published versions kept per collection (the current included)."
    )
    version_grace_s: float = Field(
        300.0,
        ge=0,
        description="How long a superseded version stays on disk for queries still reading it.",
    )
    refresh_s: float = Field(
        0.5,
        gt=0,
        description="How often each retriever and compressor replica looks for a new version "
        "of the collections it serves and opens it off the query path (queries read CURRENT "
        "themselves either way: this only spares them the wait).",
    )
    max_upload_bytes: int = Field(
        33_554_432, ge=1024, description="Largest documents upload (JSON or multipart) body."
    )
    max_documents_per_request: int = Field(
        1000, ge=1, description="Documents or files one add request may carry."
    )
    max_queued_jobs: int = Field(
        64, ge=1, description="Jobs waiting for the writer; past it, 503 with Retry-After."
    )
    jobs_kept: int = Field(1000, ge=1, description="Finished jobs whose status stays readable.")
    writer_lock_timeout_s: float = Field(
        60.0, gt=0, description="Longest wait for another writer to finish before failing."
    )
    torch_threads: int = Field(1, ge=1, description="Intra-op threads for the writer's embedder.")
    device: str = Field(
        "cpu",
        description="Torch device of the writer's embedder (the retriever's model): 'cpu' "
        "unless the writer is given a GPU share in `deployment`.",
    )
    job_cpu_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Fraction of one CPU a job may use while it embeds: it pauses after each "
        "block of chunks, so continuous ingestion leaves the rest to queries (1: no pause).",
    )
    job_scheduling: Literal["idle", "nice"] = Field(
        "idle",
        description="How the thread that runs jobs yields the CPU to queries. 'idle' "
        "(Linux SCHED_IDLE): it runs only on CPU time nothing else wants, so a job never "
        "preempts the query path's threads; under a load that keeps every CPU busy, jobs "
        "wait. 'nice': `job_niceness`, a smaller share but never starved (on 2 cores under "
        "continuous ingestion, query p99 was 2.22x the quiet phases' with nice 10 and 0.94x "
        "with SCHED_IDLE: docs/benchmarks.md).",
    )
    job_niceness: int = Field(
        10,
        ge=0,
        le=19,
        description="Unix nice value of the thread that runs jobs with job_scheduling "
        "'nice' (or where SCHED_IDLE is unavailable); 0: same priority as queries.",
    )
    deployment: WriterReplicaConfig = WriterReplicaConfig()

    @model_validator(mode="after")
    def _overlap_below_chunk(self) -> CollectionsConfig:
        if self.overlap_tokens >= self.chunk_tokens:
            raise ValueError("overlap_tokens must be smaller than chunk_tokens")
        return self


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
        if limit is not None and limit >= self.ingress.deployment.max_ongoing_requests:
            raise ValueError(
                "ingress.max_in_flight_requests must be below "
                "ingress.deployment.max_ongoing_requests"
            )
        return self

    def in_flight_limit(self) -> int:
        """Requests one ingress replica admits: as configured, else what the generator
        replicas hold (running + queued, at their most replicas) over the ingress replicas."""
        if self.ingress.max_in_flight_requests is not None:
            return self.ingress.max_in_flight_requests
        generator = self.generator.deployment
        queued = max(0, generator.max_queued_requests)
        capacity = most_replicas(generator) * (generator.max_ongoing_requests + queued)
        ingress_replicas = most_replicas(self.ingress.deployment)
        limit = max(1, -(-capacity // ingress_replicas))
        return max(1, min(limit, self.ingress.deployment.max_ongoing_requests - 1))


def most_replicas(replica: ReplicaConfig) -> int:
    """The replicas a stage can run at most: its fixed count, or its autoscaling maximum."""
    if replica.autoscaling is not None:
        return replica.autoscaling.max_replicas
    return replica.num_replicas


class ConfigError(ValueError):
    """The application config is invalid; the message names each offending key."""


def parse_config(args: dict[str, Any] | None) -> RagAppConfig:
    """Validate `args` into a RagAppConfig, or raise ConfigError naming every bad key."""
    try:
        return RagAppConfig.model_validate(args or {})
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise ConfigError(f"invalid RAG application config: {problems}") from None


def resolve_path(path: str) -> Path:
    """A config path as an absolute path (relative ones are under the project root)."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else PROJECT_ROOT / candidate


def _describe(error: Any) -> str:
    location = ".".join(str(part) for part in error["loc"]) or "(root)"
    if error["type"] == "extra_forbidden":
        return f"unknown key '{location}'"
    return f"'{location}': {error['msg']}"
