"""bench.batching's pure parts and CLI, without loading any model.

The sides' subprocesses are replaced by a fake `_run_side` that returns hand-made records;
expected figures are worked out by hand in comments.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from bench import batching
from bench.batching import (
    QUESTIONS,
    Job,
    RequestRecord,
    WorkItem,
    _StepClock,
    build_workload,
    left_pad,
    markdown_table,
    render_prompt_ids,
    static_batch_records,
    static_batches,
    summarize_all,
    summarize_run,
    throughput_ratio,
    tokens_match,
    tpot_ms,
)

ROOT = Path(__file__).resolve().parents[3]


def item(index: int, tokens: int) -> WorkItem:
    return WorkItem(index, f"q{index}", tokens)


def continuous_record(index: int, tokens: int, *, ttft_ms: float, e2e_ms: float, c: int = 2):
    return RequestRecord(
        side="continuous",
        concurrency=c,
        index=index,
        prompt_tokens=30,
        output_tokens=tokens,
        start_ms=0.0,
        ttft_ms=ttft_ms,
        e2e_ms=e2e_ms,
        last_token_ms=e2e_ms,
        ttft_from_start_ms=ttft_ms,
        e2e_from_start_ms=e2e_ms,
        token_ids=list(range(tokens)),
    )


# A batch of three with targets 2, 4 and 3: the batch runs 4 steps. Queued at t=10.0 s, the
# batch starts at 10.5 s, its steps' tokens exist at 11.0, 11.1, 11.2, 11.3 s, generate returns
# at 11.35 s.
BATCH = [item(0, 2), item(1, 4), item(2, 3)]
STEPS_S = [11.0, 11.1, 11.2, 11.3]


def batch_records(**overrides):
    kwargs = {
        "concurrency": 3,
        "batch_index": 0,
        "run_start_s": 10.0,
        "start_s": 10.5,
        "step_times_s": STEPS_S,
        "end_s": 11.35,
        "prompt_tokens": [30, 31, 32],
        "token_ids": [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]],
    }
    return static_batch_records(BATCH, **{**kwargs, **overrides})


# --- workload and batching -------------------------------------------------------------------


def test_workload_is_seeded_cycles_questions_and_stays_in_bounds():
    first = build_workload(30, seed=7, min_output_tokens=16, max_output_tokens=96)
    again = build_workload(30, seed=7, min_output_tokens=16, max_output_tokens=96)
    other = build_workload(30, seed=8, min_output_tokens=16, max_output_tokens=96)

    assert first == again
    assert [w.output_tokens for w in first] != [w.output_tokens for w in other]
    assert [w.index for w in first] == list(range(30))
    assert first[0].question == QUESTIONS[0]
    assert first[len(QUESTIONS)].question == QUESTIONS[0]
    assert all(16 <= w.output_tokens <= 96 for w in first)
    # Lengths must differ within a batch, or static batching wastes nothing.
    assert len({w.output_tokens for w in first[:8]}) > 1


def test_workload_with_equal_bounds_has_one_length():
    items = build_workload(4, seed=0, min_output_tokens=5, max_output_tokens=5, questions=["a"])
    assert [(w.question, w.output_tokens) for w in items] == [("a", 5)] * 4


@pytest.mark.parametrize(
    ("n", "low", "high", "questions"),
    [(0, 1, 2, QUESTIONS), (1, 0, 2, QUESTIONS), (1, 3, 2, QUESTIONS), (1, 1, 2, [])],
)
def test_workload_rejects_bad_settings(n, low, high, questions):
    with pytest.raises(ValueError):
        build_workload(
            n, seed=0, min_output_tokens=low, max_output_tokens=high, questions=questions
        )


def test_static_batches_take_the_queue_in_order_c_at_a_time():
    items = [item(i, 4) for i in range(7)]

    batches = static_batches(items, 3)

    assert [[w.index for w in b] for b in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    assert static_batches(items, 1) == [[w] for w in items]
    assert static_batches(items, 32) == [items]
    with pytest.raises(ValueError):
        static_batches(items, 0)


def test_left_pad_pads_on_the_left_and_masks_the_padding():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)

    assert ids == [[5, 6, 7], [0, 0, 8]]
    assert mask == [[1, 1, 1], [0, 0, 1]]


# --- static timing arithmetic -----------------------------------------------------------------


def test_static_members_share_first_token_and_end_of_their_batch():
    records = batch_records()

    # TTFT = 11.0 - 10.0 s for everyone; E2E = 11.35 - 10.0 s for everyone.
    assert [r.ttft_ms for r in records] == pytest.approx([1000.0] * 3)
    assert [r.e2e_ms for r in records] == pytest.approx([1350.0] * 3)
    assert [r.start_ms for r in records] == pytest.approx([500.0] * 3)
    # From the batch's start: 11.0 - 10.5 and 11.35 - 10.5.
    assert [r.ttft_from_start_ms for r in records] == pytest.approx([500.0] * 3)
    assert [r.e2e_from_start_ms for r in records] == pytest.approx([850.0] * 3)
    # Own last token: step target-1, i.e. 11.1, 11.3 and 11.2 s.
    assert [r.last_token_ms for r in records] == pytest.approx([1100.0, 1300.0, 1200.0])
    assert [r.batch_steps for r in records] == [4, 4, 4]
    assert {r.batch for r in records} == {0}
    assert [r.token_ids for r in records] == [[1, 2], [5, 6, 7, 8], [9, 10, 11]]
    assert [r.prompt_tokens for r in records] == [30, 31, 32]
    assert {r.side for r in records} == {"static"}


def test_static_records_need_one_time_per_step_and_one_entry_per_member():
    with pytest.raises(ValueError, match="4 steps"):
        batch_records(step_times_s=STEPS_S[:3])
    with pytest.raises(ValueError, match="one entry per batch member"):
        batch_records(prompt_tokens=[30, 31])


def test_tpot_spreads_e2e_minus_ttft_over_the_tokens_after_the_first():
    records = batch_records()

    # (1350 - 1000) / (2 - 1), / (4 - 1), / (3 - 1).
    assert [tpot_ms(r) for r in records] == pytest.approx([350.0, 350.0 / 3, 175.0])
    assert tpot_ms(continuous_record(0, 1, ttft_ms=10.0, e2e_ms=10.0)) is None


def test_step_clock_skips_the_prompt_and_times_each_step():
    clock = _StepClock()
    clock.put("prompt")
    clock.put("step 1")
    clock.put("step 2")
    clock.end()

    assert len(clock.step_times_s) == 2
    assert clock.step_times_s[0] <= clock.step_times_s[1]


def test_render_prompt_ids_uses_the_chat_template_without_extra_special_tokens():
    class FakeTokenizer:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return f"<user>{messages[0]['content']}<assistant>"

        def __call__(self, text, add_special_tokens):
            assert add_special_tokens is False
            return {"input_ids": [len(text)]}

    assert render_prompt_ids(FakeTokenizer(), ["ab", "abcd"]) == [[19], [21]]


# --- summaries --------------------------------------------------------------------------------


def test_static_summary_counts_only_own_tokens_and_reports_padding():
    summary = summarize_run("static", 3, 3, batch_records())

    assert summary.completed == 3
    assert summary.duration_s == pytest.approx(1.35)
    assert summary.output_tokens == 9  # 2 + 4 + 3, not 3 x 4
    assert summary.output_tokens_per_s == pytest.approx(9 / 1.35)
    assert summary.requests_per_s == pytest.approx(3 / 1.35)
    # Padding member-steps: (4-2) + 0 + (4-3) = 3 of 12.
    assert summary.padding_steps == 3
    assert summary.padding_fraction == pytest.approx(0.25)
    assert summary.ttft_ms is not None and summary.ttft_ms.p50 == pytest.approx(1000.0)
    assert summary.e2e_ms is not None and summary.e2e_ms.p99 == pytest.approx(1350.0)
    assert summary.tpot_ms is not None and summary.tpot_ms.p50 == pytest.approx(175.0)


def test_continuous_summary_has_no_padding_and_uses_the_last_end():
    records = [
        continuous_record(0, 10, ttft_ms=100.0, e2e_ms=500.0),
        continuous_record(1, 30, ttft_ms=120.0, e2e_ms=1000.0),
    ]

    summary = summarize_run("continuous", 2, 4, records)

    assert (summary.requests, summary.completed) == (4, 2)
    assert summary.duration_s == pytest.approx(1.0)
    assert summary.output_tokens_per_s == pytest.approx(40.0)
    assert summary.padding_steps == 0 and summary.padding_fraction == 0.0
    # p50 of TTFT 100, 120 -> 110; p99 -> 100 + 0.99 * 20.
    assert summary.ttft_ms is not None
    assert summary.ttft_ms.p50 == pytest.approx(110.0)
    assert summary.ttft_ms.p99 == pytest.approx(119.8)


def test_empty_run_summarizes_to_zero_rates():
    summary = summarize_run("continuous", 8, 32, [])

    assert summary.completed == 0
    assert summary.requests_per_s == 0.0 and summary.output_tokens_per_s == 0.0
    assert summary.ttft_ms is None and summary.tpot_ms is None


def test_summaries_and_ratio_follow_concurrency_then_side():
    records = [
        *batch_records(concurrency=2),
        continuous_record(0, 2, ttft_ms=100.0, e2e_ms=300.0),
        continuous_record(1, 4, ttft_ms=100.0, e2e_ms=500.0),
        continuous_record(2, 3, ttft_ms=350.0, e2e_ms=675.0),
    ]

    summaries = summarize_all(records, [2, 1], 3)

    assert [(s.concurrency, s.side) for s in summaries] == [
        (2, "static"),
        (2, "continuous"),
        (1, "static"),
        (1, "continuous"),
    ]
    # Same 9 tokens in 0.675 s against 1.35 s.
    assert throughput_ratio(summaries, 2) == pytest.approx(2.0)
    # Nothing ran at c=1: the static rate is 0, so no ratio.
    assert throughput_ratio(summaries, 1) is None
    assert throughput_ratio([s for s in summaries if s.side == "static"], 2) is None


def test_tokens_match_compares_the_same_request_across_sides():
    static = batch_records(concurrency=2)
    same = continuous_record(0, 2, ttft_ms=1.0, e2e_ms=2.0)
    same.token_ids = [1, 2]
    different = continuous_record(1, 4, ttft_ms=1.0, e2e_ms=2.0)

    assert tokens_match([*static, same, different]) == {"c=2": 1}


def test_markdown_table_puts_both_sides_of_a_concurrency_together():
    records = [
        *batch_records(concurrency=2),
        continuous_record(0, 2, ttft_ms=100.0, e2e_ms=300.0),
        continuous_record(1, 4, ttft_ms=100.0, e2e_ms=500.0),
        continuous_record(2, 3, ttft_ms=350.0, e2e_ms=675.0),
    ]

    table = markdown_table(summarize_all(records, [2], 3)).splitlines()

    assert table[0].startswith("| C | batching | done | req/s | out tok/s | vs static |")
    assert len(table) == 4
    static_row = [cell.strip() for cell in table[2].strip("|").split("|")]
    continuous_row = [cell.strip() for cell in table[3].strip("|").split("|")]
    assert static_row[:6] == ["2", "static", "3/3", "2.222", "6.7", "1.00x"]
    assert static_row[6] == "1,000" and static_row[-1] == "25%"
    assert continuous_row[:6] == ["2", "continuous", "3/3", "4.444", "13.3", "2.00x"]
    assert continuous_row[-1] == "-"


# --- CLI --------------------------------------------------------------------------------------


def test_job_survives_its_json_round_trip():
    job = Job("static", "/m", [1, 8], [item(0, 5), item(1, 9)], 60.0, 2)

    assert Job.from_dict(json.loads(json.dumps(asdict(job)))) == job


def test_parser_defaults_are_the_lab_question():
    args = batching.build_parser().parse_args(["--out", "x"])

    assert args.concurrency == [1, 8, 32]
    assert args.num_requests == 32
    assert args.output_tokens == [16, 96]
    assert args.sides == ["static", "continuous"]


def fake_side(job: Job, tmp: Path):
    """Static: one batch per C, 100 ms per step. Continuous: every request 10 ms per token."""
    records: list[RequestRecord] = []
    for c in job.concurrencies:
        if job.side == "static":
            t = 0.0
            for b, batch in enumerate(static_batches(job.items, c)):
                steps = max(w.output_tokens for w in batch)
                times = [t + 0.1 * (k + 1) for k in range(steps)]
                records += static_batch_records(
                    batch,
                    concurrency=c,
                    batch_index=b,
                    run_start_s=0.0,
                    start_s=t,
                    step_times_s=times,
                    end_s=times[-1],
                    prompt_tokens=[30] * len(batch),
                    token_ids=[list(range(steps))] * len(batch),
                )
                t = times[-1]
        else:
            records += [
                continuous_record(
                    w.index, w.output_tokens, ttft_ms=10.0, e2e_ms=10.0 * w.output_tokens, c=c
                )
                for w in job.items
            ]
    return records, {"fake": job.side}


def test_cli_writes_json_and_markdown_and_prints_the_table(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(batching, "_run_side", fake_side)
    out = tmp_path / "out"

    code = batching.main(
        ["--concurrency", "1", "2", "--num-requests", "4", "--output-tokens", "2", "6",
         "--out", str(out)]
    )  # fmt: skip

    assert code == 0
    payload = json.loads((out / "batching.json").read_text())
    assert payload["config"]["concurrency"] == [1, 2]
    assert payload["sides"] == {"static": {"fake": "static"}, "continuous": {"fake": "continuous"}}
    assert len(payload["records"]) == 2 * 2 * 4
    assert [(s["concurrency"], s["side"]) for s in payload["summaries"]] == [
        (1, "static"),
        (1, "continuous"),
        (2, "static"),
        (2, "continuous"),
    ]
    assert set(payload["continuous_over_static_output_tokens_per_s"]) == {"c=1", "c=2"}
    assert set(payload["tokens_match"]) == {"c=1", "c=2"}
    markdown = (out / "batching.md").read_text()
    assert "| 1 | static | 4/4 |" in markdown and "| 2 | continuous | 4/4 |" in markdown
    assert markdown.strip() in capsys.readouterr().out
    # Two concurrency levels: throughput and p99 TTFT against concurrency, per side.
    for name in ("batching_throughput.png", "batching_ttft_p99.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")


def test_cli_exits_1_and_still_writes_when_a_side_fails(monkeypatch, tmp_path, capsys):
    def static_fails(job: Job, tmp: Path):
        return ([], None) if job.side == "static" else fake_side(job, tmp)

    monkeypatch.setattr(batching, "_run_side", static_fails)

    code = batching.main(["--concurrency", "2", "--num-requests", "2", "--out", str(tmp_path)])

    assert code == 1
    payload = json.loads((tmp_path / "batching.json").read_text())
    assert payload["config"]["failed_sides"] == ["static"]
    assert [s["side"] for s in payload["summaries"]] == ["continuous"]
    assert payload["continuous_over_static_output_tokens_per_s"] == {"c=2": None}
    assert "static" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["--num-requests", "0"], ["--concurrency", "0"], ["--output-tokens", "9", "3"]],
)
def test_cli_rejects_bad_settings(argv, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        batching.main([*argv, "--out", str(tmp_path)])
    assert exit_info.value.code == 2


def test_importing_the_module_loads_no_model_library():
    code = (
        "import sys, bench.batching; "
        "print(sorted({'torch', 'transformers', 'vllm'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
