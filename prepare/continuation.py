"""A conversation's earlier questions as the generator saw them, so that a follow-up's prompt
continues the previous prompt and the prefix cache can serve all of it.

The client sends its history back as text: each earlier question alone. The generator saw
that question after its sources, so in the plain layout a follow-up's prompt shares only
the system prompt with the prompt before it, and its whole history is prefilled again.
`SentTurns` remembers, per compressor replica, the user message each question was sent as
(its sources, then the question), under a digest of its scope (the collection searched and
the system prompt) and the conversation up to that question as the client sends it: a
client that replays another's conversation over another collection gets none of its
sources. A follow-up's earlier questions are replaced by
those messages, so its prompt opens with the previous prompt and the previous answer, and
the sentences earlier turns showed are not sent again (they are in the history): a passage
retrieved again goes with only the sentences its new compression keeps that were not shown,
or not at all.

A turn not remembered (another replica prepared it, it was evicted, the client changed its
history) goes as the client sent it: a miss costs the cache hit, not the answer's sources.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pipeline.messages import Conversation, Turn
from prepare.context import ContextChunk
from prepare.memo import BoundedLru, parts_digest


@dataclass(frozen=True)
class SentTurn:
    """One question's user message as the generator received it, and what it showed."""

    content: str
    # Per passage (chunk id), the sentences the message showed of it: all of a passage sent
    # whole, those kept of one compressed by sentence selection (none known for LLMLingua's).
    shown: Mapping[str, frozenset[str]]
    # The chunk id of the message's first source ("" for none): a prompt continued from
    # this message opens with that passage, as this question's own prompt did.
    first_source: str = ""


def shown_sentences(turns: Iterable[SentTurn]) -> dict[str, frozenset[str]]:
    """Per passage, every sentence `turns` showed of it."""
    shown: dict[str, frozenset[str]] = {}
    for turn in turns:
        for chunk_id, sentences in turn.shown.items():
            shown[chunk_id] = shown.get(chunk_id, frozenset()) | sentences
    return shown


def turn_scope(collection: str, system_prompt: str) -> str:
    """What a remembered turn is good for: prompts over `collection` opened by `system_prompt`."""
    return f"{collection}\x00{system_prompt}"


def turn_key(scope: str, earlier: Sequence[Turn], question: str) -> str:
    """The digest a question's sent message is remembered under: its scope (turn_scope),
    the turns before the question as the client sends them, and the question."""
    return parts_digest(scope, *(f"{t.role}\x00{t.content}" for t in earlier), question)


def conversation_key(conversation: Conversation, collection: str) -> str:
    """The same for every question of one conversation, from its first on: the collection,
    the answer style and the conversation's opening question. What the compressor's router
    keys on, so that one replica remembers a conversation's turns."""
    opening = next((t.content for t in conversation.history if t.role == "user"), None)
    question = conversation.question if opening is None else opening
    return parts_digest(collection, conversation.answer_style, question)


class SentTurns:
    """The user messages of the last `capacity` questions this replica prepared (LRU)."""

    def __init__(self, capacity: int) -> None:
        self._turns: BoundedLru[str, SentTurn] = BoundedLru(capacity)

    def __len__(self) -> int:
        return len(self._turns)

    def remember(self, key: str, turn: SentTurn) -> None:
        self._turns.put(key, turn)

    def recall(self, key: str) -> SentTurn | None:
        return self._turns.get(key)

    def continued(
        self, scope: str, history: Sequence[Turn], start: int = 0
    ) -> tuple[tuple[Turn, ...], list[SentTurn]]:
        """`history[start:]` with each remembered user turn replaced by the message it was
        sent as (keyed by the whole `history` before it), and those messages, oldest first."""
        turns: list[Turn] = []
        sent: list[SentTurn] = []
        for index, turn in enumerate(history[start:], start):
            found = None
            if turn.role == "user":
                found = self.recall(turn_key(scope, history[:index], turn.content))
            if found is None:
                turns.append(turn)
                continue
            turns.append(Turn("user", found.content))
            sent.append(found)
        return tuple(turns), sent


def fully_shown(chunk: ContextChunk, shown: Mapping[str, frozenset[str]]) -> bool:
    """Whether earlier turns showed every sentence of `chunk`."""
    return bool(chunk.sentences) and set(chunk.sentences) <= shown.get(chunk.chunk_id, set())


def without_shown(
    chunks: Sequence[ContextChunk], shown: Mapping[str, frozenset[str]]
) -> tuple[list[ContextChunk], list[ContextChunk]]:
    """(`chunks` less the sentences earlier turns showed, those left with none)."""
    rest: list[ContextChunk] = []
    gone: list[ContextChunk] = []
    for chunk in chunks:
        before = shown.get(chunk.chunk_id)
        if not before or not chunk.sentences:
            rest.append(chunk)
            continue
        new = tuple(sentence for sentence in chunk.sentences if sentence not in before)
        if not new:
            gone.append(chunk)
        elif len(new) < len(chunk.sentences):
            rest.append(chunk.with_text(" ".join(new), new))
        else:
            rest.append(chunk)
    return rest, gone


def opening_passage(
    history: Sequence[Turn], continued: Sequence[SentTurn], kept: Sequence[ContextChunk]
) -> str:
    """The chunk id of the passage that opens the prompt past the system prompt (its
    first source, or its first earlier turn's where that turn goes as it was sent), "" for
    none: what a router keeps together, so that a conversation's follow-ups meet the
    engine that prefilled its first question."""
    if not history:
        return kept[0].chunk_id if kept else ""
    if continued and history[0].content == continued[0].content:
        return continued[0].first_source
    return ""
