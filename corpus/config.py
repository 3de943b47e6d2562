"""Users' collections (`collections:`): where versions live, chunking, upload limits, how
ingestion jobs share the CPU with queries, and the one writer replica."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from pipeline.config_base import ServeOptions, StrictModel, deployment_field, over_defaults

WRITER_SERVE_OPTIONS: ServeOptions = {
    "num_replicas": 1,
    "ray_actor_options": {"num_cpus": 0.1},
    "max_ongoing_requests": 32,  # job submissions and status reads
    "max_queued_requests": 64,
    "health_check_period_s": 5,
    "health_check_timeout_s": 10,
}


def _one_writer(options: ServeOptions) -> ServeOptions:
    if options.get("num_replicas", 1) != 1 or "autoscaling_config" in options:
        raise ValueError("the collection writer runs exactly one replica: one writer at a time")
    return options


WriterServeOptions = Annotated[
    ServeOptions, AfterValidator(over_defaults(WRITER_SERVE_OPTIONS)), AfterValidator(_one_writer)
]


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
    max_upload_bytes: int = Field(
        33_554_432, ge=1024, description="Largest documents upload (JSON or multipart) body."
    )
    upload_bytes_in_flight_per_caller: int = Field(
        67_108_864,
        ge=1024,
        description="Bytes of uploads one caller (API key, or client address without keys) "
        "may have in flight in one ingress replica; past it, 429 before the body is read. "
        "A chunked upload counts as max_upload_bytes. At least max_upload_bytes.",
    )
    upload_bytes_in_flight: int = Field(
        134_217_728,
        ge=1024,
        description="Bytes of uploads all callers together may have in flight in one ingress "
        "replica (its memory for upload bodies); past it, 429. At least "
        "upload_bytes_in_flight_per_caller.",
    )
    parse_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest parse of one uploaded PDF or HTML file, wall-clock (the parse "
        "runs at the job's CPU priority: under a load that takes every core it gets less); "
        "it runs in a child process that is killed past it, and the file fails with a clear "
        "error while the job goes on (corpus/parse_worker.py).",
    )
    parse_memory_mb: int = Field(
        1024,
        ge=64,
        description="Memory one PDF or HTML parse may take beyond what its process starts "
        "with (an address-space cap on Linux); past it the file fails, the job goes on.",
    )
    max_documents_per_request: int = Field(
        1000, ge=1, description="Documents or files one add request may carry."
    )
    max_queued_jobs: int = Field(
        64, ge=1, description="Jobs waiting for the writer; past it, 503 with Retry-After."
    )
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
        "wait. 'nice': nice 10, a smaller share but never starved (what each does to "
        "queries' p99: docs/retired.md, bench.ingestion).",
    )
    deployment: WriterServeOptions = deployment_field(WRITER_SERVE_OPTIONS, "collection writer")

    @model_validator(mode="after")
    def _overlap_below_chunk(self) -> CollectionsConfig:
        if self.overlap_tokens >= self.chunk_tokens:
            raise ValueError("overlap_tokens must be smaller than chunk_tokens")
        if self.upload_bytes_in_flight_per_caller < self.max_upload_bytes:
            raise ValueError(
                "upload_bytes_in_flight_per_caller must be at least max_upload_bytes, or no "
                "upload of the largest size could ever pass"
            )
        if self.upload_bytes_in_flight < self.upload_bytes_in_flight_per_caller:
            raise ValueError(
                "upload_bytes_in_flight must be at least upload_bytes_in_flight_per_caller"
            )
        return self
