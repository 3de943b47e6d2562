"""Token counts with the serving model's own tokenizer and chat template."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from prepare.memo import BoundedLru, parts_digest


class ServingTokenizer:
    """Counts tokens exactly as the generator will see them."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    @classmethod
    def load(cls, source: str) -> ServingTokenizer:
        """Load the tokenizer of a local model folder (or hub id, where a hub is reachable)."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(source))

    def count(self, text: str) -> int:
        """Tokens of `text` alone, without special tokens."""
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def count_chat(self, messages: Sequence[dict[str, str]], generation_prompt: bool = True) -> int:
        """Tokens of `messages` rendered by the chat template, with the generation prompt
        unless `generation_prompt` is False."""
        return self.count(self.render_chat(messages, generation_prompt))

    def render_chat(self, messages: Sequence[dict[str, str]], generation_prompt: bool) -> str:
        """`messages` as the chat template renders them."""
        rendered = self._tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(rendered)

    def reserved_strings(self) -> list[str]:
        """Control strings (special and added tokens) that untrusted text must not carry."""
        strings = set(self._tokenizer.all_special_tokens)
        strings.update(str(token) for token in self._tokenizer.get_added_vocab())
        return sorted((s for s in strings if s), key=len, reverse=True)


class RememberedCounts:
    """Token counts of texts counted before, from memory.

    A compressor replica counts the same texts again and again: a popular passage each time
    it is retrieved, each of its sentences in every compression of it, the source fences.
    Tokenizing them was most of the stage's time (docs/benchmarks.md, the compressor's
    bookkeeping). A text's count is its own, so a remembered one is exact; the last
    `capacity` texts are kept, under a digest, so what a client sends bounds nothing but
    the entries it evicts.
    """

    def __init__(self, count: Callable[[str], int], capacity: int = 16384) -> None:
        self._count = count
        self._counts: BoundedLru[str, int] = BoundedLru(capacity)

    def __call__(self, text: str) -> int:
        return self._counts.get_or_put(parts_digest(text), lambda: self._count(text))
