"""bench.overhead's pure parts: TPOT, a load point's summary, the paired chain-minus-alone
comparison, the request specs of both sides, the report, and the admission micro-benchmark
(run in-process). The phases that start services are not run."""

from __future__ import annotations

import functools

import pytest

from bench import bootstrap, overhead
from bench.loadgen import RequestRecord, request_body
from bench.overhead import Point, compare, tpot


def rec(index: int = 0, *, ok: bool = True, ttft=None, e2e=None, tokens: int = 0, **fields):
    return RequestRecord(
        index, "chat", f"q{index}", ok=ok, ttft_ms=ttft, e2e_ms=e2e, output_tokens=tokens,
        **fields,
    )  # fmt: skip


# --- tpot ---------------------------------------------------------------------------------


def test_tpot_is_the_time_after_the_first_token_per_further_token():
    assert tpot(rec(ttft=10.0, e2e=73.0, tokens=64)) == 1.0
    assert tpot(rec(ttft=50.0, e2e=60.0, tokens=2)) == 10.0


@pytest.mark.parametrize(
    "record",
    [
        rec(ttft=10.0, e2e=20.0, tokens=1),  # one token: no TPOT
        rec(ttft=10.0, e2e=20.0, tokens=0),
        rec(ttft=None, e2e=20.0, tokens=8),
        rec(ttft=10.0, e2e=None, tokens=8),
    ],
)
def test_tpot_is_undefined_without_two_tokens_and_both_times(record):
    assert tpot(record) is None


# --- Point.summary ------------------------------------------------------------------------


def test_point_summary():
    timings = {"retrieve": 2.0, "compress": 3.0, "queue": 1.0, "network": 0.5, "ttft": 12.0}
    point = Point(
        "chain",
        8,
        [
            rec(0, ttft=10.0, e2e=73.0, tokens=64, server_timings_ms=timings),
            rec(1, ttft=20.0, e2e=146.0, tokens=64),
            rec(2, ok=False, ttft=1.0, e2e=500.0, tokens=3),  # failed: left out of figures
        ],
        cpu_s=0.3,
        wall_s=2.0,
    )

    summary = point.summary()

    assert summary["side"] == "chain" and summary["concurrency"] == 8
    assert (summary["n"], summary["succeeded"]) == (3, 2)
    assert summary["ttft_ms_p50"] == 15.0
    assert summary["ttft_ms_p99"] == pytest.approx(19.9)
    assert summary["tpot_ms_p50"] == 1.5  # TPOTs 1 and 2
    assert summary["tokens_per_s"] == 64.0  # 128 tokens of the successes in 2 s
    assert summary["cpu_ms_per_request"] == pytest.approx(100.0)  # 300 ms over 3 requests
    assert summary["server_ms_p50"] == timings  # the one request that reported them
    assert [r.index for r in point.ok()] == [0, 1]


def test_point_summary_of_no_successes():
    summary = Point("alone", 1, [rec(ok=False)], cpu_s=0.0, wall_s=0.0).summary()

    assert summary["succeeded"] == 0
    assert summary["ttft_ms_p50"] is None and summary["ttft_ms_p99"] is None
    assert summary["tpot_ms_p50"] is None
    assert summary["tokens_per_s"] is None
    assert summary["server_ms_p50"] == dict.fromkeys(
        ("retrieve", "compress", "queue", "network", "ttft")
    )
    assert Point("alone", 1, [], 1.0, 1.0).summary()["cpu_ms_per_request"] == 1000.0


# --- compare ------------------------------------------------------------------------------


def paired_points() -> tuple[Point, Point]:
    """The chain: TTFT 20 ms and TPOT 1 ms more than alone on every request; request 4 failed
    on the chain side, request 5 has one token only on both."""
    chain, alone = [], []
    for i, base in enumerate([10.0, 20.0, 30.0, 40.0, 50.0]):
        chain.append(rec(i, ok=i != 4, ttft=base + 20, e2e=base + 20 + 63 * 2.0, tokens=64))
        alone.append(rec(i, ttft=base, e2e=base + 63 * 1.0, tokens=64))
    chain.append(rec(5, ttft=110.0, e2e=111.0, tokens=1))
    alone.append(rec(5, ttft=90.0, e2e=91.0, tokens=1))
    return Point("chain", 4, chain, 1.0, 4.0), Point("alone", 4, alone, 0.5, 2.0)


def test_compare_pairs_by_index_and_reports_differences_and_ratios():
    chain, alone = paired_points()

    result = compare(chain, alone, seed=0)

    assert result["pairs"] == 5  # request 4 is not a pair: its chain side failed
    assert result["ttft_ms_added"] == [20.0, 20.0, 20.0]  # the same 20 ms every time
    assert result["tpot_ms_added"] == [1.0, 1.0, 1.0]  # pairs with one token left out
    assert result["tpot_ms_ratio"] == [2.0, 2.0, 2.0]
    # TTFT chain 30, 40, 50, 60, 110 against alone 10, 20, 30, 40, 90: medians 50 / 30.
    estimate, low, high = result["ttft_ms_ratio"]
    assert estimate == pytest.approx(50 / 30)
    assert low <= estimate <= high
    # Tokens per second: chain 4 x 64 + 1 over 4 s, alone 5 x 64 + 1 over 2 s.
    assert result["throughput_share"] == pytest.approx((257 / 4) / (321 / 2))


