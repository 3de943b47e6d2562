"""bench.quality and harness.variant: the sweep against a fake service, prepare, config variants.

The service is an httpx.MockTransport answering canned replies; every expected aggregate is
worked out by hand in the comment beside the canned reply it comes from.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.config import ConfigError, parse_config
from bench import quality
from bench.quality import SWEEPS, SweepPoint
from bench.squad import SQUAD_DEV_FILENAME
from harness.variant import VariantError, write_variant
from harness.variant import main as variant_main

REPO_ROOT = Path(__file__).resolve().parents[3]
BASE_CONFIG = REPO_ROOT / "serve_config.yaml"
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

EIFFEL = "The Eiffel Tower stands in Paris. It was finished in 1889."
SEINE = "The Seine flows through Paris into the English Channel."
WHERE = "Where is the Eiffel Tower?"
WHEN = "When was it finished?"
END = "Where does the Seine end?"
E0, S0 = "Eiffel_Tower-0#0", "Seine-0#0"

TINY_SQUAD = {
    "version": "1.1",
    "data": [
        {
            "title": "Eiffel_Tower",
            "paragraphs": [
                {
                    "context": EIFFEL,
                    "qas": [
                        {
                            "id": "q-where",
                            "question": WHERE,
                            "answers": [
                                {"text": "Paris", "answer_start": 27},
                                {"text": "in Paris", "answer_start": 24},
                            ],
                        },
                        {
                            "id": "q-when",
                            "question": WHEN,
                            "answers": [{"text": "1889", "answer_start": 53}],
                        },
                    ],
                }
            ],
        },
        {
            "title": "Seine",
            "paragraphs": [
                {
                    "context": SEINE,
                    "qas": [
                        {
                            "id": "q-end",
                            "question": END,
                            "answers": [{"text": "the English Channel", "answer_start": 35}],
                        }
                    ],
                }
            ],
        },
    ],
}


def _reply(
    answer: str,
    sources: list[str],
    context: list[tuple[str, str]],
    tokens: tuple[int, int],
    ttft_ms: float,
    total_ms: float,
) -> dict[str, Any]:
    return {
        "answer": answer,
        "sources": sources,
        "context": context,
        "tokens": tokens,
        "ttft": ttft_ms,
        "total": total_ms,
    }


# (method, question) -> canned reply, or an HTTP status for an error.
CANNED: dict[tuple[str, str], dict[str, Any] | int] = {
    # none k=3. EM 1/3; F1 (1 + 1/3 + 0) / 3 = 4/9; recall 2/3; survival 2/3;
    # tokens before = kept = 280/3, ratio 1; citation validity (1 + 1/2) / 2 over 2 citing;
    # TTFT median of 300, 100, 200 = 200; total median of 1000, 3000, 2000 = 2000.
    ("none", WHERE): _reply(  # "Paris" after the citation is stripped: EM 1, F1 1; 1/1 valid
        f"Paris [{E0}]", [E0, S0], [(E0, EIFFEL), (S0, SEINE)], (100, 100), 300, 1000
    ),
    ("none", WHEN): _reply(  # 5 tokens vs "1889": P 1/5, R 1, F1 1/3; 1 of 2 citations valid
        f"It was finished in 1889 [{E0}] [bogus#9]",
        [E0, S0],
        [(E0, EIFFEL), (S0, SEINE)],
        (100, 100),
        100,
        3000,
    ),
    ("none", END): _reply(  # wrong paragraph retrieved: recall 0, survival 0, no citation
        "I don't know.", [E0], [(E0, EIFFEL)], (80, 80), 200, 2000
    ),
    # sentences@0.5 k=3. EM 1; F1 1; recall 1; survival 2/3; before 280/3, kept 120/3 = 40,
    # ratio 120/280 = 3/7; citation validity 1 over 1 citing; TTFT median 60; total median 600.
    ("sentences", WHERE): _reply(
        "Paris",
        [E0, S0],
        [(E0, "The Eiffel Tower stands in Paris."), (S0, "The Seine flows through Paris.")],
        (100, 50),
        50,
        500,
    ),
    ("sentences", WHEN): _reply(  # right answer, but the gold was compressed away
        "1889", [E0, S0], [(E0, "The Eiffel Tower stands in Paris.")], (100, 40), 70, 700
    ),
    ("sentences", END): _reply(  # "english channel" both sides after normalisation
        f"English Channel [{S0}]", [S0, E0], [(S0, "into the English Channel.")], (80, 30), 60, 600
    ),
    # llmlingua@0.5 k=3, 2 answered, 1 error. EM 1/2; F1 (1 + 2/3) / 2 = 5/6; recall 1;
    # survival 1; before (100 + 80) / 2 = 90, kept (60 + 40) / 2 = 50, ratio 100/180 = 5/9;
    # no citations; TTFT median of 400, 500 = 450; total median 4500.
    ("llmlingua", WHERE): 503,
    ("llmlingua", WHEN): _reply("1889", [E0, S0], [(E0, "finished 1889")], (100, 60), 400, 4000),
    ("llmlingua", END): _reply(  # "channel" vs "english channel": P 1, R 1/2, F1 2/3
        "Channel", [S0], [(S0, "Seine flows English Channel")], (80, 40), 500, 5000
    ),
}

EXPECTED_SUMMARY: dict[str, dict[str, float | int | None]] = {
    "none k=3": {
        "answered": 3,
        "errors": 0,
        "exact_match": 1 / 3,
        "f1": 4 / 9,
        "recall": 2 / 3,
        "answer_survival": 2 / 3,
        "context_tokens_before_mean": 280 / 3,
        "context_tokens_kept_mean": 280 / 3,
        "kept_ratio": 1.0,
        "citation_validity": 0.75,
        "citing_answers": 2,
        "ttft_ms_median": 200.0,
        "total_ms_median": 2000.0,
    },
    "sentences@0.5 k=3": {
        "answered": 3,
        "errors": 0,
        "exact_match": 1.0,
        "f1": 1.0,
        "recall": 1.0,
        "answer_survival": 2 / 3,
        "context_tokens_before_mean": 280 / 3,
        "context_tokens_kept_mean": 40.0,
        "kept_ratio": 3 / 7,
        "citation_validity": 1.0,
        "citing_answers": 1,
        "ttft_ms_median": 60.0,
        "total_ms_median": 600.0,
    },
    "llmlingua@0.5 k=3": {
        "answered": 2,
        "errors": 1,
        "exact_match": 0.5,
        "f1": 5 / 6,
        "recall": 1.0,
        "answer_survival": 1.0,
        "context_tokens_before_mean": 90.0,
        "context_tokens_kept_mean": 50.0,
        "kept_ratio": 5 / 9,
        "citation_validity": None,
        "citing_answers": 0,
        "ttft_ms_median": 450.0,
        "total_ms_median": 4500.0,
    },
}


class FakeService:
    """Answers /readyz and /v1/rag/query from CANNED, recording every request."""

    def __init__(self, ready: bool = True, doc_id: str | None = None) -> None:
        self.ready = ready
        self.doc_id = doc_id  # replaces every source's doc_id, to mimic another index
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/readyz":
            return httpx.Response(200 if self.ready else 503, json={"ready": self.ready})
        assert request.method == "POST" and request.url.path == "/v1/rag/query"
        body = json.loads(request.content)
        canned = CANNED[(body["compression"]["method"], body["question"])]
        if isinstance(canned, int):
            error = {"message": "compressor queue is full (request id r-1)", "type": "busy"}
            return httpx.Response(canned, json={"error": {**error, "param": None, "code": 503}})
        before, after = canned["tokens"]
        return httpx.Response(
            200,
            json={
                "id": "r-1",
                "answer": canned["answer"],
                "sources": [
                    {
                        "id": chunk_id,
                        "doc_id": self.doc_id or chunk_id.split("#")[0],
                        "title": "t",
                        "score": 0.5,
                    }
                    for chunk_id in canned["sources"]
                ],
                "compression_method": body["compression"]["method"],
                "context_truncated": False,
                "finish_reason": "stop",
                "usage": {
                    "prompt_tokens": 300 + after,
                    "cached_prompt_tokens": 256,
                    "context_tokens_before": before,
                    "context_tokens_after": after,
                    "completion_tokens": 4,
                },
                "timings_ms": {
                    "retrieve": 10.0,
                    "compress": 5.0,
                    "ttft": canned["ttft"],
                    "total": canned["total"],
                },
                "tpot_ms": 20.0,
                "context": [{"id": cid, "text": text} for cid, text in canned["context"]],
            },
        )

    @property
    def queries(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path == "/v1/rag/query"]


@pytest.fixture
def squad_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / SQUAD_DEV_FILENAME).write_text(json.dumps(TINY_SQUAD), encoding="utf-8")
    return cache


def _run(service: FakeService, cache: Path, out: Path, *extra: str, questions: int = 3) -> int:
    client = httpx.Client(base_url="http://service.test", transport=httpx.MockTransport(service))
    argv = [
        "run",
        "--url",
        "http://service.test",
        "--questions",
        str(questions),
        "--seed",
        "0",
        "--sweep",
        "quick",
        "--max-tokens",
        "32",
        "--cache",
        str(cache),
        "--out",
        str(out),
        "--label",
        "tiny",
        *extra,
    ]
    with client:
        return quality.main(argv, client=client)


# --- run -------------------------------------------------------------------------------------


def test_run_aggregates_each_point_as_computed_by_hand(squad_cache, tmp_path):
    assert _run(FakeService(), squad_cache, tmp_path / "out") == 0

    report = json.loads((tmp_path / "out" / "tiny.json").read_text())
    summary = {row["point"]: row for row in report["summary"]}
    assert list(summary) == list(EXPECTED_SUMMARY)
    for point, expected in EXPECTED_SUMMARY.items():
        for key, value in expected.items():
            assert summary[point][key] == (value if value is None else pytest.approx(value)), (
                point,
                key,
            )
        assert summary[point]["questions"] == 3

    assert len(report["results"]) == 9
    (failed,) = [r for r in report["results"] if r["error"]]
    assert (failed["point"], failed["question_id"], failed["status_code"]) == (
        "llmlingua@0.5 k=3",
        "q-where",
        503,
    )
    assert "compressor queue is full" in failed["error"]
    assert failed["f1"] is None and failed["context_tokens_after"] is None
    when_none = next(
        r for r in report["results"] if r["point"] == "none k=3" and r["question_id"] == "q-when"
    )
    assert when_none["citations"] == 2 and when_none["citation_validity"] == 0.5
    assert when_none["source_doc_ids"] == ["Eiffel_Tower-0", "Seine-0"]
    assert report["config"]["questions_sampled"] == 3
    assert "api_key" not in json.dumps(report["config"])


def test_run_sends_each_sweep_points_options_one_request_per_question(squad_cache, tmp_path):
    service = FakeService()
    assert _run(service, squad_cache, tmp_path / "out", "--api-key", "k-secret") == 0

    assert service.requests[0].url.path == "/readyz"
    assert len(service.queries) == 9  # 3 questions x 3 points, the 503 not retried
    compressions = [json.loads(r.content)["compression"] for r in service.queries]
    assert compressions == (
        [{"method": "none", "policy": "always"}] * 3
        + [{"method": "sentences", "rate": 0.5, "policy": "always"}] * 3
        + [{"method": "llmlingua", "rate": 0.5, "policy": "always"}] * 3
    )
    for request in service.queries:
        body = json.loads(request.content)
        assert body["include_context"] is True
        assert body["temperature"] == 0
        assert body["top_k"] == 3
        assert body["max_tokens"] == 32
        assert request.headers["authorization"] == "Bearer k-secret"
    asked = [json.loads(r.content)["question"] for r in service.queries[:3]]
    assert sorted(asked) == sorted([WHERE, WHEN, END])


def test_run_asks_the_named_collection_and_only_then(squad_cache, tmp_path):
    service = FakeService()
    assert _run(service, squad_cache, tmp_path / "default") == 0
    assert all("collection" not in json.loads(r.content) for r in service.queries)
    service = FakeService()
    assert _run(service, squad_cache, tmp_path / "mine", "--collection", "notes") == 0
    assert {json.loads(r.content)["collection"] for r in service.queries} == {"notes"}


def test_run_writes_json_markdown_and_plot_only_with_matplotlib(squad_cache, tmp_path, caplog):
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="bench.quality"):
        assert _run(FakeService(), squad_cache, out) == 0

    assert (out / "tiny.json").is_file()
    table = (out / "tiny.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "k=3" in line]
    assert [row.split(" | ")[0] for row in rows] == [
        "| none k=3",
        "| sentences@0.5 k=3",
        "| llmlingua@0.5 k=3",
        # Then each point against none, paired on the questions both answered.
        "| sentences@0.5 k=3 − none k=3",
        "| llmlingua@0.5 k=3 − none k=3",
    ]
    assert rows[4].split(" | ")[1] == "2"  # llmlingua answered 2 of the 3 questions
    assert [c["a"] for c in json.loads((out / "tiny.json").read_text())["comparisons"]] == [
        "sentences@0.5 k=3",
        "llmlingua@0.5 k=3",
    ]
    # sentences: F1 1.000, kept ratio 3/7 = 0.43, citation validity 1.000 over 1 answer
    assert "| 1.000 | 1.000 | 1.000 | 0.667 | 93 → 40 | 0.43 | 1.000 (1) | 60 | 600 |" in rows[1]
    assert "| 2/3 | 1 |" in rows[2]
    assert (out / "tiny.png").is_file() == HAS_MATPLOTLIB
    if not HAS_MATPLOTLIB:
        assert "matplotlib is not importable" in caplog.text


def test_run_records_a_timeout_once_and_goes_on(squad_cache, tmp_path):
    calls: list[str] = []

    def timing_out(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/readyz":
            return httpx.Response(200)
        raise httpx.ReadTimeout("timed out", request=request)

    client = httpx.Client(base_url="http://s.test", transport=httpx.MockTransport(timing_out))
    argv = ["run", "--questions", "1", "--cache", str(squad_cache)]
    argv += ["--out", str(tmp_path / "out"), "--label", "t", "--timeout-s", "1"]
    with client:
        assert quality.main(argv, client=client) == 0

    assert calls.count("/v1/rag/query") == 3  # one per point, none retried
    report = json.loads((tmp_path / "out" / "t.json").read_text())
    assert all(r["error"].startswith("ReadTimeout") for r in report["results"])
    assert [(s["answered"], s["errors"], s["f1"]) for s in report["summary"]] == [(0, 1, None)] * 3


def test_run_stops_before_querying_when_the_service_is_not_ready(squad_cache, tmp_path, capsys):
    service = FakeService(ready=False)
    assert _run(service, squad_cache, tmp_path / "out") == 1
    assert service.queries == []
    assert "not ready" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_run_stops_at_the_first_answer_from_another_index(squad_cache, tmp_path, capsys):
    service = FakeService(doc_id="prefix-caching")
    assert _run(service, squad_cache, tmp_path / "out") == 1
    assert len(service.queries) == 1
    assert "not SQuAD paragraphs" in capsys.readouterr().err


def test_run_without_the_cached_set_points_at_prepare(tmp_path, capsys):
    assert _run(FakeService(), tmp_path / "empty", tmp_path / "out") == 1
    assert "bench.quality prepare" in capsys.readouterr().err


def test_sweeps_hold_the_points_asked_for():
    quick = ["none k=3", "sentences@0.5 k=3", "llmlingua@0.5 k=3"]
    assert [p.name for p in SWEEPS["quick"]] == quick
    full = {(p.method, p.rate, p.top_k) for p in SWEEPS["full"]}
    methods = [
        ("none", None),
        ("sentences", 0.5),
        ("sentences", 0.33),
        ("llmlingua", 0.5),
        ("llmlingua", 0.33),
        ("sentences+llmlingua", 0.33),
    ]
    # Every method at k=3; the main ones at k=5 too; no duplicates.
    assert len(SWEEPS["full"]) == len(full) == 9
    assert {(m, r, 3) for m, r in methods} <= full
    assert {("none", None, 5), ("sentences", 0.5, 5), ("llmlingua", 0.5, 5)} <= full
    assert {(p.method, p.rate) for p in SWEEPS["qwen"]} <= set(methods)
    # The reader comparison: one point per method at top-5, rate 0.5.
    assert [p.name for p in SWEEPS["reader"]] == [
        "none k=5",
        "sentences@0.5 k=5",
        "llmlingua@0.5 k=5",
    ]
    assert SweepPoint("sentences+llmlingua", 0.33, 5).compression() == {
        "method": "sentences+llmlingua",
        "rate": 0.33,
        "policy": "always",
    }


# --- prepare ---------------------------------------------------------------------------------


class FakeBuild:
    """Stands in for subprocess.run of retrieval.build: records the command, writes an index."""

    def __init__(self, returncode: int = 0) -> None:
        self.returncode = returncode
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.commands.append(command)
        if self.returncode == 0:
            index = Path(command[command.index("--output") + 1])
            index.mkdir(parents=True)
            (index / "index.faiss").write_bytes(b"faiss")
            manifest = {"num_chunks": 2, "num_sentences": 3, "index": {"kind": "flat"}}
            manifest["extra"] = {"num_documents": 2}
            (index / "manifest.json").write_text(json.dumps(manifest))
        return subprocess.CompletedProcess(command, self.returncode)


@pytest.fixture
def fake_fetch(monkeypatch) -> list[Path]:
    fetched: list[Path] = []

    def fetch(cache_dir: Path) -> Path:
        fetched.append(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        target = cache_dir / SQUAD_DEV_FILENAME
        target.write_text(json.dumps(TINY_SQUAD), encoding="utf-8")
        return target

    monkeypatch.setattr(quality, "fetch_squad_dev", fetch)
    return fetched


def test_prepare_builds_the_index_with_the_projects_command_once(
    tmp_path, monkeypatch, fake_fetch, capsys
):
    build = FakeBuild()
    monkeypatch.setattr(quality.subprocess, "run", build)
    cache, index = tmp_path / "squad", tmp_path / "indexes" / "squad-dev"
    argv = ["prepare", "--cache", str(cache), "--index", str(index)]

    assert quality.main(argv) == 0
    expected_command = [
        sys.executable,
        "-m",
        "retrieval.build",
        "--input",
        str(cache / "corpus"),
        "--output",
        str(index),
    ]
    assert build.commands == [expected_command]
    assert fake_fetch == [cache]
    corpus = (cache / "corpus" / "squad-dev.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in corpus] == ["Eiffel_Tower-0", "Seine-0"]
    first = capsys.readouterr().out
    assert "retrieval.build --input" in first
    assert "manifest: 2 documents, 2 chunks, 3 sentences, flat index" in first

    assert quality.main(argv) == 0  # the index exists now: nothing is built
    assert build.commands == [expected_command]
    assert "already built" in capsys.readouterr().out


def test_prepare_reports_a_failed_build(tmp_path, monkeypatch, fake_fetch, capsys):
    monkeypatch.setattr(quality.subprocess, "run", FakeBuild(returncode=3))
    argv = ["prepare", "--cache", str(tmp_path / "c"), "--index", str(tmp_path / "i")]
    assert quality.main(argv) == 1
    assert "failed with exit 3" in capsys.readouterr().err


# --- variant ---------------------------------------------------------------------------------


def test_write_variant_applies_nested_overrides_and_sets_the_port(tmp_path):
    base_text = BASE_CONFIG.read_text()
    out = write_variant(
        BASE_CONFIG,
        {
            "retriever.index_path": "indexes/squad-dev",
            "generator.model_source": ".models/qwen2.5-0.5b-instruct",
            "generator.model_id": "qwen",
            "generator.engine_kwargs.dtype": "bfloat16",
            "retriever.nprobe": 4,  # not in the base file: the mapping entry is created
        },
        tmp_path / "variants" / "squad.yaml",
        port=8123,
    )

    document = yaml.safe_load(out.read_text())
    args = document["applications"][0]["args"]
    assert args["retriever"]["index_path"] == "indexes/squad-dev"
    assert args["retriever"]["nprobe"] == 4
    assert args["retriever"]["embedding"]["model"].startswith("python-package:")  # siblings kept
    assert args["generator"]["model_id"] == "qwen"
    assert args["generator"]["model_source"] == ".models/qwen2.5-0.5b-instruct"
    assert args["generator"]["engine_kwargs"]["dtype"] == "bfloat16"
    assert args["generator"]["engine_kwargs"] == {"dtype": "bfloat16"}  # over the defaults
    assert document["http_options"] == {"host": "127.0.0.1", "port": 8123}
    assert document["applications"][0]["import_path"] == "deployments.builder:build_app"
    assert parse_config(args).retriever.nprobe == 4
    assert BASE_CONFIG.read_text() == base_text


def test_write_variant_rejects_an_unknown_key_naming_it(tmp_path):
    out = tmp_path / "bad.yaml"
    with pytest.raises(ConfigError, match=r"unknown key 'retriever\.topk'"):
        write_variant(BASE_CONFIG, {"retriever.topk": 3}, out)
    with pytest.raises(ConfigError, match=r"'retriever\.default_top_k'"):
        write_variant(BASE_CONFIG, {"retriever.default_top_k": 0}, out)
    with pytest.raises(VariantError, match=r"'retriever\.index_path' is a str"):
        write_variant(BASE_CONFIG, {"retriever.index_path.deeper": 1}, out)
    assert not out.exists()


def test_variant_cli_reads_values_as_yaml_scalars(tmp_path, capsys):
    out = tmp_path / "v.yaml"
    argv = ["--base", str(BASE_CONFIG), "--out", str(out), "--port", "8001"]
    argv += ["--set", "retriever.default_top_k=3", "--set", "compression.llmlingua.enabled=false"]
    argv += ["--set", "compression.rate=0.33"]
    assert variant_main(argv) == 0
    document = yaml.safe_load(out.read_text())
    compression = document["applications"][0]["args"]["compression"]
    assert document["applications"][0]["args"]["retriever"]["default_top_k"] == 3
    assert compression["llmlingua"]["enabled"] is False
    assert compression["rate"] == 0.33
    assert document["http_options"]["port"] == 8001

    bad = ["--base", str(BASE_CONFIG), "--out", str(tmp_path / "x.yaml")]
    assert variant_main([*bad, "--set", "generator.modelid=x"]) == 2
    assert "unknown key 'generator.modelid'" in capsys.readouterr().err


def test_a_preset_sets_its_overrides_and_set_overrides_them(tmp_path):
    out = tmp_path / "v.yaml"
    argv = ["--base", str(BASE_CONFIG), "--out", str(out), "--preset", "int8"]
    assert variant_main([*argv, "--set", "generator.engine_kwargs.dtype=float32"]) == 0
    generator = yaml.safe_load(out.read_text())["applications"][0]["args"]["generator"]
    assert generator["model_id"] == "qwen2.5-coder-1.5b-instruct-w8a8-rtn"
    assert generator["model_source"] == ".models/qwen2.5-coder-1.5b-instruct-w8a8-rtn"
    assert generator["engine_kwargs"]["dtype"] == "float32"
    with pytest.raises(SystemExit):
        variant_main([*argv[:4], "--preset", "int3"])


def test_any_squad_format_file_can_be_prepared_and_run(tmp_path, monkeypatch, fake_fetch):
    other = tmp_path / "my-set.json"
    other.write_text(json.dumps(TINY_SQUAD), encoding="utf-8")
    build = FakeBuild()
    monkeypatch.setattr(quality.subprocess, "run", build)
    cache, index = tmp_path / "squad", tmp_path / "indexes" / "my-set"
    argv = ["prepare", "--cache", str(cache), "--index", str(index), "--squad-file", str(other)]

    assert quality.main(argv) == 0
    assert fake_fetch == []  # nothing downloaded
    assert build.commands[0][build.commands[0].index("--input") + 1] == str(cache / "corpus-my-set")
    assert (cache / "corpus-my-set" / "my-set.jsonl").is_file()

    empty_cache = tmp_path / "no-dev-here"
    out = tmp_path / "out"
    assert _run(FakeService(), empty_cache, out, "--squad-file", str(other)) == 0
    assert json.loads((out / "tiny.json").read_text())["results"]


# --- interleaving, method subsets, checkpoint and resume ------------------------------------


def _asked(service: FakeService) -> list[tuple[str, str]]:
    bodies = [json.loads(r.content) for r in service.queries]
    return [(b["compression"]["method"], b["question"]) for b in bodies]


def test_interleave_asks_question_by_question_with_the_points_in_abba_turn(squad_cache, tmp_path):
    service = FakeService()
    assert _run(service, squad_cache, tmp_path / "out", "--interleave") == 0

    asked = _asked(service)
    questions = [question for _, question in asked[::3]]
    assert sorted(questions) == sorted([WHERE, WHEN, END])
    forwards = ["none", "sentences", "llmlingua"]
    assert asked == [
        (method, question)
        for i, question in enumerate(questions)
        for method in (forwards if i % 2 == 0 else forwards[::-1])
    ]


def test_methods_keep_only_those_points_of_the_sweep(squad_cache, tmp_path):
    service = FakeService()
    assert _run(service, squad_cache, tmp_path / "out", "--methods", "none", "sentences") == 0

    assert {method for method, _ in _asked(service)} == {"none", "sentences"}
    report = json.loads((tmp_path / "out" / "tiny.json").read_text())
    assert [s["point"] for s in report["summary"]] == ["none k=3", "sentences@0.5 k=3"]
    with pytest.raises(quality.QualityError, match="no point of the methods"):
        quality.select_points("quick", ["sentences+llmlingua"])


class InterruptedService(FakeService):
    """Answers `answers` queries, then the operator presses Ctrl-C."""

    def __init__(self, answers: int) -> None:
        super().__init__()
        self.answers = answers

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/readyz" and len(self.queries) >= self.answers:
            raise KeyboardInterrupt
        return super().__call__(request)


def test_ctrl_c_writes_what_was_done_and_resume_asks_only_the_rest(squad_cache, tmp_path):
    out = tmp_path / "out"
    first = InterruptedService(answers=4)
    assert _run(first, squad_cache, out, "--interleave") == 0

    stopped = json.loads((out / "tiny.json").read_text())
    assert stopped["config"]["stopped_early"] is True
    assert len(stopped["results"]) == 4
    assert "Stopped early" in (out / "tiny.md").read_text()
    checkpoint = out / "tiny.partial.jsonl"
    assert len(checkpoint.read_text().splitlines()) == 4

    second = FakeService()
    assert _run(second, squad_cache, out, "--interleave", "--resume") == 0

    done_first = _asked(first)[:4]
    assert len(second.queries) == 5
    assert not set(_asked(second)) & set(done_first)
    finished = json.loads((out / "tiny.json").read_text())
    assert finished["config"]["stopped_early"] is False
    assert finished["config"]["resumed_results"] == 4
    assert len(finished["results"]) == 9
    assert len({(r["point"], r["question_id"]) for r in finished["results"]}) == 9
    assert not checkpoint.exists()


def test_a_run_without_resume_starts_afresh(squad_cache, tmp_path):
    out = tmp_path / "out"
    assert _run(InterruptedService(answers=2), squad_cache, out) == 0
    service = FakeService()
    assert _run(service, squad_cache, out) == 0
    assert len(service.queries) == 9
    assert not (out / "tiny.partial.jsonl").exists()


def test_resume_refuses_a_checkpoint_of_another_sample(squad_cache, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(InterruptedService(answers=3), squad_cache, out, "--interleave") == 0
    checkpoint = out / "tiny.partial.jsonl"
    row = json.loads(checkpoint.read_text().splitlines()[0])
    checkpoint.write_text(json.dumps({**row, "question_id": "q-elsewhere"}) + "\n")

    service = FakeService()
    assert _run(service, squad_cache, out, "--resume") == 1
    assert "q-elsewhere is not in this run's sample" in capsys.readouterr().err
    assert service.queries == []


def test_answers_that_reach_max_tokens_are_counted(squad_cache, tmp_path):
    out = tmp_path / "out"
    # The fake service's answers are 4 completion tokens long.
    assert _run(FakeService(), squad_cache, out, "--max-tokens", "4") == 0
    capped = json.loads((out / "tiny.json").read_text())["summary"]
    assert [(s["at_cap"], s["answered"]) for s in capped] == [(3, 3), (3, 3), (2, 2)]
    assert _run(FakeService(), squad_cache, out, "--max-tokens", "5") == 0
    uncapped = json.loads((out / "tiny.json").read_text())["summary"]
    assert [s["at_cap"] for s in uncapped] == [0, 0, 0]


class ConcurrentService(FakeService):
    """FakeService that holds each query a moment and records the most held at once."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most_in_flight = 0
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(0.05)
        try:
            return super().__call__(request)
        finally:
            with self.lock:
                self.in_flight -= 1


