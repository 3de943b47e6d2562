"""Batching lab: static batching (Hugging Face `.generate()`) against vLLM's continuous batching.

    python -m bench.batching --concurrency 1 8 32 --num-requests 32 --out bench-results/batching \\
        [--output-tokens 16 96] [--seed 0] [--max-seconds-per-run 120] [--threads N] \\
        [--sides static continuous] [--model .models/smollm2-135m-instruct]

What it measures: the same closed-loop workload served twice, in-process (no Ray, no HTTP), by
the same model with the same float32 weights, at each concurrency C:

- The workload: N requests, each a short question from QUESTIONS (cycling) rendered with the
  model's chat template, and each with its own output length drawn uniformly from
  `--output-tokens MIN MAX` by a seeded `random.Random`, so members of a batch differ in
  length. Decoding is greedy and ignores EOS, so every request produces exactly its target
  length on both sides. All N requests are queued at t=0.
- Static batching, the way `AutoModelForCausalLM.generate` is used for offline batches: the
  queue is cut C at a time, in order; a batch is left-padded and runs max_new_tokens = its
  longest member's target; every member ends when the batch ends. A member's TTFT is when the
  batch's first token is produced, measured from t=0, so it includes waiting for the earlier
  batches; its E2E is the end of its batch. `last_token_ms` records when its own last token
  existed, which static batching hides behind the longest member.
- Continuous batching: vLLM's `AsyncLLM` with an asyncio semaphore of C; each request stops at
  its own target length and the engine refills the freed slot at the next step. TTFT and E2E are
  measured from t=0 and also from the request's own send (semaphore acquired).

Per side and concurrency: requests/s and output tokens/s over the run (t=0 to the last end;
only each request's own target tokens count, never padding steps), TTFT p50/p99, E2E p50/p99
(from t=0) and TPOT p50 = (E2E - TTFT) / (tokens - 1). For static batching that TPOT includes
the steps a member waits for its batch's longest member: the per-token time its client sees.
Writes OUT/batching.json (settings, per-request records with token ids, summaries) and
OUT/batching.md (the table, also printed; continuous/static output-token throughput ratio per C).

Each side runs in its own subprocess, one after the other (static first), so the two models
are never loaded together and each side gets the machine's memory and cores back.

Duration: N must be at least the largest C, or the largest C never fills a batch. The default
(N=32, 16-96 tokens, C=1,8,32) takes about 5-6 minutes on an idle 2-core machine: C=1 dominates
(32 requests one at a time on each side), plus ~10 s to load HF and ~25-50 s to start vLLM.
As a safety, a run at one concurrency starts no new batch/request after
`--max-seconds-per-run` (default 120 s); the requests left are not run and the table shows
done/N. A cut run's rates stay meaningful, but its t=0 latency percentiles then cover only the
requests queued first, so compare such rows with care (or raise the limit).

Fairness caveats:
- HF has no paged KV cache: each batch allocates a contiguous cache for its padded length, and
  padding rows and finished members still cost compute at every step. That is part of what
  static batching costs, not a flaw of the measurement.
- Both sides share the same cores but use them differently. HF runs torch with `--threads`
  threads (default: all cores) in one process. vLLM's CPU backend binds its worker's OpenMP
  threads to all cores but one by default (VLLM_CPU_OMP_THREADS_BIND=auto) and keeps the other
  for the engine-core scheduler and this process's asyncio loop; on a 2-core machine that is
  one compute thread against HF's two. Set VLLM_CPU_OMP_THREADS_BIND in the environment to
  change that.
- HF runs with `torch.set_flush_denormal(True)` (several times faster in fp32 on these CPUs);
  vLLM's kernels are left as they ship.
- Neither side detokenizes (vLLM's `detokenize=False`), and vLLM's prefix cache is off, since
  HF has none (the prompts are shorter than a 128-token CPU KV block anyway).
- Greedy fp32 outputs usually agree token for token across the two; padding and batch shape
  change the arithmetic slightly, so a few requests may diverge. `tokens_match` in the JSON
  counts the requests whose ids agree.
- One warm-up generation on each side before timing; model load and engine start are reported
  but not timed into any figure.
- Run it on an otherwise idle machine. Another busy process costs HF's threads, which
  synchronize at every operator, more than vLLM's single bound worker thread, and skews the
  ratio towards vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.stats import Distribution, distribution, format_ms, per_s, tpot
from harness.service import ROOT

SIDES = ("static", "continuous")
DEFAULT_MODEL = ROOT / ".models" / "smollm2-135m-instruct"
DEFAULT_CONCURRENCY = (1, 8, 32)
DEFAULT_NUM_REQUESTS = 32
DEFAULT_OUTPUT_TOKENS = (16, 96)
DEFAULT_MAX_SECONDS_PER_RUN = 120.0
# Short questions: prompts of about 35-45 tokens with SmolLM2's default system prompt.
QUESTIONS: tuple[str, ...] = (
    "What is the KV cache?",
    "What is continuous batching?",
    "Why is decode memory-bandwidth bound?",
    "What does time to first token measure?",
    "What is prefix caching?",
    "How does PagedAttention store keys and values?",
    "What is chunked prefill?",
    "Why does static batching waste compute?",
    "What is speculative decoding?",
    "How does weight quantization speed up inference?",
    "What is tensor parallelism?",
    "What limits the batch size of an LLM server?",
)


@dataclass(frozen=True)
class WorkItem:
    """One request of the workload: its position in the queue, question and output length."""

    index: int
    question: str
    output_tokens: int


@dataclass
class RequestRecord:
    """One served request. Times are ms from t=0 of its run (all requests queued at t=0).

    `start_ms`: the request's send (continuous) or its batch's start (static). `ttft_ms`, `e2e_ms`:
    first token and end, from t=0; the `_from_start_ms` pair is the same from `start_ms`.
    `last_token_ms`: when the request's own last token existed (static: inside its batch, which
    may run on; continuous: its end). `batch`, `batch_steps`: static only, the batch's index and
    its decode steps (its longest member's target)."""

    side: str
    concurrency: int
    index: int
    prompt_tokens: int
    output_tokens: int
    start_ms: float
    ttft_ms: float
    e2e_ms: float
    last_token_ms: float
    ttft_from_start_ms: float
    e2e_from_start_ms: float
    batch: int | None = None
    batch_steps: int | None = None
    token_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RunSummary:
    """One side at one concurrency. Rates per second of `duration_s` (t=0 to the last end);
    latency distributions in ms. `padding_steps`: member-steps a static batch computed past a
    member's own target (0 for continuous); `padding_fraction` is their share of all
    member-steps."""

    side: str
    concurrency: int
    requests: int
    completed: int
    duration_s: float
    requests_per_s: float
    output_tokens: int
    output_tokens_per_s: float
    ttft_ms: Distribution | None
    e2e_ms: Distribution | None
    tpot_ms: Distribution | None
    ttft_from_start_ms: Distribution | None
    e2e_from_start_ms: Distribution | None
    padding_steps: int
    padding_fraction: float


# ---------------------------------------------------------------------------------------------
# Pure parts: workload, batching, timing arithmetic, summaries, Markdown.


def build_workload(
    num_requests: int,
    *,
    seed: int,
    min_output_tokens: int,
    max_output_tokens: int,
    questions: Sequence[str] = QUESTIONS,
) -> list[WorkItem]:
    """`num_requests` items cycling through `questions`, output lengths uniform in
    [min_output_tokens, max_output_tokens] from `random.Random(seed)`; ValueError on bad bounds."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if not 1 <= min_output_tokens <= max_output_tokens:
        raise ValueError(
            f"need 1 <= min <= max output tokens, got {min_output_tokens}..{max_output_tokens}"
        )
    if not questions:
        raise ValueError("no questions")
    rng = random.Random(seed)
    return [
        WorkItem(
            i, questions[i % len(questions)], rng.randint(min_output_tokens, max_output_tokens)
        )
        for i in range(num_requests)
    ]


def static_batches(items: Sequence[WorkItem], concurrency: int) -> list[list[WorkItem]]:
    """The queue cut into batches of `concurrency` in order; the last may be smaller."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    return [list(items[i : i + concurrency]) for i in range(0, len(items), concurrency)]


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int
) -> tuple[list[list[int]], list[list[int]]]:
    """(input ids, attention mask) with every sequence left-padded to the longest."""
    width = max(len(seq) for seq in sequences)
    ids = [[pad_id] * (width - len(seq)) + list(seq) for seq in sequences]
    mask = [[0] * (width - len(seq)) + [1] * len(seq) for seq in sequences]
    return ids, mask


