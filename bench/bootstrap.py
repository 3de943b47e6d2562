"""95% confidence intervals by the bootstrap, for the comparisons the benchmarks report.

- `ratio_ci(a, b, stat)`: stat(a) / stat(b) for two independent samples (each resampled on
  its own), e.g. the p99 E2E under overload against the p99 at capacity.
- `paired_ci(a, b, stat)`: stat(a - b) for paired samples (the same prompts on both sides,
  resampled together), e.g. TTFT through the chain minus TTFT of the engine alone.

Percentile intervals over `resamples` draws from a seeded numpy generator; a difference
whose interval contains 0 (a ratio whose interval contains 1) is no detectable difference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Statistic = Callable[[np.ndarray], float]


def median(values: np.ndarray) -> float:
    return float(np.median(values))


def mean(values: np.ndarray) -> float:
    return float(np.mean(values))


def quantile(q: float) -> Statistic:
    """The q-th percentile (0-100) as a statistic."""

    def statistic(values: np.ndarray) -> float:
        return float(np.percentile(values, q))

    statistic.__name__ = f"p{q:g}"
    return statistic


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def text(self, digits: int = 2, unit: str = "") -> str:
        fmt = f"{{:.{digits}f}}"
        return (
            f"{fmt.format(self.estimate)}{unit} [{fmt.format(self.low)}, {fmt.format(self.high)}]"
        )


def ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    stat: Statistic = median,
    resamples: int = 2000,
    seed: int = 0,
) -> Interval:
    """stat(a) / stat(b) with a 95% interval; n is the smaller sample."""
    first, second = _array(a), _array(b)
    rng = np.random.default_rng(seed)
    draws = np.empty(resamples)
    for i in range(resamples):
        top = stat(rng.choice(first, first.size))
        bottom = stat(rng.choice(second, second.size))
        draws[i] = top / bottom if bottom else np.nan
    low, high = np.nanpercentile(draws, [2.5, 97.5])
    bottom = stat(second)
    estimate = stat(first) / bottom if bottom else float("nan")
    return Interval(estimate, float(low), float(high), min(first.size, second.size))


def paired_ci(
    a: Sequence[float],
    b: Sequence[float],
    stat: Statistic = median,
    resamples: int = 2000,
    seed: int = 0,
) -> Interval:
    """stat of the per-pair differences a[i] - b[i], with a 95% interval."""
    first, second = _array(a), _array(b)
    if first.size != second.size:
        raise ValueError("paired samples must have the same length")
    differences = first - second
    rng = np.random.default_rng(seed)
    draws = np.array([stat(rng.choice(differences, differences.size)) for _ in range(resamples)])
    low, high = np.percentile(draws, [2.5, 97.5])
    return Interval(stat(differences), float(low), float(high), differences.size)


def _array(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        raise ValueError("a bootstrap needs at least one value on each side")
    return array
