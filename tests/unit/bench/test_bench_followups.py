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


def test_a_sentence_that_cites_to_speak_of_its_source_is_counted():
    from bench.squad_metrics import sentences_about_sources

    assert sentences_about_sources("She went to find Lysbeth. This is in the source [s-0#1].") == 1
    assert sentences_about_sources("The sources [a-0] and [b-0] say where they were.") == 1
    # A claim that cites, the refusal (which cites nothing), and "source" without a citation.
    assert sentences_about_sources("Cotton was white [s-0#0]. The sources do not say.") == 0
    assert sentences_about_sources("The Nile's source is in Burundi.") == 0


def test_compare_pairs_the_same_turn_of_the_same_conversation():
    def record(story: str, turn: int, answer: str, finish: str = "stop") -> dict:
        return {"story_id": story, "turn": turn, "answer": answer, "error": None,
                "finish_reason": finish, "repeated_sentences": 0, "contains_gold": turn == 1,
                "completion_tokens": 10 * turn, "ttft_ms": 100.0 * turn}  # fmt: skip

    said = "Cotton lived in the big red barn."
    before = [record("a", 1, said), record("a", 2, said + " It is in the source [a-0]."),
              record("b", 1, said), record("b", 2, said, "length")]  # fmt: skip
    after = [record("a", 1, said), record("a", 2, "She lived with her mommy."),
             record("b", 1, said), record("b", 2, said), record("c", 1, said)]  # fmt: skip
    table = followups.compare({"records": before}, {"records": after})

    rows = {tuple(cell.strip() for cell in line.split("|")[1:4]): line
            for line in table.splitlines()[2:]}  # fmt: skip
    # Story c has no turn before: left out. Follow-ups: both restated before, one after.
    assert "| 2 | 2 | 1 |" in rows[("follow-ups", "restates an earlier answer", "2")]
    assert "| 2 | 1 | 2 |" in rows[("follow-ups", "ended on its own", "2")]
    assert "| 2 | 1 | 0 |" in rows[("follow-ups", "a sentence only to cite", "2")]
    assert "+0.000" in rows[("first questions", "completion tokens (mean)", "2")]
