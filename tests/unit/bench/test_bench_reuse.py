"""bench.reuse: the skewed and uniform workloads, the pairing and the report, without a service."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from bench import reuse as reuse_module
from bench.coqa import CoqaFormatError, CoqaStory, CoqaTurn, stories_from_requests
from bench.loadgen import RequestRecord, RequestSpec
from bench.reuse import (
    SETTINGS,
    WorkItem,
    conversation_phases,
    gold_history_requests,
    overlap_row,
    phases,
    ratio_interval,
    report,
    skewed_items,
    specs,
    stage_calls,
    uniform_items,
)
from bench.squad import SquadParagraph, SquadQuestion, SquadSet
from harness.service import ROOT
from harness.variant import write_variant
from pipeline.messages import Conversation


def squad(paragraphs: int = 30, questions_each: int = 6) -> SquadSet:
    return SquadSet(
        1,
        tuple(SquadParagraph(f"p{i}", "T", f"text {i}") for i in range(paragraphs)),
        tuple(
            SquadQuestion(f"p{i}-q{j}", f"question {j} of {i}?", ("a",), f"p{i}")
            for i in range(paragraphs)
            for j in range(questions_each)
        ),
    )


def test_skewed_requests_are_distinct_questions_and_the_first_of_a_paragraph_is_cold():
    items = skewed_items(squad(), [f"p{i}" for i in range(10)], 40, 1.0, seed=0)

    assert len(items) == 40
    assert len({item.question_id for item in items}) == 40
    seen: set[str] = set()
    for item in items:
        assert item.warm == (item.paragraph_id in seen)
        assert item.question_id.startswith(f"{item.paragraph_id}-")
        seen.add(item.paragraph_id)


def test_skewed_popularity_falls_with_rank():
    ids = [f"p{i}" for i in range(30)]
    counts = Counter(item.paragraph_id for item in skewed_items(squad(30, 40), ids, 400, 1.0, 0))

    assert counts["p0"] > counts["p9"] > 0
    assert counts["p0"] > 3 * counts.get("p29", 0)


def test_skewed_is_the_same_for_the_same_seed_and_refuses_too_many_requests():
    ids = ["p0", "p1"]

    assert skewed_items(squad(), ids, 8, 1.0, 3) == skewed_items(squad(), ids, 8, 1.0, 3)
    with pytest.raises(ValueError, match="more questions"):
        skewed_items(squad(), ids, 13, 1.0, 0)


def test_uniform_asks_each_paragraph_once_all_cold():
    items = uniform_items(squad(), ["p3", "p5"], seed=0)

    assert [item.paragraph_id for item in items] == ["p3", "p5"]
    assert not any(item.warm for item in items)


def test_phases_use_disjoint_paragraphs():
    plan = phases(squad(40), requests=12, paragraphs=10, exponent=1.0, uniform=5, seed=0)

    used = [{item.paragraph_id for item in phase.items} for phase in plan]
    assert [phase.concurrency for phase in plan] == [1, 4, 1]
    assert not used[0] & used[1] and not used[0] & used[2] and not used[1] & used[2]


def test_each_setting_asks_what_it_stands_for():
    plan = phases(squad(40), requests=4, paragraphs=10, exponent=1.0, uniform=2, seed=0)

    naive, today, reuse = (
        specs(plan[0], SETTINGS[name])[0] for name in ("naive", "today", "reuse-conv")
    )
    assert (naive.compression_method, naive.compression_reuse) == ("none", False)
    assert (today.compression_method, today.compression_reuse) == (None, False)
    assert (reuse.compression_method, reuse.compression_reuse) == (None, True)
    assert SETTINGS["naive"].overrides == {"generator.engine_kwargs.enable_prefix_caching": False}
    for blocks in (32, 128):
        setting = SETTINGS[f"today-b{blocks}"]
        assert setting.overrides == {"generator.engine_kwargs.block_size": blocks}
        assert (setting.method, setting.reuse) == (None, False)
    two, routed = SETTINGS["reuse-2c"], SETTINGS["reuse-2c-conv"]
    assert two.overrides["compression.deployment.num_replicas"] == 2
    assert two.overrides["compression.request_router.kind"] == "power_of_two"
    assert routed.overrides["compression.request_router.kind"] == "conversation_affinity"
    assert two.reuse and routed.reuse
    conv = SETTINGS["reuse-conv"]
    assert conv.overrides == {} and conv.reuse  # the service as shipped


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("base", ["serve_config.yaml", "serve_config.scale.yaml"])
def test_every_setting_is_a_valid_serve_config(name, base, tmp_path):
    write_variant(ROOT / base, dict(SETTINGS[name].overrides), tmp_path / "v.yaml")


def test_the_ratio_is_the_median_per_request_ratio_and_skips_missing_pairs():
    interval = ratio_interval([50.0, 100.0, 30.0, None], [100.0, 200.0, 60.0, 80.0])

    assert interval is not None
    assert interval.estimate == pytest.approx(0.5)
    assert interval.n == 3
    assert ratio_interval([None], [1.0]) is None


def record(ttft: float, cached: int = 128, ok: bool = True, passages: int | None = None) -> dict:
    return {
        "ok": ok,
        "ttft_ms": ttft,
        "usage_prompt_tokens": 512,
        "usage_cached_prompt_tokens": cached,
        "usage_cached_by_segment": (
            None
            if passages is None
            else {"system": cached - passages, "history": 0, "passages": passages, "question": 0}
        ),
    }


def saved(phase: str, items: list[dict], runs: list[dict]) -> dict:
    """A results.json of one phase (its concurrency from its name) and `runs`."""
    concurrency = int(phase.rsplit("-c", 1)[1])
    return {
        "command": "python -m bench.reuse",
        "machine": "test CPU",
        "phases": [{"name": phase, "concurrency": concurrency, "items": items}],
        "runs": runs,
    }


def test_the_report_gives_each_parts_cached_share_where_the_records_split_it():
    items = [{"question_id": "q0", "question": "?", "paragraph_id": "p0", "warm": False}]
    results = saved(
        "uniform-c1",
        items,
        [
            {"setting": "today-b32", "records": {"uniform-c1": [record(90, 320, passages=64)]}},
            {"setting": "today-b128", "records": {"uniform-c1": [record(100, 256)]}},
        ],
    )

    text = report(results)

    # 320 of 512 prompt tokens cached: 256 from the system prompt, 64 from the passages.
    assert "| uniform-c1 | all (1) | today-b32 | 1 | 90 | 90 | 0.62 | 0.50 | 0.00 | 0.12 |" in text
    assert "| uniform-c1 | all (1) | today-b128 | 1 | 100 | 100 | 0.50 | - | - | - |" in text
    assert "| uniform-c1 | all | today-b32 / today-b128 | no interval | 0 |" in text


def test_the_report_splits_cold_and_warm_and_pairs_the_settings():
    items = [
        {"question_id": "q0", "question": "?", "paragraph_id": "p0", "warm": False},
        {"question_id": "q1", "question": "?", "paragraph_id": "p0", "warm": True},
        {"question_id": "q2", "question": "?", "paragraph_id": "p0", "warm": True},
    ]
    results = saved(
        "skewed-c1",
        items,
        [
            {"setting": "today", "records": {"skewed-c1": [record(100), record(100), record(90)]}},
            {
                "setting": "reuse",
                "records": {"skewed-c1": [record(100), record(50, 384), record(45)]},
            },
        ],
    )

    text = report(results)

    assert "| skewed-c1 | warm (2) | reuse | 2 |" in text
    assert "| skewed-c1 | warm | reuse / today | 0.50x" in text
    # One cold pair is too few for an interval.
    assert "| skewed-c1 | cold | reuse / today | no interval | 0 |" in text
    assert "naive" not in text.split("Median per-request")[1]


SERVE_LOG = """\
(ServeReplica:rag:Generator pid=1) INFO rag_Generator hk1spbnp 99c4 -- CALL generate OK 6025.7ms
(ServeReplica:rag:Generator pid=2) INFO rag_Generator zz9qq 1a2b -- CALL generate OK 12.0ms
(ServeReplica:rag:Generator pid=1) INFO rag_Generator hk1spbnp d92d -- CALL generate OK 5995.7ms
(ServeReplica:rag:Generator pid=1) INFO rag_Generator hk1spbnp e3f1 -- CALL generate ERROR 1.0ms
(ServeReplica:rag:Compressor pid=3) INFO rag_Compressor c0 77aa -- CALL prepare OK 4.0ms
"""


def test_stage_calls_are_counted_per_replica_from_serves_access_log():
    assert stage_calls(SERVE_LOG) == {"hk1spbnp": 2, "zz9qq": 1}
    assert stage_calls(SERVE_LOG, "compressor") == {"c0": 1}
    assert stage_calls("") == {}


def test_the_report_shows_each_replicas_share_where_there_were_two():
    items = [
        {"question_id": f"q{i}", "question": "?", "paragraph_id": "p0", "warm": False}
        for i in range(4)
    ]
    runs = [
        {
            "setting": setting,
            "records": {"skewed-c4": [record(90)] * 4},
            "generator_calls": {"skewed-c4": calls},
        }
        for setting, calls in (
            ("reuse-conv-2g-p2c", {"a": 1, "b": 3}),
            ("reuse-conv-2g", {"a": 2, "b": 2}),
            ("reuse-conv-2g", {"a": 1, "b": 1}),
            ("today", {"a": 4}),
        )
    ]
    results = saved("skewed-c4", items, runs)

    text = report(results).split("Generator calls per replica")[1]

    assert "| 0-reuse-conv-2g-p2c | skewed-c4 | 4 | 3 / 1 | 0.75 |" in text
    assert "| 1-reuse-conv-2g | skewed-c4 | 4 | 2 / 2 | 0.50 |" in text
    # Fewer calls counted than requests sent: the share is of what was counted, and says so.
    assert "| 2-reuse-conv-2g | skewed-c4 | 2 | 1 / 1 | 0.50 (of 4 sent) |" in text
    assert "3-today" not in text


def test_overlap_counts_what_earlier_requests_retrieved_for_the_warm_ones():
    items = [
        WorkItem("q0", "?", "p0", False),
        WorkItem("q1", "?", "p0", True),
        WorkItem("q2", "?", "p1", False),
        WorkItem("q3", "?", "p0", True),
    ]
    retrieved = [["a", "b"], ["b", "c"], ["d", "e"], ["a", "d"]]

    # q1: b seen (1/2), top b was no earlier top; q3: a and d seen (2/2), top a was q0's.
    assert overlap_row(items, retrieved) == [2, "0.75", "0.50"]
    assert overlap_row(items[:1], retrieved[:1]) == [0, "-", "-"]


def test_the_report_pairs_the_compressor_stages_own_time():
    items = [
        {"question_id": f"q{i}", "question": "?", "paragraph_id": "p0", "warm": False}
        for i in range(3)
    ]

    def timed(compress_ms: float) -> dict:
        return {**record(100), "server_timings_ms": {"compress": compress_ms}}

    results = saved(
        "uniform-c1",
        items,
        [
            {"setting": "today", "records": {"uniform-c1": [timed(5), timed(6), timed(7)]}},
            {"setting": "reuse", "records": {"uniform-c1": [timed(5.5), timed(6.5), timed(7.5)]}},
        ],
    )

    text = report(results).split("The compressor stage's own time")[1]

    assert "| uniform-c1 | all | reuse − today | +0.50 | [+0.50, +0.50] | 3 |" in text


def story(story_id: str, turns: int) -> CoqaStory:
    asked = tuple(CoqaTurn(f"{story_id} question {t}?", (f"answer {t}",)) for t in range(turns))
    return CoqaStory(story_id, "mctest", f"The story {story_id}.", asked)


def test_conversations_ask_each_storys_questions_in_order_on_disjoint_stories():
    stories = [story(f"s{i}", 3 + i % 3) for i in range(12)]

    one, four = conversation_phases(stories, conversations=3, turns=4, seed=0)

    assert (one.name, one.concurrency, four.name, four.concurrency) == (
        "conversation-c1", 1, "conversation-c4", 4,
    )  # fmt: skip
    assert len(one.items) == len(four.items) == 12
    assert not {i.paragraph_id for i in one.items} & {i.paragraph_id for i in four.items}
    assert [i.turn for i in one.items] == [0, 1, 2, 3] * 3
    assert [i.warm for i in one.items[:4]] == [False, True, True, True]
    assert one.items[1].question == f"{one.items[0].paragraph_id} question 1?"
    assert conversation_phases(stories, 3, 4, seed=0) == [one, four]  # drawn by the seed
    with pytest.raises(ValueError):  # only 8 stories have 4 turns
        conversation_phases(stories, conversations=5, turns=4, seed=0)


def test_in_process_conversations_carry_gold_answers_and_search_as_the_service_does():
    stories = [story(f"s{i}", 3) for i in range(4)]
    one, _ = conversation_phases(stories, conversations=2, turns=3, seed=0)
    searched: list[str] = []

    requests = gold_history_requests(one, lambda text: searched.append(text) or len(searched))

    first, second, third = requests[:3]
    name = one.items[0].paragraph_id
    assert first[0] == Conversation(f"{name} question 0?", (), "short")
    assert [turn.content for turn in third[0].history] == [
        f"{name} question 0?", "answer 0", f"{name} question 1?", "answer 1",
    ]  # fmt: skip
    assert (second[1], second[2], second[3]) == (2, "answer 1", 1)
    # The service's default follow-up query: the last two user turns, then the question.
    assert searched[2] == f"{name} question 0? {name} question 1? {name} question 2?"
    # A new story starts a new history.
    assert requests[3][0].history == ()


def test_a_follow_up_carries_the_questions_and_the_services_answers_before_it(monkeypatch):
    sent: list[RequestSpec] = []

    async def answering(client, requests, **kwargs):
        (spec,) = requests
        sent.append(spec)
        return [RequestRecord(0, "rag", spec.question, ok=True, answer=f"A{len(sent)} ")]

    monkeypatch.setattr(reuse_module, "run_load", answering)
    (phase, _) = conversation_phases([story("s0", 3), story("s1", 3)], 1, 3, seed=0)

    answers = reuse_module.Answers(max_tokens=48, style="short")
    records = asyncio.run(reuse_module._converse(None, phase, SETTINGS["reuse-conv"], answers))

    first, second, third = sent
    assert first.history == () and first.compression_reuse is True
    assert {(spec.max_tokens, spec.answer_style) for spec in sent} == {(48, "short")}
    assert second.history == (
        {"role": "user", "content": first.question}, {"role": "assistant", "content": "A1"},
    )  # fmt: skip
    assert third.history[2:] == (
        {"role": "user", "content": second.question}, {"role": "assistant", "content": "A2"},
    )  # fmt: skip
    assert [r.index for r in records] == [0, 1, 2]
    assert [r.question for r in records] == [i.question for i in phase.items]


def test_coqa_requests_become_stories_with_their_turns_in_order():
    def request(story_id: str, turn: int, answers: list[str]) -> dict:
        doc = {"id": f"{story_id}_turn{turn}", "source": "race", "story": f"Story {story_id}.",
               "question": f"Q{turn}?", "answers": answers}  # fmt: skip
        return {"doc": doc}

    stories = stories_from_requests(
        [request("b", 1, ["y", "y"]), request("a", 0, ["x"]), request("b", 0, ["z", "w"])]
    )

    assert [s.story_id for s in stories] == ["b", "a"]
    assert stories[0].turns == (CoqaTurn("Q0?", ("z", "w")), CoqaTurn("Q1?", ("y",)))
    with pytest.raises(CoqaFormatError, match=r"not 0\.\.n-1"):
        stories_from_requests([request("a", 1, ["x"])])
    with pytest.raises(CoqaFormatError, match="empty"):
        stories_from_requests([request("a", 0, [""])])


def conversation_items(gold: str, turns: int = 4) -> list[dict]:
    """A saved conversation phase's items: one story's `turns` questions, each gold `gold`."""
    return [
        {"question_id": f"s_turn{t}", "question": "?", "paragraph_id": "s", "warm": t > 0,
         "turn": t, "golds": [gold]}
        for t in range(turns)
    ]  # fmt: skip


def test_the_report_scores_conversation_answers_against_their_golds_paired_by_request():
    items = conversation_items("white cat")

    def answered(*answers: str) -> list[dict]:
        return [record(100) | {"index": i, "answer": a} for i, a in enumerate(answers)]

    today = answered("a white cat", "a dog", "no", "white cat")
    reuse = answered("a white cat", "the white cat", "white", "white cat")
    results = saved(
        "conversation-c1",
        items,
        [{"setting": "today", "records": {"conversation-c1": today}},
         {"setting": "reuse", "records": {"conversation-c1": reuse}}],
    )  # fmt: skip

    text = report(results)

    # Follow-ups: today F1 (0, 0, 1) and holds (0, 0, 1); reuse F1 (1, 2/3, 1) and (1, 0, 1).
    assert "| conversation-c1 | warm | today | 3 | 0.333 | 0.333 |" in text
    assert "| conversation-c1 | warm | reuse | 3 | 0.889 | 0.667 |" in text
    assert "| conversation-c1 | cold | reuse − today | 1 |" in text
    assert "| conversation-c1 | warm | reuse − today | 3 | +0.556 [" in text


def test_the_report_counts_the_follow_ups_whose_prompt_continued_the_one_before():
    items = conversation_items("x")

    def continued(*turns: int | None) -> list[dict]:
        return [
            record(100) | {"index": i, "answer": "x", "usage_continued_turns": n}
            for i, n in enumerate(turns)
        ]

    results = saved(
        "conversation-c4",
        items,
        [{"setting": "reuse-2c", "records": {"conversation-c4": continued(0, 1, 0, 0)}},
         {"setting": "reuse-2c-conv", "records": {"conversation-c4": continued(0, 1, 2, 3)}},
         {"setting": "today", "records": {"conversation-c4": continued(None, None, None, None)}}],
    )  # fmt: skip

    text = report(results).split("Follow-ups continued")[1]

    assert "| conversation-c4 | reuse-2c | 3 | 1 | 0.33 | 2: 1/1, 3: 0/1, 4: 0/1 |" in text
    assert "| conversation-c4 | reuse-2c-conv | 3 | 3 | 1.00 | 2: 1/1, 3: 1/1, 4: 1/1 |" in text
    assert "| today |" not in text  # records without the count are not counted as misses


def test_the_report_compares_ttft_by_question_beside_each_sides_prompt_tokens():
    # Two stories of three questions: each question number has two paired requests.
    items = conversation_items("x", turns=3) + conversation_items("x", turns=3)

    def timed(
        ttfts: list[float], prompts: list[int], cached: list[int], answers: str = "xxx"
    ) -> list[dict]:
        return [
            record(t, c) | {"index": i, "answer": a, "usage_prompt_tokens": p}
            for i, (t, p, c, a) in enumerate(zip(ttfts, prompts, cached, answers * 2, strict=True))
        ]

    # Today's third answers miss their gold.
    today = timed([100, 100, 100] * 2, [500, 520, 540] * 2, [128, 128, 128] * 2, "xxy")
    # Reuse: the second question twice as fast, the third slower, its prompt longer.
    reuse = timed([100, 50, 150] * 2, [500, 800, 1200] * 2, [128, 600, 900] * 2)
    results = saved(
        "conversation-c4",
        items,
        [{"setting": "today", "records": {"conversation-c4": today}},
         {"setting": "reuse", "records": {"conversation-c4": reuse}}],
    )  # fmt: skip

    text = report(results).split("TTFT by question")[1]

    rows = [line for line in text.splitlines() if line.startswith("| conversation-c4")]
    assert rows[0].startswith("| conversation-c4 | 1 | reuse / today | 1.00x")
    assert "| 2 | 500 / 500 | 372 / 372 |" in rows[0]
    assert rows[1].startswith("| conversation-c4 | 2 | reuse / today | 0.50x")
    assert "| 2 | 800 / 520 | 200 / 392 | +0.000" in rows[1]
    assert rows[2].startswith("| conversation-c4 | 3 | reuse / today | 1.50x")
    assert "| 2 | 1200 / 540 | 300 / 412 | +1.000" in rows[2]
    assert len(rows) == 3


def test_a_single_question_phase_has_no_table_by_question():
    items = [{"question_id": "q", "question": "?", "paragraph_id": "p", "warm": False,
              "golds": ["x"]}] * 2  # fmt: skip
    runs = [
        {"setting": name, "records": {"skewed-c1": [record(100) | {"index": i} for i in range(2)]}}
        for name in ("today", "reuse")
    ]
    assert "TTFT by question" not in report(saved("skewed-c1", items, runs))


def test_the_generator_overrides_name_the_reader_and_the_window_only_when_asked():
    assert reuse_module.generator_overrides(None, None) is None
    qwen = reuse_module.generator_overrides("qwen2.5-coder-1.5b-instruct", None)
    assert qwen is not None and str(qwen["generator.model_source"]).endswith("1.5b-instruct")
    assert "generator.max_model_len" not in qwen
    longer = reuse_module.generator_overrides("qwen2.5-coder-1.5b-instruct", 4096)
    assert longer == {**qwen, "generator.max_model_len": 4096}
    smol = reuse_module.generator_overrides(None, 4096)
    assert smol is not None and smol["generator.max_model_len"] == 4096
    assert smol["generator.engine_kwargs.dtype"] == "float32"  # the stored runs' reader


def test_the_shipped_layouts_router_settings_pin_both_queue_gaps():
    for name, compressor_gap in [
        ("reuse-conv-2g", 2),
        ("reuse-conv-2g-cgap4", 4),
        ("reuse-conv-1g", 4),
    ]:
        overrides = SETTINGS[name].overrides
        assert overrides["generator.request_router.kind"] == "passage_affinity", name
        assert overrides["compression.request_router.kind"] == "conversation_affinity", name
        assert overrides["generator.request_router.imbalanced_threshold"] == 2, name
        assert overrides["compression.request_router.imbalanced_threshold"] == compressor_gap
    assert SETTINGS["reuse-conv-1g"].overrides["generator.deployment.num_replicas"] == 1
    assert "generator.deployment.num_replicas" not in SETTINGS["reuse-conv-2g"].overrides
    assert SETTINGS["reuse-conv-2g-p2c"].overrides == {
        "generator.request_router.kind": "power_of_two",
        "compression.request_router.kind": "power_of_two",
    }
