"""Token budgets: keep the context inside what the serving model can take."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prepare.context import ContextChunk

TokenCounter = Callable[[str], int]


def context_budget_tokens(
    max_model_len: int, max_output_tokens: int, fixed_prompt_tokens: int, margin_tokens: int = 16
) -> int:
    """Tokens left for sources once the fixed prompt and the answer are reserved (may be <= 0)."""
    return max_model_len - max_output_tokens - fixed_prompt_tokens - margin_tokens


def fit_to_budget(
    chunks: Sequence[ContextChunk], count_tokens: TokenCounter, budget_tokens: int
) -> tuple[list[ContextChunk], bool]:
    """Keep chunks in rank order while they fit; cut the first that does not at a sentence.

    Returns the kept chunks and whether anything was cut. A chunk's cost is its own text's
    token count plus a small allowance for its <source> fence.
    """
    kept: list[ContextChunk] = []
    used = 0
    for chunk in chunks:
        cost = source_cost(chunk, count_tokens)
        if used + cost <= budget_tokens:
            kept.append(chunk)
            used += cost
            continue
        room = budget_tokens - used - fence_tokens(chunk, count_tokens)
        cut = _leading_sentences(chunk, count_tokens, room)
        if cut is not None:
            kept.append(cut)
        return kept, True
    return kept, False


def source_cost(chunk: ContextChunk, count_tokens: TokenCounter) -> int:
    """What a chunk takes of the budget: its text's tokens and its fence's."""
    return count_tokens(chunk.text) + fence_tokens(chunk, count_tokens)


def fence_tokens(chunk: ContextChunk, count_tokens: TokenCounter) -> int:
    """Tokens the <source id=... title=...> wrapper adds around a chunk."""
    return count_tokens(f'<source id="{chunk.chunk_id}" title="{chunk.title}">\n\n</source>\n')


def _leading_sentences(
    chunk: ContextChunk, count_tokens: TokenCounter, room: int
) -> ContextChunk | None:
    sentences = chunk.sentences or (chunk.text,)
    kept: list[str] = []
    used = 0
    for sentence in sentences:
        cost = count_tokens(sentence) + 1
        if used + cost > room:
            break
        kept.append(sentence)
        used += cost
    if not kept:
        return None
    return chunk.with_text(" ".join(kept), tuple(kept))
