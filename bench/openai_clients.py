"""The OpenAI surface on the reader `make run` serves: serve_config.yaml as shipped (keys
required), then each goal of docs/api.md's "OpenAI clients" asked of it, every request
kept.

    python -m bench.openai_clients --out docs/results/openai-clients [--same-answer 10]

- structured output: each of the 20 default-collection questions with a strict
  `json_schema` (the short answer style, so that a question takes seconds, not minutes,
  on a 2-core CPU), the answer validated against the schema;
- the chat route and the Responses API, greedy with one seed, on the first questions: the
  same answer text or not;
- `stop` at the answer's fourth word and `n: 3` on one question;
- one call of each client: openai (chat stream with usage, parse, responses plain,
  streamed and parse, embeddings), LangChain, LlamaIndex, the OpenAI Agents SDK.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import openai
from pydantic import BaseModel

from bench.labs import keyed_service, machine, positive_int, utc_now
from bench.questions import DEFAULT_QUESTIONS
from bench.stats import fmt_interval, one_sample, sample_mean
from pipeline.config_base import PROJECT_ROOT

logger = logging.getLogger(__name__)

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confident": {"type": "boolean"}},
    "required": ["answer", "confident"],
    "additionalProperties": False,
}


# The structured calls ask for the short style: a span, seconds a question on 2 cores.
SHORT = {"rag": {"answer_style": "short"}}


class Answer(BaseModel):
    answer: str
    confident: bool


class Records(list):
    """The run's records, each also appended to a JSON-lines file as it comes, so that a
    run stopped part-way keeps what it measured."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = path
        path.write_text("", encoding="utf-8")

    def append(self, record: dict) -> None:
        super().append(record)
        with self._path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    return call(), (time.perf_counter() - started) * 1000


def structured(client: Any, model: str, records: list[dict]) -> None:
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
    }
    for question in DEFAULT_QUESTIONS:
        started = time.perf_counter()
        try:
            reply = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": question}],
                max_tokens=160,
                temperature=0,
                response_format=response_format,
                extra_body=SHORT,
            )
        except openai.APIError as exc:  # a refusal or a time-out is a result too
            records.append({"check": "json_schema", "question": question, "valid": False,
                            "error": repr(exc)[:300]})  # fmt: skip
            continue
        ms = (time.perf_counter() - started) * 1000
        text = reply.choices[0].message.content or ""
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
        records.append(
            {"check": "json_schema", "question": question, "valid": valid, "text": text,
             "finish_reason": reply.choices[0].finish_reason, "ms": ms,
             "completion_tokens": reply.usage.completion_tokens}
        )  # fmt: skip


def same_answer(client: Any, model: str, count: int, records: list[dict]) -> None:
    for question in DEFAULT_QUESTIONS[:count]:
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}], max_tokens=48,
            temperature=0, seed=7,
        )  # fmt: skip
        response = client.responses.create(
            model=model, input=question, max_output_tokens=48, temperature=0,
            extra_body={"seed": 7},
        )  # fmt: skip
        chat_text = chat.choices[0].message.content or ""
        records.append(
            {"check": "same_answer", "question": question,
             "same": chat_text == response.output_text, "chat": chat_text,
             "responses": response.output_text}
        )  # fmt: skip


def stop_and_n(client: Any, model: str, records: list[dict]) -> None:
    question = DEFAULT_QUESTIONS[10]
    ask = {"model": model, "messages": [{"role": "user", "content": question}], "temperature": 0}
    whole = client.chat.completions.create(**ask, max_tokens=48)
    text = whole.choices[0].message.content or ""
    stop = " " + text.split()[3]
    cut = client.chat.completions.create(**ask, max_tokens=48, stop=[stop])
    cut_text = cut.choices[0].message.content or ""
    records.append(
        {"check": "stop", "stop": stop, "whole": text, "cut": cut_text,
         "cut_where_it_appears": text.startswith(cut_text) and stop not in cut_text
         and text[len(cut_text):].startswith(stop)}
    )  # fmt: skip
    three = client.chat.completions.create(
        **{**ask, "temperature": 0.8}, max_tokens=32, n=3, seed=1
    )
    rag = three.model_extra["rag"]
    records.append(
        {"check": "n", "choices": [c.message.content for c in three.choices],
         "timings_ms": rag["timings_ms"], "completion_tokens": three.usage.completion_tokens}
    )  # fmt: skip


