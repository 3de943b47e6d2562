"""The null engine alone behind a minimal OpenAI chat endpoint: the baseline bench.overhead
compares the serving chain against.

    python -m bench.paced_server --port 8100 --ttft-ms 50 --tpot-ms 5

POST /v1/chat/completions with `stream: true` answers OpenAI chunks (`data: {...}`, then a
usage chunk and `data: [DONE]`) from the same `generation.paced_engine.PacedEngine` the
chain's paced generator runs; GET /health answers 200. Like vLLM's own server: FastAPI,
uvicorn, pre-encoded `data:` lines.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from generation.paced_engine import PacedEngine
from pipeline.messages import FinishEvent, GenerationRequest, TokenEvent


def create_app(engine: PacedEngine) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        generation = GenerationRequest(
            messages=body["messages"],
            max_tokens=int(body.get("max_tokens") or 16),
            temperature=float(body.get("temperature") or 0.0),
            request_id=uuid.uuid4().hex,
        )
        return StreamingResponse(
            _chunks(engine, generation, body.get("model", "paced")),
            media_type="text/event-stream",
        )

    return app


async def _chunks(
    engine: PacedEngine, request: GenerationRequest, model: str
) -> AsyncIterator[str]:
    chunk_id, created = f"chatcmpl-{request.request_id}", int(time.time())

    def line(choices: list, **extra) -> str:
        body = {
            "id": chunk_id, "object": "chat.completion.chunk", "created": created,
            "model": model, "choices": choices, **extra,
        }  # fmt: skip
        return f"data: {json.dumps(body)}\n\n"

    yield line([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    async for event in engine.stream(request):
        if isinstance(event, TokenEvent):
            yield line([{"index": 0, "delta": {"content": event.text}, "finish_reason": None}])
        elif isinstance(event, FinishEvent):
            yield line([{"index": 0, "delta": {}, "finish_reason": event.reason}])
            usage = event.usage
            yield line(
                [],
                usage={
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                },
            )
    yield "data: [DONE]\n\n"


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m bench.paced_server", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--tpot-ms", type=float, default=5.0)
    args = parser.parse_args()
    app = create_app(PacedEngine(args.ttft_ms, args.tpot_ms))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
