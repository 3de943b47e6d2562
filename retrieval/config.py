"""The search stage's settings (`retriever:` in serve_config.yaml): the index, the embedder,
the ranking (dense, BM25 or hybrid) and the retriever's replicas."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from pipeline.config_base import ServeOptions, StrictModel, deployment_field, over_defaults
from pipeline.messages import RetrievalMode
from retrieval.fusion import HybridParams, check_fusion_params
from retrieval.models import DEFAULT_EMBEDDING_MODEL

# A retrieval takes tens of ms: 32 at once and 64 queued per caller drain in about a
# second; past that the caller gets 503 + Retry-After, not a longer wait.
RETRIEVER_SERVE_OPTIONS: ServeOptions = {
    "num_replicas": 1,
    "ray_actor_options": {"num_cpus": 0.2},
    "max_ongoing_requests": 32,
    "max_queued_requests": 64,
    "health_check_period_s": 5,
    "health_check_timeout_s": 10,
}
RetrieverServeOptions = Annotated[
    ServeOptions, AfterValidator(over_defaults(RETRIEVER_SERVE_OPTIONS))
]


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
    dev by bench.retrieval_modes (docs/retired.md, "Hybrid retrieval")."""

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
    deployment: RetrieverServeOptions = deployment_field(RETRIEVER_SERVE_OPTIONS, "retriever")

    @model_validator(mode="after")
    def _top_k(self) -> RetrieverConfig:
        if self.default_top_k > self.max_top_k:
            raise ValueError("default_top_k must not exceed max_top_k")
        return self