def static_batch_records(
    batch: Sequence[WorkItem],
    *,
    concurrency: int,
    batch_index: int,
    run_start_s: float,
    start_s: float,
    step_times_s: Sequence[float],
    end_s: float,
    prompt_tokens: Sequence[int],
    token_ids: Sequence[Sequence[int]],
) -> list[RequestRecord]:
    """Records of one static batch from its clock readings (perf_counter seconds).

    `step_times_s[k]` is when decode step k's tokens existed (k=0: the first token, after the
    batch's prefill); there must be exactly one per step of the longest member. Every member
    gets the batch's first step as its first token and `end_s` (generate returned) as its end;
    its own last token is step `output_tokens - 1`. `token_ids[i]` is member i's output, cut to
    its own target."""
    steps = max(item.output_tokens for item in batch)
    if len(step_times_s) != steps:
        raise ValueError(f"batch of {steps} steps has {len(step_times_s)} step times")
    if not len(prompt_tokens) == len(token_ids) == len(batch):
        raise ValueError("prompt_tokens and token_ids need one entry per batch member")

    def ms(t: float) -> float:
        return (t - run_start_s) * 1000

    first_s = step_times_s[0]
    return [
        RequestRecord(
            side="static",
            concurrency=concurrency,
            index=item.index,
            prompt_tokens=prompt_tokens[i],
            output_tokens=item.output_tokens,
            start_ms=ms(start_s),
            ttft_ms=ms(first_s),
            e2e_ms=ms(end_s),
            last_token_ms=ms(step_times_s[item.output_tokens - 1]),
            ttft_from_start_ms=(first_s - start_s) * 1000,
            e2e_from_start_ms=(end_s - start_s) * 1000,
            batch=batch_index,
            batch_steps=steps,
            token_ids=list(token_ids[i])[: item.output_tokens],
        )
        for i, item in enumerate(batch)
    ]


