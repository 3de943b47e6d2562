"""bench.caps: which answers the cap cut, and the point's scores with them asked again."""

from __future__ import annotations

from typing import Any

from bench.caps import cut_answers, extends, is_loop, point_summary, render_markdown


def result(
    qid: str, tokens: int, f1: float, gold: bool, point: str = "none k=5", answer: str = ""
) -> dict[str, Any]:
    return {"point": point, "question_id": qid, "completion_tokens": tokens, "f1": f1,
            "contains_gold": gold, "error": None, "answer": answer}  # fmt: skip


STORED = [
    result("a", 64, 0.2, True, answer="Paris is the"),
    result("b", 10, 1.0, True),
    result("c", 64, 0.0, False, answer="It is it is it is"),
    result("d", 5, 0.5, True),
    result("a", 64, 0.1, False, point="sentences@0.5 k=5"),
    {"point": "none k=5", "question_id": "e", "completion_tokens": None, "error": "timeout"},
]


def test_cut_answers_are_the_answered_ones_at_the_cap() -> None:
    cut = cut_answers({"config": {"max_tokens": 64}, "results": STORED})
    assert [(r["point"], r["question_id"]) for r in cut] == [
        ("none k=5", "a"),
        ("none k=5", "c"),
        ("sentences@0.5 k=5", "a"),
    ]


def test_point_summary_replaces_the_cut_answers_and_pairs_the_change() -> None:
    new = {
        ("none k=5", "a"): result("a", 90, 0.6, True, answer="Paris is the capital."),
        ("none k=5", "c"): result("c", 256, 0.0, True, answer="No. " + "It is so, it is. " * 4),
    }
    summary = point_summary("none k=5", STORED, new, 64, 256)
    assert summary["answered"] == 4
    assert summary["cut"] == 2
    assert summary["reasked"] == 2
    assert summary["ended_under_new_cap"] == 1
    assert summary["ended_at_tokens"] == [90]
    assert summary["still_cut_loops"] == 1
    assert summary["diverged"] == 1  # "No. ..." does not begin with "It is it is it is"
    assert summary["f1"]["before"] == (0.2 + 1.0 + 0.0 + 0.5) / 4
    assert summary["f1"]["after"] == (0.6 + 1.0 + 0.0 + 0.5) / 4
    assert abs(summary["f1"]["difference"]["estimate"] - 0.1) < 1e-9
    assert summary["contains_gold"]["after"] == 1.0
    table = render_markdown([summary], 64, 256)
    assert "| none k=5 | 4 | 2 | 1/2 (90) | 1/1 | 1 | 0.425 → 0.525 |" in table


def test_a_loop_is_a_six_word_run_said_three_times() -> None:
    assert is_loop("The Yuan dynasty is the name of the dynasty. " * 3)
    assert not is_loop("The Yuan dynasty is the name of the dynasty. " * 2)
    assert not is_loop("one two three four five six seven eight nine ten eleven twelve")
    assert not is_loop("")
    numbered = "".join(f"{i}. Palace of Culture and Science\n" for i in range(1, 5))
    assert is_loop(numbered)


def test_a_reasked_answer_extends_the_stored_one_up_to_a_split_character() -> None:
    assert extends("The Grill Room was", " The Grill Room was the work of Poynter.")
    assert extends("It costs 5 \ufffd", "It costs 5 € more.")
    assert not extends("The Grill Room was", "The source is a document collection.")
