"""bench.quality_report: paired comparisons by question, on hand-made runs whose answers are
known, and bench.tables' one renderer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import quality_report
from bench.stats import NO_DIFFERENCE
from bench.tables import markdown_table


def result(point: str, question: str, f1: float, ttft: float, error: str | None = None) -> dict:
    return {"point": point, "question_id": question, "f1": f1, "exact_match": f1,
            "answer_survived": True, "recall": 1.0, "ttft_ms": ttft, "error": error}  # fmt: skip


POINTS = [
    {"name": "none k=3", "method": "none", "top_k": 3},
    {"name": "sentences@0.5 k=3", "method": "sentences", "top_k": 3},
    {"name": "llmlingua@0.5 k=5", "method": "llmlingua", "top_k": 5},  # no none at k=5
]


def test_each_point_is_paired_with_none_at_its_k_on_the_questions_both_answered():
    results = [result("none k=3", f"q{i}", 1.0, 200.0) for i in range(10)]
    results += [result("sentences@0.5 k=3", f"q{i}", 0.0 if i < 5 else 1.0, 100.0)
                for i in range(10)]  # fmt: skip
    results.append(result("sentences@0.5 k=3", "q10", 1.0, 100.0))  # none never answered it
    results[0]["error"] = "HTTP 503"  # q0 failed under none: left out of the pairs

    rows = quality_report.against_none(results, POINTS)

    assert [(r["a"], r["b"]) for r in rows] == [("sentences@0.5 k=3", "none k=3")]
    row = rows[0]
    assert row["n"] == 9
    assert row["F1"].estimate == pytest.approx(-4 / 9)
    assert row["F1"].high < 0  # lower, and told so
    assert row["TTFT"].estimate == pytest.approx(0.5)
    assert row["answer kept"].estimate == 0.0
    text = quality_report.comparisons_markdown(rows)
    assert "sentences@0.5 k=3 − none k=3 | 9 |" in text
    assert ": lower" in text and NO_DIFFERENCE in text and "0.50x" in text
    assert json.dumps(quality_report.jsonable(rows))  # every interval became data


def test_the_prefix_report_pairs_questions_and_averages_two_runs_a_side(tmp_path: Path):
    ttfts = {"off-1": 1000.0, "on-1": 600.0, "on-2": 400.0, "off-2": 1000.0}
    for run, ttft in ttfts.items():
        folder = tmp_path / run
        folder.mkdir()
        doc = {"results": [result("p", f"q{i}", 1.0, ttft + i) for i in range(6)]}
        (folder / quality_report.PREFIX_FILE).write_text(json.dumps(doc))

    assert quality_report.main(["prefix", str(tmp_path)]) == 0

    data = json.loads((tmp_path / "prefix.json").read_text())
    assert data["n"] == 6
    both = data["ratios"]["on / off (mean of two runs a side)"]
    assert both["estimate"] == pytest.approx(0.5, abs=0.01)
    assert data["ratios"]["on-1 / off-1"]["high"] < 1


def test_the_abba_report_pairs_four_services_and_scores_each_side_over_its_two_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # b is twice as fast at both phases (and to the whole answer) and loses the gold on q0
    # in one of its two runs.
    speeds = {"bf16-1": 1.0, "int8-1": 0.5, "int8-2": 0.5, "bf16-2": 1.0}
    for run, scale in speeds.items():
        folder = tmp_path / run
        folder.mkdir()
        results = [result("sentences@0.5 k=5", f"q{i}", 1.0, scale * (1000 + i)) for i in range(8)]
        for r in results:
            r["tpot_ms"], r["contains_gold"], r["answer"] = scale * 100, True, "gold"
            r["total_ms"] = scale * 5000
        if run == "int8-1":
            results[0].update(f1=0.0, contains_gold=False, answer="other")
        results.append(result("sentences@0.5 k=5", "q9", 1.0, 1.0, error="timeout"))
        (folder / "squad-default-8q-as-shipped.json").write_text(json.dumps({"results": results}))
        (folder / "squad.serve.yaml").write_text("not a result")

    assert quality_report.main(["abba", str(tmp_path), "bf16", "int8"]) == 0

    data = json.loads((tmp_path / "int8-against-bf16.json").read_text())
    assert data["runs_in_order"] == ["bf16-1", "int8-1", "int8-2", "bf16-2"]
    assert data["TTFT"]["n"] == 8  # q9 failed everywhere
    both = "int8 / bf16 (mean of two runs a side)"
    assert data["TTFT"]["ratios"][both]["estimate"] == pytest.approx(0.5)
    assert data["TPOT"]["ratios"]["int8-2 / bf16-2"]["estimate"] == pytest.approx(0.5)
    assert data["answer"]["ratios"][both]["estimate"] == pytest.approx(0.5)
    gold = data["answers"]["contains gold"]
    assert gold["int8"]["estimate"] == pytest.approx(1 - 0.5 / 8)
    assert gold["difference"]["estimate"] == pytest.approx(-0.5 / 8)
    assert data["answers"]["same_in_both_runs"] == 15
    # The tails: each side's two runs pooled, b's p99 half of a's.
    tails = data["TTFT"]["p99"]
    assert tails["bf16"]["estimate"] == pytest.approx(1007, abs=0.5)
    assert tails["int8 / bf16"]["estimate"] == pytest.approx(0.5)
    assert "p99 of each side's two runs pooled" in capsys.readouterr().out


def test_the_abba_report_refuses_a_folder_without_exactly_one_run(tmp_path: Path):
    for run in ("a-1", "b-1", "b-2", "a-2"):
        (tmp_path / run).mkdir()
    with pytest.raises(SystemExit, match="expected one"):
        quality_report.main(["abba", str(tmp_path), "a", "b"])


def test_the_reader_report_compares_f1_on_shared_questions():
    stronger = {"results": [result("none k=5", f"q{i}", 1.0, 1.0) for i in range(8)]}
    weaker = {"results": [result("none k=5", f"q{i}", 0.0, 1.0) for i in range(4)]}

    text, data = quality_report.reader_report(stronger, weaker, ["none k=5"])

    assert data["none k=5"]["n"] == 4
    assert data["none k=5"]["difference"]["estimate"] == 1.0
    assert data["none k=5"]["verdict"] == "higher"
    assert "| none k=5 | 4 |" in text


def test_markdown_table_aligns_numbers_and_escapes_pipes():
    text = markdown_table(["name", "n"], [["a|b", 3]], numeric=(1,))

    assert text.splitlines() == ["| name | n |", "|---|---:|", "| a\\|b | 3 |"]
    with pytest.raises(ValueError):
        markdown_table(["name", "n"], [["only one cell"]])


def test_the_run_report_gives_each_point_its_intervals_and_leaves_out_failures():
    results = [result("sentences@0.5 k=5", f"q{i}", float(i % 2), 100.0 + i) for i in range(20)]
    for r in results:
        r["contains_gold"], r["tpot_ms"] = r["f1"] == 1.0, 50.0
    results.append(result("sentences@0.5 k=5", "q-failed", 1.0, 1.0, error="timeout"))
    text, data = quality_report.run_report({"results": results})
    point = data["sentences@0.5 k=5"]
    assert point["n"] == 20
    assert point["contains gold"]["estimate"] == pytest.approx(0.5)
    assert point["contains gold"]["low"] < 0.5 < point["contains gold"]["high"]
    assert point["ttft_ms_p50"]["estimate"] == pytest.approx(109.5)
    assert point["tpot_ms_p50"]["estimate"] == pytest.approx(50.0)
    assert "TPOT p50 ms" in text and "sentences@0.5 k=5" in text
