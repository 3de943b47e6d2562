"""prepare.tokens: ServingTokenizer's own logic over a minimal Hugging Face tokenizer stand-in.

The stand-in is a fake because these tests are about counting and filtering; the real serving
tokenizer is exercised in test_retrieval_preparation.py (marker `models`).
"""

from __future__ import annotations

from prepare.tokens import RememberedCounts, ServingTokenizer


class CharTokenizer:
    """One token per character; a chat template that wraps each message in markers."""

    all_special_tokens = ("<|im_start|>", "<|im_end|>", "")

    def __init__(self) -> None:
        self.seen_special: list[bool] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.seen_special.append(add_special_tokens)
        return [ord(c) for c in text]

    def apply_chat_template(self, messages, tokenize: bool, add_generation_prompt: bool) -> str:
        assert tokenize is False
        body = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return body + ("<assistant>" if add_generation_prompt else "")

    def get_added_vocab(self) -> dict[str, int]:
        return {"<tool>": 5, "<|im_end|>": 2}


def test_count_is_without_special_tokens_and_count_chat_includes_the_generation_prompt():
    hf = CharTokenizer()
    tokenizer = ServingTokenizer(hf)

    assert tokenizer.count("abc") == 3
    assert tokenizer.count_chat([{"role": "user", "content": "hi"}]) == len(
        "<user>hi</><assistant>"
    )
    assert set(hf.seen_special) == {False}


def test_count_chat_without_the_generation_prompt_counts_where_the_next_message_starts():
    tokenizer = ServingTokenizer(CharTokenizer())
    system = [{"role": "system", "content": "s"}]

    assert tokenizer.render_chat(system, False) == "<system>s</>"
    assert tokenizer.count_chat(system, False) == len("<system>s</>")
    assert tokenizer.count_chat(system) == len("<system>s</><assistant>")


def test_reserved_strings_are_unique_non_empty_and_longest_first():
    reserved = ServingTokenizer(CharTokenizer()).reserved_strings()

    assert sorted(reserved) == ["<tool>", "<|im_end|>", "<|im_start|>"]
    assert [len(s) for s in reserved] == sorted((len(s) for s in reserved), reverse=True)


def test_a_remembered_count_is_the_texts_own_and_counted_once_until_evicted():
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return len(text.split())

    counts = RememberedCounts(count, capacity=2)
    assert [counts("a b"), counts("a b"), counts("c")] == [2, 2, 1]
    assert counted == ["a b", "c"]
    counts("d e f")  # the third text evicts the least recently used, "a b"
    assert counts("c") == 1 and counted == ["a b", "c", "d e f"]
    assert counts("a b") == 2 and counted[-1] == "a b"
    assert counts("ab") == 1  # another text, another count
