"""bench.engines' pure parts: the requests both sides get, the serve config of each side,
a side's summary, the paired external-against-in-ray comparison and the report, from canned
records. The sides themselves (services, vLLM's server) are not started."""

from __future__ import annotations

import pytest
import yaml

from app.config import parse_config
from bench import engines
from bench.engines import compare, markdown, point_specs, report, side_summary, verdict
from bench.loadgen import RequestRecord, request_body
from bench.overhead import Point
from bench.questions import DEFAULT_QUESTIONS
from harness.service import ROOT

BASE = ROOT / "serve_config.yaml"


def rec(index: int, ttft: float, e2e: float, *, ok: bool = True, tokens: int = 32, **fields):
    return RequestRecord(
        index, "chat", f"q{index}", ok=ok, ttft_ms=ttft, e2e_ms=e2e, output_tokens=tokens,
        send_at_ms=0.0, end_at_ms=e2e, error_kind=None if ok else "http_503", **fields,
    )  # fmt: skip


def point(side: str, records: list[RequestRecord], concurrency: int = 1, cpu_s: float = 3.0):
    return Point(side, concurrency, records, cpu_s=cpu_s, wall_s=1.0)


def args_of(path):
    document = yaml.safe_load(path.read_text())
    return document, document["applications"][0]["args"]


# --- the requests -------------------------------------------------------------------------


def test_point_specs_draw_the_same_questions_for_the_same_seed():
    first = point_specs([1, 8], 30, seed=0, model="m")
    again = point_specs([1, 8], 30, seed=0, model="m")

    assert first == again
    assert [len(specs) for specs in first.values()] == [30, 30]
    assert first[1] != first[8]  # one draw per point
    assert {spec.question for specs in first.values() for spec in specs} <= set(DEFAULT_QUESTIONS)
    assert point_specs([1], 30, seed=1, model="m")[1] != first[1]


def test_point_specs_are_streaming_chat_requests_at_temperature_0():
    spec = point_specs([1], 1, seed=0, model="smollm2-135m-instruct")[1][0]
    body = request_body(spec)

    assert spec.endpoint == "chat"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 32 and body["temperature"] == 0.0
    assert body["model"] == "smollm2-135m-instruct"
    assert body["messages"] == [{"role": "user", "content": spec.question}]


# --- the sides' configs -------------------------------------------------------------------


def test_the_in_ray_side_is_the_shipped_config_with_llmlingua_unloaded(tmp_path):
    out = engines.write_side_config(BASE, "in-ray", tmp_path / "in-ray.yaml", 8123)

    document, args = args_of(out)
    _, shipped = args_of(BASE)
    assert document["http_options"]["port"] == 8123
    assert args["compression"]["llmlingua"]["enabled"] is False
    shipped["compression"]["llmlingua"]["enabled"] = False
    assert args == shipped


def test_the_external_side_streams_from_vllm_and_changes_nothing_else(tmp_path):
    out = engines.write_side_config(BASE, "external", tmp_path / "ext.yaml", 8124, vllm_port=9001)

    document, args = args_of(out)
    config = parse_config(args)
    generator = config.generator
    assert document["http_options"]["port"] == 8124
    assert generator.engine == "openai"
    assert generator.openai is not None
    assert generator.openai.base_url == "http://127.0.0.1:9001/v1"
    assert generator.openai.read_timeout_s == config.ingress.request_timeout_s
    assert generator.deployment.num_cpus == 0.1
    assert generator.served_model_name() == generator.model_id  # vLLM's --served-model-name
    assert config.compression.llmlingua.enabled is False
    # Everything but those keys is the in-ray side's.
    in_ray = args_of(engines.write_side_config(BASE, "in-ray", tmp_path / "r.yaml", 8124))[1]
    for tree in (args, in_ray):
        tree["generator"].pop("engine", None)
        tree["generator"].pop("openai", None)
        tree["generator"]["deployment"].pop("num_cpus")
    assert args == in_ray


def test_write_side_config_refuses_an_external_side_without_its_server(tmp_path):
    with pytest.raises(ValueError, match="vllm_port"):
        engines.write_side_config(BASE, "external", tmp_path / "x.yaml", 8000)
    with pytest.raises(ValueError, match="unknown side"):
        engines.write_side_config(BASE, "sideways", tmp_path / "x.yaml", 8000)


# --- figures ------------------------------------------------------------------------------


def test_side_summary():
    records = [
        rec(0, 100.0, 410.0, usage_prompt_tokens=600, usage_cached_prompt_tokens=256),
        rec(1, 200.0, 820.0, usage_prompt_tokens=700, usage_cached_prompt_tokens=128),
        rec(2, 300.0, 930.0, usage_prompt_tokens=800),
        rec(3, 5.0, 6.0, ok=False, tokens=0),  # failed: counted, left out of the figures
    ]

    summary = side_summary(point("external", records, concurrency=8, cpu_s=2.0))

    assert (summary["side"], summary["concurrency"]) == ("external", 8)
    assert (summary["n"], summary["ok"], summary["failed"]) == (4, 3, 1)
    assert summary["errors"] == {"http_503": 1}
    assert summary["ttft_ms_p50"] == 200.0
    assert summary["ttft_ms_p95"] == pytest.approx(290.0)
    assert summary["tpot_ms_p50"] == 20.0  # (E2E - TTFT) / 31: 10, 20, 20.3
    assert summary["e2e_ms_p50"] == 820.0
    assert summary["output_tokens_per_s"] == pytest.approx(96 / 0.93)  # 3 x 32 over 930 ms
    assert summary["prompt_tokens_mean"] == 700.0
    assert summary["cached_prompt_tokens_mean"] == 192.0  # of those that reported it
    assert summary["cpu_s_per_request"] == 0.5


