"""The generator's settings (`generator:`): the engine (vLLM in Ray, an external
OpenAI-compatible server, the paced null engine), the model, token limits, routing between
replicas and the replicas themselves."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from generation.checkpoints import dtype_problem
from generation.cpuinfo import ALL_CORES
from generation.weights import Weights
from pipeline.config_base import ServeOptions, StrictModel, deployment_field, over_defaults

# One replica runs max_num_seqs (16) sequences in vLLM's continuous batch; a queued request
# waits for a running one to finish, so the queue is half a batch. The actor itself takes
# no CPU: vLLM's placement bundles hold it. A dead engine fails LLMServer.check_health and
# Serve replaces the replica.
GENERATOR_SERVE_OPTIONS: ServeOptions = {
    "num_replicas": 1,
    "ray_actor_options": {"num_cpus": 0},
    "max_ongoing_requests": 16,
    "max_queued_requests": 8,
    "health_check_period_s": 5,
    "health_check_timeout_s": 20,
}
GeneratorServeOptions = Annotated[
    ServeOptions, AfterValidator(over_defaults(GENERATOR_SERVE_OPTIONS))
]


class OpenAIEngineConfig(StrictModel):
    """An OpenAI-compatible server outside Ray as the generator (TGI, TensorRT-LLM's OpenAI
    frontend, SGLang, a vLLM fleet). Its API key, if it needs one, comes from the
    environment (RAG_GENERATOR_API_KEY, app.settings), never from this file."""

    base_url: str = Field(
        ...,
        pattern=r"^https?://",
        description="The server's base URL up to and including /v1, e.g. "
        "https://vllm.internal:8000/v1. http:// is accepted for a loopback host only "
        "(127.0.0.0/8, ::1, localhost) unless allow_plaintext is set: prompts, answers and "
        "RAG_GENERATOR_API_KEY would cross the network in clear text.",
    )
    allow_plaintext: bool = Field(
        False,
        description="Accept an http:// base_url on a host other than loopback (a private "
        "network you trust, or TLS terminated by a sidecar on the same pod).",
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

    @model_validator(mode="after")
    def _no_clear_text_off_the_machine(self) -> OpenAIEngineConfig:
        url = urlsplit(self.base_url)
        if url.scheme == "http" and not self.allow_plaintext and not _is_loopback(url.hostname):
            raise ValueError(
                f"base_url {self.base_url!r} is http:// to a host other than loopback: use "
                "https://, or set generator.openai.allow_plaintext to send prompts and the "
                "key in clear text"
            )
        return self


class RequestRouterConfig(StrictModel):
    kind: Literal["power_of_two", "prefix_cache_affinity", "passage_affinity"] = Field(
        "power_of_two",
        description="How the ingress picks a generator replica: Serve's default (the less "
        "loaded of two random replicas); Ray Serve LLM's PrefixCacheAffinityRouter (the "
        "replica that already served the longest prefix of the prompt text, while loads "
        "are balanced); or passage_affinity (deployments.passage_router: the replica a "
        "hash of the passage that opens the prompt points at (a continued follow-up's: its "
        "conversation's first), or of a conversation's first turn sent as text, while loads "
        "are balanced; no shared state).",
    )
    imbalanced_threshold: float | None = Field(
        2.0,
        ge=0,
        description="Affinity routers: queue-length gap past which load wins over affinity. "
        "None (never) lets affinity always win: with prefix_cache_affinity every request "
        "then goes to one replica here, since all prompts share the long system prompt.",
    )


# The CPU default `make run` serves: the activation dtype chosen on the replica's own CPU
# (generation/dtype.py), eager mode (17-25 s to start instead of 26-60 s compiled), the
# static system prompt's KV blocks cached, cached prompt tokens reported in usage, and a
# continuous batch of 16 (the generator's max_ongoing_requests). A profile's engine_kwargs
# are laid over these: a GPU profile sets enforce_eager false and its own dtype.
CPU_ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "fastest",
    "enforce_eager": True,
    "enable_prefix_caching": True,
    "enable_prompt_tokens_details": True,
    "max_num_seqs": 16,
}
# vLLM's CPU build fails to start on memory unless told its KV cache size, in GiB (the CUDA
# build ignores it).
CPU_ENV_VARS: dict[str, Any] = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def _over(defaults: dict[str, Any]) -> Any:
    """A validator laying a given dict over `defaults` (a key given as null drops it); what
    is not a dict is left for the field's own check to refuse."""

    def merged(given: Any) -> Any:
        if not isinstance(given, dict):
            return given
        options = {**defaults, **given}
        return {key: value for key, value in options.items() if value is not None}

    return merged


EngineKwargs = Annotated[dict[str, Any], BeforeValidator(_over(CPU_ENGINE_KWARGS))]
EnvVars = Annotated[dict[str, str], BeforeValidator(_over(CPU_ENV_VARS))]


