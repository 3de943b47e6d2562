"""Hand-made load-generator records for the tests of bench.direct's comparison and report."""

from __future__ import annotations

from bench.loadgen import RequestRecord


def rec(
    index: int,
    *,
    ttft: float | None = 100.0,
    e2e: float = 1100.0,
    tokens: int = 11,
    ok: bool = True,
    timings: dict[str, float] | None = None,
    prompt: int | None = 900,
    cached: int | None = 256,
    endpoint: str = "rag",
) -> RequestRecord:
    """A finished request, sent at 0 ms; TPOT is (e2e - ttft) / (tokens - 1)."""
    return RequestRecord(
        index,
        endpoint,
        f"question {index}",
        send_at_ms=0.0,
        end_at_ms=e2e,
        ttft_ms=ttft if ok else None,
        e2e_ms=e2e,
        output_tokens=tokens,
        usage_completion_tokens=tokens if ok else None,
        usage_prompt_tokens=prompt if ok else None,
        usage_cached_prompt_tokens=cached if ok else None,
        ok=ok,
        status=200 if ok else 503,
        error_kind=None if ok else "http_503",
        server_timings_ms=timings,
    )
