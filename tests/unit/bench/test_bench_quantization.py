"""bench.quantization, the pure parts: checkpoints by variant, scoring, and the report's
pairing of each variant with fp32 (by prompt within a block for speed, by SQuAD id for
answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import quantization as q


def _latency(variant: str, block: int, ttft: list[float], tpot: list[float]) -> dict[str, Any]:
    rows = [{"ttft_ms": a, "tpot_ms": b} for a, b in zip(ttft, tpot, strict=True)]
    return {
        "step": "latency", "reader": "qwen0.5b", "variant": variant, "weights": "w",
        "dtype": "float32", "checkpoint_bytes": 1_000_000, "cpu": "cpu", "engine_start_s": 20.0,
        "engine_rss_bytes_loaded": 2_000_000, "config": {"style": "short", "block": block},
        "points": [{"concurrency": 1, "rows": rows, "wall_s": 1.0},
                   {"concurrency": 8, "rows": rows, "wall_s": 1.0}],
    }  # fmt: skip


def _quality(variant: str, f1: dict[str, float]) -> dict[str, Any]:
    rows = [{"id": i, "f1": v, "em": float(v == 1.0), "contains_gold": v, "gold_in_context": 1.0,
             "ttft_ms": 10.0, "tpot_ms": 5.0} for i, v in f1.items()]  # fmt: skip
    doc = _latency(variant, 0, [], [])
    return doc | {"step": "quality", "points": [{"concurrency": 8, "rows": rows, "wall_s": 1.0}]}


def test_checkpoints_sit_beside_the_reader_named_by_scheme() -> None:
    assert q.checkpoint("qwen1.5b", "fp32") == Path(".models/qwen2.5-coder-1.5b-instruct")
    assert q.checkpoint("qwen1.5b", "bf16") == q.checkpoint("qwen1.5b", "fp32")
    assert q.checkpoint("qwen0.5b", "int4").name == "qwen2.5-coder-0.5b-instruct-w4a16"
    assert q.checkpoint("qwen0.5b", "int8").name == "qwen2.5-coder-0.5b-instruct-w8a8"
    assert q.VARIANTS["int4"].dtype == "bfloat16"  # the CPU WNA16 kernel has no fp32 path


def test_the_4_bit_checkpoint_runs_as_w4a16_or_as_w4a8_only_where_named() -> None:
    # vLLM runs a 4-bit checkpoint as W4A8 by default on an AMX CPU: `int4` must say W4A16.
    int4, int4a8 = q.VARIANTS["int4"], q.VARIANTS["int4a8"]
    assert q.checkpoint("qwen1.5b", "int4a8") == q.checkpoint("qwen1.5b", "int4")
    assert dict(int4.environment) == {"VLLM_CPU_INT4_W4A8": "0"}
    assert dict(int4a8.environment) == {"VLLM_CPU_INT4_W4A8": "1"}
    assert q.unmet_cpu_flag(int4, {"avx512f"}) is None
    assert q.unmet_cpu_flag(int4a8, {"amx_int8", "amx_tile"}) is None
    assert "amx_int8" in (q.unmet_cpu_flag(int4a8, {"avx512f", "avx512_bf16"}) or "")


def test_score_counts_the_gold_in_the_answer_and_in_the_context() -> None:
    s = q.score("It was Denver Broncos.", ["Denver Broncos"], "The Denver Broncos won.")
    assert s["contains_gold"] == 1.0 and s["gold_in_context"] == 1.0
    assert s["em"] == 0.0 and 0.0 < s["f1"] < 1.0
    assert q.score("no idea", ["Denver"], "nothing")["contains_gold"] == 0.0


def test_latency_pairs_match_prompts_within_blocks_both_variants_ran() -> None:
    runs = [_latency("fp32", 0, [100, 200], [10, 20]), _latency("int4", 0, [150, 300], [5, 10]),
            _latency("int4", 1, [1, 1], [1, 1])]  # fmt: skip
    base = q.joined_latency(runs, "qwen0.5b", "fp32", "short", 1)
    other = q.joined_latency(runs, "qwen0.5b", "int4", "short", 1)
    assert q.latency_pairs(base, other, "tpot_ms") == [(5, 10), (10, 20)]  # block 1 unpaired


def test_summary_gives_ratios_and_paired_score_differences_against_fp32() -> None:
    ids = {f"id{i}": 1.0 if i % 2 else 0.5 for i in range(20)}
    worse = {k: v - 0.25 for k, v in ids.items()}
    runs = [_latency("fp32", 0, [100.0] * 10, [20.0] * 10),
            _latency("int4", 0, [110.0] * 10, [10.0] * 10),
            _quality("fp32", ids), _quality("int4", worse)]  # fmt: skip
    entries = {e["variant"]: e for e in q.summarize(runs)}
    assert list(entries) == ["fp32", "int4"]
    assert entries["fp32"]["c1"]["tpot_vs_fp32"] is None  # no ratio to itself
    tpot = entries["int4"]["c1"]["tpot_vs_fp32"]
    assert tpot["estimate"] == pytest.approx(0.5)
    assert entries["int4"]["c1"]["ttft_vs_fp32"]["estimate"] == pytest.approx(1.1)
    f1 = entries["int4"]["quality"]["f1_vs_fp32"]
    assert f1["estimate"] == pytest.approx(-0.25) and f1["n"] == 20
    assert "f1_vs_fp32" not in entries["fp32"]["quality"]
    text = q.markdown(list(entries.values()), "python -m bench.quantization report")
    assert "0.50x [0.50, 0.50]" in text and "-0.250" in text and q.CAVEAT in text
    answers = [
        line for line in text.splitlines() if line.startswith("| qwen0.5b | short | int4 | 20 |")
    ]
    assert len(answers) == 1 and answers[0].count("|") == 14  # 13 columns


def test_answers_are_also_paired_with_bf16_when_it_answered_the_same_questions() -> None:
    ids = {f"id{i}": 1.0 if i % 3 else 0.0 for i in range(30)}
    better = {k: min(1.0, v + 0.5) for k, v in ids.items()}
    runs = [_quality("bf16", ids), _quality("int4a8", better)]
    entries = {e["variant"]: e for e in q.summarize(runs)}
    assert list(entries) == ["bf16", "int4a8"]  # no fp32 answered: no pairing with it
    answers = entries["int4a8"]["quality"]
    assert "f1_vs_fp32" not in answers
    assert (
        answers["f1_vs_bf16"]["estimate"] == pytest.approx(5 / 30)
        and answers["f1_vs_bf16"]["n"] == 30
    )
    assert "f1_vs_bf16" not in entries["bf16"]["quality"]


def test_run_files_name_step_reader_variant_style_and_block() -> None:
    assert q.run_file("latency", "qwen1.5b", "int4", "short", 1) == (
        "latency-qwen1.5b-int4-short-b1.json")  # fmt: skip
    assert (
        q.run_file("quality", "qwen1.5b", "int4", "short", 0) == "quality-qwen1.5b-int4-short.json"
    )


def test_a_folder_mixing_settings_is_refused(tmp_path: Path) -> None:
    import json

    for name, tokens in (("quality-a.json", 32), ("quality-b.json", 64)):
        run = _quality("fp32", {"x": 1.0})
        run["config"] |= {"seed": 0, "top_k": 5, "questions": 1, "max_new_tokens": tokens}
        (tmp_path / name).write_text(json.dumps(run))
    with pytest.raises(SystemExit, match="different"):
        q.load_runs(tmp_path)
    (tmp_path / "quality-b.json").unlink()
    assert len(q.load_runs(tmp_path)) == 1


def test_a_stopped_quality_run_of_the_same_settings_is_taken_up_again(tmp_path: Path) -> None:
    import json

    settings = {"seed": 0, "top_k": 5, "questions": 200, "max_new_tokens": 64, "style": "short"}
    stopped = _quality("int4", {"a": 1.0, "b": 0.0}) | {"started_at": "then"}
    stopped["config"] = dict(settings)
    path = tmp_path / q.run_file("quality", "qwen0.5b", "int4", "short", None)
    path.write_text(json.dumps(stopped))
    asked = {"reader": "qwen0.5b", "variant": "int4", "config": dict(settings)}
    earlier = q.answered_before(tmp_path, asked)
    assert earlier is not None and [r["id"] for r in earlier["points"][0]["rows"]] == ["a", "b"]
    # Other settings, another variant or a finished run start afresh.
    shorter = asked | {"config": settings | {"max_new_tokens": 32}}
    assert q.answered_before(tmp_path, shorter) is None
    assert q.answered_before(tmp_path, asked | {"variant": "fp32"}) is None
    path.write_text(json.dumps(stopped | {"finished_at": "later"}))
    assert q.answered_before(tmp_path, asked) is None
