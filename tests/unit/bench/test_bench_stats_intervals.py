"""bench.stats' intervals: the estimate is the statistic on the data, the interval around it comes
from seeded resamples, and a clear difference is told apart from none."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.stats import (
    NO_DIFFERENCE,
    Interval,
    clustered_share,
    difference_verdict,
    fmt_interval,
    fmt_ratio,
    independent_ratio,
    one_sample,
    paired_ci,
    paired_difference,
    paired_ratio,
    quantile,
    ratio_ci,
    sample_mean,
    sample_median,
)

RESAMPLES = 400


def sample(seed: int, n: int, centre: float, spread: float) -> list[float]:
    return list(np.random.default_rng(seed).normal(centre, spread, n))


def test_quantile_is_numpys_percentile_and_named_after_it():
    values = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    assert quantile(50)(values) == 3.0
    assert quantile(75)(values) == 4.0
    assert quantile(90)(values) == pytest.approx(7.6)  # rank 3.6: 4 + 0.6 * 6
    assert quantile(99).__name__ == "p99"
    assert quantile(99.9).__name__ == "p99.9"
    assert isinstance(quantile(50)(values), float)


def test_median_and_mean_statistics():
    values = np.array([1.0, 2.0, 9.0])
    assert sample_median(values) == 2.0
    assert sample_mean(values) == 4.0


def test_interval_contains_its_bounds_and_nothing_outside():
    interval = Interval(1.5, 1.2, 1.8, 10)
    assert interval.contains(1.2) and interval.contains(1.8) and interval.contains(1.5)
    assert not interval.contains(1.19) and not interval.contains(1.81)


def test_interval_text():
    interval = Interval(1.5, 1.234, 1.8, 10)
    assert interval.text() == "1.50 [1.23, 1.80]"
    assert interval.text(digits=1, unit=" ms") == "1.5 ms [1.2, 1.8]"
    assert Interval(-3.0, -4.5, -1.25, 3).text(0) == "-3 [-4, -1]"


# --- ratio_ci -------------------------------------------------------------------------------


def test_ratio_estimate_is_the_statistic_ratio_and_inside_the_interval():
    a, b = sample(1, 60, 200, 20), sample(2, 80, 100, 10)

    interval = ratio_ci(a, b, resamples=RESAMPLES, seed=0)

    assert interval.estimate == pytest.approx(np.median(a) / np.median(b))
    assert interval.low <= interval.estimate <= interval.high
    assert interval.n == 60  # the smaller sample
    # A doubling is told apart from no change.
    assert not interval.contains(1.0)
    assert 1.8 < interval.low < interval.high < 2.2


def test_ratio_with_another_statistic():
    a, b = sample(3, 50, 300, 30), sample(4, 50, 100, 10)

    p99 = ratio_ci(a, b, quantile(99), resamples=RESAMPLES, seed=0)
    means = ratio_ci(a, b, sample_mean, resamples=RESAMPLES, seed=0)

    assert p99.estimate == pytest.approx(np.percentile(a, 99) / np.percentile(b, 99))
    assert means.estimate == pytest.approx(np.mean(a) / np.mean(b))
    assert means.contains(means.estimate) and not means.contains(1.0)


def test_ratio_of_a_sample_to_itself_contains_one():
    a = sample(5, 40, 100, 15)

    interval = ratio_ci(a, a, resamples=RESAMPLES, seed=0)

    assert interval.estimate == 1.0
    assert interval.contains(1.0)


def test_ratio_of_constant_samples_is_exact():
    interval = ratio_ci([6.0] * 5, [3.0] * 7, resamples=RESAMPLES, seed=0)
    assert (interval.estimate, interval.low, interval.high, interval.n) == (2.0, 2.0, 2.0, 5)


def test_ratio_draws_with_a_zero_denominator_are_left_out():
    # The median of a resample of b is 0 whenever most draws are the zero.
    interval = ratio_ci([10.0, 10.0, 10.0], [0.0, 5.0, 5.0], resamples=RESAMPLES, seed=0)
    assert interval.estimate == 2.0
    assert np.isfinite(interval.low) and np.isfinite(interval.high)
    assert interval.contains(2.0)


# --- paired_ci ------------------------------------------------------------------------------


def test_paired_estimate_is_the_statistic_of_the_differences():
    b = sample(6, 50, 100, 30)
    noise = sample(7, 50, 0, 1)
    a = [x + 5 + e for x, e in zip(b, noise, strict=True)]

    interval = paired_ci(a, b, resamples=RESAMPLES, seed=0)

    differences = np.array(a) - np.array(b)
    assert interval.estimate == pytest.approx(np.median(differences))
    assert interval.low <= interval.estimate <= interval.high
    assert interval.n == 50
    # Pairing takes the spread between requests out: a 5 ms shift is clear, though each
    # side alone spreads over 30 ms.
    assert not interval.contains(0.0)
    assert 4 < interval.low < interval.high < 6


def test_paired_mean_statistic():
    a, b = [3.0, 5.0, 10.0, 4.0], [1.0, 1.0, 1.0, 1.0]
    interval = paired_ci(a, b, sample_mean, resamples=RESAMPLES, seed=0)
    assert interval.estimate == pytest.approx(4.5)
    assert interval.contains(4.5)


def test_identical_pairs_give_a_zero_width_interval_at_zero():
    a = sample(8, 30, 100, 20)

    interval = paired_ci(a, list(a), resamples=RESAMPLES, seed=0)

    assert (interval.estimate, interval.low, interval.high) == (0.0, 0.0, 0.0)
    assert interval.contains(0.0)


def test_no_difference_contains_zero():
    b = sample(9, 60, 100, 20)
    a = [x + e for x, e in zip(b, sample(10, 60, 0, 3), strict=True)]

    interval = paired_ci(a, b, resamples=RESAMPLES, seed=0)

    assert interval.contains(0.0)


# --- seeds and errors -----------------------------------------------------------------------


@pytest.mark.parametrize("function", [ratio_ci, paired_ci])
def test_the_same_seed_gives_the_same_interval_and_another_seed_another(function):
    a, b = sample(11, 25, 150, 40), sample(12, 25, 100, 30)

    first = function(a, b, resamples=RESAMPLES, seed=3)
    again = function(a, b, resamples=RESAMPLES, seed=3)
    other = function(a, b, resamples=RESAMPLES, seed=4)

    assert first == again
    assert (other.low, other.high) != (first.low, first.high)
    assert other.estimate == first.estimate  # the estimate does not depend on the draws


@pytest.mark.parametrize("function", [ratio_ci, paired_ci])
@pytest.mark.parametrize(("a", "b"), [([], [1.0]), ([1.0], []), ([], [])])
def test_an_empty_side_is_an_error(function, a, b):
    with pytest.raises(ValueError, match="at least one value"):
        function(a, b, resamples=10)


def test_paired_samples_of_unequal_length_are_an_error():
    with pytest.raises(ValueError, match="same length"):
        paired_ci([1.0, 2.0, 3.0], [1.0, 2.0], resamples=10)


def test_ratio_samples_may_differ_in_length():
    assert ratio_ci([2.0, 2.0, 2.0], [1.0], resamples=10).n == 1


def test_paired_ratio_is_the_median_per_pair_ratio():
    pairs = [(50.0, 100.0), (100.0, 200.0), (150.0, 300.0), (60.0, 120.0)]

    interval = paired_ratio(pairs)

    assert interval is not None
    assert interval.estimate == pytest.approx(0.5)
    assert interval.low == pytest.approx(0.5) and interval.high == pytest.approx(0.5)
    assert interval.n == 4
    assert interval.high < 1.0


def test_paired_ratio_leaves_out_missing_and_non_positive_sides():
    pairs = [(2.0, 1.0), (None, 1.0), (2.0, None), (0.0, 1.0), (4.0, 2.0)]

    interval = paired_ratio(pairs)

    assert interval is not None and interval.n == 2
    assert interval.estimate == pytest.approx(2.0)
    assert interval.low > 1.0


def test_fewer_than_two_values_give_no_interval():
    assert paired_ratio([(1.0, 2.0)]) is None
    assert independent_ratio([1.0], [1.0, 2.0]) is None
    assert one_sample([3.0]) is None
    assert paired_difference([(1.0, 0.0)]) is None
    assert fmt_ratio(None, 1) == "n = 1: no interval"


def test_independent_ratio_is_the_ratio_of_the_medians():
    a, b = [10.0, 12.0, 14.0], [5.0, 6.0, 100.0]

    interval = independent_ratio(a, b)

    assert interval is not None
    assert interval.estimate == pytest.approx(12.0 / 6.0)
    assert interval.low <= interval.estimate <= interval.high


def test_one_sample_median_and_mean():
    values = [1.0, 2.0, 3.0, 4.0, 100.0]

    middle = one_sample(values)
    average = one_sample([0.0, 1.0, 1.0, 0.0], sample_mean)

    assert middle is not None and middle.estimate == 3.0 and middle.n == 5
    assert average is not None and average.estimate == 0.5
    assert 0.0 <= average.low <= average.high <= 1.0


def test_one_sample_skips_none_and_nan():
    interval = one_sample([1.0, None, math.nan, 3.0])

    assert interval is not None and interval.n == 2 and interval.estimate == 2.0


def test_paired_difference_of_identical_scores_holds_zero():
    same = paired_difference([(1.0, 1.0), (0.0, 0.0), (1.0, 1.0)])
    worse = paired_difference([(0.0, 1.0)] * 10 + [(1.0, 1.0)] * 10)

    assert same is not None and same.estimate == 0.0
    assert difference_verdict(same) == NO_DIFFERENCE
    assert worse is not None and worse.estimate == pytest.approx(-0.5)
    assert difference_verdict(worse) == "lower"


def test_formats():
    assert fmt_ratio(Interval(0.81, 0.69, 0.83, 6)) == "0.81x [0.69, 0.83]"
    assert fmt_ratio(Interval(1.05, 0.85, 1.39, 4)) == f"1.05x [0.85, 1.39]: {NO_DIFFERENCE}"
    assert fmt_interval(Interval(0.8, 0.7, 0.88, 120)) == "0.800 [0.700, 0.880] (n=120)"
    assert fmt_interval(None) == "-"


def test_clustered_share_counts_values_and_resamples_whole_groups():
    share = clustered_share([[1.0, 1.0, 0.0], [0.0], [1.0, 1.0]])
    assert share is not None and share.n == 6
    assert share.estimate == pytest.approx(4 / 6)
    assert 0.0 <= share.low <= share.estimate <= share.high <= 1.0
    assert clustered_share([[1.0, 0.0], []]) is None
