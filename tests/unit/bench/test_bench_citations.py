"""bench.citations: scoring a reply's citations, and the lab against a fake service
(httpx.MockTransport), every expected figure worked out by hand beside its canned reply."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.schemas import RagQueryResponse
from bench import citations
from bench.citations_report import CitationRow, score_reply

URL = "http://127.0.0.1:8000"
EIFFEL = "The Eiffel Tower stands in Paris. It was finished in 1889."
SEINE = "The Seine flows through Paris into the English Channel."
WHERE, WHEN, END = (
    "Where is the Eiffel Tower?",
    "When was it finished?",
    "Where does the Seine end?",
)
E0, S0 = "Eiffel_Tower-0#0", "Seine-0#0"
FIRST_SENTENCE = (0, 33)  # "The Eiffel Tower stands in Paris."


def _qa(qid: str, question: str, *answers: str) -> dict[str, Any]:
    return {
        "id": qid,
        "question": question,
        "answers": [{"text": a, "answer_start": 0} for a in answers],
    }


TINY_SQUAD = {
    "data": [
        {
            "title": "Eiffel_Tower",
            "paragraphs": [
                {
                    "context": EIFFEL,
                    "qas": [
                        _qa("q-where", WHERE, "Paris", "in Paris"),
                        _qa("q-when", WHEN, "1889"),
                    ],
                }
            ],
        },
        {
            "title": "Seine",
            "paragraphs": [{"context": SEINE, "qas": [_qa("q-end", END, "the English Channel")]}],
        },
    ]
}


def _citation(source_id: str, span: tuple[int, int], score: float) -> dict[str, Any]:
    return {
        "answer_span": [0, 4],
        "source_id": source_id,
        "source_span": list(span),
        "score": score,
    }


# (style, question) -> (answer, context, citations or None, attribute ms), or an HTTP status.
CANNED: dict[tuple[str, str], tuple[str, list[tuple[str, str]], Any, float] | int] = {
    # short, 3 answered: coverage 2/3; span precision 1/2, passage precision 2/2; span hits
    # 1/3; ceiling 3/3; answer holds gold 2/3; 4 citations, 1 with an unknown source (also a
    # bad span: not in the context); attribute p50 of 10, 20, 30 = 20, p95 = 29.
    ("short", WHERE): (  # the top citation (0.9) is the sentence with "Paris"
        "Paris",
        [(E0, EIFFEL), (S0, SEINE)],
        [_citation(S0, (0, 10), 0.5), _citation(E0, FIRST_SENTENCE, 0.9)],
        10.0,
    ),
    ("short", WHEN): (  # the top citation misses "1889" but its passage holds it
        "1889",
        [(E0, EIFFEL)],
        [_citation(E0, FIRST_SENTENCE, 0.7), _citation("bogus#9", (0, 3), 0.2)],
        20.0,
    ),
    ("short", END): ("I don't know.", [(S0, SEINE)], [], 30.0),  # no citation
    # explained: 2 answered, attribution unavailable once; coverage 0/2; no precision.
    ("explained", WHERE): ("It is in Paris.", [(E0, EIFFEL)], None, 2000.0),
    ("explained", WHEN): 503,
    ("explained", END): ("It ends in the sea.", [(S0, SEINE)], [], 40.0),
}


class FakeService:
    def __init__(self, doc_id: str | None = None) -> None:
        self.doc_id = doc_id
        self.requests: list[httpx.Request] = []

    @property
    def queries(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests if r.url.path == "/v1/rag/query"]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/readyz":
            return httpx.Response(200, json={"ready": True})
        body = json.loads(request.content)
        canned = CANNED.get((body["answer_style"], body["question"]))
        if canned is None:  # the warm-up
            canned = ("x", [(E0, EIFFEL)], [], 0.0)
        if isinstance(canned, int):
            error = {"message": "generator failed (request id r-2)", "type": "generator_error"}
            return httpx.Response(canned, json={"error": {**error, "param": None, "code": canned}})
        answer, context, cites, attribute_ms = canned
        return httpx.Response(
            200,
            json=_reply(body["answer_style"], answer, context, cites, attribute_ms, self.doc_id),
        )


def _reply(
    style: str,
    answer: str,
    context: list[tuple[str, str]],
    cites: Any,
    attribute_ms: float,
    doc_id: str | None = None,
) -> dict[str, Any]:
    return {
        "id": "r-1",
        "answer": answer,
        "sources": [
            {"id": cid, "doc_id": doc_id or cid.split("#")[0], "title": "t", "score": 0.5}
            for cid, _ in context
        ],
        "citations": cites,
        "answer_style": style,
        "retrieval_query": {"mode": "last", "text": "q"},
        "compression_method": "sentences",
        "context_truncated": False,
        "finish_reason": "stop",
        "usage": {
            "prompt_tokens": 400,
            "cached_prompt_tokens": 256,
            "context_tokens_before": 200,
            "context_tokens_after": 100,
            "completion_tokens": 4,
        },
        "timings_ms": {
            "retrieve": 10.0,
            "compress": 5.0,
            "attribute": attribute_ms,
            "ttft": 100.0,
            "total": 300.0,
        },
        "tpot_ms": 20.0,
        "context": [{"id": cid, "text": text} for cid, text in context],
    }


@pytest.fixture
def squad_file(tmp_path: Path) -> Path:
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(TINY_SQUAD), encoding="utf-8")
    return path


def _run(service: FakeService, squad: Path, out: Path, *extra: str) -> int:
    argv = ["run", "--url", URL, "--squad-file", str(squad), "--out", str(out), *extra]
    with httpx.Client(base_url=URL, transport=httpx.MockTransport(service)) as client:
        return citations.main([*argv, "--questions", "3"], client=client)


# --- scoring one reply -----------------------------------------------------------------------


def _row(golds: list[str]) -> CitationRow:
    return CitationRow("q", "short", "?", golds, "Eiffel_Tower-0")


def test_score_reply_slices_the_top_citations_span_from_its_passage():
    row = _row(["Paris"])
    reply = RagQueryResponse.model_validate(
        _reply("short", "Paris", [(E0, EIFFEL)], [_citation(E0, FIRST_SENTENCE, 0.8)], 12.0)
    )
    score_reply(row, reply, top_k=5)

    assert row.top_span_text == "The Eiffel Tower stands in Paris."
    assert (row.top_span_has_gold, row.top_passage_has_gold, row.context_has_gold) == (
        True,
        True,
        True,
    )
    assert (row.citation_count, row.invalid_source_ids, row.bad_spans) == (1, 0, 0)
    assert row.gold_retrieved is True and row.answer_has_gold is True
    assert row.attribute_ms == 12.0


def test_score_reply_counts_unknown_sources_and_spans_outside_their_text():
    row = _row(["1889"])
    cites = [
        _citation(E0, (40, 999), 0.6),  # past the passage's end
        _citation("elsewhere#1", (0, 5), 0.6),  # not among the sources
        _citation(E0, (34, 58), 0.6),  # "It was finished in 1889."
    ]
    score_reply(
        row, RagQueryResponse.model_validate(_reply("short", "1889", [(E0, EIFFEL)], cites, 1)), 5
    )

    assert (row.invalid_source_ids, row.bad_spans) == (1, 2)
    # Equal scores: the first one is the top; its span is cut at the passage's end.
    assert row.top_source_id == E0 and row.top_span_text == EIFFEL[40:]
    assert row.top_span_has_gold is True  # "finished in 1889." holds it


def test_score_reply_without_attribution_leaves_the_citation_figures_empty():
    row = _row(["Paris"])
    score_reply(
        row, RagQueryResponse.model_validate(_reply("short", "Paris", [(E0, EIFFEL)], None, 0)), 5
    )

    assert row.citations is None and row.citation_count is None
    assert row.top_span_has_gold is None
    assert row.context_has_gold is True


# --- the lab ---------------------------------------------------------------------------------


def test_run_summarises_each_style_as_computed_by_hand(squad_file, tmp_path):
    out = tmp_path / "out"
    assert _run(FakeService(), squad_file, out, "--styles", "short", "explained") == 0

    report = json.loads((out / "citations.json").read_text())
    short, explained = report["summary"]
    assert short["style"] == "short" and (short["answered"], short["errors"]) == (3, 0)
    estimates = {
        k: (v["estimate"], v["n"]) for k, v in short.items() if isinstance(v, dict) and "n" in v
    }
    assert estimates["coverage"] == (pytest.approx(2 / 3), 3)
    assert estimates["span_precision"] == (0.5, 2)
    assert estimates["passage_precision"] == (1.0, 2)
    assert estimates["span_precision_when_context_has_gold"] == (0.5, 2)
    assert estimates["span_hits"] == (pytest.approx(1 / 3), 3)
    assert estimates["context_ceiling"] == (1.0, 3)
    assert estimates["answer_has_gold"] == (pytest.approx(2 / 3), 3)
    assert estimates["attribute_ms_p50"] == (20.0, 3)
    assert short["attribute_ms_p95"] == pytest.approx(29.0)
    assert (short["citations"], short["invalid_source_ids"], short["bad_spans"]) == (4, 1, 1)
    assert short["citations_per_answer"] == pytest.approx(4 / 3)
    assert short["compression_methods"] == {"sentences": 3}

    assert (explained["answered"], explained["errors"], explained["attribution_missing"]) == (
        2,
        1,
        1,
    )
    assert explained["coverage"]["estimate"] == 0.0
    assert explained["span_precision"] is None
    assert explained["span_hits"]["estimate"] == 0.0

    failed = [r for r in report["results"] if r["error"]]
    assert [(r["style"], r["question_id"], r["status_code"]) for r in failed] == [
        ("explained", "q-when", 503)
    ]
    table = (out / "citations.md").read_text()
    assert "| short | 3/3 | 0.667 [" in table
    assert "| short | 4 (1.33) | 1 (1) | 1 | 0 | 20.0 [" in table


def test_run_asks_each_question_with_citations_context_and_the_default_compression(
    squad_file, tmp_path
):
    service = FakeService()
    assert _run(service, squad_file, tmp_path / "out", "--api-key", "key-1") == 0

    assert service.requests[0].url.path == "/readyz"
    warm_up, *asked = service.queries
    assert warm_up["question"] == citations.WARM_UP_QUESTION
    assert sorted(q["question"] for q in asked) == sorted([WHERE, WHEN, END])
    for body in asked:
        assert body["answer_style"] == "short"
        assert body["include_context"] is True and body["citations"] is True
        assert body["top_k"] == 5 and body["max_tokens"] == 32 and body["temperature"] == 0
        assert "compression" not in body
    assert all(r.headers["authorization"] == "Bearer key-1" for r in service.requests[1:])
    report = json.loads((tmp_path / "out" / "citations.json").read_text())
    assert "key-1" not in json.dumps(report)
    assert report["config"]["questions_asked"] == 3


def test_run_stops_at_an_answer_from_another_index(squad_file, tmp_path, capsys):
    service = FakeService(doc_id="prefix-caching")
    assert _run(service, squad_file, tmp_path / "out") == 1
    assert len(service.queries) == 2  # the warm-up and the first question
    assert "not SQuAD paragraphs" in capsys.readouterr().err


def test_run_refuses_a_url_off_loopback(squad_file, tmp_path, capsys):
    service = FakeService()
    argv = ["run", "--url", "http://192.168.1.9:8000", "--squad-file", str(squad_file)]
    with httpx.Client(base_url=URL, transport=httpx.MockTransport(service)) as client:
        assert citations.main([*argv, "--out", str(tmp_path / "o")], client=client) == 1
    assert service.requests == []
    assert "loopback" in capsys.readouterr().err


def test_run_without_the_data_set_says_how_to_get_it(tmp_path, capsys):
    assert _run(FakeService(), tmp_path / "missing.json", tmp_path / "out") == 1
    assert "bench.quality prepare" in capsys.readouterr().err


def test_report_rescores_a_runs_answers_with_em_and_f1(squad_file, tmp_path):
    out = tmp_path / "out"
    assert _run(FakeService(), squad_file, out, "--styles", "short") == 0
    path = out / "citations.json"
    report = json.loads(path.read_text())
    for row in report["results"]:  # as a run written before EM/F1 were kept
        row.pop("exact_match")
        row.pop("f1")
    path.write_text(json.dumps(report))

    assert citations.main(["report", str(path)]) == 0

    rescored = json.loads(path.read_text())
    answered = [r for r in rescored["results"] if r["answer"] is not None]
    assert answered and all(r["f1"] is not None for r in answered)
    expected_f1 = sum(r["f1"] for r in answered) / len(answered)
    [short] = rescored["summary"]
    assert short["f1"]["estimate"] == pytest.approx(expected_f1)
    assert short["f1"]["n"] == len(answered)
    assert "| EM | F1 |" in (out / "citations.md").read_text()
