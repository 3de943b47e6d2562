"""What the conversation and citation labs share (bench.conversation, bench.citations).

- `require_loopback`: the labs talk only to a service on this machine.
- `post_query`: one POST /v1/rag/query with a timeout; a failure is recorded, never raised
  or retried.
- `squad_service`: serve_config.yaml with `retriever.index_path` on the SQuAD index
  (`python -m bench.quality prepare` builds it), started and stopped by harness.service, the
  way bench.suite starts its variants.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from app.schemas import RagQueryResponse
from bench import quality
from harness.service import ROOT, free_port, running_service
from harness.variant import write_variant

QUERY_PATH = "/v1/rag/query"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_ERROR_TEXT_CHARS = 500


class LabError(RuntimeError):
    """A lab cannot go on (bad input file, a non-loopback URL, the wrong index served)."""


def require_loopback(url: str) -> str:
    """`url` unchanged if it is http(s) on a loopback host, else LabError."""
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or parts.hostname not in LOOPBACK_HOSTS:
        raise LabError(f"{url!r}: the labs only query a service on loopback (127.0.0.1)")
    return url


def auth_headers(api_key: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Bearer {api_key}"} if api_key else None


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


def error_text(response: httpx.Response) -> str:
    """The OpenAI-shaped error's message, else the start of the body."""
    try:
        message = response.json()["error"]["message"]
        if isinstance(message, str):
            return message[:_ERROR_TEXT_CHARS]
    except (ValueError, KeyError, TypeError):
        pass
    return response.text[:_ERROR_TEXT_CHARS]


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


# --- the service -----------------------------------------------------------------------------


@contextmanager
def squad_service(
    base_config: Path,
    out_dir: Path,
    name: str,
    index_dir: Path = quality.DEFAULT_INDEX_DIR,
    overrides: Mapping[str, object] | None = None,
) -> Iterator[str]:
    """Start `base_config` serving the SQuAD index on a free loopback port (the variant and
    its log go to `out_dir/<name>.serve.{yaml,log}`), yield its base URL, stop it on exit.
    LabError before anything starts when the index is missing."""
    index_on_disk = index_dir if index_dir.is_absolute() else ROOT / index_dir
    if not quality.index_is_built(index_on_disk):
        raise LabError(f"no index at {index_on_disk}; run `python -m bench.quality prepare`")
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = write_variant(
        base_config,
        {"retriever.index_path": str(index_dir), **(overrides or {})},
        out_dir / f"{name}.serve.yaml",
        port,
    )
    with running_service(config, port, out_dir / f"{name}.serve.log") as url:
        yield url