def test_compare_is_reproducible_with_a_seed(monkeypatch):
    # Fewer draws than the 2,000 of a report: the seed matters the same way.
    for name in ("paired_ci", "ratio_ci"):
        monkeypatch.setattr(
            bootstrap, name, functools.partial(getattr(bootstrap, name), resamples=200)
        )
    jitter = [rec(i, ttft=30.0 + (i * 7) % 11, e2e=200.0, tokens=8) for i in range(20)]
    base = [rec(i, ttft=10.0 + (i * 5) % 13, e2e=150.0, tokens=8) for i in range(20)]
    chain, alone = Point("chain", 1, jitter, 1, 1), Point("alone", 1, base, 1, 1)

    assert compare(chain, alone, seed=1) == compare(chain, alone, seed=1)
    assert compare(chain, alone, seed=1) != compare(chain, alone, seed=2)


def test_compare_needs_two_pairs_for_an_interval():
    chain = Point("chain", 1, [rec(0, ttft=30.0, e2e=100.0, tokens=8)], 1.0, 1.0)
    alone = Point("alone", 1, [rec(0, ttft=10.0, e2e=80.0, tokens=8)], 1.0, 1.0)

    result = compare(chain, alone, seed=0)

    assert result == {"pairs": 1, "throughput_share": 1.0}


def test_compare_without_throughput_on_one_side_leaves_the_share_out():
    chain = Point("chain", 1, [rec(0, ok=False)], 1.0, 1.0)
    alone = Point("alone", 1, [rec(0, ttft=10.0, e2e=80.0, tokens=8)], 1.0, 1.0)
    assert compare(chain, alone, seed=0) == {"pairs": 0}


def test_compare_refuses_sides_of_different_lengths():
    chain = Point("chain", 1, [rec(0), rec(1)], 1.0, 1.0)
    alone = Point("alone", 1, [rec(0)], 1.0, 1.0)
    with pytest.raises(ValueError):
        compare(chain, alone, seed=0)


# --- specs --------------------------------------------------------------------------------


def test_chat_specs():
    count = len(overhead.QUESTIONS)
    specs = overhead.chat_specs(count, 64, "smollm2-135m-instruct", offset=5)

    assert len(specs) == count
    assert specs[0].question == f"{overhead.QUESTIONS[5]} (#5)"
    wrap = count - 5
    assert specs[wrap].question == f"{overhead.QUESTIONS[0]} (#{5 + wrap})"  # they cycle
    assert len({spec.question for spec in specs}) == count
    for spec in specs:
        assert (spec.endpoint, spec.max_tokens, spec.model) == ("chat", 64, "smollm2-135m-instruct")
        assert spec.temperature == 0.0 and spec.messages is None


def test_direct_specs_send_the_same_question_as_plain_messages():
    chain = overhead.chat_specs(3, 32, "smollm2-135m-instruct")

    direct = overhead.direct_specs(chain, "paced")

    assert [spec.question for spec in direct] == [spec.question for spec in chain]
    for spec, original in zip(direct, chain, strict=True):
        body = request_body(spec)
        assert body["model"] == "paced"
        assert body["messages"] == [{"role": "user", "content": original.question}]
        assert body["max_tokens"] == 32 and body["temperature"] == 0.0
        assert "rag" not in body
    assert overhead.direct_specs([], "paced") == []


# --- markdown -----------------------------------------------------------------------------


def side(**fields) -> dict:
    base = {
        "ttft_ms_p50": 60.4, "ttft_ms_p99": 90.0, "tpot_ms_p50": 5.123, "tokens_per_s": 1200.0,
        "cpu_ms_per_request": 12.34, "n": 30,
        "server_ms_p50": {"retrieve": 1.5, "compress": 2.25, "queue": 0.5, "network": 1.0,
                          "ttft": 52.0},
    }  # fmt: skip
    return base | fields


