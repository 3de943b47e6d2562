"""The unseen-documents lab: CoQA's first questions as SQuAD, and the collection it adds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench import unseen
from bench.coqa import CoqaStory, CoqaTurn
from bench.squad import load_squad

STORIES = [
    CoqaStory("3abc", "mctest", "Cotton was a white kitten. She lived in a barn.",
              (CoqaTurn("What color was Cotton?", ("white", "White")),
               CoqaTurn("Where did she live?", ("in a barn",)))),
    CoqaStory("7def", "race", "The ferry leaves at noon.",
              (CoqaTurn("When does the ferry leave?", ("at noon",)),)),
]  # fmt: skip


def test_each_story_is_one_article_with_its_first_question(tmp_path: Path) -> None:
    path = tmp_path / "first.json"
    path.write_text(json.dumps(unseen.first_questions(STORIES)), encoding="utf-8")
    squad = load_squad(path)
    assert [q.question for q in squad.questions] == [
        "What color was Cotton?",
        "When does the ferry leave?",
    ]
    assert squad.questions[0].gold_answers == ("white", "White")
    # A source's document id is the paragraph id the questions point at.
    assert [q.paragraph_id for q in squad.questions] == [d["id"] for d in unseen.documents(STORIES)]


def test_add_collection_creates_adds_in_batches_and_waits_for_each_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(unseen, "BATCH", 1)
    monkeypatch.setattr(unseen, "JOB_POLL_S", 0.0)
    seen: list[tuple[str, str]] = []
    polls: dict[str, int] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        if request.url.path == "/v1/collections":
            return httpx.Response(201, json={"name": "c"})
        if request.method == "POST":
            job = f"job-{len(seen)}"
            return httpx.Response(202, json={"id": job, "status": "queued", "errors": []})
        job = request.url.path.rsplit("/", 1)[-1]
        polls[job] = polls.get(job, 0) + 1
        status = "succeeded" if polls[job] > 1 else "running"
        return httpx.Response(200, json={"id": job, "status": status, "errors": [],
                                         "counts": {"documents": 2}})  # fmt: skip

    with httpx.Client(base_url="http://t", transport=httpx.MockTransport(handler)) as client:
        job = unseen.add_collection(client, "c", unseen.documents(STORIES))
    assert job["status"] == "succeeded"
    posts = [path for method, path in seen if method == "POST"]
    assert posts == ["/v1/collections", "/v1/collections/c/documents",
                     "/v1/collections/c/documents"]  # fmt: skip
    assert all(count == 2 for count in polls.values())


def test_a_failed_job_stops_the_lab() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/collections":
            return httpx.Response(201, json={})
        return httpx.Response(202, json={"id": "j", "status": "failed", "errors": ["bad"]})

    with (
        httpx.Client(base_url="http://t", transport=httpx.MockTransport(handler)) as client,
        pytest.raises(unseen.UnseenError, match="failed"),
    ):
        unseen.add_collection(client, "c", unseen.documents(STORIES))


def test_report_gives_the_scores_over_all_and_over_retrieved_stories() -> None:
    def result(recall: float, gold: bool, finish: str, point: str = "p") -> dict[str, object]:
        return {"error": None, "recall": recall, "contains_gold": gold, "f1": 0.5,
                "finish_reason": finish, "repeated_sentences": 0, "ttft_ms": 1000.0,
                "total_ms": 5000.0, "point": point, "answer_survived": gold}  # fmt: skip

    results = [result(1.0, True, "stop"), result(1.0, True, "stop"),
               result(0.0, False, "length"), {"error": "HTTP 503"}]  # fmt: skip
    text = unseen.report({"results": results})
    all_row, retrieved_row, kept_row = text.splitlines()[2:5]
    assert all_row.startswith("| all answered | 3 | 0.667")
    assert retrieved_row.startswith("| story retrieved | 2 | 1.000")
    assert kept_row.startswith("| retrieved, answer kept | 2 | 1.000")
    assert "| 1.000 [1.000, 1.000]" in retrieved_row  # contains gold, ended on its own
    # A run of several settings: each setting's rows apart.
    two = unseen.report({"results": [*results[:3], result(0.0, False, "stop", "q")]})
    assert [line.split(" | ")[0] for line in two.splitlines()[2:]] == [
        "| p: all answered",
        "| p: story retrieved",
        "| p: retrieved, answer kept",
        "| q: all answered",
        "| q: story retrieved",
        "| q: retrieved, answer kept",
    ]


def test_the_unseen_plan_asks_its_collection_through_quality_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextlib import contextmanager

    from bench import suite

    @contextmanager
    def fake_service(*args: object, **kwargs: object) -> Iterator[str]:
        yield "http://svc"

    asked: list[list[str]] = []
    monkeypatch.setattr(suite.unseen, "COLLECTIONS_ROOT", tmp_path / "collections")
    monkeypatch.setattr(suite, "variant_service", fake_service)
    monkeypatch.setattr(suite, "unseen_collection", lambda url: ["--collection", "c"])
    monkeypatch.setattr(suite.quality, "main", lambda argv: asked.append(argv) or 0)
    suite.run_quality(suite.QUALITY_PLANS["unseen-default"], tmp_path, tmp_path / "base.yaml")
    (argv,) = asked
    assert argv[0] == "run"
    assert argv[argv.index("--collection") + 1] == "c"


def test_the_label_sample_is_seeded_and_the_tally_refuses_unknown_labels() -> None:
    pair = {"answer_sentence": "a", "source_id": "s#0", "source_sentence": "b", "score": 1.0}
    doc = {"results": [{"question_id": f"q{i}", "question": "?", "point": f"p{i % 2}",
                        "attributions": [pair] * 3} for i in range(30)]}  # fmt: skip
    first = unseen.attribution_sample(doc, 10)
    assert first == unseen.attribution_sample(doc, 10)
    assert len(first) == 10 and len({(p["question_id"], p["index"]) for p in first}) == 10
    only = unseen.attribution_sample(doc, 100, point="p1")
    assert len(only) == 45 and {p["point"] for p in only} == {"p1"}
    labels = [{"question_id": f"q{i}", "label": "supported"} for i in range(3)]
    labels.append({"question_id": "q0", "label": "contradicted"})
    text = unseen.labels_report(labels)
    # 4 pairs from 3 answers: 3 supported, 1 contradicted.
    assert (
        "| the run's | 4 | 3 | 3: 0.750 " in text
        and "| 0: 0.000 [0.000, 0.000] (n=4) | 1: 0.250 " in text
    )
    per_point = unseen.labels_report(
        [{**x, "point": "none k=5"} for x in labels[:2]]
        + [{**labels[2], "point": "sentences@0.5 k=5"}]
    )
    assert (
        "| none k=5 | 2 | 2 | 2: 1.000 " in per_point and "| sentences@0.5 k=5 | 1 |" in per_point
    )
    with pytest.raises(unseen.UnseenError, match="maybe"):
        unseen.labels_report([{"label": "maybe"}])
