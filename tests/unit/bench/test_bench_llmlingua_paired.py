"""bench.llmlingua_paired: every context compressed by both variants, paired per question."""

from __future__ import annotations

import json
from pathlib import Path

from bench.intervals import all_sections
from bench.llmlingua_paired import NEW, OLD, render_markdown, time_pairs
from prepare.context import ContextChunk


class Halving:
    """Keeps the first half of a chunk's words; records the order it was called in."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def compress_chunk(self, question: str, text: str, rate: float) -> str:
        self.calls.append(self.name)
        words = text.split()
        return " ".join(words[: len(words) // 2])


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def count(text: str) -> int:
    return len(text.split())


def contexts(n: int) -> list[tuple[str, list[ContextChunk]]]:
    return [
        (
            f"q{i}",
            [
                ContextChunk(f"c{i}", "d", "t", words(40), 1.0),
                ContextChunk("x", "d", "t", words(20), 0.5),
            ],
        )
        for i in range(n)
    ]


def test_every_context_is_compressed_by_both_in_a_seeded_order() -> None:
    calls: list[str] = []
    compressors = {OLD: Halving(OLD, calls), NEW: Halving(NEW, calls)}
    timings = time_pairs(contexts(12), compressors, count, seed=3)
    assert len(timings) == 12
    assert all(sorted(t.ms) == sorted((OLD, NEW)) for t in timings)
    assert all(t.context_tokens == 60 and t.chunks == 2 for t in timings)
    assert all(t.kept_tokens == {OLD: 30, NEW: 30} for t in timings)
    # Two calls per chunk in each context's own order, and the order varies.
    assert calls == [name for t in timings for name in t.order for _ in range(2)]
    assert len({tuple(t.order) for t in timings}) == 2
    again = time_pairs(contexts(12), compressors, count, seed=3)
    assert [t.order for t in again] == [t.order for t in timings]


def test_report_gives_n_and_the_paired_speedup() -> None:
    calls: list[str] = []
    timings = time_pairs(
        contexts(5), {OLD: Halving(OLD, calls), NEW: Halving(NEW, calls)}, count, 0
    )
    for t in timings:
        t.ms[OLD], t.ms[NEW] = 200.0, 100.0
    table = render_markdown(timings)
    assert table.startswith("n = 5 questions, context 60–60 tokens")
    assert "| 50% |" in table
    assert "2.00x" in table


def test_intervals_section_reads_the_paired_timings(tmp_path: Path) -> None:
    folder = tmp_path / "llmlingua-paired"
    folder.mkdir()
    timings = [{"ms": {OLD: 300.0 + i, NEW: 100.0 + i / 3}} for i in range(30)]
    (folder / "llmlingua-paired.json").write_text(json.dumps({"timings": timings}))
    [section] = [s for s in all_sections(tmp_path) if "paired on SQuAD" in s.title]
    assert section.data["n"] == 30
    assert abs(section.data["speedup"]["estimate"] - 3.0) < 1e-6
    assert "3.00x [3.00, 3.00]" in section.lines[0]