class GeneratorConfig(StrictModel):
    engine: Literal["vllm", "openai", "paced"] = Field(
        "vllm",
        description="vllm (inside Ray, Ray Serve LLM); openai: an OpenAI-compatible server "
        "outside Ray (see `openai`); paced: the null engine at vLLM's pace on the CPU default "
        "(generation.paced_engine; bench.chaos' overload runs).",
    )
    openai: OpenAIEngineConfig | None = Field(
        None, description="The external server, for engine: openai."
    )
    stream_batching_interval_ms: float = Field(
        50.0,
        ge=0,
        description="The generator sends its first token at once, then what accumulated at "
        "most every this many ms (one Ray object per batch, not per token); 0 sends each "
        "token on its own. Chosen with bench.overhead (docs/retired.md).",
    )
    cpu_binding: list[str] | None = Field(
        [ALL_CORES],
        description="engine vllm, CPU only: cores for each replica's vLLM threads, by replica rank "
        "(VLLM_CPU_OMP_THREADS_BIND), e.g. ['1', '0'] so two replicas do not share a core; "
        "'all': every core the replica may run on, shared with the other stages (the CPU "
        "default: faster than vLLM's own binding, which leaves a core idle, one and four "
        "requests at a time, docs/benchmarks.md). null: vLLM's default binding.",
    )
    request_router: RequestRouterConfig = RequestRouterConfig()
    model_id: str = Field("qwen2.5-coder-1.5b-instruct", description="Name clients use as `model`.")
    model_source: str = Field(
        ".models/qwen2.5-coder-1.5b-instruct",
        description="Local model folder or hub id for vLLM (the default: `make models-qwen15`).",
    )
    weights: Weights = Field(
        "fastest",
        description="engine vllm: 'fastest' serves model_source's INT8 checkpoint "
        "(`<model_source>-w8a8-rtn`, `make models-int8`; `make run` makes it on such a CPU) "
        "on a node whose CPU has AMX-INT8 and holds it, model_source elsewhere "
        "(generation/weights.py; on AMX: 0.76x bf16's TTFT, 0.61x its TPOT, answers no "
        "detectably different, docs/quantization.md); 'given': model_source always.",
    )
    max_model_len: int = Field(
        2048,
        ge=256,
        description="Context window vLLM allocates (engine: openai: the external server's "
        "window, which the token budget must not exceed).",
    )
    engine_kwargs: EngineKwargs = Field(
        CPU_ENGINE_KWARGS,
        description="engine vllm: passed to vLLM as engine arguments (enable_prefix_caching, "
        "quantization, speculative_config, dtype, ...), laid over CPU_ENGINE_KWARGS (a key "
        "given null drops it). max_model_len is set from the field above. "
        "dtype 'fastest' (this project's, generation/dtype.py): bfloat16 on CPUs with native bf16, "
        "float32 on other CPUs, vLLM's auto on a GPU, chosen on the replica's node.",
    )
    accelerator_type: str | None = Field(
        None,
        description="engine vllm: Ray accelerator type for GPU replicas (e.g. 'L4', 'H100').",
    )
    placement_bundles: list[dict[str, float]] | None = Field(
        [{"CPU": 1.0}],
        description="engine vllm: placement-group bundles for one replica. On CPU: [{CPU: 1}] "
        "and no accelerator_type; on GPU null, for one bundle per tensor-parallel GPU.",
    )
    env_vars: EnvVars = Field(
        CPU_ENV_VARS,
        description="engine vllm: environment of the vLLM replica, laid over CPU_ENV_VARS.",
    )
    default_max_tokens: int = Field(128, ge=1, description="Answer length when none is asked.")
    max_tokens_limit: int = Field(512, ge=1, description="Largest max_tokens a request may ask.")
    default_temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature.")
    deployment: GeneratorServeOptions = deployment_field(GENERATOR_SERVE_OPTIONS, "generator")

    @model_validator(mode="after")
    def _limits(self) -> GeneratorConfig:
        if self.engine == "vllm" and "max_replicas_per_node" in self.deployment:
            raise ValueError(
                "generator.deployment.max_replicas_per_node cannot be used with vLLM, whose "
                "replicas hold placement groups (Ray Serve refuses both); spread generator "
                "replicas by their bundles' resources instead"
            )
        if self.engine == "openai" and self.openai is None:
            raise ValueError("generator.engine 'openai' needs generator.openai.base_url")
        if self.engine != "vllm" and self.request_router.kind != "power_of_two":
            raise ValueError(
                f"generator.request_router.kind {self.request_router.kind} needs engine "
                "'vllm': it routes to replicas' prefix caches"
            )
        if "max_model_len" in self.engine_kwargs:
            raise ValueError("set generator.max_model_len, not engine_kwargs.max_model_len")
        if self.engine == "vllm":
            problem = dtype_problem(self.model_source, self.engine_kwargs.get("dtype"))
            if problem:
                raise ValueError(problem)
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


def _is_loopback(host: str | None) -> bool:
    """Whether `host` names this machine: localhost, 127.0.0.0/8 or ::1."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
