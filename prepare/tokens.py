"""Token counts with the serving model's own tokenizer and chat template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
