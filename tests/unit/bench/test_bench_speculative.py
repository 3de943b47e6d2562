"""bench.speculative, the pure parts: prompt order, TPOT, acceptance, the paired speed-up
interval and its verdict, the summaries and the report built from saved runs."""

from __future__ import annotations

import json
import math

import pytest

from bench import speculative, stats
from bench.stats import Interval


def test_pick_questions_is_seeded_and_cycles_past_the_list():
    questions = [f"q{i}" for i in range(5)]
    first = speculative.pick_questions(questions, 5, seed=3)
    assert sorted(first) == questions
    assert first == speculative.pick_questions(questions, 5, seed=3)
    assert first != speculative.pick_questions(questions, 5, seed=4)
    seven = speculative.pick_questions(questions, 7, seed=3)
    assert seven[:5] == first and seven[5:] == first[:2]


def test_tpot_excludes_the_first_token():
    assert stats.tpot(100.0, 1100.0, 11) == pytest.approx(100.0)
    assert stats.tpot(100.0, 100.0, 1) is None


def test_acceptance_is_accepted_over_drafted():
    assert speculative.acceptance(30, 40) == pytest.approx(0.75)
    assert speculative.acceptance(0, 0) is None


def test_speedup_ci_is_the_median_ratio_of_pairs():
    plain = [200.0, 210.0, 190.0, 220.0, 205.0] * 4
    spec = [100.0, 105.0, 95.0, 110.0, 102.5] * 4
    interval = speculative.speedup_ci(plain, spec)
    assert interval.estimate == pytest.approx(2.0)
    assert interval.low == pytest.approx(2.0) and interval.high == pytest.approx(2.0)
    assert interval.n == 20
    assert speculative.verdict(interval) == "faster with the draft"


def test_speedup_ci_of_noise_crosses_one():
    plain = [100.0, 120.0, 90.0, 110.0, 95.0, 105.0]
    spec = [110.0, 100.0, 95.0, 100.0, 105.0, 98.0]
    interval = speculative.speedup_ci(plain, spec)
    ratios = sorted(p / s for p, s in zip(plain, spec, strict=True))
    assert interval.estimate == pytest.approx(math.sqrt(ratios[2] * ratios[3]))
    assert speculative.verdict(interval) == "no detectable difference"


def test_verdict_slower():
    assert speculative.verdict(Interval(0.8, 0.7, 0.9, 20)) == "slower with the draft"


def request(tpot: float, ids: list[int], tokens: int = 11) -> dict[str, object]:
    return {"ttft_ms": 50.0, "e2e_ms": 50.0 + tpot * (tokens - 1), "tokens": tokens,
            "tpot_ms": tpot, "token_ids": ids}  # fmt: skip


def test_point_summary_medians_and_throughput():
    rows = [request(100.0, [1]), request(200.0, [2]), request(300.0, [3])]
    summary = speculative.point_summary(rows, wall_s=3.3)
    assert summary["n"] == 3
    assert summary["tpot_ms_p50"] == 200.0
    assert summary["output_tokens"] == 33
    assert summary["output_tok_s"] == pytest.approx(10.0)


def hf_document() -> dict[str, object]:
    rows = []
    for i in range(4):
        plain = request(200.0, [1, 2, i])
        assisted = request(100.0, [1, 2, i] if i else [9]) | {"drafted": 10, "accepted": 6}
        rows.append({"prompt_tokens": 500, "plain": plain, "assisted": assisted,
                     "identical": plain["token_ids"] == assisted["token_ids"]})  # fmt: skip
    return {"engine": "hf", "rows": rows}


def test_summarize_hf_counts_acceptance_and_identical_outputs():
    summary = speculative.summarize_hf(hf_document())
    assert summary["acceptance"] == pytest.approx(0.6)
    assert summary["identical"] == 3 and summary["n"] == 4
    assert summary["tpot_speedup"]["estimate"] == pytest.approx(2.0)


def vllm_document(tpot: float, spec: dict[str, float], ids: list[int]) -> dict[str, object]:
    points = [{"concurrency": c, "wall_s": 10.0, "spec": spec,
               "rows": [request(tpot, ids) for _ in range(3)]} for c in (1, 8)]  # fmt: skip
    return {"engine": "vllm", "config": {"n": 3, "n8": 3}, "points": points}