def test_compare_pairs_by_request_and_finds_a_slower_external_side():
    in_ray = [rec(i, 100.0 + i, 100.0 + i + 31 * 10) for i in range(30)]
    external = [rec(i, 2 * (100.0 + i), 2 * (100.0 + i) + 31 * 10) for i in range(30)]

    result = compare(point("in-ray", in_ray), point("external", external), seed=0)

    assert result["pairs"] == 30
    ttft = result["ttft_ms"]
    assert ttft["n"] == 30
    assert ttft["ratio"] == pytest.approx([2.0, 2.0, 2.0])
    assert ttft["difference_ms"][0] == pytest.approx(114.5)  # median of 100..129
    assert ttft["verdict"] == "external slower"
    assert result["tpot_ms"]["ratio"] == pytest.approx([1.0, 1.0, 1.0])
    assert result["tpot_ms"]["verdict"] == "no detectable difference"
    assert result["e2e_ms"]["verdict"] == "external slower"


def test_compare_leaves_out_pairs_with_a_failure_on_either_side():
    in_ray = [rec(0, 100, 410), rec(1, 100, 410, ok=False), rec(2, 90, 400), rec(3, 80, 390)]
    external = [rec(0, 50, 360), rec(1, 50, 360), rec(2, 45, 355, ok=False), rec(3, 40, 350)]

    result = compare(point("in-ray", in_ray), point("external", external), seed=0)

    assert result["pairs"] == 2
    assert result["ttft_ms"]["n"] == 2
    assert result["ttft_ms"]["ratio"][0] == pytest.approx(0.5)
    assert result["ttft_ms"]["verdict"] == "external faster"


def test_compare_needs_two_pairs():
    result = compare(
        point("in-ray", [rec(0, 100, 410), rec(1, 100, 410)]),
        point("external", [rec(0, 50, 360), rec(1, 50, 360, ok=False)]),
        seed=0,
    )

    assert result == {"pairs": 1, "ttft_ms": None, "tpot_ms": None, "e2e_ms": None}


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        ([1.02, 0.97, 1.08], "no detectable difference"),
        ([1.0, 1.0, 1.0], "no detectable difference"),
        ([1.2, 1.01, 1.4], "external slower"),
        ([0.8, 0.7, 0.99], "external faster"),
    ],
)
def test_verdict(ratio, expected):
    assert verdict(ratio) == expected


# --- the report ---------------------------------------------------------------------------


CONFIG = {
    "command": "python -m bench.engines --requests 3 --concurrency 1",
    "date": "2026-12-02 12:00 UTC",
    "model": "smollm2-135m-instruct",
    "requests": 3,
    "seed": 0,
}


def canned_points():
    in_ray = [rec(i, 1000.0 + 10 * i, 1000.0 + 10 * i + 3100) for i in range(3)]
    # TTFT +5, -5 and +8 ms: no consistent difference; TPOT the same on both sides.
    external = [rec(i, ttft, ttft + 3100) for i, ttft in enumerate((1005.0, 1005.0, 1028.0))]
    return {"in-ray": {1: point("in-ray", in_ray)}, "external": {1: point("external", external)}}


def test_report_holds_summaries_comparisons_and_records():
    document = report(canned_points(), CONFIG, seed=0)

    assert document["config"] == CONFIG
    assert [(row["side"], row["concurrency"]) for row in document["summary"]] == [
        ("in-ray", 1),
        ("external", 1),
    ]
    [comparison] = document["comparison"]
    assert comparison["concurrency"] == 1 and comparison["pairs"] == 3
    assert len(document["records"]["external"]["1"]) == 3
    assert document["records"]["in-ray"]["1"][0]["ttft_ms"] == 1000.0


def test_markdown_names_the_command_and_says_no_detectable_difference():
    text = markdown(report(canned_points(), CONFIG, seed=0))

    assert "`python -m bench.engines --requests 3 --concurrency 1`" in text
    assert "**Smoke run**" in text  # 3 < 30 requests per point
    assert "| 1 | in-ray | 3 / 0 | 1,010 | 1,019 | 100 | 4,110 |" in text
    assert "| 1 | external | 3 / 0 | 1,005 |" in text
    comparison = next(line for line in text.splitlines() if line.startswith("| 1 | 3 |"))
    ttft, tpot, _ = comparison.split(" | ")[2:5]
    assert ttft.endswith("(+5.0 ms): no detectable difference")
    assert tpot == "1.00x [1.00, 1.00] (+0.0 ms): no detectable difference"


def test_markdown_of_one_side_only_has_no_comparison():
    points = canned_points()
    del points["external"]

    text = markdown(report(points, CONFIG | {"requests": 30}, seed=0))

    assert "| 1 | in-ray |" in text and "external |" not in text
    assert "paired by request" not in text and "Smoke run" not in text
