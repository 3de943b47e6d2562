"""bench.conversation: the follow-up pairs on a hand-made SQuAD set, the lab against a fake
service (httpx.MockTransport), its summary worked out by hand, and the interval labels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench import conversation
from bench.client import LabError, require_loopback
from bench.conversation import RunSettings, run_pairs
from bench.conversation_pairs import (
    build_pairs,
    candidate_pairs,
    load_pairs,
    make_pair,
    write_pairs,
)
from bench.squad import SquadQuestion, load_squad
from bench.stats import NO_DIFFERENCE, Interval, difference_verdict, one_sample, sample_mean

URL = "http://127.0.0.1:8000"


def _qa(qid: str, question: str, answer: str) -> dict[str, Any]:
    return {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": 0}]}


TINY_SQUAD = {
    "version": "1.1",
    "data": [
        {
            "title": "Super_Bowl_50",
            "paragraphs": [
                {
                    "context": "Super Bowl 50 was played at Levi's Stadium. Denver won.",
                    "qas": [
                        _qa("sb-1", "Who won Super Bowl 50?", "Denver Broncos"),
                        _qa("sb-2", "Where was Super Bowl 50 played?", "Levi's Stadium"),
                        _qa("sb-3", "How many Super Bowl 50 tickets were sold?", "70,000"),
                    ],
                },
                {
                    "context": "The Denver Broncos, coached by Gary Kubiak, beat Carolina.",
                    "qas": [
                        _qa("sb-4", "Who did the Denver Broncos beat?", "Carolina Panthers"),
                        _qa("sb-5", "Who coached the Denver Broncos?", "Gary Kubiak"),
                    ],
                },
            ],
        },
        {
            "title": "Normans",
            "paragraphs": [
                {
                    "context": "The Normans were Norse raiders led by Rollo.",
                    "qas": [
                        _qa("no-1", "Who were the Normans?", "Norse raiders"),
                        _qa("no-2", "Who led the Normans into battle?", "Rollo"),
                        _qa("no-3", "What is the capital of France?", "Paris"),
                    ],
                }
            ],
        },
        {
            "title": "Warsaw",
            "paragraphs": [
                {
                    "context": "Warsaw covers 517 km2 and has 1.7 million people.",
                    "qas": [
                        _qa("wa-1", "How big is Warsaw?", "517 km2"),
                        _qa("wa-2", "What is Warsaw's population?", "1.7 million"),
                    ],
                }
            ],
        },
    ],
}


@pytest.fixture
def squad_file(tmp_path: Path) -> Path:
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(TINY_SQUAD), encoding="utf-8")
    return path


def _q(question: str, qid: str = "q", answer: str = "a") -> SquadQuestion:
    return SquadQuestion(qid, question, (answer,), "P-0")


# --- the pairs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("title", "first", "second", "follow_up", "replaced", "pronoun"),
    [
        ("Super_Bowl_50", "Who won Super Bowl 50?", "Where was Super Bowl 50 played?",
         "Where was it played?", "Super Bowl 50", "it"),
        # "the X" goes with X; a plural-looking name takes "they" as a subject, "them" after
        # a verb, and a capital at the start.
        ("Normans", "Who led the Normans?", "Who were the Normans?", "Who were they?",
         "the Normans", "they"),
        ("Normans", "Who were the Normans?", "Who led the Normans into battle?",
         "Who led them into battle?", "the Normans", "them"),
        ("Normans", "Who were the Normans?", "The Normans were in what country?",
         "They were in what country?", "The Normans", "they"),
        ("Normans", "Who were the Normans?", "When did the Normans conquer England?",
         "When did they conquer England?", "the Normans", "they"),
        ("Warsaw", "How big is Warsaw?", "What is Warsaw's population?",
         "What is its population?", "Warsaw's", "its"),
        # "the X" + another word reads as "this" + word.
        ("Super_Bowl_50", "Who won Super Bowl 50?", "Who was the Super Bowl 50 MVP?",
         "Who was this MVP?", "the Super Bowl 50", "this"),
        # The title matched in any case and without its parenthesis.
        ("Sky_(United_Kingdom)", "When did Sky launch?", "Who owns sky?", "Who owns it?",
         "sky", "it"),
    ],
)  # fmt: skip
def test_make_pair_replaces_the_entity_with_a_pronoun(
    title, first, second, follow_up, replaced, pronoun
):
    pair = make_pair(_q(first, "q1", "gold one"), _q(second, "q2"), title)

    assert pair is not None
    assert (pair.follow_up, pair.replaced, pair.pronoun) == (follow_up, replaced, pronoun)
    assert pair.entity_source == "title"
    assert pair.question == second
    assert pair.history() == [
        {"role": "user", "content": first},
        {"role": "assistant", "content": "gold one"},
    ]


def test_make_pair_uses_a_capitalised_phrase_both_questions_name():
    pair = make_pair(
        _q("Who did the Denver Broncos beat?", "q1"),
        _q("Who coached the Denver Broncos?", "q2"),
        "Super_Bowl_50",
    )

    assert pair is not None
    assert (pair.follow_up, pair.replaced, pair.entity_source) == (
        "Who coached them?",
        "the Denver Broncos",
        "shared_phrase",
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("Who won the game?", "Where was Super Bowl 50 played?"),  # Q1 does not name it
        ("Who won Super Bowl 50?", "Who scored first?"),  # Q2 does not name it
        ("Who won Super Bowl 50?", "How many Super Bowl 50 tickets were sold?"),  # no pronoun
        # Replaced, but "Super Bowl" still names the article.
        ("Who won Super Bowl 50?", "Was Super Bowl 50 the first Super Bowl on CBS?"),
        ("Who won Super Bowl 50?", 'Who sang "Super Bowl 50 Blues"?'),  # inside quotes
        ("Who won Super Bowl 50?", "Who won Super Bowl 50?"),  # the same question
    ],
)
def test_make_pair_rejects_what_cannot_become_a_follow_up(first, second):
    assert (
        make_pair(_q(first, "q1"), _q(second, "q2" if first != second else "q1"), "Super_Bowl_50")
        is None
    )


def test_candidate_pairs_of_each_paragraph(squad_file):
    candidates = candidate_pairs(load_squad(squad_file))

    assert sorted(candidates) == ["Normans-0", "Super_Bowl_50-0", "Super_Bowl_50-1", "Warsaw-0"]
    # sb-3 has no pronoun as a follow-up, but as a first question it names the title.
    assert sorted(p.pair_id for p in candidates["Super_Bowl_50-0"]) == [
        "sb-1>sb-2",
        "sb-2>sb-1",
        "sb-3>sb-1",
        "sb-3>sb-2",
    ]
    assert {p.follow_up for p in candidates["Normans-0"]} == {
        "Who were they?",
        "Who led them into battle?",
    }


def test_build_pairs_is_seeded_one_per_paragraph_and_capped(squad_file):
    squad = load_squad(squad_file)

    first, again = build_pairs(squad, 3, seed=0), build_pairs(squad, 3, seed=0)
    assert first == again
    assert len(first.pairs) == 3
    assert len({p.paragraph_id for p in first.pairs}) == 3
    everything = build_pairs(squad, 50, seed=0)
    assert len(everything.pairs) == 4 and everything.candidate_paragraphs == 4
    assert everything.articles == ("Normans", "Super_Bowl_50", "Warsaw")
    draws = {tuple(p.pair_id for p in build_pairs(squad, 4, seed).pairs) for seed in range(8)}
    assert len(draws) > 1  # the seed decides, not the file order
    with pytest.raises(ValueError):
        build_pairs(squad, 0, seed=0)


def test_build_cli_writes_a_pair_file_that_loads_back(squad_file, tmp_path, capsys):
    out = tmp_path / "pairs.json"
    argv = ["build", "--squad-file", str(squad_file), "--n", "4", "--seed", "3"]
    assert conversation.main([*argv, "--out", str(out)]) == 0

    document = json.loads(out.read_text())
    assert document["n"] == 4 and document["seed"] == 3
    assert "gold answer" in document["history_note"]
    assert {"pair_id", "paragraph_id", "first_question_id", "question_id"} <= set(
        document["pairs"][0]
    )
    loaded = load_pairs(out)
    assert loaded.pairs == build_pairs(load_squad(squad_file), 4, 3).pairs
    assert loaded.squad_path == str(squad_file)
    assert str(out) in capsys.readouterr().out


def test_load_pairs_refuses_another_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"pairs": [{"nope": 1}]}))
    with pytest.raises(LabError, match="not a pair file"):
        load_pairs(bad)


# --- the lab against a fake service ----------------------------------------------------------

# condition -> (ranked sources given the gold paragraph G and another O, rewrite ms, TTFT ms)
CANNED: dict[str, tuple[list[str], float, float]] = {
    "full": (["G#0", "O#0"], 0.0, 100.0),  # rank 1
    "last": (["O#0", "O#1"], 0.0, 100.0),  # missed
    "join": (["O#0", "G#1"], 0.0, 120.0),  # rank 2
    "rewrite": (["G#0"], 300.0, 420.0),  # rank 1, 300 ms more TTFT than the join
}


class FakeService:
    """/readyz and /v1/rag/query: answers each condition from CANNED, records requests."""

    def __init__(self, pairs_path: Path, fail: set[tuple[str, str]] | None = None) -> None:
        pairs = load_pairs(pairs_path).pairs
        self.by_question = {p.question: p for p in pairs} | {p.follow_up: p for p in pairs}
        self.fail = fail or set()  # (pair_id, condition) answered 503
        self.other_doc = "Normans-0"
        self.doc_override: str | None = None
        self.requests: list[httpx.Request] = []

    @property
    def queries(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests if r.url.path == "/v1/rag/query"]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/readyz":
            return httpx.Response(200, json={"ready": True})
        body = json.loads(request.content)
        pair = self.by_question.get(body["question"])
        if pair is None:  # the warm-up
            return httpx.Response(200, json=_reply(["Normans-0#0"], "last", 0.0, 50.0, 0))
        condition = body["retrieval_query"] if body.get("history") else "full"
        if (pair.pair_id, condition) in self.fail:
            error = {"message": "overloaded (request id r-9)", "type": "overloaded"}
            return httpx.Response(503, json={"error": {**error, "param": None, "code": 503}})
        ranked, rewrite_ms, ttft_ms = CANNED[condition]
        other = "Warsaw-0" if pair.paragraph_id == self.other_doc else self.other_doc
        doc_ids = [
            self.doc_override or source.replace("G", pair.paragraph_id).replace("O", other)
            for source in ranked
        ]
        # The first pair's `last` request found nothing cached.
        cached = (
            0 if (condition == "last" and pair == next(iter(self.by_question.values()))) else 256
        )
        mode = "last" if condition == "full" else condition
        return httpx.Response(200, json=_reply(doc_ids, mode, rewrite_ms, ttft_ms, cached))


def _reply(
    chunk_ids: list[str], mode: str, rewrite_ms: float, ttft_ms: float, cached: int
) -> dict[str, Any]:
    return {
        "id": "r-1",
        "answer": "x",
        "sources": [
            {"id": c, "doc_id": c.split("#")[0], "title": "t", "score": 0.5} for c in chunk_ids
        ],
        "citations": None,
        "answer_style": "explained",
        "retrieval_query": {"mode": mode, "text": f"searched by {mode}"},
        "compression_method": "none",
        "context_truncated": False,
        "finish_reason": "length",
        "usage": {
            "prompt_tokens": 600,
            "cached_prompt_tokens": cached,
            "context_tokens_before": 500,
            "context_tokens_after": 500,
            "completion_tokens": 1,
        },
        "timings_ms": {
            "retrieve": 10.0,
            "compress": 1.0,
            "rewrite": rewrite_ms,
            "ttft": ttft_ms,
            "total": ttft_ms + 50,
        },
        "tpot_ms": None,
    }


@pytest.fixture
def pairs_path(squad_file: Path, tmp_path: Path) -> Path:
    # Two pairs, from Normans-0 and Warsaw-0 or the Super Bowl paragraphs, drawn by the seed.
    return write_pairs(build_pairs(load_squad(squad_file), 2, seed=0), tmp_path / "pairs.json")


def _run(service: FakeService, pairs: Path, out: Path, *extra: str) -> int:
    client = httpx.Client(base_url=URL, transport=httpx.MockTransport(service))
    argv = ["run", "--url", URL, "--pairs", str(pairs), "--out", str(out), *extra]
    with client:
        return conversation.main(argv, client=client)


def test_run_summarises_each_condition_and_the_paired_differences(pairs_path, tmp_path):
    service = FakeService(pairs_path)
    assert _run(service, pairs_path, tmp_path / "out", "--api-key", "k-secret") == 0

    report = json.loads((tmp_path / "out" / "conversation.json").read_text())
    assert len(report["results"]) == 8  # 2 pairs x 4 conditions
    conditions = {c["condition"]: c for c in report["summary"]["conditions"]}
    recall = {name: c["recall"]["estimate"] for name, c in conditions.items()}
    assert recall == {"full": 1.0, "last": 0.0, "join": 1.0, "rewrite": 1.0}
    assert conditions["join"]["mrr"] == pytest.approx(0.5)  # rank 2 both times
    assert conditions["rewrite"]["rewrite_ms_p50"] == 300.0
    assert conditions["rewrite"]["applied_modes"] == {"rewrite": 2}
    differences = {d["name"]: d for d in report["summary"]["recall_differences"]}
    assert list(differences) == ["join − full", "rewrite − full", "last − full", "rewrite − join"]
    assert differences["last − full"]["interval"]["estimate"] == -1.0
    assert differences["last − full"]["label"] == "lower"
    for name in ("join − full", "rewrite − full", "rewrite − join"):
        assert differences[name]["label"] == NO_DIFFERENCE  # [0, 0] holds 0
        assert differences[name]["pairs"] == 2
    cost = report["summary"]["rewrite_cost"]
    assert cost["rewrite_ms_p50"]["estimate"] == 300.0
    assert cost["ttft_ms"]["interval"]["estimate"] == 300.0  # 420 - 120 on both pairs
    assert cost["ttft_ms"]["label"] == "higher"
    assert cost["fallbacks"] == 0
    # 6 follow-up requests (last, join, rewrite x 2), one with nothing cached.
    cache = report["summary"]["prefix_cache"]
    assert (cache["with_cached_prompt"], cache["follow_up_requests"]) == (5, 6)
    assert cache["fraction"]["estimate"] == pytest.approx(5 / 6)

    rows = report["results"]
    assert {r["condition"] for r in rows if r["pair_id"] == rows[0]["pair_id"]} == set(CANNED)
    join = next(r for r in rows if r["condition"] == "join")
    assert (join["gold_rank"], join["recall"], join["retrieval_text"]) == (
        2,
        1.0,
        "searched by join",
    )
    assert report["config"]["pairs_sent"] == 2 and not report["config"]["budget_spent"]
    assert "k-secret" not in json.dumps(report)

    table = (tmp_path / "out" / "conversation.md").read_text()
    assert "| full | 2/2 | 0 | 1.000 [1.000, 1.000] (n=2) | 1.000 | last 2 |" in table
    assert "| last − full | 2 | -1.000 [-1.000, -1.000] (n=2) | lower |" in table
    assert "gold answer" in table  # the history is stated
    assert "5/6" in table


def test_run_sends_each_condition_as_the_contract_says(pairs_path, tmp_path):
    service = FakeService(pairs_path)
    assert _run(service, pairs_path, tmp_path / "out", "--api-key", "k", "--top-k", "3") == 0

    assert service.requests[0].url.path == "/readyz"
    queries = service.queries
    warm_ups, counted = queries[:2], queries[2:]
    assert warm_ups[1]["retrieval_query"] == "rewrite" and warm_ups[1]["history"]
    pair = load_pairs(pairs_path).pairs[0]
    by_condition = {q["retrieval_query"] if "history" in q else "full": q for q in counted[:4]}
    assert set(by_condition) == {"full", "last", "join", "rewrite"}
    assert by_condition["full"]["question"] == pair.question
    assert "history" not in by_condition["full"]
    for condition in ("last", "join", "rewrite"):
        body = by_condition[condition]
        assert body["question"] == pair.follow_up
        assert body["history"] == pair.history()
    for body in counted:
        assert body["max_tokens"] == 1
        assert body["top_k"] == 3
        assert body["compression"] == {"method": "none"}
        assert body["include_context"] is False
    assert all(r.headers["authorization"] == "Bearer k" for r in service.requests[1:])


def test_a_failed_request_is_recorded_and_leaves_its_pair_out_of_the_comparison(
    pairs_path, tmp_path
):
    pair_id = load_pairs(pairs_path).pairs[0].pair_id
    service = FakeService(pairs_path, fail={(pair_id, "join")})
    assert _run(service, pairs_path, tmp_path / "out") == 0

    report = json.loads((tmp_path / "out" / "conversation.json").read_text())
    (failed,) = [r for r in report["results"] if r["error"]]
    assert (failed["pair_id"], failed["condition"], failed["status_code"]) == (pair_id, "join", 503)
    assert "overloaded" in failed["error"] and failed["recall"] is None
    join = next(c for c in report["summary"]["conditions"] if c["condition"] == "join")
    assert (join["answered"], join["errors"]) == (1, 1)
    differences = {d["name"]: d["pairs"] for d in report["summary"]["recall_differences"]}
    assert differences == {
        "join − full": 1,
        "rewrite − full": 2,
        "last − full": 2,
        "rewrite − join": 1,
    }


def test_the_time_budget_is_checked_before_each_pair(pairs_path, tmp_path):
    service = FakeService(pairs_path)
    ticks = iter([0.0, 0.0, 100.0])  # the deadline, pair 1 (in time), pair 2 (too late)
    settings = RunSettings(url=URL, pairs_path=pairs_path, out_dir=tmp_path, budget_s=50)
    with httpx.Client(base_url=URL, transport=httpx.MockTransport(service)) as client:
        rows, sent = run_pairs(client, load_pairs(pairs_path), settings, clock=lambda: next(ticks))

    assert sent == 1 and len(rows) == 4


def test_modes_limit_the_conditions(pairs_path, tmp_path):
    service = FakeService(pairs_path)
    assert _run(service, pairs_path, tmp_path / "out", "--modes", "full", "join") == 0

    report = json.loads((tmp_path / "out" / "conversation.json").read_text())
    assert {r["condition"] for r in report["results"]} == {"full", "join"}
    assert [d["name"] for d in report["summary"]["recall_differences"]] == ["join − full"]
    assert report["summary"]["rewrite_cost"] is None
    assert "retrieval_query" not in service.queries[1]  # no rewrite warm-up without rewrite


def test_run_refuses_a_url_off_loopback(pairs_path, tmp_path, capsys):
    service = FakeService(pairs_path)
    client = httpx.Client(base_url=URL, transport=httpx.MockTransport(service))
    argv = ["run", "--url", "http://10.1.2.3:8000", "--pairs", str(pairs_path)]
    with client:
        assert conversation.main([*argv, "--out", str(tmp_path / "o")], client=client) == 1
    assert service.requests == []
    assert "loopback" in capsys.readouterr().err


def test_run_stops_at_an_answer_from_another_index(pairs_path, tmp_path, capsys):
    service = FakeService(pairs_path)
    service.doc_override = "prefix-caching"
    assert _run(service, pairs_path, tmp_path / "out") == 1
    assert len(service.queries) == 3  # two warm-ups, then the first counted request
    assert "not SQuAD paragraphs" in capsys.readouterr().err


def test_all_refuses_to_start_without_the_index(squad_file, tmp_path, capsys):
    argv = ["all", "--squad-file", str(squad_file), "--out", str(tmp_path / "o")]
    assert conversation.main([*argv, "--index", str(tmp_path / "no-index")]) == 1
    assert "no index" in capsys.readouterr().err


# --- intervals and labels --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("low", "high", "label"),
    [(-0.1, 0.2, NO_DIFFERENCE), (0.0, 0.3, NO_DIFFERENCE), (0.05, 0.3, "higher"),
     (-0.4, -0.1, "lower")],
)  # fmt: skip
def test_difference_label_says_no_detectable_difference_when_the_interval_holds_zero(
    low, high, label
):
    assert difference_verdict(Interval((low + high) / 2, low, high, 100)) == label
    assert difference_verdict(None) == NO_DIFFERENCE


def test_sample_interval_of_a_proportion_brackets_it():
    interval = one_sample([1.0, 0.0] * 50, sample_mean)
    assert interval is not None
    assert interval.estimate == 0.5 and interval.n == 100
    assert 0.35 < interval.low < 0.5 < interval.high < 0.65
    assert one_sample([]) is None


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:8"])
def test_require_loopback_accepts_this_machine(url):
    assert require_loopback(url) == url


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "https://example.com", "ftp://127.0.0.1"])
def test_require_loopback_refuses_the_rest(url):
    with pytest.raises(LabError):
        require_loopback(url)
