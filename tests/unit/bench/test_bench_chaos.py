"""bench.chaos' pure parts: the request specs, the per-run summary, the recovery time read
from the /readyz log, the report, and wait_replicas against a local fake /readyz (with a
fake clock, so its half-second pauses cost nothing). No scenario is run: they start Ray."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from bench import chaos
from bench.chaos import ReadinessLog
from bench.loadgen import RequestRecord
from bench.tables import markdown_table

# The header row of every outcome table.
OUTCOMES_HEADER = markdown_table(chaos.OUTCOME_HEADER, []).splitlines()[0]


def rec(index: int, **fields) -> RequestRecord:
    return RequestRecord(index, "rag", f"q{index}", **fields)


def records() -> list[RequestRecord]:
    """Two successes, two clean refusals, a 500, a hung request and one never sent; the run
    spans 0 ms (first send) to 4,000 ms (last end)."""
    return [
        rec(0, ok=True, status=200, send_at_ms=0.0, end_at_ms=1000.0, e2e_ms=1000.0),
        rec(1, ok=True, status=200, send_at_ms=100.0, end_at_ms=2100.0, e2e_ms=2000.0),
        rec(2, status=503, error_kind="http_503", error_code="overloaded", retry_after="1",
            send_at_ms=200.0, end_at_ms=205.0, e2e_ms=5.0),
        rec(3, status=429, error_kind="http_429", error_code="rate_limited", retry_after="2",
            send_at_ms=300.0, end_at_ms=315.0, e2e_ms=15.0),
        rec(4, status=500, error_kind="http_500", error_code="internal_error", error="boom",
            send_at_ms=400.0, end_at_ms=450.0, e2e_ms=50.0),
        rec(5, status=200, error_kind="timeout", error="no complete response",
            send_at_ms=500.0, end_at_ms=4000.0, e2e_ms=3500.0),
        rec(6, error_kind="not_sent", error="the run's deadline passed"),
    ]  # fmt: skip


def readiness() -> ReadinessLog:
    return ReadinessLog([(0.0, 200, {}), (0.5, 503, {}), (1.0, 200, {}), (1.5, 200, {})])


# --- specs --------------------------------------------------------------------------------


def test_specs_are_distinct_rag_questions_with_the_offset_in_them():
    specs = chaos.specs(len(chaos.QUESTIONS) + 2, offset=10)

    assert len(specs) == len(chaos.QUESTIONS) + 2
    assert {spec.endpoint for spec in specs} == {"rag"}
    assert {spec.max_tokens for spec in specs} == {chaos.MAX_TOKENS}
    assert specs[0].question == f"{chaos.QUESTIONS[0]} (#10)"
    cycled = len(chaos.QUESTIONS) + 1
    assert specs[cycled].question == f"{chaos.QUESTIONS[1]} (#{10 + cycled})"  # they cycle
    assert len({spec.question for spec in specs}) == len(specs)
    # Different offsets never repeat a prompt.
    assert not {s.question for s in chaos.specs(8)} & {s.question for s in specs}
    assert chaos.specs(0) == []


# --- summary ------------------------------------------------------------------------------


def test_summary_of_a_run():
    result = chaos.summary(records(), readiness())

    assert result["sent"] == 6
    assert (result["succeeded"], result["refused"], result["interrupted"]) == (2, 2, 0)
    assert (result["failed"], result["hung"], result["not_sent"]) == (1, 1, 1)
    assert result["reject_ms_p50"] == 10.0
    assert result["reject_ms_p99"] == pytest.approx(14.9)  # 5 + 0.99 * 10
    assert result["admitted_e2e_ms_p50"] == 1500.0
    assert result["admitted_e2e_ms_p99"] == pytest.approx(1990.0)
    assert result["throughput_rps"] == pytest.approx(0.5)  # 2 answers over 4 s
    assert result["ready_share"] == 0.75
    assert result["failures"] == [
        "#4 500 http_500 boom",
        "#5 200 timeout no complete response",
    ]
    assert result["codes"] == [
        "200:None",
        "429:rate_limited",
        "500:internal_error",
        "503:overloaded",
        "None:None",
    ]
    # Every request's record beside the summary, each field as the client saw it.
    assert [r["index"] for r in result["records"]] == [r.index for r in records()]
    assert result["records"][4]["status"] == 500 and "ttft_ms" in result["records"][0]
    json.dumps(result)  # written to docs/results as it is


def test_summary_of_nothing_sent():
    result = chaos.summary([rec(0, error_kind="not_sent")], ReadinessLog())

    assert result["sent"] == 0 and result["not_sent"] == 1
    assert result["throughput_rps"] is None
    assert result["reject_ms_p50"] is None and result["admitted_e2e_ms_p99"] is None
    assert result["ready_share"] is None
    assert chaos.summary([], ReadinessLog())["throughput_rps"] is None


# --- _recovery_s --------------------------------------------------------------------------


def log_of(*generator_counts: int | None) -> ReadinessLog:
    """One poll every second; None stands for a failed poll."""
    return ReadinessLog(
        [
            (float(t), None if n is None else 200, {} if n is None else {"generator": n})
            for t, n in enumerate(generator_counts)
        ]
    )


def test_recovery_is_from_the_kill_to_the_stage_being_whole_in_the_log():
    #               0  1  2  3     4  5  6
    log = log_of(2, 2, 2, 1, None, 1, 2)
    assert chaos._recovery_s(log, "generator", struck=2.5, waited_after_run=99.0) == 3.5


def test_recovery_waits_out_a_view_that_still_lags():
    # Two ingress replicas answer /readyz from their own views: one can show the stage
    # whole again while the other still counts it short.
    #               0  1  2  3  4  5  6
    log = log_of(2, 2, 1, 2, 1, 2, 2)
    assert chaos._recovery_s(log, "generator", struck=1.5, waited_after_run=None) == 3.5


def test_recovery_ignores_a_dip_before_the_kill():
    log = log_of(1, 2, 2, 1, 2)
    assert chaos._recovery_s(log, "generator", struck=1.5, waited_after_run=None) == 2.5


def test_recovery_not_seen_in_the_log_adds_the_wait_after_the_run():
    down_for_good = log_of(2, 2, 1, 1, 1)  # last sample at 4 s
    assert chaos._recovery_s(down_for_good, "generator", 1.5, waited_after_run=6.0) == 8.5
    never_seen_down = log_of(2, 2, 2, 2)  # the kill did not show while the load ran
    assert chaos._recovery_s(never_seen_down, "generator", 1.0, waited_after_run=2.0) == 4.0
    assert chaos._recovery_s(ReadinessLog(), "generator", 3.0, waited_after_run=2.0) == 2.0


def test_no_recovery_at_all_is_none():
    assert chaos._recovery_s(log_of(2, 1, 1), "generator", 0.5, waited_after_run=None) is None


def test_recovery_reads_only_the_given_stage():
    log = ReadinessLog([(0.0, 200, {"retriever": 2}), (1.0, 200, {"retriever": 1})])
    assert chaos._recovery_s(log, "generator", 0.5, waited_after_run=None) is None
    assert chaos._recovery_s(log, "retriever", 0.5, waited_after_run=1.0) == 1.5


# --- markdown -----------------------------------------------------------------------------


def results() -> dict:
    run = chaos.summary(records(), readiness())
    none = chaos.summary([], ReadinessLog())
    return {
        "date": "2025-01-02 03:04 UTC",
        "machine": "2 cores, 8 GiB, CPU only",
        "overload": {
            "in_flight_limit": 8,
            "offered_rate_rps": 5.0,
            "capacity": {**run, "throughput_rps": 0.5},
            "overload": run,
            "admitted_p99_ratio": [3.21, 2.5, 4.0],
        },
        "replica-kill": [
            {
                "target": "Retriever replica",
                "detected_after_s": 0.54,
                "recovered_after_s": 12.34,
                **none,
            },
            {
                "target": "Generator engine",
                "detected_after_s": None,
                "recovered_after_s": None,
                **run,
            },
        ],
        "node-loss": {
            "deploy_to_ready_s": 42.0,
            "placement_before": {"node_a": ["rag:Generator"], "node_b": ["rag:Retriever"]},
            "placement_after": {"node_a": ["rag:Generator", "rag:Retriever"]},
            "alive_nodes_after": 1,
            "struck_at_s": 5.0,
            "after_15s": {
                "sent": 3,
                "succeeded": 3,
                "refused": 0,
                "interrupted": 0,
                "failed": 0,
                "hung": 0,
                "not_sent": 0,
            },
            **run,
        },
        "fuzz": {
            "examples_per_operation": 100,
            "exit_code": 0,
            "generated": 400,
            "server_errors_found": False,
            "seconds": 12.4,
            "summary": "Tested 4 API operations\nNo issues found",
        },
    }


RUN_ROW = "| 6 | 2 | 2 | 0 | 1 | 1 | 10 / 15 | 1,500 / 1,990 | 75% |"


def table_after(text: str, heading: str) -> list[str]:
    """The table rows (without header and separator) of the first table after `heading`."""
    lines = text.splitlines()
    start = lines.index(heading)
    header = next(i for i in range(start, len(lines)) if lines[i].startswith("| "))
    rows = []
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_markdown_has_every_section_with_its_rows_and_figures():
    text = chaos.markdown(results(), "python -m bench.chaos --seed 0")

    assert text.startswith("# Reliability:")
    assert "Measured with `python -m bench.chaos --seed 0` on 2025-01-02 03:04 UTC" in text
    assert "(2 cores, 8 GiB, CPU only)" in text
    assert "within 120 s." in text
    assert text.count(OUTCOMES_HEADER) == 3

    assert table_after(text, "## Overload at 10x capacity") == [
        "| at capacity " + RUN_ROW,
        "| 10x overload " + RUN_ROW,
    ]
    assert "the ingress admits 8 requests in flight" in text
    assert "Poisson arrivals at 5.00 req/s, 10x the 0.50 req/s measured at capacity" in text
    assert (
        "Admitted p99 E2E under overload / at capacity: 3.21 (95% bootstrap CI 2.50 to 4.00)"
        in text
    )
    assert (
        "Refusal codes: 200:None, 429:rate_limited, 500:internal_error, 503:overloaded, "
        "None:None." in text
    )

    kills = "## kill -9 of one replica of each stage, and of one vLLM engine"
    assert table_after(text, kills) == [
        "| Retriever replica | 0 | 0 | 0 | 0 | 0 | 0 | - / - | - / - | - |",
        "| Generator engine " + RUN_ROW,
    ]
    timing = text[text.index("| target | detected after") :].splitlines()
    assert timing[2:4] == [
        "| Retriever replica | 0.5 s | 12.3 s | - |",
        "| Generator engine | - | - | 200:None, 429:rate_limited, 500:internal_error, "
        "503:overloaded, None:None |",
    ]

    assert table_after(text, "## Losing a node") == [
        "| node_b lost " + RUN_ROW,
        "| sent 15 s or more after the loss | 3 | 3 | 0 | 0 | 0 | 0 | - / - | - / - | - |",
    ]
    assert "(ready 42.0 s after the deploy)" in text
    assert 'Replicas before: `{"node_a": ["rag:Generator"], "node_b": ["rag:Retriever"]}`' in text
    assert '`{"node_a": ["rag:Generator", "rag:Retriever"]}` (1 node(s) alive)' in text

    assert "--max-examples 100` against the CPU default" in text
    assert "exit code 0 (no response >= 500), 12 s." in text
    assert "```\nTested 4 API operations\nNo issues found\n```" in text


def test_markdown_tells_the_null_engine_overload_apart():
    full = results()
    paced = full["overload"] | {"engine": "paced", "in_flight_limit": 40}
    text = chaos.markdown(
        {"date": "d", "machine": "m", "overload": full["overload"], "overload-paced": paced},
        "cmd",
    )

    headings = [line for line in text.splitlines() if line.startswith("## Overload")]
    assert headings[0] == "## Overload at 10x capacity"
    assert headings[1].startswith("## Overload at 10x capacity, with a null engine")
    assert len(headings) == 2 and text.count(OUTCOMES_HEADER) == 2
    assert "the ingress admits 40 requests in flight" in text
    assert text.count("null engine") == 2  # the heading and the sentence of the paced run


def test_markdown_says_when_the_fuzzer_found_server_errors():
    fuzz = results()["fuzz"] | {"exit_code": 1, "server_errors_found": True}
    text = chaos.markdown({"date": "d", "machine": "m", "fuzz": fuzz}, "cmd")
    assert "exit code 1 (server errors found)" in text


def test_markdown_has_only_the_sections_that_ran():
    full = results()
    text = chaos.markdown({key: full[key] for key in ("date", "machine", "overload")}, "cmd")

    assert "## Overload at 10x capacity" in text
    assert "## kill -9" not in text and "## Losing a node" not in text
    assert "## Fuzzing" not in text
    assert text.count(OUTCOMES_HEADER) == 1

    no_refusals = full["overload"] | {"overload": full["overload"]["overload"] | {"codes": []}}
    assert "Refusal codes: none." in chaos.markdown(
        {"date": "d", "machine": "m", "overload": no_refusals}, "cmd"
    )


# --- wait_replicas ------------------------------------------------------------------------


class FakeClock:
    """Stands in for bench.chaos' `time`: perf_counter moves only when it sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(chaos, "time", fake)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    return fake