def test_concurrency_keeps_that_many_requests_in_flight_and_records_every_one(
    squad_cache, tmp_path
):
    one, three = FakeService(), ConcurrentService()
    assert _run(one, squad_cache, tmp_path / "one") == 0
    assert _run(three, squad_cache, tmp_path / "three", "--concurrency", "3") == 0

    assert three.most_in_flight == 3
    in_turn = json.loads((tmp_path / "one" / "tiny.json").read_text())
    at_once = json.loads((tmp_path / "three" / "tiny.json").read_text())
    assert at_once["config"]["concurrency"] == 3
    assert at_once["summary"] == in_turn["summary"]
    key = lambda r: (r["point"], r["question_id"])  # noqa: E731
    assert sorted(map(key, at_once["results"])) == sorted(map(key, in_turn["results"]))
    assert {r["finish_reason"] for r in at_once["results"] if not r["error"]} == {"stop"}


def test_attributions_pair_each_cited_answer_sentence_with_its_source_sentence():
    from app.schemas import CitationInfo, ContextPassage, RagQueryResponse

    answer = "It opened in 1889. It is in Paris."
    passage = "The tower opened in 1889. It stands on the Champ de Mars."
    reply = RagQueryResponse.model_construct(
        answer=answer,
        context=[ContextPassage(id="eiffel#0", text=passage)],
        citations=[
            CitationInfo(answer_span=(0, 18), source_id="eiffel#0", source_span=(0, 25), score=0.8),
            CitationInfo(answer_span=(19, 34), source_id="gone#1", source_span=(0, 5), score=0.5),
        ],
    )
    assert quality.attributions(reply) == [
        {"answer_sentence": "It opened in 1889.", "source_id": "eiffel#0",
         "source_sentence": "The tower opened in 1889.", "score": 0.8}
    ]  # fmt: skip
    assert quality.attributions(RagQueryResponse.model_construct(answer="x", citations=None,
                                                                 context=None)) == []  # fmt: skip
