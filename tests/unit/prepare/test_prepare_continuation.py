"""prepare.continuation: a follow-up's earlier questions sent as the generator saw them, so
its prompt continues the prompt before it; through PromptPreparer with a word tokenizer."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from test_prepare_preparation import PLAIN_SPECS, PROMPTS, WordTokenizer, corpus, retrieval

from pipeline.messages import CompressionPlan, Conversation, Turn
from prepare.continuation import SentTurn, SentTurns, turn_key, turn_scope
from prepare.options import PreparationOptions
from prepare.preparation import PromptPreparer

NONE = CompressionPlan("none", reuse=True)
SENTENCES = CompressionPlan("sentences", rate=0.5, reuse=True)


def test_a_turn_is_keyed_by_its_scope_the_turns_before_it_and_the_question() -> None:
    earlier = (Turn("user", "a"), Turn("assistant", "b"))
    key = turn_key("system", earlier, "q")
    assert turn_scope("team", "system") != turn_scope("default", "system")
    assert key == turn_key("system", earlier, "q")
    assert key != turn_key("other system", earlier, "q")
    assert key != turn_key("system", earlier[:1], "q")
    assert key != turn_key("system", (Turn("user", "ab"),), "q")
    assert key != turn_key("system", (Turn("assistant", "a"), earlier[1]), "q")
    assert turn_key("s", (), "ab") != turn_key("sa", (), "b")  # parts cannot run together


def test_the_least_recently_recalled_turn_is_forgotten_first() -> None:
    turns = SentTurns(2)
    for key in ("a", "b"):
        turns.remember(key, SentTurn(key, {}))
    assert turns.recall("a") is not None  # "b" is now the oldest
    turns.remember("c", SentTurn("c", {}))
    assert (turns.recall("b"), len(turns)) == (None, 2)
    assert turns.recall("a") is not None and turns.recall("c") is not None
    with pytest.raises(ValueError):
        SentTurns(0)


def test_only_remembered_user_turns_are_replaced_and_keys_follow_the_whole_history() -> None:
    turns = SentTurns(8)
    history = (
        Turn("user", "q1"),
        Turn("assistant", "a1"),
        Turn("user", "q2"),
        Turn("assistant", "a2"),
    )
    turns.remember(
        turn_key("s", history[:2], "q2"), SentTurn("sources 2 + q2", {"d#0": frozenset({"s."})})
    )

    replaced, sent = turns.continued("s", history)
    assert replaced == (history[0], history[1], Turn("user", "sources 2 + q2"), history[3])
    assert [turn.content for turn in sent] == ["sources 2 + q2"]
    # From the third turn on, keyed by everything before it in the whole history.
    assert turns.continued("s", history, start=2)[0] == replaced[2:]


def preparer(
    sent_turns: SentTurns | None,
    max_model_len: int = 2048,
    skip_shown_turns: int | None = None,
    resend_top_passages: int = 0,  # what is left out, shown with nothing sent again
    **options,
) -> PromptPreparer:
    store, _ = corpus(*PLAIN_SPECS)
    return PromptPreparer(
        WordTokenizer(),
        PROMPTS,
        max_model_len=max_model_len,
        sentence_store=store,
        sent_turns=sent_turns,
        options=PreparationOptions(
            skip_shown_turns=skip_shown_turns, resend_top_passages=resend_top_passages
        ),
        **options,
    )


@pytest.fixture
def chunks():
    return corpus(*PLAIN_SPECS)[1]


def follow_up(first, answer: str, question: str) -> Conversation:
    return Conversation(question, (Turn("user", first.question), Turn("assistant", answer)))


def test_a_follow_up_continues_the_first_prompt_and_does_not_resend_its_whole_passages(chunks):
    prepare = preparer(SentTurns(16)).prepare
    first = Conversation("Which alpha?")
    asked = prepare(first, retrieval(*chunks[:3]), NONE, 64)
    then = prepare(
        follow_up(first, "alpha0.", "And beta?"), retrieval(chunks[2], chunks[3]), NONE, 64
    )

    # The follow-up's prompt opens with the whole first prompt, then the answer.
    assert then.messages[: len(asked.messages)] == asked.messages
    assert then.messages[len(asked.messages)] == {"role": "assistant", "content": "alpha0."}
    assert then.continued_turns == 1
    # doc2 was shown whole in the first prompt: only doc3 is sent again, both may be cited.
    assert "doc3#0" in then.messages[-1]["content"] and "doc2#0" not in then.messages[-1]["content"]
    assert {s.chunk_id for s in then.sources} == {"doc2#0", "doc3#0"}
    assert then.context_tokens_before < asked.context_tokens_before
    # It opens with the passage the first prompt opened with: the router's key for both.
    assert asked.opening_passage == then.opening_passage == asked.sources[0].chunk_id


def test_when_every_passage_was_shown_before_the_follow_up_says_so(chunks):
    prepare = preparer(SentTurns(16)).prepare
    first = Conversation("Which alpha?")
    prepare(first, retrieval(*chunks[:2]), NONE, 64)
    then = prepare(follow_up(first, "alpha0.", "And beta?"), retrieval(*chunks[:2]), NONE, 64)

    assert "no new sources" in then.messages[-1]["content"]
    assert {s.chunk_id for s in then.sources} == {"doc0#0", "doc1#0"}


def test_a_passage_shown_compressed_goes_again_with_only_its_sentences_not_shown(chunks):
    prepare = preparer(SentTurns(16)).prepare
    first = Conversation("Which alpha?")
    asked = prepare(first, retrieval(*chunks[:2]), SENTENCES, 64)  # the alpha sentences
    every_sentence = CompressionPlan("sentences", rate=1.0, reuse=True)
    then = prepare(
        follow_up(first, "alpha0.", "And one?"), retrieval(*chunks[:2]), every_sentence, 64
    )

    assert then.continued_turns == 1
    assert then.messages[1]["content"] == asked.messages[-1]["content"]
    assert [s.text for s in asked.sources] == [
        "alpha0 beta gamma delta.",
        "alpha1 beta gamma delta.",
    ]
    assert [s.text for s in then.sources] == [
        "one0 two three four five.",
        "one1 two three four five.",
    ]
    # Asked again the same way, nothing is new: no sources are sent again, both stay citable.
    again = prepare(follow_up(first, "alpha0.", "Which?"), retrieval(*chunks[:2]), SENTENCES, 64)
    assert "no new sources" in again.messages[-1]["content"]
    assert {s.chunk_id for s in again.sources} == {"doc0#0", "doc1#0"}


def test_sentences_shown_in_any_earlier_turn_count_as_shown(chunks):
    prepare = preparer(SentTurns(16)).prepare
    every_sentence = CompressionPlan("sentences", rate=1.0, reuse=True)
    first = Conversation("Which alpha?")
    a1 = prepare(first, retrieval(chunks[0]), SENTENCES, 64)
    second = follow_up(first, "alpha0.", "And one?")
    a2 = prepare(second, retrieval(chunks[0]), every_sentence, 64)
    history = (*second.history, Turn("user", "And one?"), Turn("assistant", "one0."))
    a3 = prepare(Conversation("All of it?", history), retrieval(*chunks[:2]), every_sentence, 64)

    assert [s.text for s in a2.sources] == ["one0 two three four five."]
    assert a3.continued_turns == 2
    assert a3.messages[1]["content"] == a1.messages[-1]["content"]
    assert a3.messages[3]["content"] == a2.messages[-1]["content"]
    # doc0 was shown whole over two turns: only doc1 is new.
    assert [s.chunk_id for s in a3.sources] == ["doc1#0", "doc0#0"]
    assert "doc0#0" not in a3.messages[-1]["content"]


@pytest.mark.parametrize("plan", [NONE, SENTENCES])
def test_repeating_what_was_shown_continues_the_prompt_with_this_turns_passages_as_planned(
    chunks, plan
):
    prepare = preparer(SentTurns(16), skip_shown_turns=0).prepare
    first = Conversation("Which alpha?")
    asked = prepare(first, retrieval(*chunks[:3]), plan, 64)
    second = follow_up(first, "alpha0.", "And beta?")
    then = prepare(second, retrieval(*chunks[:3]), plan, 64)

    # The history is continued (cached) as without repeating ...
    assert then.messages[: len(asked.messages)] == asked.messages
    assert then.continued_turns == 1
    # ... but every passage goes again as this turn's compression keeps it, beside the
    # question, as the plain layout sends it: nothing is "no new sources".
    plain = preparer(None).prepare(second, retrieval(*chunks[:3]), plan, 64)
    assert then.messages[-1] == plain.messages[-1]
    assert then.sources == plain.sources
    assert {s.chunk_id for s in then.sources} == {s.chunk_id for s in asked.sources}


@pytest.mark.parametrize(
    ("sent_turns", "plan", "history_changed"),
    [
        (None, NONE, False),
        (SentTurns(16), CompressionPlan("none"), False),
        (SentTurns(16), NONE, True),
    ],
)
def test_without_reuse_or_a_remembered_turn_the_follow_up_is_laid_out_plainly(
    chunks, sent_turns, plan, history_changed
):
    prepare = preparer(sent_turns).prepare
    first = Conversation("Which alpha?")
    prepare(first, retrieval(*chunks[:3]), plan, 64)
    asked_before = "Which alpha, really?" if history_changed else first.question
    history = (Turn("user", asked_before), Turn("assistant", "alpha0."))
    then = prepare(Conversation("And beta?", history), retrieval(*chunks[2:]), plan, 64)

    assert then.continued_turns == 0
    assert then.messages[1] == {"role": "user", "content": asked_before}
    assert {s.chunk_id for s in then.sources} == {"doc2#0", "doc3#0"}
    # It opens with the first question as text: no passage opens it.
    assert then.opening_passage == ""


def test_a_continuation_that_would_crowd_out_new_passages_falls_back_to_the_plain_history(chunks):
    # Continued, the follow-up's history (the first prompt, 64 tokens) would leave its new
    # 17-token passage less room than it needs; the plain history leaves it enough.
    prepare = preparer(SentTurns(16), max_model_len=110).prepare
    first = Conversation("Which alpha?")
    prepare(first, retrieval(*chunks[:3]), NONE, 16)
    then = prepare(follow_up(first, "alpha0.", "And one3?"), retrieval(chunks[3]), NONE, 16)

    assert then.continued_turns == 0
    assert then.messages[1] == {"role": "user", "content": "Which alpha?"}
    assert "doc3#0" in then.messages[-1]["content"] and not then.truncated


def test_the_room_a_continuation_must_leave_is_what_the_plans_compression_would_keep(chunks):
    # At 105 tokens the continued history leaves doc3 room for its compressed half, not for
    # all of it: continued under sentence selection, plain when nothing is compressed.
    def follow_up_under(plan: CompressionPlan):
        prepare = preparer(SentTurns(16), max_model_len=105).prepare
        first = Conversation("Which alpha?")
        prepare(first, retrieval(*chunks[:3]), plan, 16)
        return prepare(follow_up(first, "alpha0.", "And one3?"), retrieval(chunks[3]), plan, 16)

    compressed, whole = follow_up_under(SENTENCES), follow_up_under(NONE)

    assert (compressed.continued_turns, compressed.truncated) == (1, False)
    assert (whole.continued_turns, whole.truncated) == (0, False)


def test_the_same_conversation_over_another_collection_is_not_continued(chunks):
    # A client replaying another client's conversation over another collection must not get
    # the first collection's sources in its prompt.
    prepare = preparer(SentTurns(16)).prepare
    first = Conversation("Which alpha?")
    prepare(first, retrieval(*chunks[:3]), NONE, 64)
    elsewhere = replace(retrieval(chunks[3]), collection="other-team")
    then = prepare(follow_up(first, "alpha0.", "And beta?"), elsewhere, NONE, 64)

    assert then.continued_turns == 0
    assert "doc0#0" not in " ".join(m["content"] for m in then.messages)


@pytest.mark.parametrize(
    ("skip", "sent_again"), [(None, set()), (1, {"doc0#0"}), (0, {"doc0#0", "doc1#0"})]
)
def test_skip_shown_turns_leaves_out_only_what_the_last_turns_showed(chunks, skip, sent_again):
    prepare = preparer(SentTurns(16), skip_shown_turns=skip).prepare
    first = Conversation("Which alpha?")
    prepare(first, retrieval(chunks[0]), NONE, 64)  # shows doc0 whole
    second = follow_up(first, "alpha0.", "And beta?")
    prepare(second, retrieval(chunks[1]), NONE, 64)  # shows doc1 whole
    history = (*second.history, Turn("user", "And beta?"), Turn("assistant", "beta0."))
    third = prepare(Conversation("Both?", history), retrieval(chunks[0], chunks[1]), NONE, 64)

    assert third.continued_turns == 2
    last = third.messages[-1]["content"]
    assert {c for c in ("doc0#0", "doc1#0") if c in last} == sent_again
    assert ("no new sources" in last) == (not sent_again)
    assert {s.chunk_id for s in third.sources} == {"doc0#0", "doc1#0"}


def test_with_reuse_a_first_question_goes_plainly_and_its_follow_up_continues(chunks):
    """Single questions as without reuse, however often asked; conversations continued."""
    store, _ = corpus(*PLAIN_SPECS)
    with_reuse = PromptPreparer(
        WordTokenizer(), PROMPTS, max_model_len=2048, sentence_store=store, sent_turns=SentTurns(16)
    )
    plain = PromptPreparer(WordTokenizer(), PROMPTS, max_model_len=2048, sentence_store=store)
    first = Conversation("Which alpha?")
    for _ in range(3):
        asked = with_reuse.prepare(first, retrieval(*chunks[:3]), SENTENCES, 64)
        alone = plain.prepare(first, retrieval(*chunks[:3]), SENTENCES, 64)
        assert asked.messages == alone.messages
    then = with_reuse.prepare(
        follow_up(first, "alpha0.", "And beta?"), retrieval(chunks[2], chunks[3]), SENTENCES, 64
    )
    assert then.continued_turns == 1
    assert then.messages[: len(asked.messages)] == asked.messages


def source_ids(content: str) -> list[str]:
    """The source ids of a user message, in the order it shows them."""
    return re.findall(r'<source id="([^"]+)"', content)


def test_resend_top_passages_sends_the_top_passage_again_beside_the_question(chunks):
    prepare = preparer(SentTurns(16), skip_shown_turns=1, resend_top_passages=1).prepare
    first = Conversation("Which alpha?")
    prepare(first, retrieval(chunks[0], chunks[1]), NONE, 64)  # shows doc0 and doc1 whole
    then = prepare(follow_up(first, "alpha0.", "And beta?"), retrieval(*chunks[:3]), NONE, 64)

    assert then.continued_turns == 1
    # doc0 ranks first: sent again whole; doc1, shown and ranked below it, is left out.
    assert source_ids(then.messages[-1]["content"]) == ["doc0#0", "doc2#0"]
    assert "alpha0 beta gamma delta." in then.messages[-1]["content"]
    assert sorted(s.chunk_id for s in then.sources) == ["doc0#0", "doc1#0", "doc2#0"]


class CountingWords(WordTokenizer):
    """Records the chats it renders to count."""

    def __init__(self) -> None:
        self.chats: list[list[dict[str, str]]] = []

    def count_chat(self, messages, generation_prompt: bool = True) -> int:
        self.chats.append(list(messages))
        return super().count_chat(messages, generation_prompt)


def test_a_sent_question_is_counted_ahead_so_its_follow_up_does_not_count_it(chunks):
    tokenizer = CountingWords()
    store, _ = corpus(*PLAIN_SPECS)
    preparer = PromptPreparer(
        tokenizer, PROMPTS, max_model_len=2048, sentence_store=store, sent_turns=SentTurns(16)
    )
    first = Conversation("Which alpha?")
    asked = preparer.prepare(first, retrieval(*chunks[:3]), NONE, 64)
    preparer.settle()
    sent = asked.messages[-1]
    assert any(sent in chat for chat in tokenizer.chats)  # counted, in the background

    tokenizer.chats.clear()
    then = preparer.prepare(
        follow_up(first, "alpha0.", "And beta?"), retrieval(chunks[2], chunks[3]), NONE, 64
    )
    assert then.continued_turns == 1 and then.messages[1] == sent
    assert not any(sent in chat for chat in tokenizer.chats)