def clients(base_url: str, key: str, model: str, records: list[dict]) -> None:
    """One call of each client; a failure is recorded, not raised."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
    from langchain_openai import ChatOpenAI
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    set_tracing_disabled(True)
    client: Any = openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
    question = DEFAULT_QUESTIONS[5]
    messages = [{"role": "user", "content": question}]
    embedding_model = client.models.list().data[1].id
    langchain = ChatOpenAI(
        model=model, base_url=f"{base_url}/v1", api_key=key, max_tokens=64, temperature=0,
        top_p=0.9, stop=["\n\n"],
    )  # fmt: skip
    llama = OpenAILike(
        model=model, api_base=f"{base_url}/v1", api_key=key, is_chat_model=True,
        context_window=4096, max_tokens=64,
    )  # fmt: skip
    agent = Agent(
        name="docs", instructions="Answer from the documents.",
        model=OpenAIResponsesModel(
            model=model, openai_client=openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key)
        ),
        model_settings=ModelSettings(max_tokens=256, temperature=0, extra_body=SHORT),
    )  # fmt: skip
    calls: dict[str, Callable[[], Any]] = {
        "openai chat stream+usage": lambda: list(client.chat.completions.create(
            model=model, messages=messages, max_tokens=48, stream=True,
            stream_options={"include_usage": True}))[-1].usage.completion_tokens,
        "openai chat.completions.parse": lambda: client.chat.completions.parse(
            model=model, messages=messages, response_format=Answer, max_tokens=256,
            extra_body=SHORT).choices[0].message.parsed.answer,
        "openai responses.create": lambda: client.responses.create(
            model=model, input=question, max_output_tokens=64).output_text,
        "openai responses stream": lambda: [e.type for e in client.responses.create(
            model=model, input=question, max_output_tokens=64, stream=True)][-1],
        "openai responses.parse": lambda: client.responses.parse(
            model=model, input=question, text_format=Answer, max_output_tokens=256,
            extra_body=SHORT).output_parsed.answer,
        "openai embeddings.create": lambda: len(client.embeddings.create(
            model=embedding_model, input=[question]).data[0].embedding),
        "langchain invoke": lambda: langchain.invoke(question).content,
        "langchain stream": lambda: "".join(str(c.content) for c in langchain.stream(question)),
        "langchain with_structured_output": lambda: ChatOpenAI(
            model=model, base_url=f"{base_url}/v1", api_key=key, max_tokens=256,
            extra_body=SHORT).with_structured_output(Answer).invoke(question),
        "llamaindex chat": lambda: llama.chat([ChatMessage(role="user", content=question)])
        .message.content,
        "llamaindex stream_chat": lambda: "".join(
            r.delta or "" for r in llama.stream_chat([ChatMessage(role="user", content=question)])),
        "openai-agents Runner.run_sync": lambda: Runner.run_sync(agent, question).final_output,
    }  # fmt: skip
    for name, call in calls.items():
        try:
            result, ms = _timed(call)
            shown = str(result)[:300]
            records.append({"check": "client", "call": name, "ok": True, "result": shown, "ms": ms})
        except Exception as exc:  # a client failing is the finding
            logger.exception("%s failed", name)
            failure = repr(exc)[:500]
            records.append({"check": "client", "call": name, "ok": False, "error": failure})


def report(records: list[dict]) -> str:
    schema_rows = [r for r in records if r["check"] == "json_schema"]
    same_rows = [r for r in records if r["check"] == "same_answer"]
    client_rows = [r for r in records if r["check"] == "client"]
    stops = [r for r in records if r["check"] == "stop"]
    threes = [r for r in records if r["check"] == "n"]
    failed = [r["error"] for r in records if r["check"] == "phase_failed"]
    valid = [1.0 if r["valid"] else 0.0 for r in schema_rows]
    same = [1.0 if r["same"] else 0.0 for r in same_rows]
    lines = [
        f"- strict json_schema answers valid: {int(sum(valid))} of {len(valid)} "
        f"(share {fmt_interval(one_sample(valid, sample_mean), 2)})",
        f"- chat and Responses, greedy, seed 7: the same text {int(sum(same))} of {len(same)}",
        *(
            f"- stop {stop['stop']!r}: cut where it appears: {stop['cut_where_it_appears']}"
            for stop in stops
        ),
        *(
            f"- n=3: {len(three['choices'])} choices, one retrieval "
            f"({three['timings_ms']['retrieve']:.0f} ms) and one compression "
            f"({three['timings_ms']['compress']:.0f} ms)"
            for three in threes
        ),
        *(f"- a phase failed: {error}" for error in failed),
        f"- clients: {sum(r['ok'] for r in client_rows)} of {len(client_rows)} calls succeeded"
        + "".join(f"; {r['call']} failed" for r in client_rows if not r["ok"]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--same-answer", type=positive_int, default=5)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = utc_now()
    records = Records(args.out / "records.jsonl")
    with keyed_service(args.out, "make-run", []) as (service, key):
        model = _shipped_reader()["model_id"]
        client: Any = openai.OpenAI(
            base_url=f"{service.base_url}/v1", api_key=key, timeout=600, max_retries=0
        )
        phases: list[Callable[[], None]] = [
            lambda: structured(client, model, records),
            lambda: same_answer(client, model, args.same_answer, records),
            lambda: stop_and_n(client, model, records),
            lambda: clients(service.base_url, key, model, records),
        ]
        for phase in phases:
            try:
                phase()
            except openai.APIError as exc:  # the next phase still runs; the report says
                logger.error("a phase failed: %r", exc)
                records.append({"check": "phase_failed", "error": repr(exc)[:300]})
    text = report(records)
    document = {
        "command": "python -m bench.openai_clients " + " ".join(argv or []),
        "machine": machine(), "started": started, "ended": utc_now(), "reader": model,
        "records": list(records),
    }  # fmt: skip
    (args.out / "records.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    (args.out / "report.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


def _shipped_reader() -> dict[str, Any]:
    import yaml

    config = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
    return dict(config["applications"][0]["args"]["generator"])


if __name__ == "__main__":
    raise SystemExit(main())