RESULTS = {
    "date": "2025-01-02 03:04 UTC",
    "paced": [
        {
            "tpot_ms": 5.0,
            "concurrency": 8,
            "chain": side(),
            "alone": side(ttft_ms_p50=50.2, tpot_ms_p50=5.01, cpu_ms_per_request=3.0),
            "added": {
                "pairs": 30,
                "ttft_ms_added": [10.21, 9.5, 11.75],
                "tpot_ms_added": [0.113, 0.05, 0.2],
                "throughput_share": 0.934,
            },
        },
        {
            "tpot_ms": 50.0,
            "concurrency": 64,
            "chain": side(server_ms_p50={"retrieve": 1.0, "compress": None}),
            "alone": side(ttft_ms_p50=None),
            "added": {"pairs": 1},
        },
    ],
    "interval": [
        {"interval_ms": 0.0, "concurrency": 1, **side()},
        {"interval_ms": 10.0, "concurrency": 64, **side(n=128, tokens_per_s=12345.67)},
    ],
    "vllm": {
        "max_tokens": 32,
        "rows": [
            {
                "concurrency": 1,
                "chain": side(),
                "alone": side(ttft_ms_p50=55.0),
                "added": {
                    "pairs": 30,
                    "ttft_ms_ratio": [1.0981, 1.05, 1.15],
                    "tpot_ms_ratio": [1.0021, 0.99, 1.01],
                },
                "prompt_tokens_equal": 29,
                "prompts": 30,
            }
        ],
    },
    "micro": {"bare_asgi_call_us": 7.05, "guard_us": 9.02, "gate_enter_leave_us": 0.24},
}


def rows_after(text: str, header_start: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_markdown_tables_of_every_part():
    text = overhead.markdown(RESULTS, "python -m bench.overhead --requests 30")

    assert text.startswith(
        "Measured with `python -m bench.overhead --requests 30` on 2025-01-02 03:04 UTC."
    )
    assert rows_after(text, "| TPOT | C | n |") == [
        "| 5 ms | 8 | 30 | 60.4 / 50.2 | 10.2 [9.5, 11.8] | 5.12 / 5.01 | 0.11 [0.05, 0.20] "
        "| 93% | 12.3 / 3.0 | 3.8 | 1.5 |",
        "| 50 ms | 64 | 1 | 60.4 / - | - | 5.12 / 5.12 | - | - | 12.3 / 12.3 | - | - |",
    ]
    assert rows_after(text, "| interval | C | n |") == [
        "| 0 ms | 1 | 30 | 60.4 | 5.12 | 1,200.0 | 12.3 |",
        "| 10 ms | 64 | 128 | 60.4 | 5.12 | 12,345.7 | 12.3 |",
    ]
    assert "max_tokens 32;" in text
    assert rows_after(text, "| C | n | same prompt tokens |") == [
        "| 1 | 30 | 29/30 | 60.4 / 55.0 | 1.098 [1.050, 1.150] | 5.1 / 5.1 "
        "| 1.002 [0.990, 1.010] | 3.8 |"
    ]
    assert (
        "**The admission path, per call** (in-process, p50 of 2,000 calls): "
        "bare_asgi_call 7.0 µs, guard 9.0 µs, gate_enter_leave 0.2 µs" in text
    )


def test_markdown_has_only_the_parts_that_ran():
    text = overhead.markdown({"date": "d", "micro": RESULTS["micro"]}, "cmd")

    assert "**The admission path" in text
    assert "| TPOT |" not in text and "| interval |" not in text and "| C | n |" not in text
    assert overhead.markdown({"date": "d"}, "cmd") == "Measured with `cmd` on d.\n"


# --- run_micro ----------------------------------------------------------------------------


def test_run_micro_times_each_part_of_the_admitted_path(monkeypatch):
    import app.guard

    refusals = []
    refusal = app.guard._refusal

    def recorded(state, scope):
        refusals.append(refusal(state, scope))
        return refusals[-1]

    monkeypatch.setattr(app.guard, "_refusal", recorded)

    result = overhead.run_micro(repeats=50)

    assert set(result) == {"bare_asgi_call_us", "guard_us", "body_limit_us", "gate_enter_leave_us"}
    assert all(isinstance(value, float) and 0 < value < 10_000 for value in result.values())
    # Every guarded call was let through (the key and the rate limit pass): the figure is
    # the cost of the admitted path, not of a refusal.
    assert len(refusals) == 50
    assert refusals == [None] * 50


def test_the_final_prompt_is_rebuilt_from_what_the_chain_reported():
    record = rec(
        3,
        passages=[("awq#1", "AWQ and GPTQ", "AWQ keeps salient weights."), ("q#0", "Q", "x")],
        usage_prompt_tokens=420,
    )
    record.question = "  What is AWQ? (#3) "

    messages, tokens = overhead.final_prompt(record, "SYSTEM")

    assert tokens == 420
    assert messages[0] == {"role": "system", "content": "SYSTEM"}
    user = messages[1]["content"]
    assert user.index('<source id="awq#1" title="AWQ and GPTQ">') < user.index('id="q#0"')
    assert "AWQ keeps salient weights." in user
    assert user.endswith("Question: What is AWQ? (#3)")


def test_a_request_that_reported_no_context_cannot_be_replayed():
    with pytest.raises(RuntimeError, match="no context"):
        overhead.final_prompt(rec(1, ok=False, error="boom"), "SYSTEM")


def test_include_context_asks_the_chat_endpoint_for_the_passages():
    [spec] = overhead.chat_specs(1, 8, "m", include_context=True)

    assert request_body(spec)["rag"] == {"include_context": True}
    assert "rag" not in request_body(overhead.chat_specs(1, 8, "m")[0])