def tpot_ms(record: RequestRecord) -> float | None:
    """(E2E - TTFT) / (output_tokens - 1), None below 2 tokens."""
    return tpot(record.ttft_ms, record.e2e_ms, record.output_tokens)


def summarize_run(
    side: str, concurrency: int, requests: int, records: Sequence[RequestRecord]
) -> RunSummary:
    """Throughput and latency of one side at one concurrency; `requests` is how many were
    queued (records may be fewer when the run hit its time limit)."""
    duration_s = max((r.e2e_ms for r in records), default=0.0) / 1000
    output_tokens = sum(r.output_tokens for r in records)
    padding = sum((r.batch_steps or r.output_tokens) - r.output_tokens for r in records)
    member_steps = output_tokens + padding
    return RunSummary(
        side=side,
        concurrency=concurrency,
        requests=requests,
        completed=len(records),
        duration_s=duration_s,
        requests_per_s=per_s(len(records), duration_s),
        output_tokens=output_tokens,
        output_tokens_per_s=per_s(output_tokens, duration_s),
        ttft_ms=distribution(r.ttft_ms for r in records),
        e2e_ms=distribution(r.e2e_ms for r in records),
        tpot_ms=distribution(t for r in records if (t := tpot_ms(r)) is not None),
        ttft_from_start_ms=distribution(r.ttft_from_start_ms for r in records),
        e2e_from_start_ms=distribution(r.e2e_from_start_ms for r in records),
        padding_steps=padding,
        padding_fraction=padding / member_steps if member_steps else 0.0,
    )


