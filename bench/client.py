"""The lab's one blocking HTTP client for the service (streaming load is bench.loadgen's).

- `with_client`: run with a given client, or with one of its own for a URL (no proxies
  from the environment: the labs talk to this machine only).
- `check_ready`: GET /readyz, or why the service is not ready.
- `post_query`: one POST /v1/rag/query with a timeout; a failure is recorded as the
  outcome's `error` (the service's own message when it sent one), never raised or retried.
- `warm_up`: the first requests after a start, which pay kernel warm-up (tens of seconds
  on CPU) and must not be timed.
- `burst`: many requests at once, each on a connection of its own (the refusal and upload
  floods); `ready_replicas`: the running replicas per stage a /readyz answer reports.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import ValidationError

from app.schemas import RagQueryResponse

T = TypeVar("T")

QUERY_PATH = "/v1/rag/query"
READY_PATH = "/readyz"
WARM_UP_QUESTIONS = ("What is a KV cache?",)
WARM_UP_TIMEOUT_S = 600.0
_ERROR_TEXT_CHARS = 500


def auth_headers(api_key: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Bearer {api_key}"} if api_key else None


def with_client(
    url: str, timeout_s: float, client: httpx.Client | None, run: Callable[[httpx.Client], T]
) -> T:
    """`run(client)`, or `run` with a client of its own for `url` (closed after)."""
    if client is not None:
        return run(client)
    with httpx.Client(base_url=url, timeout=timeout_s, trust_env=False) as own_client:
        return run(own_client)


def openai_error(body: str | bytes) -> dict[str, Any] | None:
    """The `error` object of an OpenAI-shaped error body; None for any other body."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, dict) else None


def error_text(response: httpx.Response) -> str:
    """The OpenAI-shaped error's message, else the start of the body."""
    message = (openai_error(response.content) or {}).get("message")
    return (message if isinstance(message, str) else response.text)[:_ERROR_TEXT_CHARS]


def check_ready(client: httpx.Client, timeout_s: float) -> str | None:
    """None when GET /readyz answers 200, else why not."""
    try:
        response = client.get(READY_PATH, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"service not reachable: {type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return (
            f"service not ready: {READY_PATH} answered HTTP {response.status_code}: "
            f"{response.text[:_ERROR_TEXT_CHARS]}"
        )
    return None


@dataclass(frozen=True)
class QueryOutcome:
    """One request: the parsed reply, or why there is none."""

    status_code: int | None
    client_ms: float
    reply: RagQueryResponse | None = None
    error: str | None = None


def post_query(
    client: httpx.Client,
    body: Mapping[str, Any],
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> QueryOutcome:
    """POST `body` to /v1/rag/query once. A transport error, a non-200 status or a body that
    is not a RagQueryResponse comes back as `error` (with the service's message)."""
    started = time.perf_counter()
    try:
        response = client.post(
            QUERY_PATH, json=dict(body), headers=dict(headers or {}), timeout=timeout_s
        )
    except httpx.HTTPError as exc:
        return QueryOutcome(None, _ms_since(started), error=f"{type(exc).__name__}: {exc}")
    client_ms = _ms_since(started)
    if response.status_code != 200:
        return QueryOutcome(
            response.status_code,
            client_ms,
            error=f"HTTP {response.status_code}: {error_text(response)}",
        )
    try:
        reply = RagQueryResponse.model_validate_json(response.content)
    except ValidationError as exc:
        first = exc.errors()[0]
        return QueryOutcome(
            200,
            client_ms,
            error=f"malformed response: {exc.error_count()} problems, first {first['loc']}: "
            f"{first['msg']}",
        )
    return QueryOutcome(200, client_ms, reply=reply)


def warm_up(
    url: str,
    questions: Iterable[str] = WARM_UP_QUESTIONS,
    max_tokens: int = 4,
    timeout_s: float = WARM_UP_TIMEOUT_S,
    strict: bool = True,
    api_key: str | None = None,
) -> None:
    """One short request per question (with `api_key` when the service requires keys).
    Strict: an error status raises; otherwise it is the caller's next requests that tell
    (the chaos runs warm up services they then break). A 503 is retried after its
    Retry-After until `timeout_s` has passed: with several ingress replicas, /readyz may
    answer from one whose stages are known while the next request reaches another that has
    not refreshed its view yet."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=timeout_s, trust_env=False) as client:
        for question in questions:
            body = {"question": question, "max_tokens": max_tokens}
            while True:
                response = client.post(QUERY_PATH, json=body, headers=auth_headers(api_key))
                if response.status_code != 503 or time.monotonic() >= deadline:
                    break
                time.sleep(_retry_after_s(response))
            if strict:
                response.raise_for_status()


async def burst(
    url: str, count: int, timeout_s: float, send: Callable[[httpx.AsyncClient, int], Awaitable[T]]
) -> list[T]:
    """`send(client, i)` for i in range(count), all at once, on one client that opens a
    connection per request and keeps none alive, as `count` separate clients would."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=url, timeout=timeout_s, limits=limits, trust_env=False
    ) as client:
        return list(await asyncio.gather(*(send(client, i) for i in range(count))))


def ready_replicas(response: httpx.Response) -> dict[str, int]:
    """The running replicas per stage of a /readyz answer; {} when it has none (or is not
    JSON: ValueError)."""
    body = response.json()
    replicas = body.get("replicas", {}) if isinstance(body, dict) else {}
    return replicas if isinstance(replicas, dict) else {}


def _retry_after_s(response: httpx.Response, default_s: float = 1.0) -> float:
    try:
        return min(10.0, max(0.1, float(response.headers.get("retry-after", default_s))))
    except ValueError:
        return default_s


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)
