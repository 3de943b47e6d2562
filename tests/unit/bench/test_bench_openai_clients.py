"""bench.openai_clients' report: what each check's records add up to."""

from __future__ import annotations

from bench.openai_clients import report


def test_the_report_counts_each_check():
    records = [
        {"check": "json_schema", "valid": True},
        {"check": "json_schema", "valid": False},
        {"check": "same_answer", "same": True},
        {"check": "stop", "stop": " KV", "cut_where_it_appears": True},
        {
            "check": "n",
            "choices": ["a", "b", "c"],
            "timings_ms": {"retrieve": 12.0, "compress": 3.0},
        },
        {"check": "client", "call": "langchain invoke", "ok": True},
        {"check": "client", "call": "llamaindex chat", "ok": False},
    ]

    text = report(records)

    assert "valid: 1 of 2" in text
    assert "the same text 1 of 1" in text
    assert "cut where it appears: True" in text
    assert "n=3: 3 choices, one retrieval (12 ms) and one compression (3 ms)" in text
    assert "1 of 2 calls succeeded; llamaindex chat failed" in text