def summarize_all(
    records: Sequence[RequestRecord], concurrencies: Sequence[int], requests: int
) -> list[RunSummary]:
    """One summary per (side, concurrency) that has records or was asked for, sides in SIDES
    order, concurrencies in the given order."""
    sides = [s for s in SIDES if any(r.side == s for r in records)]
    return [
        summarize_run(
            side, c, requests, [r for r in records if r.side == side and r.concurrency == c]
        )
        for c in concurrencies
        for side in sides
    ]


def throughput_ratio(summaries: Sequence[RunSummary], concurrency: int) -> float | None:
    """Continuous over static output tokens/s at `concurrency`; None without both sides or
    with a zero static figure."""
    by_side = {s.side: s for s in summaries if s.concurrency == concurrency}
    static, continuous = by_side.get("static"), by_side.get("continuous")
    if static is None or continuous is None or static.output_tokens_per_s <= 0:
        return None
    return continuous.output_tokens_per_s / static.output_tokens_per_s


def tokens_match(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Per concurrency ("c=8"), how many requests produced the same token ids on both sides."""
    matches: dict[str, int] = {}
    by_key = {(r.side, r.concurrency, r.index): r.token_ids for r in records}
    for (side, c, index), ids in by_key.items():
        if side != "static":
            continue
        other = by_key.get(("continuous", c, index))
        if other is not None:
            matches[f"c={c}"] = matches.get(f"c={c}", 0) + (ids == other)
    return matches


def markdown_table(summaries: Sequence[RunSummary]) -> str:
    """Static and continuous rows next to each other per concurrency; latencies in ms from
    t=0, TTFT also from the request's start (send or batch start)."""
    lines = [
        "| C | batching | done | req/s | out tok/s | vs static | TTFT p50 | TTFT p99 "
        "| TTFT p50 from start | E2E p50 | E2E p99 | TPOT p50 | padding |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        ratio = 1.0 if s.side == "static" else throughput_ratio(summaries, s.concurrency)
        cells = [
            str(s.concurrency),
            s.side,
            f"{s.completed}/{s.requests}",
            f"{s.requests_per_s:.3f}",
            f"{s.output_tokens_per_s:.1f}",
            "-" if ratio is None else f"{ratio:.2f}x",
            _p(s.ttft_ms, "p50"),
            _p(s.ttft_ms, "p99"),
            _p(s.ttft_from_start_ms, "p50"),
            _p(s.e2e_ms, "p50"),
            _p(s.e2e_ms, "p99"),
            _p(s.tpot_ms, "p50"),
            f"{s.padding_fraction:.0%}" if s.side == "static" else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _p(dist: Distribution | None, name: str) -> str:
    return format_ms(None if dist is None else getattr(dist, name))


def record_from_dict(data: dict[str, Any]) -> RequestRecord:
    return RequestRecord(**data)


# ---------------------------------------------------------------------------------------------
# The two sides. Each runs in its own subprocess (`--worker`); heavy imports stay in here.


@dataclass(frozen=True)
class Job:
    """What a side's subprocess runs: read from and written to JSON."""

    side: str
    model: str
    concurrencies: list[int]
    items: list[WorkItem]
    max_seconds_per_run: float
    threads: int
    max_model_len: int = 2048

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        items = [WorkItem(**item) for item in data["items"]]
        return cls(**{**data, "items": items})


class _StepClock:
    """A `generate` streamer that only notes when each decode step's tokens exist.

    `generate` calls `put` once with the prompt, then once per step with that step's tokens."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.step_times_s: list[float] = []

    def put(self, value: Any) -> None:
        if self.prompt_seen:
            self.step_times_s.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass


def render_prompt_ids(tokenizer: Any, questions: Sequence[str]) -> list[list[int]]:
    """Each question as one user turn in the chat template with the assistant prompt opened,
    tokenized without extra special tokens (the template writes them)."""
    ids = []
    for question in questions:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        ids.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return ids


def run_static_side(job: Job) -> tuple[list[RequestRecord], dict[str, Any]]:
    """Load the model with transformers in fp32 and run every concurrency of `job`."""
    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(job.threads)
    torch.set_flush_denormal(True)
    tokenizer = AutoTokenizer.from_pretrained(job.model)
    model = AutoModelForCausalLM.from_pretrained(job.model, dtype=torch.float32)
    model.eval()
    # generate() fills unset options from the model's generation config, so the EOS stop has
    # to be removed there (passing eos_token_id=None is overridden by it).
    model.generation_config.eos_token_id = None
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = render_prompt_ids(tokenizer, [item.question for item in job.items])

    def generate(batch: Sequence[WorkItem], clock: _StepClock | None) -> list[list[int]]:
        members = [prompts[item.index] for item in batch]
        ids, mask = left_pad(members, pad_id)
        steps = max(item.output_tokens for item in batch)
        output = model.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            max_new_tokens=steps,
            do_sample=False,
            pad_token_id=pad_id,
            streamer=clock,
        )
        width = len(ids[0])
        new_ids: list[list[int]] = output[:, width:].tolist()
        if any(len(row) != steps for row in new_ids):
            raise RuntimeError(f"generate stopped early: wanted {steps} tokens")
        return new_ids

    generate([WorkItem(0, job.items[0].question, 4)] * 2, None)  # warm-up, padding path too
    load_s = time.perf_counter() - started
    records: list[RequestRecord] = []
    for concurrency in job.concurrencies:
        run_start = time.perf_counter()
        deadline = run_start + job.max_seconds_per_run
        for batch_index, batch in enumerate(static_batches(job.items, concurrency)):
            start = time.perf_counter()
            if start > deadline:
                break
            clock = _StepClock()
            token_ids = generate(batch, clock)
            end = time.perf_counter()
            records += static_batch_records(
                batch,
                concurrency=concurrency,
                batch_index=batch_index,
                run_start_s=run_start,
                start_s=start,
                step_times_s=clock.step_times_s,
                end_s=end,
                prompt_tokens=[len(prompts[item.index]) for item in batch],
                token_ids=token_ids,
            )
        _progress(job.side, concurrency, records, len(job.items), time.perf_counter() - run_start)
    info = {
        "load_and_warmup_s": load_s,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
    }
    return records, info


def run_continuous_side(job: Job) -> tuple[list[RequestRecord], dict[str, Any]]:
    """Start vLLM's AsyncLLM in fp32 (eager) and run every concurrency of `job`."""
    return asyncio.run(_continuous(job))


async def _continuous(job: Job) -> tuple[list[RequestRecord], dict[str, Any]]:
    started = time.perf_counter()
    # Read by vLLM when the engine is created; without it CPU start-up fails on memory.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoTokenizer
    from vllm import AsyncEngineArgs, SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    tokenizer = AutoTokenizer.from_pretrained(job.model)
    prompts = render_prompt_ids(tokenizer, [item.question for item in job.items])
    engine_args = AsyncEngineArgs(
        model=job.model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=job.max_model_len,
        max_num_seqs=max(job.concurrencies),
        enable_prefix_caching=False,
        seed=0,
        disable_log_stats=True,
    )
    engine = AsyncLLM.from_engine_args(engine_args)
    try:

        async def generate(
            request_id: str, prompt: list[int], tokens: int
        ) -> tuple[float, list[int]]:
            """(perf_counter of the first token, all token ids)."""
            params = SamplingParams(
                max_tokens=tokens,
                temperature=0.0,
                ignore_eos=True,
                detokenize=False,
                output_kind=RequestOutputKind.DELTA,
            )
            first_s = None
            ids: list[int] = []
            async for out in engine.generate(
                TokensPrompt(prompt_token_ids=prompt), params, request_id
            ):
                new = out.outputs[0].token_ids
                if new and first_s is None:
                    first_s = time.perf_counter()
                ids.extend(new)
            if first_s is None or len(ids) != tokens:
                raise RuntimeError(f"{request_id}: wanted {tokens} tokens, got {len(ids)}")
            return first_s, ids

        await generate("warmup", prompts[0], 4)
        load_s = time.perf_counter() - started
        records: list[RequestRecord] = []
        for concurrency in job.concurrencies:
            semaphore = asyncio.Semaphore(concurrency)
            run_start = time.perf_counter()
            deadline = run_start + job.max_seconds_per_run

            async def one(
                item: WorkItem,
                c: int = concurrency,
                t0: float = run_start,
                limit: float = deadline,
                sem: asyncio.Semaphore = semaphore,
            ) -> RequestRecord | None:
                # Defaults bind this run's values (the closure is made once per concurrency).
                async with sem:
                    start = time.perf_counter()
                    if start > limit:
                        return None
                    prompt = prompts[item.index]
                    first, ids = await generate(f"c{c}-{item.index}", prompt, item.output_tokens)
                    end = time.perf_counter()
                return RequestRecord(
                    side="continuous",
                    concurrency=c,
                    index=item.index,
                    prompt_tokens=len(prompt),
                    output_tokens=item.output_tokens,
                    start_ms=(start - t0) * 1000,
                    ttft_ms=(first - t0) * 1000,
                    e2e_ms=(end - t0) * 1000,
                    last_token_ms=(end - t0) * 1000,
                    ttft_from_start_ms=(first - start) * 1000,
                    e2e_from_start_ms=(end - start) * 1000,
                    token_ids=ids,
                )

            done = await asyncio.gather(*(one(item) for item in job.items))
            records += [r for r in done if r is not None]
            _progress(
                job.side, concurrency, records, len(job.items), time.perf_counter() - run_start
            )
    finally:
        engine.shutdown()
    info = {
        "load_and_warmup_s": load_s,
        "vllm": _version("vllm-cpu") or _version("vllm"),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
    }
    return records, info


def _progress(
    side: str, concurrency: int, records: Sequence[RequestRecord], n: int, s: float
) -> None:
    done = sum(r.concurrency == concurrency for r in records)
    print(
        f"[{side}] c={concurrency}: {done}/{n} requests in {s:.1f} s", file=sys.stderr, flush=True
    )


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def worker_main(argv: Sequence[str]) -> int:
    """Subprocess entry: `--worker JOB.json RESULT.json`; runs the job's side, writes
    {records, info}."""
    job_path, result_path = (Path(p) for p in argv)
    job = Job.from_dict(json.loads(job_path.read_text()))
    runner = run_static_side if job.side == "static" else run_continuous_side
    records, info = runner(job)
    result = {"records": [asdict(r) for r in records], "info": info}
    result_path.write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.batching",
        description="Static (HF generate) vs continuous (vLLM) batching: throughput and latency.",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(DEFAULT_CONCURRENCY))
    parser.add_argument("--num-requests", type=int, default=DEFAULT_NUM_REQUESTS)
    parser.add_argument(
        "--output-tokens", type=int, nargs=2, metavar=("MIN", "MAX"),
        default=list(DEFAULT_OUTPUT_TOKENS), help="per-request output length, uniform in MIN..MAX",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the output lengths")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="local HF model folder")
    parser.add_argument(
        "--max-seconds-per-run", type=float, default=DEFAULT_MAX_SECONDS_PER_RUN,
        help="per side and concurrency: start no batch/request after this many seconds",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the HF side"
    )
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on `argv` (sys.argv when None). 0 when every side ran, 1 when one failed."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["--worker"]:
        return worker_main(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        items = build_workload(
            args.num_requests,
            seed=args.seed,
            min_output_tokens=args.output_tokens[0],
            max_output_tokens=args.output_tokens[1],
        )
        if any(c < 1 for c in args.concurrency):
            raise ValueError("concurrency must be >= 1")
    except ValueError as error:
        parser.error(str(error))
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    records: list[RequestRecord] = []
    info: dict[str, Any] = {}
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
        for side in args.sides:
            job = Job(
                side=side,
                model=str(args.model),
                concurrencies=list(args.concurrency),
                items=items,
                max_seconds_per_run=args.max_seconds_per_run,
                threads=args.threads,
            )
            side_records, side_info = _run_side(job, Path(tmp))
            if side_info is None:
                failed.append(side)
                continue
            records += side_records
            info[side] = side_info
    summaries = summarize_all(records, args.concurrency, len(items))
    table = markdown_table(summaries)
    config = {
        "started_at": started_at,
        "model": str(args.model),
        "concurrency": args.concurrency,
        "num_requests": args.num_requests,
        "output_tokens": args.output_tokens,
        "seed": args.seed,
        "max_seconds_per_run": args.max_seconds_per_run,
        "hf_threads": args.threads,
        "cpu_count": os.cpu_count(),
        "sides": args.sides,
        "failed_sides": failed,
    }
    paths = write_outputs(args.out, config, info, records, summaries, table)
    print(f"{_heading(config)}\n\n{table}\n")
    print("wrote " + ", ".join(str(path) for path in paths))
    if failed:
        print(f"error: side(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _run_side(job: Job, tmp: Path) -> tuple[list[RequestRecord], dict[str, Any] | None]:
    """Run one side in a fresh interpreter; (records, info), info None when it failed."""
    job_path, result_path = tmp / f"{job.side}.job.json", tmp / f"{job.side}.result.json"
    job_path.write_text(json.dumps(asdict(job)))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
    }
    print(f"[{job.side}] starting", file=sys.stderr, flush=True)
    command = [sys.executable, "-m", "bench.batching", "--worker", str(job_path), str(result_path)]
    completed = subprocess.run(command, cwd=ROOT, env=env, check=False)
    if completed.returncode != 0 or not result_path.exists():
        print(f"[{job.side}] failed with exit code {completed.returncode}", file=sys.stderr)
        return [], None
    result = json.loads(result_path.read_text())
    return [record_from_dict(r) for r in result["records"]], result["info"]


def _heading(config: dict[str, Any]) -> str:
    low, high = config["output_tokens"]
    return (
        f"## Static vs continuous batching: {Path(config['model']).name}, fp32, "
        f"{config['num_requests']} requests, {low}-{high} output tokens (seed {config['seed']}), "
        f"HF threads {config['hf_threads']} of {config['cpu_count']} cores\n\n"
        "Latencies in ms from t=0 (all requests queued at t=0); TTFT from start = from the "
        "request's send (continuous) or its batch's start (static). \"vs static\": output "
        "tokens/s over static's at the same C. padding: member-steps static batching spent past "
        "a member's own length."
    )


def write_outputs(
    out_dir: Path,
    config: dict[str, Any],
    info: dict[str, Any],
    records: Sequence[RequestRecord],
    summaries: Sequence[RunSummary],
    table: str,
) -> list[Path]:
    """Write out_dir/batching.json and out_dir/batching.md; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "batching.json", out_dir / "batching.md"
    ratios = {f"c={c}": throughput_ratio(summaries, c) for c in config["concurrency"]}
    payload = {
        "config": config,
        "sides": info,
        "summaries": [asdict(s) for s in summaries],
        "continuous_over_static_output_tokens_per_s": ratios,
        "tokens_match": tokens_match(records),
        "records": [asdict(r) for r in records],
    }
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    md_path.write_text(f"{_heading(config)}\n\n{table}\n")
    return [json_path, md_path, *plot_summaries(summaries, out_dir)]


def plot_summaries(summaries: Sequence[RunSummary], out_dir: Path) -> list[Path]:
    """batching_throughput.png and batching_ttft_p99.png against concurrency, one line per
    side; none without matplotlib or with fewer than two concurrency levels."""
    from bench.plots import plot_lines

    figures = {
        "batching_throughput.png": ("output tokens/s", lambda s: s.output_tokens_per_s),
        "batching_ttft_p99.png": (
            "p99 TTFT from t=0, ms",
            lambda s: None if s.ttft_from_start_ms is None else s.ttft_from_start_ms.p99,
        ),
    }
    written = []
    for name, (ylabel, value_of) in figures.items():
        series = {
            side: [
                (float(s.concurrency), float(value))
                for s in summaries
                if s.side == side and (value := value_of(s)) is not None
            ]
            for side in SIDES
        }
        if max((len(points) for points in series.values()), default=0) < 2:
            continue
        try:
            plot_lines(
                series,
                "concurrency (requests in flight)",
                ylabel,
                f"Static vs continuous batching: {ylabel}",
                out_dir / name,
                log_x=True,
            )
        except (ImportError, ValueError) as error:
            print(f"no plot {name}: {error}", file=sys.stderr)
            continue
        written.append(out_dir / name)
    return written


if __name__ == "__main__":
    sys.exit(main())