@pytest.fixture
def reused_client(monkeypatch):
    """httpx.get through one client: a fresh client per call (as wait_replicas makes) costs
    ~50 ms of TLS setup, too much for the tests that poll twenty times."""
    client = httpx.Client(trust_env=False)
    monkeypatch.setattr(chaos.httpx, "get", lambda url, timeout: client.get(url, timeout=timeout))
    yield
    client.close()


def replicas(**counts: int) -> tuple[int, dict]:
    return 200, {"ready": True, "replicas": counts}


def test_wait_replicas_returns_once_every_stage_has_its_count_several_answers_in_a_row(
    clock, readyz
):
    whole = replicas(retriever=2, generator=2, compressor=0)  # the compressor is not asked
    server = readyz(
        [
            replicas(retriever=1, generator=2),
            (200, "not json"),
            (503, {"ready": False, "replicas": {"retriever": 2}}),  # no generator yet
            whole,
            replicas(retriever=0, generator=0),  # one lagging view breaks the streak
            *[whole] * chaos.WHOLE_STREAK,
        ]
    )

    waited = chaos.wait_replicas(server.url, {"retriever": 2, "generator": 2}, timeout_s=60)

    pauses = 5 + chaos.WHOLE_STREAK - 1
    assert waited == 0.5 * pauses
    assert server.gets == 5 + chaos.WHOLE_STREAK


