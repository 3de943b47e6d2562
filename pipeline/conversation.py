"""A follow-up question as the text retrieval searches for.

"And what does it cost?" alone retrieves nothing useful: retrieval needs a standalone
question. `join_question` joins the recent user turns to the current one (no model call);
`rewrite_messages` asks the generator, under its own static system prompt (so the prefix
cache holds it too), to rewrite the question; `read_rewrite` checks what came back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.messages import Turn

# A rewrite longer than this many times the question (plus slack) is an answer, not a
# question: it is not used.
_MAX_GROWTH = 4
_PREFACES = ("standalone question:", "rewritten question:", "question:", "rewrite:")


# The embedder reads a few hundred tokens (all-MiniLM-L6-v2: 256) and cuts the rest, so
# the earlier turns are held to their last characters: the question itself, which comes
# last, is never cut away by a long earlier turn.
JOIN_EARLIER_MAX_CHARS = 600


def join_question(history: Sequence[Turn], question: str, user_turns: int) -> str:
    """The last `user_turns` earlier user messages and `question`, oldest first, one text;
    the earlier part at most JOIN_EARLIER_MAX_CHARS long (its end kept)."""
    earlier = [turn.content.strip() for turn in history if turn.role == "user"]
    recent = " ".join(filter(None, earlier[-user_turns:] if user_turns > 0 else []))
    if len(recent) > JOIN_EARLIER_MAX_CHARS:
        recent = recent[-JOIN_EARLIER_MAX_CHARS:].split(" ", 1)[-1]
    return f"{recent} {question}" if recent else question


# A rewrite needs the subject the follow-up points back to, which the opening of the recent
# turns names: each is held to its first this many characters, so the rewrite's prompt is
# bounded however long the conversation ran.
REWRITE_TURN_MAX_CHARS = 600


def recent_turns(history: Sequence[Turn], user_turns: int) -> tuple[Turn, ...]:
    """The turns from the `user_turns`-th last user turn on (none with 0), each at most
    REWRITE_TURN_MAX_CHARS long."""
    starts = [i for i, turn in enumerate(history) if turn.role == "user"]
    if user_turns <= 0 or not starts:
        return ()
    recent = history[starts[-min(user_turns, len(starts))] :]
    return tuple(Turn(turn.role, turn.content[:REWRITE_TURN_MAX_CHARS]) for turn in recent)


def rewrite_messages(
    system_prompt: str, history: Sequence[Turn], question: str
) -> list[dict[str, str]]:
    """Chat messages asking for `question` rewritten as a standalone question."""
    lines = [f"{turn.role}: {turn.content.strip()}" for turn in history]
    conversation = "\n".join(lines) if lines else "(no earlier messages)"
    return [
        {"role": "system", "content": system_prompt},
        {
            "role": "user",
            "content": f"Conversation:\n{conversation}\n\nLast question: {question}\n\n"
            "Standalone question:",
        },
    ]


def read_rewrite(text: str, question: str) -> str | None:
    """The rewritten question from the model's reply, or None when the reply is unusable:
    empty, far longer than a question, or no question where one was asked (a small model
    often answers instead of rewriting: SmolLM2-135M did on most SQuAD follow-ups)."""
    line = next((line.strip() for line in text.strip().splitlines() if line.strip()), "")
    lowered = line.lower()
    for preface in _PREFACES:
        if lowered.startswith(preface):
            line = line[len(preface) :].strip()
            break
    line = line.strip("\"'`“”").strip()
    if not line or len(line) > _MAX_GROWTH * len(question) + 80:
        return None
    if question.rstrip().endswith("?") and not line.endswith("?"):
        return None
    return line


@dataclass(frozen=True)
class ConversationSettings:
    """How the pipeline turns a follow-up into a retrieval query (from the config tree)."""

    join_user_turns: int = 2
    rewrite_system_prompt: str = ""
    rewrite_max_tokens: int = 48
    rewrite_timeout_s: float = 10.0
