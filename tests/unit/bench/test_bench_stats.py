"""bench.stats' figures against known values. Its summaries of load-generator records are
tested with the load generator, in test_bench_latency."""

from __future__ import annotations

import math
import random

import pytest

from bench.stats import (
    format_ms,
    mean,
    median,
    per_s,
    percentile,
    percentile_or_none,
    tpot,
)


def documented_percentile(values: list[float], q: float) -> float:
    """The definition in bench.stats' docstring, written out: h = (n - 1) * q / 100, then
    v[floor(h)] + (h - floor(h)) * (v[floor(h) + 1] - v[floor(h)]) over the sorted values."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


def test_percentile_known_values():
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]  # sorted 1 1 2 3 4 5 6 9, n - 1 = 7
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 3.5  # rank 3.5: 3 + 0.5 * 1
    assert percentile(values, 75) == pytest.approx(5.25)  # rank 5.25: 5 + 0.25 * 1
    assert percentile(values, 90) == pytest.approx(6.9)  # rank 6.3: 6 + 0.3 * 3
    assert percentile(values, 100) == 9.0
    assert percentile([2, 4], 25) == 2.5 and isinstance(percentile([2, 4], 25), float)
    assert percentile((7.0,), 37) == 7.0


def test_percentile_follows_its_documented_definition():
    rng = random.Random(0)
    for _ in range(300):
        values = [rng.uniform(0, 5000) for _ in range(rng.randint(1, 40))]
        for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
            expected = documented_percentile(values, q)
            assert percentile(values, q) == pytest.approx(expected, rel=1e-12, abs=1e-9)


def test_percentile_refuses_no_values_and_a_q_out_of_range():
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    for q in (-1, 100.5):
        with pytest.raises(ValueError, match=r"\[0, 100\]"):
            percentile([1.0], q)


def test_percentile_or_none():
    assert percentile_or_none([], 99) is None  # chaos reports: no refusals, no figure
    assert percentile_or_none([1.0, 2.0, 3.0], 50) == 2.0
    assert percentile_or_none([10.0, 20.0], 50) == 15.0


def test_median_and_mean_skip_missing_values():
    assert median([4, None, 1, 3, None, 2]) == 2.5
    assert median([None, 7]) == 7.0
    assert median([]) is None and median([None]) is None
    assert mean([1, None, 2, 4]) == pytest.approx(7 / 3)
    assert mean([0.1] * 10) == 0.1  # an exact sum (1.0), not 0.9999999999999999
    assert mean([]) is None and mean([None, None]) is None


def test_rates_and_time_per_output_token():
    assert per_s(9, 1.5) == 6.0
    assert per_s(9, 0.0) == 0.0
    assert tpot(100.0, 1100.0, 11) == 100.0
    assert tpot(100.0, 1100.0, 2) == 1000.0
    assert tpot(100.0, 100.0, 1) is None and tpot(100.0, 100.0, 0) is None


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "-"), (0.0, "0.0"), (12.345, "12.3"), (-99.94, "-99.9"), (100.0, "100"),
     (1234.5, "1,234"), (-250.0, "-250")],
)  # fmt: skip
def test_format_ms_keeps_a_decimal_only_below_100(value, text):
    assert format_ms(value) == text