def test_summarize_vllm_pairs_points_and_reads_spec_counters():
    plain = vllm_document(100.0, {}, [1, 2])
    draft = vllm_document(80.0, {"accepted_tokens": 45.0, "draft_tokens": 60.0}, [1, 2])
    points = speculative.summarize_vllm([plain], [draft])
    assert [p["concurrency"] for p in points] == [1, 8]
    assert points[0]["acceptance"] == pytest.approx(0.75)
    assert points[0]["tpot_speedup"]["estimate"] == pytest.approx(1.25)
    assert points[0]["identical"] == 3
    assert points[0]["throughput_ratio"] == pytest.approx(1.0)
    assert points[0]["ttft_speedup"]["estimate"] == pytest.approx(1.0)
    assert points[0]["e2e_speedup"]["estimate"] == pytest.approx((50 + 1000) / (50 + 800))


def test_report_step_writes_summary_from_saved_runs(tmp_path):
    (tmp_path / "hf.json").write_text(json.dumps(hf_document()))
    plain = vllm_document(100.0, {}, [1])
    draft = vllm_document(50.0, {"accepted_tokens": 1.0, "draft_tokens": 2.0}, [1])
    (tmp_path / "vllm-plain.json").write_text(json.dumps(plain))
    (tmp_path / "vllm-draft.json").write_text(json.dumps(draft))
    assert speculative.main(["report", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["hf"]["n"] == 4 and len(summary["vllm"]) == 2
    text = (tmp_path / "summary.md").read_text()
    assert "| vLLM | 8 | draft (0.5B) |" in text
    assert "x2.00 [2.00, 2.00] (faster with the draft)" in text


def test_speedup_ci_leaves_out_pairs_without_a_tpot():
    interval = speculative.speedup_ci([200.0, None, 300.0, 400.0], [100.0, 50.0, None, 200.0])
    assert interval is not None and interval.n == 2 and interval.estimate == pytest.approx(2.0)
    assert speculative.speedup_ci([200.0, None], [100.0, 50.0]) is None  # one pair: no interval


def test_blocks_are_consecutive_slices_of_one_order():
    order = [f"q{i}" for i in range(10)]
    assert speculative.block_slice(order, None, 4) == order[:4]
    assert speculative.block_slice(order, 0, 4) == order[:4]
    assert speculative.block_slice(order, 1, 4) == order[4:8]
    assert speculative.vllm_file("plain", None) == "vllm-plain.json"
    assert speculative.vllm_file("draft", 1) == "vllm-draft-b1.json"


def test_join_blocks_concatenates_rows_and_sums_wall_time_and_counters():
    first = vllm_document(100.0, {"accepted_tokens": 3.0, "draft_tokens": 6.0}, [1])
    second = vllm_document(50.0, {"accepted_tokens": 1.0, "draft_tokens": 2.0}, [2])
    joined = speculative.join_blocks([first, second])
    assert [p["concurrency"] for p in joined] == [1, 8]
    assert [r["tpot_ms"] for r in joined[0]["rows"]] == [100.0] * 3 + [50.0] * 3
    assert joined[0]["wall_s"] == pytest.approx(20.0)
    assert joined[0]["spec"] == {"accepted_tokens": 4.0, "draft_tokens": 8.0}


def test_report_pairs_blocks_by_name_and_leaves_out_a_lone_block(tmp_path, capsys):
    spec = {"accepted_tokens": 1.0, "draft_tokens": 2.0}
    for block, (plain_tpot, draft_tpot) in enumerate(((100.0, 50.0), (300.0, 100.0))):
        (tmp_path / f"vllm-plain-b{block}.json").write_text(
            json.dumps(vllm_document(plain_tpot, {}, [block]))
        )
        (tmp_path / f"vllm-draft-b{block}.json").write_text(
            json.dumps(vllm_document(draft_tpot, spec, [block]))
        )
    (tmp_path / "vllm-plain-b2.json").write_text(json.dumps(vllm_document(1.0, {}, [7])))
    plain, draft = speculative.load_vllm_runs(tmp_path)
    assert len(plain) == len(draft) == 2
    assert "'-b2' has one variant only" in capsys.readouterr().err
    points = speculative.summarize_vllm(plain, draft)
    assert points[0]["n"] == 6 and points[0]["blocks"] == 2
    assert points[0]["identical"] == 6
    assert points[0]["acceptance"] == pytest.approx(0.5)
    ratios = sorted([2.0] * 3 + [3.0] * 3)
    assert points[0]["tpot_speedup"]["estimate"] == pytest.approx(math.sqrt(ratios[2] * ratios[3]))


def test_report_refuses_to_join_runs_of_different_settings(tmp_path):
    for variant in ("plain", "draft"):
        (tmp_path / f"vllm-{variant}-b0.json").write_text(json.dumps(vllm_document(100.0, {}, [1])))
    other = vllm_document(100.0, {}, [1]) | {"config": {"n": 20, "n8": 24}}
    (tmp_path / "vllm-plain.json").write_text(json.dumps(other))
    (tmp_path / "vllm-draft.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="different settings"):
        speculative.load_vllm_runs(tmp_path)
