"""prepare.chat_tokens: a chat's count from its messages' counts equals the whole count, each
message is tokenized once, and a template that does not add up is counted whole."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from prepare.chat_tokens import ChatTokens

PROJECT_ROOT = Path(__file__).resolve().parents[3]
READERS = [
    PROJECT_ROOT / ".models" / name
    for name in ("smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct")
]


class ChatML:
    """One token per character of ChatML; records what it was asked to count."""

    def __init__(self) -> None:
        self.counted: list[str] = []

    def render_chat(self, messages, generation_prompt: bool = True) -> str:
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return body + ("<|im_start|>assistant\n" if generation_prompt else "")

    def count_chat(self, messages, generation_prompt: bool = True) -> int:
        self.counted.extend(m["content"] for m in messages)
        return len(self.render_chat(messages, generation_prompt))


class SystemFolded(ChatML):
    """A template that folds the system message into the first user message, as some do:
    the first user message's count depends on the system message's text."""

    def render_chat(self, messages, generation_prompt: bool = True) -> str:
        if len(messages) > 1 and messages[0]["role"] == "system":
            first = {"role": "user", "content": f"{messages[0]['content']}{messages[1]['content']}"}
            messages = [first, *messages[2:]]
        return super().render_chat(messages, generation_prompt)


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "Answer from the sources only."}]
    for turn in range(turns):
        sources = f"Sources:\n<source>s{turn}</source>\nQ{turn}?"
        messages.append({"role": "user", "content": sources})
        messages.append({"role": "assistant", "content": f"A{turn} [s{turn}]."})
    return messages


def test_a_chat_template_rendering_each_message_alone_adds_up() -> None:
    tokenizer = ChatML()
    counter = ChatTokens(tokenizer)

    assert counter.additive
    for turns in range(4):
        messages = conversation(turns)
        for prompt in (True, False):
            assert counter.count(messages, prompt) == tokenizer.count_chat(messages, prompt)


def test_each_message_is_tokenized_once_across_a_conversations_prompts() -> None:
    tokenizer = ChatML()
    counter = ChatTokens(tokenizer)
    messages = conversation(3)
    tokenizer.counted.clear()

    for turns in range(1, 4):  # each follow-up's prompt holds the turns before it
        counter.count(messages[: 1 + 2 * turns])

    sent_first = messages[1]["content"]
    assert tokenizer.counted.count(sent_first) == 1
    assert len(tokenizer.counted) - tokenizer.counted.count(counter._anchor[0]["content"]) == 7


def test_a_template_that_does_not_add_up_is_counted_whole() -> None:
    tokenizer = SystemFolded()
    counter = ChatTokens(tokenizer)

    assert not counter.additive
    messages = conversation(2)
    assert counter.count(messages) == tokenizer.count_chat(messages)
    assert counter.count(messages, False) == tokenizer.count_chat(messages, False)


def test_a_chat_that_does_not_open_with_a_system_message_is_counted_whole() -> None:
    tokenizer = ChatML()
    counter = ChatTokens(tokenizer)
    messages = conversation(2)[1:]
    tokenizer.counted.clear()

    assert counter.count(messages) == tokenizer.count_chat(messages)
    assert tokenizer.counted == [m["content"] for m in messages] * 2


def test_the_memory_of_message_counts_is_bounded() -> None:
    counter = ChatTokens(ChatML(), capacity=3)
    counter.count(conversation(4))

    assert len(counter._messages) == 3
    with pytest.raises(ValueError):
        ChatTokens(ChatML(), capacity=0)
    with pytest.raises(ValueError):
        ChatTokens(ChatML(), ahead=0)


def test_a_message_counted_ahead_is_not_tokenized_again_by_the_chat_that_holds_it() -> None:
    tokenizer = ChatML()
    counter = ChatTokens(tokenizer)
    messages = conversation(2)
    counter.count(messages[:2])
    tokenizer.counted.clear()

    counter.count_ahead(messages[3])  # the second question as it was sent
    counter.settle()
    assert tokenizer.counted.count(messages[3]["content"]) == 1

    assert counter.count(messages) == tokenizer.count_chat(messages)
    tokenizer.counted.clear()
    counter.count(messages)
    assert messages[3]["content"] not in tokenizer.counted


class Held(ChatML):
    """Counts only once let go, so that messages queue behind the first."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.go = threading.Event()

    def count_chat(self, messages, generation_prompt: bool = True) -> int:
        if self.hold:
            self.go.wait(10)
        return super().count_chat(messages, generation_prompt)


def test_messages_past_the_queues_bound_are_left_to_be_counted_by_their_chat() -> None:
    tokenizer = Held()
    counter = ChatTokens(tokenizer, ahead=1)
    tokenizer.hold = True
    one, two, three = ({"role": "user", "content": f"sent {n}"} for n in range(3))

    counter.count_ahead(one)  # taken by the thread, which holds
    while counter._ahead.qsize():
        threading.Event().wait(0.01)
    counter.count_ahead(two)  # waits in the queue
    counter.count_ahead(three)  # past the bound: dropped, and count_ahead returned
    tokenizer.go.set()
    counter.settle()

    assert "sent 1" in tokenizer.counted and "sent 2" not in tokenizer.counted
    chat = [{"role": "system", "content": "S"}, three]
    assert counter.count(chat) == tokenizer.count_chat(chat)


def test_a_template_that_does_not_add_up_counts_nothing_ahead() -> None:
    tokenizer = SystemFolded()
    counter = ChatTokens(tokenizer)
    tokenizer.counted.clear()

    counter.count_ahead({"role": "user", "content": "sent"})
    counter.settle()
    assert tokenizer.counted == []


@pytest.mark.models
@pytest.mark.parametrize("reader", READERS, ids=lambda path: path.name)
def test_the_served_readers_templates_add_up_and_match_whole_counts(reader: Path) -> None:
    if not reader.is_dir():
        pytest.skip(f"{reader.name} is not prepared")
    from transformers import AutoTokenizer

    from prepare.prompt import DEFAULT_SYSTEM_PROMPT
    from prepare.tokens import ServingTokenizer

    tokenizer = ServingTokenizer(AutoTokenizer.from_pretrained(str(reader)))
    counter = ChatTokens(tokenizer)
    messages = conversation(3)
    messages[0]["content"] = DEFAULT_SYSTEM_PROMPT
    messages[3]["content"] = " An answer\n\nwith  spaces and a [source#1] citation. "

    assert counter.additive
    for end in range(1, len(messages) + 1):
        for prompt in (True, False):
            whole = tokenizer.count_chat(messages[:end], prompt)
            assert counter.count(messages[:end], prompt) == whole
