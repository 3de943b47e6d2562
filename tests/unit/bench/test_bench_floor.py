"""The floor lab's arithmetic: the line through the engine's times and each request's ratio."""

from __future__ import annotations

import pytest

from bench.floor import NEW_TOKENS, drawn_lengths, floor_ms, prefill_rates, report


def test_rates_are_medians_per_length_and_the_floor_interpolates_them() -> None:
    rows = [{"uncached_tokens": 256, "ttft_ms": ms} for ms in (500.0, 512.0, 640.0)]
    rows += [{"uncached_tokens": 1024, "ttft_ms": 4096.0}]
    rates = prefill_rates(rows)
    assert rates == {256: pytest.approx(500.0), 1024: pytest.approx(250.0)}
    assert floor_ms(rates, 256) == pytest.approx(512)
    assert floor_ms(rates, 640) == pytest.approx(640 / 375 * 1000)  # halfway: 375 tokens/s
    assert floor_ms(rates, 128) == pytest.approx(256)  # below the lengths: the first rate
    assert floor_ms(rates, 2048) == pytest.approx(8192)  # above: the last


def test_drawn_lengths_are_every_length_repeated_in_a_seeded_order() -> None:
    lengths = drawn_lengths(3, seed=0)
    assert sorted(lengths) == sorted(NEW_TOKENS * 3)
    assert lengths == drawn_lengths(3, seed=0)
    assert lengths != sorted(lengths)


def test_report_divides_each_ttft_by_the_floor_of_its_uncached_tokens() -> None:
    rates = {256: 800.0, 1024: 800.0}
    assert floor_ms(rates, 400) == 500
    # 656 − 256 = 400 uncached → floor 500 ms; TTFTs 600 and 750 → ratios 1.2 and 1.5.
    results = [
        {"ttft_ms": 600.0, "prompt_tokens": 656, "cached_prompt_tokens": 256},
        {"ttft_ms": 750.0, "prompt_tokens": 656, "cached_prompt_tokens": 256},
        {"ttft_ms": None, "prompt_tokens": 656, "cached_prompt_tokens": 256},  # failed: left out
    ]
    engine = {
        "rates": {"256": 800.0, "1024": 800.0},  # as JSON keeps them
        "rows": [{"uncached_tokens": 256, "tpot_ms": ms} for ms in (100.0, 100.0, 100.0)],
    }
    for r in results:
        r["tpot_ms"] = 120.0
    text, data = report(engine, {"run": {"results": results}})
    assert data["run"]["n"] == 2
    assert data["run"]["floor_ms_p50"]["estimate"] == pytest.approx(500)
    assert 1.2 <= data["run"]["ttft_over_floor"]["estimate"] <= 1.5
    assert "TTFT / floor" in text
    assert data["run"]["tpot_over_engine"]["estimate"] == pytest.approx(1.2)
    assert data["run"]["engine_tpot_length"] == 256
