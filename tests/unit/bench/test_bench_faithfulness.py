"""The faithfulness lab's reading of the judge's tokens, its verdicts and its tallies (the
judge itself is the reader on vLLM, run by `python -m bench.faithfulness judge`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import faithfulness


def record(question_id: str, attributions: list[dict], point: str = "sentences@0.5 k=5") -> dict:
    return {"question_id": question_id, "question": f"q {question_id}?", "point": point,
            "error": None, "attributions": attributions}  # fmt: skip


def pair(answer: str, source: str = "The sky is blue.") -> dict:
    return {"answer_sentence": answer, "source_id": "d-0#0", "source_sentence": source,
            "score": 0.5}  # fmt: skip


def test_pairs_carry_the_run_style_and_strip_citation_markers():
    doc = {
        "config": {"answer_style": "short"},
        "results": [
            record("a", [pair("It is blue [d-0#0]."), pair("Very  blue.")]),
            {**record("b", [pair("lost")]), "error": "HTTP 503"},
            record("c", []),
        ],
    }
    pairs = faithfulness.pairs_of(doc)
    assert [(p["question_id"], p["index"]) for p in pairs] == [("a", 0), ("a", 1)]
    assert [p["answer_sentence"] for p in pairs] == ["It is blue .", "Very blue."]
    assert {p["answer_style"] for p in pairs} == {"short"}
    assert "Claim: It is blue ." in faithfulness.user_message(pairs[0], "support")


def test_p_yes_weighs_yes_against_no_in_any_case_and_spacing():
    top = {"Yes": math.log(0.6), " yes": math.log(0.1), "No": math.log(0.1), "Maybe": 0.0}
    assert faithfulness.p_yes(top) == pytest.approx(0.7 / 0.8)
    assert faithfulness.p_yes({"Maybe": 0.0}) is None


@pytest.mark.parametrize(
    ("support", "contradiction", "expected"),
    [(0.5, 0.9, "supported"), (0.49, 0.5, "contradicted"), (0.2, 0.1, "not supported"),
     (None, None, "not supported"), (None, 0.8, "contradicted")],
)  # fmt: skip
def test_verdict_puts_support_first_then_contradiction(support, contradiction, expected):
    assert faithfulness.verdict(support, contradiction) == expected


def judged(question_id: str, verdict: str, point: str = "sentences@0.5 k=5", index: int = 0):
    p = 0.9 if verdict == "supported" else 0.2
    return {"question_id": question_id, "index": index, "point": point,
            "answer_style": "explained", "verdict": verdict, "p_support": p,
            "p_contradiction": 0.1}  # fmt: skip


def test_agreement_matches_labels_to_verdicts_by_question_and_index(tmp_path: Path):
    verdicts = [judged("a", "supported"), judged("a", "not supported", index=1),
                judged("b", "supported"), judged("c", "supported")]  # fmt: skip
    (tmp_path / "faithfulness.json").write_text(json.dumps({"pairs": verdicts}))
    labels = [{"question_id": "a", "index": 0, "label": "supported"},
              {"question_id": "a", "index": 1, "label": "supported"},
              {"question_id": "c", "index": 0, "label": "contradicted"}]  # fmt: skip
    (tmp_path / "hand-labels.json").write_text(json.dumps({"labels": labels}))
    text = faithfulness.agreement(tmp_path)
    assert "| judge agrees with the hand label | 0.333 " in text
    assert '| "supported" always agrees | 0.667 ' in text
    assert "| supported | 1 | 1 | 0 |" in text
    assert "| contradicted | 1 | 0 | 0 |" in text
    # The hand's two supported pairs got P(yes) 0.9 and 0.2 to the support question.
    assert "| supported | 2 | 0.550 " in text