def test_wait_replicas_takes_more_than_wanted_and_an_empty_want(clock, readyz):
    server = readyz([replicas(retriever=3)])
    streak_s = 0.5 * (chaos.WHOLE_STREAK - 1)
    assert chaos.wait_replicas(server.url, {"retriever": 2}) == streak_s
    assert chaos.wait_replicas(server.url, {}) == streak_s
    assert server.gets == 2 * chaos.WHOLE_STREAK


def test_wait_replicas_gives_up_when_told(clock, readyz, reused_client):
    server = readyz([replicas(retriever=1)])
    asked: list[float] = []

    def give_up() -> bool:
        asked.append(clock.now)
        return True

    assert chaos.wait_replicas(server.url, {"retriever": 2}, give_up=give_up) is None
    assert len(asked) == 1 and 10 < asked[0] <= 11  # asked every 10 s, not at every poll
    assert clock.now < 12  # long before the 300 s timeout
    assert 20 <= server.gets <= 22


def test_wait_replicas_times_out_when_the_count_never_comes(clock, readyz, reused_client):
    server = readyz([replicas(retriever=1)])
    asked: list[float] = []

    def give_up() -> bool:
        asked.append(clock.now)
        return False

    assert chaos.wait_replicas(server.url, {"retriever": 2}, 11, give_up=give_up) is None
    assert 11 <= clock.now <= 11.5
    assert len(asked) == 1  # once after 10 s
    assert server.gets == 22


