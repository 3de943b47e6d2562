"""Per-stage latency of single queries against a running service, by compression method.

    python -m scripts.stage_costs --url http://127.0.0.1:8000 --repeats 5

Sends each question once per method, one request at a time, and prints the median of the
timings the service reports (retrieve, compress, TTFT, total, TPOT) and the context tokens
before and after compression. One warm-up request is sent first and not counted.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

import httpx

QUESTIONS = (
    "Why is only a full KV block cached by the prefix cache?",
    "What is the difference between static and continuous batching?",
    "How does speculative decoding with a draft model work?",
    "What does AWQ quantize and why does it speed up decoding?",
    "How is time per output token measured?",
)
METHODS = ("none", "sentences", "llmlingua")


def measure(url: str, api_key: str | None, repeats: int, max_tokens: int) -> dict[str, dict]:
    """Median figures per compression method."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    results: dict[str, dict] = {}
    with httpx.Client(base_url=url, headers=headers, timeout=600) as client:
        _query(client, QUESTIONS[0], "none", max_tokens)
        for method in METHODS:
            samples = [
                _query(client, question, method, max_tokens) for question in QUESTIONS[:repeats]
            ]
            results[method] = {
                key: statistics.median(s[key] for s in samples if s[key] is not None)
                for key in samples[0]
            }
    return results


def _query(client: httpx.Client, question: str, method: str, max_tokens: int) -> dict:
    response = client.post(
        "/v1/rag/query",
        json={
            "question": question,
            "max_tokens": max_tokens,
            "compression": {"method": method, "policy": "always"},
        },
    )
    response.raise_for_status()
    body = response.json()
    return {
        **body["timings_ms"],
        "tpot": body["tpot_ms"],
        "tokens_before": body["usage"]["context_tokens_before"],
        "tokens_after": body["usage"]["context_tokens_after"],
        "prompt_tokens": body["usage"]["prompt_tokens"],
        "cached_tokens": body["usage"]["cached_prompt_tokens"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--repeats", type=int, default=5, choices=range(1, len(QUESTIONS) + 1))
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    results = measure(args.url, args.api_key, args.repeats, args.max_tokens)
    columns = list(next(iter(results.values())))
    print("| method | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for method, figures in results.items():
        print(f"| {method} | " + " | ".join(f"{figures[c]:.0f}" for c in columns) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
