"""The follow-ups lab: the conversation a client holds, and what it counts in the answers."""

from __future__ import annotations

import json

import httpx

from bench import followups
from bench.coqa import CoqaStory, CoqaTurn
from bench.squad_metrics import restated_sentences

STORY = CoqaStory("3abc", "mctest", "Cotton was a white kitten. She lived in a barn.",
                  (CoqaTurn("What color was Cotton?", ("white",)),
                   CoqaTurn("Where did she live?", ("in a barn",)),
                   CoqaTurn("With whom?", ("her mommy",))))  # fmt: skip


def test_a_sentence_restating_an_earlier_answer_is_counted_nearly_word_for_word():
    earlier = ["Cotton was a white kitten who lived in a big red barn [d#0]. Yes."]
    # Word for word but the citation; one word of ten changed (Jaccard 9/11 >= 0.8); new.
    # (Articles are dropped in normalising.)
    answer = (
        "Cotton was a white kitten who lived in a big red barn. "
        "Cotton was a white kitten who lived in a big red shed. She had a mommy."
    )
    assert restated_sentences(answer, earlier) == 2
    assert restated_sentences(answer, []) == 0
    assert restated_sentences("Yes. Yes.", ["Yes."]) == 0  # too short to say anything twice


def answering(answers: list[tuple[str, str]]):
    """A service that gives `answers` (text, finish reason) in turn, keeping each body."""
    bodies: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if not answers:
            return httpx.Response(503, json={"error": {"message": "down", "type": "x",
                                                       "param": None, "code": "x"}})  # fmt: skip
        text, finish = answers.pop(0)
        return httpx.Response(200, json={
            "id": "r", "answer": text, "sources": [], "compression_method": "sentences",
            "context_truncated": False, "finish_reason": finish,
            "usage": {"prompt_tokens": 9, "cached_prompt_tokens": 0, "context_tokens_before": 1,
                      "context_tokens_after": 1, "completion_tokens": 7},
            "timings_ms": {"retrieve": 1.0, "compress": 1.0, "ttft": 50.0, "total": 90.0},
            "tpot_ms": 5.0,
        })  # fmt: skip

    client = httpx.Client(base_url="http://svc", transport=httpx.MockTransport(handle))
    return client, bodies


def test_each_turn_sends_the_questions_and_the_services_answers_before_it():
    client, bodies = answering([
        ("Cotton was white, a white kitten.", "stop"),
        ("Cotton was white, a white kitten. She lived in a barn.", "length"),
    ])  # fmt: skip
    records = followups.converse(client, STORY, 3, "coqa-unseen")

    assert [b["question"] for b in bodies] == [t.question for t in STORY.turns]
    assert bodies[0]["history"] == [] and bodies[0]["collection"] == "coqa-unseen"
    assert bodies[1]["history"] == [
        {"role": "user", "content": "What color was Cotton?"},
        {"role": "assistant", "content": "Cotton was white, a white kitten."},
    ]
    first, second, third = records
    assert first["contains_gold"] is True
    assert (second["finish_reason"], second["contains_gold"]) == ("length", True)
    assert third["error"] is not None and "answer" not in third
    restates = [r["restates"] for r in followups.restatements(records)]
    assert restates == [0, 1]
    table = followups.report({"records": records})
    assert "| first questions | 1 | 1 of 1 |" in table
    assert "| follow-ups | 1 | 0 of 1 |" in table and "Failed requests: 1." in table


def test_saying_the_refusal_again_restates_no_answer():
    def record(turn: int, answer: str) -> dict:
        return {"story_id": "s", "turn": turn, "answer": answer, "error": None}

    refusal = followups.REFUSAL
    records = [record(2, refusal), record(1, refusal),
               record(3, "Cotton lived in the big red barn. " + refusal)]  # fmt: skip
    scored = followups.restatements(records)
    assert [r["turn"] for r in scored] == [1, 2, 3]
    assert [r["restates"] for r in scored] == [0, 1, 1]
    assert [r["restates_content"] for r in scored] == [0, 0, 0]


def test_the_refusal_is_the_one_the_prompt_asks_for():
    from prepare.prompt import DEFAULT_SYSTEM_PROMPT, SHORT_ANSWER_SYSTEM_PROMPT

    assert f"reply exactly: {followups.REFUSAL}" in SHORT_ANSWER_SYSTEM_PROMPT
    assert "say that the sources do\n   not say, in one sentence" in DEFAULT_SYSTEM_PROMPT


def test_conversations_are_drawn_among_long_enough_stories_with_a_seed():
    short = CoqaStory("s", "race", "x", STORY.turns[:1])
    drawn = followups.draw_conversations([STORY, short] * 3, 2, turns=3)
    assert drawn == followups.draw_conversations([STORY, short] * 3, 2, turns=3)
    assert len(drawn) == 2 and all(len(s.turns) >= 3 for s in drawn)
