"""Generator stage: Ray Serve LLM's `LLMServer` (vLLM) plus one plain-data method.

`generate` builds the OpenAI request inside the replica and yields plain dicts, so the
ingress never imports vLLM (about 700 MB and 8 s per process) to talk to it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from ray.serve.llm import LLMServer


class GeneratorServer(LLMServer):
    async def generate(
        self, messages: list[dict[str, str]], max_tokens: int, temperature: float
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream one chat completion as events.

        Yields {"type": "token", "text"}, then {"type": "finish", "reason"} and
        {"type": "usage", "prompt_tokens", "completion_tokens", "cached_tokens"};
        or {"type": "error", "status", "message", "error_type"} when vLLM refuses the request.
        """
        from ray.serve.llm.openai_api_models import ChatCompletionRequest

        request = ChatCompletionRequest(
            model=self._llm_config.model_id,
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=True,
            stream_options={"include_usage": True},
        )
        stream = await self.chat(request)
        async for batch in stream:
            for item in batch if isinstance(batch, list) else [batch]:
                for event in _events_of(item):
                    yield event


def _events_of(item: Any) -> list[dict[str, Any]]:
    if not isinstance(item, str):
        error = getattr(item, "error", None)
        if error is None:
            return [{"type": "error", "status": 500, "message": "unexpected engine output"}]
        return [
            {
                "type": "error",
                "status": int(getattr(error, "code", 500) or 500),
                "message": str(getattr(error, "message", "generation failed")),
                "error_type": str(getattr(error, "type", "server_error")),
            }
        ]
    events: list[dict[str, Any]] = []
    for line in item.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        events.extend(_events_of_chunk(json.loads(line.removeprefix("data: "))))
    return events


def _events_of_chunk(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    if "error" in chunk:
        error = chunk["error"]
        return [
            {
                "type": "error",
                "status": int(error.get("code") or 500),
                "message": str(error.get("message", "generation failed")),
                "error_type": str(error.get("type", "server_error")),
            }
        ]
    events: list[dict[str, Any]] = []
    for choice in chunk.get("choices") or []:
        text = (choice.get("delta") or {}).get("content")
        if text:
            events.append({"type": "token", "text": text})
        if choice.get("finish_reason"):
            events.append({"type": "finish", "reason": choice["finish_reason"]})
    usage = chunk.get("usage")
    if usage:
        details = usage.get("prompt_tokens_details") or {}
        events.append(
            {
                "type": "usage",
                "prompt_tokens": int(usage.get("prompt_tokens") or 0),
                "completion_tokens": int(usage.get("completion_tokens") or 0),
                "cached_tokens": int(details.get("cached_tokens") or 0),
            }
        )
    return events