def test_wait_replicas_outlives_an_unreachable_service(clock, reused_client):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert chaos.wait_replicas(f"http://127.0.0.1:{port}", {"retriever": 1}, 2) is None
    assert clock.now == 2.0


def test_the_report_names_the_folder_its_records_were_saved_to():
    text = chaos.markdown(results(), "cmd", "docs/results/reliability-passage-router/")

    assert "Raw records are in docs/results/reliability-passage-router/." in text
    assert "Raw records are in docs/results/reliability/." in chaos.markdown(results(), "cmd")


def test_each_section_names_the_reader_it_was_measured_with():
    readers = {name: f"reader of {name}" for name in chaos.SCENARIOS}
    text = chaos.markdown(results() | {"readers": readers}, "cmd")

    lines = text.splitlines()
    for heading, name in [
        ("## Overload at 10x capacity", "overload"),
        ("## kill -9 of one replica of each stage, and of one vLLM engine", "replica-kill"),
        ("## Losing a node", "node-loss"),
        ("## Fuzzing every route (schemathesis)", "fuzz"),
    ]:
        assert lines[lines.index(heading) + 2] == f"Reader: reader of {name}."


def test_a_config_names_its_model_and_what_fastest_means_on_the_cpu():
    args = {"generator": {"model_id": "m", "model_source": "/nowhere/m",
                          "engine_kwargs": {"dtype": "fastest"}}}  # fmt: skip
    assert chaos.reader_of(args, frozenset({"avx512_bf16"})) == (
        "m (vLLM, dtype fastest: bfloat16 here)"
    )
    assert chaos.reader_of(args, frozenset({"avx2"})) == "m (vLLM, dtype fastest: float32 here)"
    assert chaos.reader_of(args, None) == "m (vLLM, dtype fastest)"
    paced = {"generator": {"engine": "paced"}, "compression": {"llmlingua": {"enabled": False}}}
    assert chaos.reader_of(paced, None) == "the null engine at vLLM's pace (no model)"


def test_a_rendered_report_takes_each_reader_from_its_record_or_says_it_was_not_recorded(
    tmp_path,
):
    saved = tmp_path / "results"
    saved.mkdir()
    fuzz = results()["fuzz"]
    (saved / "fuzz.json").write_text(
        json.dumps({"measured": "then", "reader": "the run's own reader", "result": fuzz})
    )
    overload = results()["overload"]
    (saved / "overload.json").write_text(json.dumps({"measured": "before", "result": overload}))
    out = tmp_path / "reliability.md"

    argv = ["--render-only", "--out", str(out), "--results", str(saved)]
    assert chaos.main([*argv, "--work", str(tmp_path / "work")]) == 0

    text = out.read_text()
    assert "Reader: the run's own reader." in text
    from_tree = chaos.scenario_reader("overload", None)  # serve_config.yaml's, as now
    assert from_tree.endswith("(vLLM, dtype fastest)")
    assert (
        f"Reader: {from_tree}; not recorded by that run: read from serve_config.yaml as the "
        "tree holds it now." in text
    )
