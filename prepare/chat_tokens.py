"""A prompt's chat-template token count from its messages' counts, each message tokenized once.

A follow-up that continues the prompts before it (prepare.continuation) carries every earlier
prompt's sources in its history, and the preparer counts that history to fit the window and
again to report its share of the prompt: counted whole, a fourth question tokenized three
prompts' worth of text twice. Under a template that renders each message on its own (ChatML:
role markers and separators that are special tokens, so no token spans two messages), a
chat's count is the sum of its messages' counts, and a message seen in an earlier turn's
prompt (the question as it was sent, the answer) is counted from memory.

Whether the template is such is probed once, on the serving tokenizer, against whole
counts; where it is not, every count is a whole one: a template the probe does not vouch
for costs time, never a wrong budget.

The one message a follow-up brings that no earlier count saw is the previous question as it
was sent, its sources included: the longest of its history. `count_ahead` counts such a
message on a background thread while its answer is generated, so the follow-up finds it
remembered; the queue is bounded, and a message it drops is counted when a chat holds it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from typing import Protocol

from prepare.memo import BoundedLru, parts_digest

# Messages whose count the probe compares with the whole chat's: roles in the order a
# follow-up's prompt has them, texts that open and close with whitespace and markup.
_PROBE = (
    {"role": "system", "content": "Answer from the sources.\n"},
    {"role": "user", "content": 'Sources:\n<source id="a#0">One. Two.</source>\n\nQuestion: Who?'},
    {"role": "assistant", "content": " Nobody, [a#0].\n"},
    {"role": "user", "content": "Sources: none new.\n\nQuestion: And then? "},
)


class ChatCounter(Protocol):
    def count_chat(
        self, messages: Sequence[dict[str, str]], generation_prompt: bool = True
    ) -> int: ...


logger = logging.getLogger(__name__)


class ChatTokens:
    """Counts a chat (a system message first) as the serving template renders it."""

    def __init__(self, tokenizer: ChatCounter, capacity: int = 1024, ahead: int = 64) -> None:
        if ahead < 1:
            raise ValueError("ahead must be at least 1")
        self._tokenizer = tokenizer
        self._messages: BoundedLru[str, int] = BoundedLru(capacity)
        # Messages waiting for count_ahead's thread (started on first use).
        self._ahead: queue.Queue[dict[str, str]] = queue.Queue(ahead)
        self._ahead_thread: threading.Thread | None = None
        self._ahead_lock = threading.Lock()
        self._anchor = [dict(_PROBE[0])]
        self._anchor_tokens = tokenizer.count_chat(self._anchor, False)
        self._generation_tokens = tokenizer.count_chat(self._anchor) - self._anchor_tokens
        self.additive = all(
            self._summed(_PROBE[:end], prompt) == tokenizer.count_chat(_PROBE[:end], prompt)
            for end in (1, 2, 3, len(_PROBE))
            for prompt in (True, False)
        )

    def count(self, messages: Sequence[dict[str, str]], generation_prompt: bool = True) -> int:
        """Tokens of `messages` rendered by the chat template, with the generation prompt
        unless `generation_prompt` is False: the same as counting the rendered chat."""
        if not self.additive or not messages or messages[0]["role"] != "system":
            return self._tokenizer.count_chat(messages, generation_prompt)
        return self._summed(messages, generation_prompt)

    def count_ahead(self, message: dict[str, str]) -> None:
        """Count `message`, as a later message of a chat, on a background thread: for a
        message that a coming chat will hold. Returns at once; where the queue is full the
        message is left to be counted when a chat holds it."""
        if not self.additive:
            return
        try:
            self._ahead.put_nowait(message)
        except queue.Full:
            return
        with self._ahead_lock:
            if self._ahead_thread is None:
                self._ahead_thread = threading.Thread(
                    target=self._count_ahead_loop, name="count-ahead", daemon=True
                )
                self._ahead_thread.start()

    def settle(self) -> None:
        """Wait until every message given to count_ahead is counted."""
        self._ahead.join()

    def _count_ahead_loop(self) -> None:
        while True:
            message = self._ahead.get()
            try:
                self._message(message)
            except Exception:  # the chat that holds it counts it, or fails, itself
                logger.debug("counting a message ahead failed", exc_info=True)
            finally:
                self._ahead.task_done()

    def _summed(self, messages: Sequence[dict[str, str]], generation_prompt: bool) -> int:
        opening = self._message(messages[0], alone=True)
        rest = sum(self._message(message) for message in messages[1:])
        return opening + rest + (self._generation_tokens if generation_prompt else 0)

    def _message(self, message: dict[str, str], alone: bool = False) -> int:
        """A message's tokens: as the chat's first (`alone`), or after a system message."""
        key = parts_digest("1" if alone else "0", message["role"], message["content"])
        return self._messages.get_or_put(key, lambda: self._counted(message, alone))

    def _counted(self, message: dict[str, str], alone: bool) -> int:
        if alone:
            return self._tokenizer.count_chat([message], False)
        return self._tokenizer.count_chat([*self._anchor, message], False) - self._anchor_tokens
