"""bench.ingestion: the invented facts, the passages and document stream, the phase plan,
the rate, the summaries and verdicts of each goal, and the report (no service)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from bench.ingestion import inputs, parts, report
from bench.ingestion import summary as figures
from bench.ingestion.client import QueryRecord
from bench.ingestion.inputs import Passage
from bench.ingestion.summary import INGESTING, QUIET, AddRun, PhaseRun
from bench.questions import DEFAULT_QUESTIONS

ROOT = Path(__file__).resolve().parents[3]


def test_facts_are_seeded_and_their_invented_words_unique():
    facts = inputs.invent_facts(30, seed=1)

    assert facts == inputs.invent_facts(30, seed=1)
    assert facts != inputs.invent_facts(30, seed=2)
    assert [f.doc_id for f in facts] == [f"fact-{i:03d}" for i in range(30)]
    words = [w for f in facts for w in (f.name, *f.keeper.split(), f.land)]
    assert len(words) == len(set(words))
    assert all(re.fullmatch(r"[A-Z][a-z]+", word) for word in words)


def test_a_fact_is_in_its_text_and_its_questions_name_it():
    fact = inputs.invent_facts(1, seed=0)[0]
    record = fact.record()

    assert record["id"] == fact.doc_id and record["title"] == fact.title
    assert f"keeps exactly {fact.count} {fact.things}" in record["text"]
    assert fact.keeper in record["text"] and fact.name in record["text"]
    assert fact.paraphrases[0] == fact.question
    assert len(set(fact.paraphrases)) == len(fact.paraphrases)
    assert all(fact.name in q or fact.keeper in q for q in fact.paraphrases if "keeps" not in q)


def test_paragraphs_drop_headings_and_stubs_and_join_lines():
    text = "# Title\n\nshort one\n\n" + "word " * 50 + "\nmore " * 10 + "\n\n## Next\n" + "x" * 210

    paragraphs = inputs.paragraphs_from_text(text)

    assert len(paragraphs) == 2
    assert "\n" not in paragraphs[0] and paragraphs[0].startswith("word word")
    assert paragraphs[1] == "x" * 210


def test_passages_fall_back_to_the_corpus_when_squad_is_not_cached(tmp_path):
    kind, passages = inputs.load_passages(ROOT / "data/corpus", tmp_path / "missing.json")

    assert kind.startswith("paragraphs of")
    assert len(passages) > 36
    assert all(len(p.text) >= inputs.MIN_PARAGRAPH_CHARS for p in passages)


def test_the_document_stream_never_repeats_an_id_and_cycles_the_passages():
    passages = [Passage(f"s{i}", f"T{i}", f"text {i}") for i in range(3)]

    records = list(itertools.islice(inputs.document_stream(passages, seed=0), 7))

    assert [r["id"] for r in records] == [f"ingest-{i:06d}" for i in range(7)]
    assert {r["text"] for r in records[:3]} == {"text 0", "text 1", "text 2"}
    assert records == list(itertools.islice(inputs.document_stream(passages, seed=0), 7))
    stream = inputs.document_stream(passages, seed=0)
    assert len(inputs.take(stream, 2)) == 2 and inputs.take(stream, 1)[0]["id"].endswith("2")
    with pytest.raises(ValueError):
        next(inputs.document_stream([], seed=0))


def test_phases_run_in_abba_order_from_quiet():
    assert parts.phase_plan(4) == [QUIET, INGESTING, INGESTING, QUIET]
    assert parts.phase_plan(8) == [QUIET, INGESTING, INGESTING, QUIET] * 2
    assert parts.phase_plan(3) == [QUIET, INGESTING, INGESTING]
    assert parts.phase_plan(2, warm_up=True) == [figures.WARM_UP, QUIET, INGESTING]
    with pytest.raises(ValueError):
        parts.phase_plan(1)


def test_the_rate_is_a_fraction_of_capacity():
    assert parts.choose_rate(2.0, 0.45) == 0.9
    assert parts.choose_rate(0.001, 0.45) == 0.01
    with pytest.raises(ValueError):
        parts.choose_rate(0.0, 0.45)


def query(doc_ids=(), status=200, error_kind=None, sent_wall=None, **fields) -> QueryRecord:
    return QueryRecord(
        fields.pop("part", "load"),
        fields.pop("index", 0),
        fields.pop("question", "q"),
        status=status,
        error_kind=error_kind,
        doc_ids=list(doc_ids),
        sent_wall=sent_wall,
        **fields,
    )


def add_run(first_cited_s, duration_s=1.0, finished=101.0, queries=None) -> AddRun:
    job = {"status": "succeeded", "duration_s": duration_s, "finished_at": finished}
    queries = queries if queries is not None else [query(["fact-000"], sent_wall=finished)]
    return AddRun("fact-000", 100.0, job, queries, first_cited_s, first_cited_s is None)


def test_an_add_misses_only_queries_sent_after_its_job_finished():
    early_miss = query(["other"], sent_wall=100.5)
    late_miss = query(["other"], sent_wall=101.5)
    hit = query(["fact-000"], sent_wall=102.0)

    assert add_run(2.5, queries=[early_miss, hit]).misses_after_publish == 0
    assert add_run(2.5, queries=[early_miss, late_miss, hit]).misses_after_publish == 1
    assert add_run(2.5).published_s == pytest.approx(1.0)
    assert add_run(2.5, queries=[early_miss, hit]).first_cited_sent_s == pytest.approx(2.0)
    assert add_run(None, queries=[early_miss]).first_cited_sent_s is None


def test_add_summary_and_verdict():
    runs = [add_run(1.0 + i / 10, duration_s=0.5 + i / 10) for i in range(10)]

    summary = figures.add_summary(runs)

    assert summary["adds"] == summary["cited"] == 10 and summary["misses_after_publish"] == 0
    assert summary["first_cited_s"]["n"] == 10
    assert summary["first_cited_s"]["median"] == pytest.approx(1.45)
    interval = summary["first_cited_s"]["median_ci"]
    assert interval["low"] <= interval["estimate"] <= interval["high"]
    assert summary["first_cited_s"]["max"] == pytest.approx(1.9)
    assert summary["job_duration_s"]["median"] == pytest.approx(0.95)
    assert summary["lag_after_publish_s"]["median"] == pytest.approx(0.45)
    assert summary["verdict"]["met"] is True

    missed = [*runs, add_run(None)]
    assert figures.add_summary(missed)["verdict"]["met"] is False
    late = [*runs, add_run(3.0, queries=[query(["x"], sent_wall=102), query(["fact-000"])])]
    assert figures.add_summary(late)["verdict"]["met"] is False
    assert figures.add_summary([])["verdict"]["met"] is False


def test_paraphrase_records_are_seeded_draws_aimed_at_the_fact():
    fact = inputs.invent_facts(1, seed=0)[0]

    records = inputs.paraphrase_records(fact, 50, seed=3, part="delete")

    assert [r.question for r in records] == [
        r.question for r in inputs.paraphrase_records(fact, 50, seed=3, part="delete")
    ]
    assert {r.question for r in records} <= set(fact.paraphrases)
    assert len({r.question for r in records}) > 3
    assert {r.target for r in records} == {fact.doc_id}


def test_delete_summary_counts_retrievals_failures_and_versions():
    job = {"status": "succeeded", "version": "v2", "duration_s": 1.0}
    precheck = [query(["gone"]), query(["gone"]), query(["other"])]
    clean = [query(["other"], index_version="v2") for _ in range(5)]

    summary = figures.delete_summary(precheck, clean, "gone", job)

    assert summary["precheck_retrieved"] == 2 and summary["precheck_n"] == 3
    assert summary["retrieved"] == 0 and summary["ok"] == 5 and summary["versions"] == ["v2"]
    assert summary["verdict"]["met"] is True
    assert "0/5" in summary["verdict"]["text"]

    leaked = [*clean, query(["gone", "other"], index_version="v1")]
    summary = figures.delete_summary(precheck, leaked, "gone", job)
    assert summary["retrieved"] == 1 and summary["older_versions"] == 1
    assert summary["verdict"]["met"] is False
    failed = [*clean, query(status=503, error_kind="http_503")]
    assert figures.delete_summary(precheck, failed, "gone", job)["verdict"]["met"] is False


def load_records(quiet_ms, ingesting_ms):
    records = []
    for phase, condition, values in ((0, QUIET, quiet_ms), (1, INGESTING, ingesting_ms)):
        for value in values:
            record = query(phase=phase, condition=condition, index_version=f"v{phase}")
            record.e2e_ms = value
            records.append(record)
    return records


def phases(added=40):
    jobs = [{"status": "succeeded", "counts": {"added": added // 2}, "duration_s": 2.0}] * 2
    return [PhaseRun(0, QUIET, 0.0, 100.0), PhaseRun(1, INGESTING, 100.0, 200.0, list(jobs))]


def test_each_phase_gives_the_medians_of_the_services_stage_times():
    records = load_records([1000.0] * 3, [2000.0] * 3)
    for i, record in enumerate(records):
        slow = record.phase == 1
        record.timings_ms = {"retrieve": 30.0 + i + 40 * slow, "ttft": 900.0 + 900 * slow}
        record.prompt_tokens = 500 + i
    records[0].timings_ms = {}  # an answer without timings counts in none of them

    by_phase = {p["index"]: p for p in figures.load_summary(records, phases())["phases"]}

    assert by_phase[0]["retrieve_ms_p50"] == 31.5 and by_phase[0]["ttft_ms_p50"] == 900.0
    assert by_phase[1]["retrieve_ms_p50"] == 74.0 and by_phase[1]["ttft_ms_p50"] == 1800.0
    assert by_phase[0]["prompt_tokens_p50"] == 501.0 and by_phase[1]["compress_ms_p50"] is None


def test_load_summary_per_condition_and_ratios():
    quiet = [1000.0 + i for i in range(100)]
    ingesting = [1100.0 + i for i in range(100)]

    summary = figures.load_summary(load_records(quiet, ingesting), phases())

    by = summary["conditions"]
    assert by[QUIET]["n"] == by[QUIET]["ok"] == 100 and by[QUIET]["documents_added"] == 0
    assert by[INGESTING]["documents_per_s"] == pytest.approx(0.4)
    assert by[INGESTING]["jobs"] == 2 and by[INGESTING]["job_duration_s"]["median"] == 2.0
    assert by[QUIET]["e2e_ms_p99"] == pytest.approx(1098.01)
    assert summary["p99_ratio"]["estimate"] == pytest.approx(1198.01 / 1098.01)
    assert summary["p50_ratio"]["low"] > 1
    assert [p["n"] for p in summary["phases"]] == [100, 100]
    assert summary["phases"][0]["e2e_ms_p50"] == pytest.approx(1049.5)
    assert summary["verdict"]["met"] is True and summary["verdict"]["p99_within_confidently"]


def test_the_load_goal_fails_on_a_hung_or_failed_query_or_a_slow_p99():
    quiet = [1000.0] * 50
    hung = load_records(quiet, [1000.0] * 50)
    hung[-1].status, hung[-1].error_kind = None, "hung"
    failed = load_records(quiet, [1000.0] * 50)
    failed[-1].status, failed[-1].error_kind = 503, "http_503"

    hung_summary = figures.load_summary(hung, phases())
    assert hung_summary["conditions"][INGESTING]["hung"] == 1
    assert hung_summary["verdict"]["met"] is False
    failed_summary = figures.load_summary(failed, phases())
    assert failed_summary["conditions"][INGESTING]["not_200"] == 1
    assert failed_summary["verdict"]["met"] is False
    slow = figures.load_summary(load_records(quiet, [1000.0] * 45 + [3000.0] * 5), phases())
    assert slow["verdict"]["met"] is False and slow["verdict"]["p99_within"] is False
    empty = figures.load_summary(load_records(quiet, []), phases())
    assert empty["verdict"]["met"] is False and "p99_ratio" not in empty


def test_a_ratio_reads_against_one():
    assert figures.ratio_reading({"low": 0.9, "high": 1.2}) == "no detectable difference"
    assert figures.ratio_reading({"low": 1.1, "high": 1.2}) == "higher under ingestion"
    assert figures.ratio_reading({"low": 0.5, "high": 0.9}) == "lower under ingestion"


def test_the_report_names_every_goal_and_the_document_is_json(tmp_path):
    measured = {
        "rate_per_s": 0.9,
        "rate_source": "0.45 x measured capacity",
        "setup_job": {"status": "succeeded"},
        "calibration": {
            "single_e2e_ms": figures.latency_summary([900.0, 1000.0]),
            "capacity_concurrency": 4,
            "capacity_per_s": 2.0,
        },
        "timings_s": {},
        "adds": [add_run(1.5)],
        "deletion": {
            "summary": figures.delete_summary(
                [query(["gone"])],
                [query(["x"], index_version="v2")],
                "gone",
                {"status": "succeeded", "version": "v2", "duration_s": 1.0},
            ),
            "records": [query(["x"])],
        },
        "load_records": load_records([1000.0] * 20, [1100.0] * 20),
        "phases": phases(),
        "calibration_records": [],
    }
    config = {
        "command": "python -m bench.ingestion --adds 1",
        "date": "today",
        "cpu_count": 2,
        "base": "serve_config.yaml",
        "model": "m",
        "collection": "c",
        "corpus": "data/corpus",
        "corpus_documents": 36,
        "max_tokens": 2,
        "seed": 0,
        "delete_concurrency": 4,
        "phases": 2,
        "phase_s": 100.0,
        "docs_per_job": 20,
        "passages": "3 paragraphs",
        "hung_s": 60.0,
        "warm_up_s": 60.0,
    }

    document = report.build_document(measured, config, seed=0, duration_s=600.0)
    text = report.markdown(document)

    json.dumps(document)
    assert "Goal 1 met" in text and "Goal 2 met" in text and "Goal 3 met" in text
    assert "0.9 queries/s" in text and "10.0 min" in text
    assert document["records"]["adds"][0]["misses_after_publish"] == 0
    no_delete = report.markdown(report.build_document(
        measured | {"deletion": None}, config, seed=0, duration_s=1.0))  # fmt: skip
    assert "Not measured" in no_delete


def test_warm_up_queries_count_in_no_condition():
    records = load_records([1000.0] * 10, [1000.0] * 10)
    warm = query(phase=2, condition=figures.WARM_UP)
    warm.e2e_ms = 9000.0
    warm_up = PhaseRun(2, figures.WARM_UP, -60.0, 0.0)

    summary = figures.load_summary([warm, *records], [warm_up, *phases()])

    assert summary["conditions"][QUIET]["n"] == summary["conditions"][INGESTING]["n"] == 10
    assert summary["p99_ratio"]["estimate"] == pytest.approx(1.0)
    assert summary["phases"][0]["condition"] == figures.WARM_UP
    assert summary["phases"][0]["e2e_ms_p99"] == 9000.0


def test_distinct_load_questions_do_not_recur_until_the_pool_is_spent():
    corpus = [
        {"id": "a", "text": "The first sentence is long enough. The second one is as well."},
        {"id": "b", "text": "Short. A third sentence that counts for the pool."},
    ]

    stream = inputs.load_questions("distinct", corpus, seed=0)
    first_round = [next(stream) for _ in range(3)]

    assert len(set(first_round)) == 3  # "Short." is too short to ask about
    assert all(q.startswith("What do the documents say about this: ") for q in first_round)
    assert sorted(next(stream) for _ in range(3)) == sorted(first_round)


def test_repeated_load_questions_come_from_the_fixed_set():
    stream = inputs.load_questions("repeated", [], seed=0)

    assert {next(stream) for _ in range(50)} <= set(DEFAULT_QUESTIONS)
