"""The final prompts of bench.direct, built in this process with the service's own code: the
messages the generator receives for each question, so that vLLM alone can be sent exactly
what the pipeline sends it.

Retrieval is the retriever's (its embedder and FAISS index, retrieval.retriever.Retriever), and the
prompt is the compressor deployment's own `prepare` (retrieval.preparation.PromptPreparer)
with the compression plan the ingress makes for the request.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence
from dataclasses import dataclass

from app.config import PROJECT_ROOT, RagAppConfig, resolve_path
from pipeline.messages import CompressionMethod, CompressionPlan, Retrieval
from retrieval.models import resolve_model_reference
from retrieval.tokens import ServingTokenizer


def compression_plan(config: RagAppConfig, method: CompressionMethod | None) -> CompressionPlan:
    """The plan the ingress makes (app.api._plan) for a request that names at most the
    compression method: the config's rate, target and policy."""
    defaults = config.compression
    return CompressionPlan(
        method or defaults.default_method, defaults.rate, defaults.target_tokens, defaults.policy
    )


@dataclass(frozen=True)
class PromptJob:
    """A request whose final prompt to build: what the ingress would hand the stages."""

    question: str
    plan: CompressionPlan
    max_tokens: int


@dataclass(frozen=True)
class FinalPrompt:
    """The messages the generator receives for one question, and how they came about."""

    question: str
    messages: tuple[dict[str, str], ...]
    prompt_tokens: int  # rendered by the serving tokenizer's chat template, here
    method: str  # what was applied (policy 'auto' may fall back to 'none')
    context_tokens_before: int
    context_tokens_after: int
    truncated: bool


def build_final_prompts(config: RagAppConfig, jobs: Sequence[PromptJob]) -> list[FinalPrompt]:
    """Retrieve and prepare each job as the retriever and compressor deployments do, in this
    process. Loads the embedder, the index, the serving tokenizer and, only when a job's
    method needs it, the LLMLingua scorer. A stage that refuses a job raises its own error
    (retrieval.preparation.PromptTooLongError when the question alone does not fit)."""
    retrievals = _retrieve(config, [job.question.strip() for job in jobs])
    gc.collect()  # the embedder goes before the compressor's models load
    return asyncio.run(_prepare(config, jobs, retrievals))


def _retrieve(config: RagAppConfig, questions: Sequence[str]) -> list[Retrieval]:
    import torch

    from retrieval.retriever import Retriever

    settings = config.retriever
    torch.set_num_threads(settings.embedding.torch_threads)
    retriever = Retriever.load(
        resolve_path(settings.index_path),
        resolve_model_reference(settings.embedding.model, PROJECT_ROOT),
        device=settings.embedding.device,
        batch_size=settings.embedding.batch_size,
        use_gpu_index=settings.use_gpu_index,
        nprobe=settings.nprobe,
        ef_search=settings.ef_search,
    )
    return [retriever.retrieve(question, settings.default_top_k) for question in questions]


async def _prepare(
    config: RagAppConfig, jobs: Sequence[PromptJob], retrievals: Sequence[Retrieval]
) -> list[FinalPrompt]:
    # The compressor stage's own class builds the prompts, so they follow the service's
    # code, cost model and LLMLingua options.
    from retrieval.preparation import PromptPreparer

    compression = config.compression
    needs_llmlingua = any("llmlingua" in job.plan.method for job in jobs)
    preparer = PromptPreparer.load(
        resolve_model_reference(config.generator.model_source, PROJECT_ROOT),
        config.prompt.system_prompt,
        config.generator.max_model_len,
        margin_tokens=config.prompt.margin_tokens,
        index_path=resolve_path(config.retriever.index_path),
        # Loading the scorer changes no prompt that does not use it; skip its memory.
        llmlingua=compression.llmlingua.to_load() if needs_llmlingua else None,
        sentence_prefilter_rate=compression.sentence_prefilter_rate,
        cost_model=compression.cost_model.to_model(),
    )
    tokenizer = ServingTokenizer.load(
        resolve_model_reference(config.generator.model_source, PROJECT_ROOT)
    )
    prompts = []
    for job, retrieval in zip(jobs, retrievals, strict=True):
        question = job.question.strip()
        prepared = preparer.prepare(question, retrieval, job.plan, job.max_tokens)
        prompts.append(
            FinalPrompt(
                question=job.question,
                messages=tuple(prepared.messages),
                prompt_tokens=tokenizer.count_chat(prepared.messages),
                method=prepared.method,
                context_tokens_before=prepared.context_tokens_before,
                context_tokens_after=prepared.context_tokens_after,
                truncated=prepared.truncated,
            )
        )
    return prompts
