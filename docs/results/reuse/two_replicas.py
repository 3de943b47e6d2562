"""Cached share, TTFT p50 and p99 of follow-ups, setting against setting, from a bench.reuse
conversation run's records (the results.json in the run's folder, named first).

    .venv/bin/python docs/results/reuse/two_replicas.py docs/results/reuse/v16-two-generators \
        reuse-2g-affinity reuse-2g reuse-1g > docs/results/reuse/v16-two-generators/two_replicas.txt

Per setting, the follow-ups continued (usage.continued_turns > 0) and, of those, the ones
prefilled away from the engine that held the turn before (cached tokens under half of the
previous turn's prompt tokens). For each pair of the settings named (each against every one
named after it): the ratio of the cached shares of the follow-ups' prompt tokens (their
cached tokens over their prompt tokens, every run of the setting), and the TTFT p50 and p99
ratios, each with a 95% interval from a paired bootstrap over the follow-ups (2,000
resamples, bench.stats' seed: a resample draws follow-ups, and takes every run's record of
each, on both sides).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402

RESAMPLES = 2000


def follow_ups(doc: dict, setting: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cached tokens, prompt tokens, TTFT ms), each follow-up a row, each run a column."""
    cached, prompt, ttft = [], [], []
    for phase in doc["phases"]:
        runs = [r["records"][phase["name"]] for r in doc["runs"] if r["setting"] == setting]
        for index, item in enumerate(phase["items"]):
            if not item["warm"]:
                continue
            records = [run[index] for run in runs]
            if not all(record["ok"] for record in records):
                raise SystemExit(f"{setting}: follow-up {item['id']} failed in a run")
            cached.append([r["usage_cached_prompt_tokens"] for r in records])
            prompt.append([r["usage_prompt_tokens"] for r in records])
            ttft.append([r["ttft_ms"] for r in records])
    return np.array(cached, float), np.array(prompt, float), np.array(ttft, float)


def continued(doc: dict, setting: str) -> tuple[int, int, int]:
    """(follow-ups, continued, continued but cached under half the previous prompt)."""
    total = kept = missed = 0
    for phase in doc["phases"]:
        items = phase["items"]
        for run in (r for r in doc["runs"] if r["setting"] == setting):
            records = run["records"][phase["name"]]
            for index, item in enumerate(items):
                if not item["warm"]:
                    continue
                total += 1
                if records[index]["usage_continued_turns"]:
                    kept += 1
                    before = records[index - 1]["usage_prompt_tokens"]
                    missed += records[index]["usage_cached_prompt_tokens"] < before / 2
    return total, kept, missed


def share(cached: np.ndarray, prompt: np.ndarray) -> float:
    return float(cached.sum() / prompt.sum())


def interval(statistic, a, b) -> stats.Interval:
    """statistic(a rows) / statistic(b rows), with rows resampled together on both sides."""
    rows = a[0].shape[0]
    rng = np.random.default_rng(stats.SEED)
    draws = np.empty(RESAMPLES)
    for i in range(RESAMPLES):
        pick = rng.integers(0, rows, rows)
        draws[i] = statistic(*(x[pick] for x in a)) / statistic(*(x[pick] for x in b))
    low, high = np.percentile(draws, [2.5, 97.5])
    return stats.Interval(statistic(*a) / statistic(*b), float(low), float(high), rows)


def main() -> None:
    run, *names = sys.argv[1:]
    doc = json.loads((Path(run) / "results.json").read_text())
    data = {name: follow_ups(doc, name) for name in names}
    for name, (cached, prompt, ttft) in data.items():
        print(
            f"{name}: {cached.shape[0]} follow-ups x {cached.shape[1]} runs; cached share "
            f"{share(cached, prompt):.3f}; TTFT p50 {np.median(ttft):,.0f} ms, "
            f"p99 {np.percentile(ttft, 99):,.0f} ms"
        )
        total, kept, missed = continued(doc, name)
        print(f"  continued {kept} of {total}; of those, cached under half the previous "
              f"prompt: {missed}")  # fmt: skip
    for index, first in enumerate(names):
        for other in names[index + 1 :]:
            compare(first, data[first], other, data[other])


def compare(first: str, a, other: str, b) -> None:
    """`first` against `other`: cached share, TTFT p50 and p99 ratios with their intervals."""
    rows = [
        ("cached share", interval(share, a[:2], b[:2])),
        ("TTFT p50", interval(lambda t: float(np.median(t)), a[2:], b[2:])),
        ("TTFT p99", interval(lambda t: float(np.percentile(t, 99)), a[2:], b[2:])),
    ]
    for label, found in rows:
        print(f"{first} / {other}, {label}: {stats.fmt_ratio(found)}")


if __name__ == "__main__":
    main()
