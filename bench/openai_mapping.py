"""What the OpenAI surface costs per request in the ingress: a chat request with every
sampling field and a JSON schema, and a Responses request with message items, parsed from
their JSON bodies, checked and mapped to the pipeline's query (app.sampling,
app.openai_format, app.responses_format), and an answer rendered back into each API's
body. No stage, no HTTP: the ingress's own work on each side of the pipeline.

    python -m bench.openai_mapping --out docs/results/openai-mapping/mapping.json [--repeats 2000]

Writes every timing (microseconds) and prints the medians and p99 with 95% intervals.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from app import openai_format, responses_format
from app.schemas import ChatCompletionRequest, ResponsesRequest
from bench.stats import fmt_interval, one_sample, quantile
from bench.tables import markdown_table
from pipeline.messages import (
    CompressionPlan,
    PreparedPrompt,
    PromptSource,
    StageTiming,
    TokenUsage,
)
from pipeline.rag import HopTiming, RagQuery, RagResult, RetrievalQuery

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confident": {"type": "boolean"}},
    "required": ["answer", "confident"],
    "additionalProperties": False,
}
HISTORY = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What is continuous batching?"},
    {"role": "assistant", "content": "The scheduler admits requests at every step."},
    {"role": "user", "content": "How does it differ from static batching?"},
]
CHAT_BODY = json.dumps(
    {
        "model": "m", "messages": HISTORY, "max_tokens": 128, "temperature": 0.7,
        "top_p": 0.9, "stop": ["\n\n", "END"], "seed": 7, "presence_penalty": 0.1,
        "frequency_penalty": 0.1, "logit_bias": {"13": -5, "42": 2}, "logprobs": True,
        "top_logprobs": 2, "n": 2, "user": "u", "metadata": {"a": "b"},
        "response_format": {
            "type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}
        },
        "rag": {"top_k": 3, "compression": {"method": "sentences", "rate": 0.5}},
    }
)  # fmt: skip


def _text_part(text: str) -> dict[str, str]:
    return {"type": "input_text", "text": text}


RESPONSES_BODY = json.dumps(
    {
        "model": "m", "instructions": "Be brief.", "max_output_tokens": 128,
        "input": [
            {"type": "message", "role": m["role"], "content": [_text_part(m["content"])]}
            for m in HISTORY
        ],
        "text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}},
        "temperature": 0.7, "top_p": 0.9, "store": False,
    }
)  # fmt: skip
ANSWER = "Continuous batching admits new requests at every decoding step. " * 3


def _result(query: RagQuery) -> RagResult:
    sources = tuple(
        PromptSource(f"doc-{i}#0", f"doc-{i}", f"Doc {i}", "A passage. " * 20, 0.5)
        for i in range(3)
    )
    prepared = PreparedPrompt(
        [{"role": "user", "content": "x"}], sources, "sentences", 600, 300, 1.0, False,
        StageTiming(0.0, 1.0),
    )  # fmt: skip
    hop = HopTiming(1.0, 0.1, 0.1)
    return RagResult(
        query.request_id, "sentences", ANSWER, prepared, "stop", TokenUsage(800, 40, 128),
        hop, hop, 200.0, 900.0, 950.0, False, RetrievalQuery("join", "q"),
    )  # fmt: skip


def _query(conversation, sampling, n: int) -> RagQuery:
    return RagQuery(
        question=conversation.question, top_k=3, plan=CompressionPlan("sentences"),
        max_tokens=128, temperature=0.7, request_id="req-1", history=conversation.history,
        sampling=sampling, n=n,
    )  # fmt: skip


def chat_once() -> tuple[float, float]:
    """(request in, answer out) in microseconds."""
    started = time.perf_counter()
    body = ChatCompletionRequest.model_validate_json(CHAT_BODY)
    openai_format.sampling.check_refused(body)
    query = _query(openai_format.conversation_of(body), openai_format.sampling_of(body), body.n)
    parsed = time.perf_counter()
    result = _result(query)
    rendered_at = time.perf_counter()
    json.dumps(openai_format.completion_body(result, body.model, 0, 1, body.logprobs))
    return (parsed - started) * 1e6, (time.perf_counter() - rendered_at) * 1e6


def responses_once() -> tuple[float, float]:
    started = time.perf_counter()
    body = ResponsesRequest.model_validate_json(RESPONSES_BODY)
    responses_format.check_refused(body)
    conversation = responses_format.conversation_of(body)
    query = _query(conversation, responses_format.sampling_of(body), 1)
    parsed = time.perf_counter()
    result = _result(query)
    rendered_at = time.perf_counter()
    builder = responses_format.ResponseBuilder(query, body, 0)
    json.dumps(responses_format.response_body(result, builder))
    return (parsed - started) * 1e6, (time.perf_counter() - rendered_at) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args(argv)
    records: dict = {"cpu": platform.processor() or platform.machine(), "repeats": args.repeats}
    rows = []
    for name, once in (("chat", chat_once), ("responses", responses_once)):
        for _ in range(50):  # warm caches and pydantic's validators
            once()
        timings = np.array([once() for _ in range(args.repeats)])
        records[name] = {
            "parse_map_us": timings[:, 0].tolist(),
            "render_us": timings[:, 1].tolist(),
        }
        for column, label in ((0, "parse and map"), (1, "render")):
            values = timings[:, column].tolist()
            rows.append(
                [name, label, fmt_interval(one_sample(values), 1),
                 fmt_interval(one_sample(values, quantile(99)), 1)]
            )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(records), encoding="utf-8")
    header = ["API", "step", f"µs, median (n={args.repeats})", "µs, p99"]
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
