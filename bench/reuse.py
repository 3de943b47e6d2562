"""Reuse of retrieved passages' prefill, on a workload that looks like traffic.

    python -m bench.reuse --out docs/results/reuse/vNN-name   # needs `bench.quality prepare`

Many questions land on a few popular passages. The workload: SQuAD dev paragraphs with
Zipf(s) popularity over P paragraphs drawn at random (seed 0); each request is a distinct
question of its paragraph (a paragraph whose questions are used up is not drawn again); a
paragraph's first request is cold, its later ones warm. A uniform control asks each of
other paragraphs once, where reuse cannot help. The phases use disjoint paragraph sets, so
one phase does not warm the next.

Settings, each on a fresh service over the SQuAD index (harness.variant), read by the
reader the stored figures were read by (bench.suite.MEASURED_WITH, SmolLM2 in fp32):
- naive: prefix caching off, no compression;
- today: the service's pipeline (sentence selection, the `auto` policy) with
  `compression.reuse` off (the service's default until 2026-12-06);
- reuse-conv: `compression.reuse` as the service ships it: a question without history goes
  as today's; a follow-up continues the prompts before it, leaving out what the turn before
  showed but its top passage;
- reuse-2c, reuse-2c-conv: reuse-conv over two compressor replicas, under Serve's default
  router and under the conversation router (`compression.request_router`);
- reuse-conv-2g and its variants: over the scale profile's two generators, by router.
The stored runs (docs/results/reuse/) also measured layouts since retired with their
settings (docs/retired.md): a one-passage path for questions without history (v1-v24), and
follow-ups leaving out what any turn showed (`reuse`), nothing (`reuse-repeat`), or what the
last turn showed without sending the top passage again (`reuse-last1`).
By default `today` and `reuse-conv` run twice, in the order today, reuse-conv, reuse-conv,
today, so drift over the run falls on both; naive once, last. Every request's record is
stored; the report pairs requests across settings (same questions in the same order) and
gives the median per-request TTFT ratio with a 95% bootstrap interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from app.config import ConversationConfig
from bench.coqa import CACHE_DIR as COQA_CACHE_DIR
from bench.coqa import COQA_FILENAME, CoqaStory
from bench.coqa import INDEX_DIR as COQA_INDEX_DIR
from bench.coqa import load as load_coqa
from bench.labs import machine, reader, variant_service
from bench.loadgen import RequestRecord, RequestSpec, make_client, run_load
from bench.quality import DEFAULT_INDEX_DIR
from bench.squad import (
    DEFAULT_CACHE_DIR,
    SQUAD_DEV_FILENAME,
    SquadQuestion,
    SquadSet,
    load_squad,
)
from bench.stats import (
    Interval,
    fmt_difference,
    fmt_ratio,
    paired_difference,
    paired_ratio,
    percentile,
    sample_median,
)
from bench.suite import MEASURED_WITH
from bench.tables import markdown_table
from harness.service import ROOT
from pipeline.conversation import join_question
from pipeline.messages import AnswerStyle, Conversation, Turn

logger = logging.getLogger(__name__)

MAX_TOKENS = 16


@dataclass(frozen=True)
class Answers:
    """How every request of a run asks to be answered."""

    max_tokens: int = MAX_TOKENS
    style: str | None = None  # None: the service's default answer style


@dataclass(frozen=True)
class WorkItem:
    question_id: str
    question: str
    paragraph_id: str  # in a conversation phase: the story
    # An earlier request of the same phase asked about this paragraph (a follow-up, in a
    # conversation phase).
    warm: bool
    # In a conversation phase, the question's place in its story's conversation (0: first)
    # and its gold answers (scored in the report).
    turn: int = 0
    golds: tuple[str, ...] = ()


@dataclass(frozen=True)
class Phase:
    name: str
    concurrency: int
    items: tuple[WorkItem, ...]


@dataclass(frozen=True)
class Setting:
    name: str
    overrides: dict[str, object]
    method: str | None
    reuse: bool | None


# Two compressor replicas, each remembering only the turns it prepared; their scheduling
# label lowered so that both fit the 2-core default beside the generator.
TWO_COMPRESSORS: dict[str, object] = {
    "compression.deployment.num_replicas": 2,
    "compression.deployment.ray_actor_options.num_cpus": 0.2,
}
DEFAULT_ROUTERS: dict[str, object] = {
    "generator.request_router.kind": "power_of_two",
    "compression.request_router.kind": "power_of_two",
}
AFFINITY_ROUTERS: dict[str, object] = {
    "generator.request_router.kind": "passage_affinity",
    "compression.request_router.kind": "conversation_affinity",
}


def queue_gaps(generator: float, compressor: float) -> dict[str, object]:
    """The affinity routers' queue-length gaps, both pinned."""
    return {
        "generator.request_router.imbalanced_threshold": generator,
        "compression.request_router.imbalanced_threshold": compressor,
    }


ONE_GENERATOR: dict[str, object] = {
    "generator.deployment.num_replicas": 1,
    "generator.cpu_binding": None,
}
SETTINGS = {
    "naive": Setting(
        "naive", {"generator.engine_kwargs.enable_prefix_caching": False}, "none", False
    ),
    "today": Setting("today", {}, None, False),
    # The shipped reuse: a question without history in today's layout, a follow-up
    # continuing the prompts before it.
    "reuse-conv": Setting("reuse-conv", {}, None, True),
    # Two compressor replicas: Serve's default router against the conversation router
    # (deployments.conversation_router).
    "reuse-2c": Setting(
        "reuse-2c",
        {**TWO_COMPRESSORS, "compression.request_router.kind": "power_of_two"},
        None,
        True,
    ),
    "reuse-2c-conv": Setting(
        "reuse-2c-conv",
        {**TWO_COMPRESSORS, "compression.request_router.kind": "conversation_affinity"},
        None,
        True,
    ),
    # vLLM's CPU KV block: prefix caching reuses full blocks only, so a shared passage loses
    # the partial block at its end (on average half a block).
    "today-b128": Setting("today-b128", {"generator.engine_kwargs.block_size": 128}, None, False),
    "today-b32": Setting("today-b32", {"generator.engine_kwargs.block_size": 32}, None, False),
    # The shipped layout over the scale profile, affinity routers at both
    # stages, the generator's queue gap at 2: the compressor's gap at 2 (its default, as the
    # generator's) against 4, and one generator replica (the hit rate two should keep); and
    # Serve's default router at both stages. A follow-up that load moves to another
    # compressor replica loses its whole continuation; one moved to the other generator
    # loses only its cached blocks.
    "reuse-conv-2g": Setting("reuse-conv-2g", {**AFFINITY_ROUTERS, **queue_gaps(2, 2)}, None, True),
    "reuse-conv-2g-cgap4": Setting(
        "reuse-conv-2g-cgap4",
        {**AFFINITY_ROUTERS, **queue_gaps(2, 4)},
        None,
        True,
    ),
    "reuse-conv-1g": Setting(
        "reuse-conv-1g",
        {**AFFINITY_ROUTERS, **queue_gaps(2, 4), **ONE_GENERATOR},
        None,
        True,
    ),
    "reuse-conv-2g-p2c": Setting("reuse-conv-2g-p2c", {**DEFAULT_ROUTERS}, None, True),
    # The scale profile's own generator router, Ray Serve LLM's prefix-cache-affine one
    # (a continued follow-up's prompt text opens with the previous prompt's).
    "reuse-2g-prefix": Setting(
        "reuse-2g-prefix",
        {**AFFINITY_ROUTERS, "generator.request_router.kind": "prefix_cache_affinity"},
        None,
        True,
    ),
}
# Pairs the report compares, where both sides ran (the stored runs' settings included, so
# that --report-only renders them again).
COMPARISONS = (
    ("reuse", "today"),
    ("reuse-repeat", "today"),
    ("reuse-repeat", "reuse"),
    ("reuse-last1", "today"),
    ("reuse-last1", "reuse"),
    ("reuse-top1", "today"),
    ("reuse-top1", "reuse-last1"),
    ("reuse-conv", "today"),
    ("reuse-conv", "reuse-top1"),
    ("reuse", "naive"),
    ("today", "naive"),
    ("today-b32", "today-b128"),
    ("reuse-2c-conv", "reuse-2c"),
    ("reuse-conv-2g", "reuse-2g-prefix"),
    ("reuse-conv-2g-cgap4", "reuse-conv-1g"),
    ("reuse-conv-2g", "reuse-conv-1g"),
    ("reuse-conv-2g-cgap4", "reuse-conv-2g"),
    ("reuse-conv-2g-cgap4", "reuse-conv-2g-p2c"),
    ("reuse-conv-2g-p2c", "reuse-conv-1g"),
)
# Serve's access log lines of a finished generator and compressor call: "rag_Generator
# <replica> <request> -- CALL generate OK"; counted per replica, they give each replica's
# share of the requests.
_STAGE_CALLS = {
    "generator": re.compile(r"rag_Generator (\S+) \S+ -- CALL generate OK"),
    "compressor": re.compile(r"rag_Compressor (\S+) \S+ -- CALL prepare OK"),
}
# Serve forwards replica logs to the `serve run` output within about a second.
_LOG_LAG_S = 3.0
# Ray folds lines that differ only in ids and numbers into one "[repeated Nx across
# cluster]" line, which would hide calls and their replicas from the count: off for the
# services this lab starts (they inherit its environment).
DEDUP_OFF = {"RAY_DEDUP_LOGS": "0"}
ORDER = ("today", "reuse-conv", "reuse-conv", "today", "naive")
PHASES = ("skewed-c1", "skewed-c4", "uniform-c1")
CONVERSATION_PHASES = ("conversation-c1", "conversation-c4")


def skewed_items(
    squad: SquadSet, paragraph_ids: Sequence[str], requests: int, exponent: float, seed: int
) -> list[WorkItem]:
    """`requests` questions over `paragraph_ids`, the i-th paragraph drawn with weight
    1 / (i + 1)**exponent, each question asked once."""
    rng = random.Random(seed)
    questions = _questions_by_paragraph(squad)
    left = {pid: rng.sample(questions[pid], len(questions[pid])) for pid in paragraph_ids}
    if requests > sum(len(queue) for queue in left.values()):
        raise ValueError(f"{requests} requests need more questions than the paragraphs hold")
    weights = [1 / (rank + 1) ** exponent for rank in range(len(paragraph_ids))]
    items: list[WorkItem] = []
    seen: set[str] = set()
    while len(items) < requests:
        pid = rng.choices(paragraph_ids, weights)[0]
        if not left[pid]:
            continue  # its questions are used up: a request must be a question not yet asked
        question = left[pid].pop()
        items.append(WorkItem(question.question_id, question.question, pid, pid in seen))
        seen.add(pid)
    return items


def uniform_items(squad: SquadSet, paragraph_ids: Sequence[str], seed: int) -> list[WorkItem]:
    """One question of each paragraph: every request cold."""
    rng = random.Random(seed)
    questions = _questions_by_paragraph(squad)
    return [
        WorkItem(q.question_id, q.question, pid, False)
        for pid in paragraph_ids
        for q in [rng.choice(questions[pid])]
    ]


def _questions_by_paragraph(squad: SquadSet) -> dict[str, list[SquadQuestion]]:
    """Each paragraph's questions, in file order."""
    questions: dict[str, list[SquadQuestion]] = defaultdict(list)
    for question in squad.questions:
        questions[question.paragraph_id].append(question)
    return questions


def phases(
    squad: SquadSet, requests: int, paragraphs: int, exponent: float, uniform: int, seed: int
) -> list[Phase]:
    """Skewed at concurrency 1 and 4 and the uniform control, on disjoint paragraph sets."""
    rng = random.Random(seed)
    with_questions = sorted({q.paragraph_id for q in squad.questions})
    drawn = rng.sample(with_questions, 2 * paragraphs + uniform)
    first, second, control = (
        drawn[:paragraphs],
        drawn[paragraphs : 2 * paragraphs],
        drawn[2 * paragraphs :],
    )
    return [
        Phase("skewed-c1", 1, tuple(skewed_items(squad, first, requests, exponent, seed))),
        Phase("skewed-c4", 4, tuple(skewed_items(squad, second, requests, exponent, seed))),
        Phase("uniform-c1", 1, tuple(uniform_items(squad, control, seed))),
    ]


def conversation_phases(
    stories: Sequence[CoqaStory], conversations: int, turns: int, seed: int
) -> list[Phase]:
    """CoQA conversations of `turns` questions, asked in order with the service's own
    answers as the history, one at a time and four at once, on disjoint stories drawn at
    random; a conversation's first question is cold, its follow-ups warm."""
    rng = random.Random(seed)
    long_enough = [story for story in stories if len(story.turns) >= turns]
    drawn = rng.sample(long_enough, 2 * conversations)

    def items(chosen: Sequence[CoqaStory]) -> tuple[WorkItem, ...]:
        return tuple(
            WorkItem(
                f"{s.story_id}_turn{t}",
                s.turns[t].question,
                s.story_id,
                t > 0,
                t,
                s.turns[t].answers,
            )
            for s in chosen
            for t in range(turns)
        )

    return [
        Phase("conversation-c1", 1, items(drawn[:conversations])),
        Phase("conversation-c4", 4, items(drawn[conversations:])),
    ]


def gold_history_requests(
    phase: Phase,
    retrieve: Callable[[str], Any],
    answer_style: AnswerStyle = "short",
    user_turns: int = ConversationConfig().join_user_turns,
) -> list[tuple[Conversation, Any, str, int]]:
    """A conversation phase's questions as a compressor would get them, in process, with
    each conversation's first gold answers as its history (no generator): per question the
    Conversation, `retrieve`'s answer to the service's default follow-up query (the last
    `user_turns` user turns joined to the question, conversation.join_user_turns), the
    first gold answer and the turn."""
    requests: list[tuple[Conversation, Any, str, int]] = []
    history: list[Turn] = []
    story = None
    for item in phase.items:
        if item.paragraph_id != story:
            history, story = [], item.paragraph_id
        retrieval = retrieve(join_question(history, item.question, user_turns))
        answer = item.golds[0] if item.golds else "unknown"
        conversation = Conversation(item.question, tuple(history), answer_style)
        requests.append((conversation, retrieval, answer, item.turn))
        history += [Turn("user", item.question), Turn("assistant", answer)]
    return requests


def specs(phase: Phase, setting: Setting, answers: Answers = Answers()) -> list[RequestSpec]:
    return [
        RequestSpec(
            "rag",
            item.question,
            answers.max_tokens,
            compression_method=setting.method,
            compression_reuse=setting.reuse,
            answer_style=answers.style,
        )
        for item in phase.items
    ]


def generator_overrides(
    reader_id: str | None, max_model_len: int | None
) -> dict[str, object] | None:
    """What serves the run's reader (None: MEASURED_WITH's, the stored runs' SmolLM2), with
    `max_model_len` as its context window where given."""
    generator = None if reader_id is None else reader(reader_id)
    if max_model_len is None:
        return generator
    return {**(MEASURED_WITH if generator is None else generator),
            "generator.max_model_len": max_model_len}  # fmt: skip


def run_setting(
    setting: Setting,
    plan: Sequence[Phase],
    base: Path,
    out_dir: Path,
    run: int,
    index: Path = DEFAULT_INDEX_DIR,
    generator: dict[str, object] | None = None,
    answers: Answers = Answers(),
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, dict[str, int]]]]:
    """Start a fresh service for `setting` over `index`, read by `generator`'s overrides
    (MEASURED_WITH by default), send every phase in turn, stop it: the records of every
    phase, and per stage (generator, compressor) and phase its finished calls per replica."""
    overrides = {
        **(MEASURED_WITH if generator is None else generator),
        "retriever.index_path": str(index),
        **setting.overrides,
    }
    name = f"{run}-{setting.name}"
    records: dict[str, list[dict[str, Any]]] = {}
    calls: dict[str, dict[str, dict[str, int]]] = {stage: {} for stage in _STAGE_CALLS}
    log = out_dir / f"{name}.serve.log"
    with variant_service(base, overrides, out_dir, name) as url:
        for phase in plan:
            logger.info("%s: %s, %d requests", name, phase.name, len(phase.items))
            offset = log.stat().st_size
            sent = asyncio.run(_send(url, phase, setting, answers))
            records[phase.name] = [asdict(r) for r in sent]
            time.sleep(_LOG_LAG_S)
            with log.open("rb") as file:
                file.seek(offset)
                text = file.read().decode(errors="replace")
            for stage in _STAGE_CALLS:
                calls[stage][phase.name] = stage_calls(text, stage)
    return records, calls


def stage_calls(log_text: str, stage: str = "generator") -> dict[str, int]:
    """Finished calls of `stage` (generator or compressor) per replica in a stretch of a
    `serve run` log."""
    return dict(Counter(_STAGE_CALLS[stage].findall(log_text)))


async def _send(url: str, phase: Phase, setting: Setting, answers: Answers) -> list[RequestRecord]:
    async with make_client(url) as client:
        if phase.name in CONVERSATION_PHASES:
            return await _converse(client, phase, setting, answers)
        questions = specs(phase, setting, answers)
        return await run_load(
            client, questions, rate_per_s=None, concurrency=phase.concurrency, seed=0
        )


async def _converse(
    client: Any, phase: Phase, setting: Setting, answers: Answers = Answers()
) -> list[RequestRecord]:
    """`phase.concurrency` conversations at a time, each question after the one before it
    was answered, with the questions and answers so far as its history (as a client sends
    them: text only)."""
    questions = specs(phase, setting, answers)
    records: list[RequestRecord] = [
        RequestRecord(i, "rag", q.question) for i, q in enumerate(questions)
    ]
    stories: dict[str, list[int]] = defaultdict(list)
    for i, item in enumerate(phase.items):
        stories[item.paragraph_id].append(i)
    gate = asyncio.Semaphore(phase.concurrency)

    async def converse(indices: list[int]) -> None:
        history: list[dict[str, str]] = []
        async with gate:
            for i in indices:
                spec = replace(questions[i], history=tuple(history))
                (record,) = await run_load(client, [spec], rate_per_s=None, concurrency=1, seed=0)
                records[i] = replace(record, index=i)
                answer = record.answer.strip() or "(no answer)"
                history += [{"role": "user", "content": spec.question},
                            {"role": "assistant", "content": answer}]  # fmt: skip

    async with asyncio.TaskGroup() as group:
        for indices in stories.values():
            group.create_task(converse(indices))
    return records


def _ttfts(runs: Sequence[dict[str, list[dict[str, Any]]]], phase: str) -> list[float | None]:
    """Per request, the mean TTFT over the runs that answered it (None if none did)."""
    return _per_request(runs, phase, lambda record: record["ttft_ms"])


def _prepare_ms(runs: Sequence[dict[str, list[dict[str, Any]]]], phase: str) -> list[float | None]:
    """Per request, the mean time the compressor stage took (its own, as the service reports
    it: layout, bookkeeping, compression and prompt assembly)."""
    return _per_request(runs, phase, _compress_ms)


def _compress_ms(record: dict[str, Any]) -> float | None:
    value = (record.get("server_timings_ms") or {}).get("compress")
    return float(value) if value is not None else None


def _per_request(
    runs: Sequence[dict[str, list[dict[str, Any]]]],
    phase: str,
    value_of: Callable[[dict[str, Any]], float | None],
) -> list[float | None]:
    """Per request, the mean of `value_of` over the runs that answered it with one."""
    per_request: list[float | None] = []
    for i in range(len(runs[0][phase])):
        values = [
            value
            for run in runs
            if run[phase][i]["ok"] and (value := value_of(run[phase][i])) is not None
        ]
        per_request.append(sum(values) / len(values) if values else None)
    return per_request


def ratio_interval(a: Sequence[float | None], b: Sequence[float | None]) -> Interval | None:
    """Median per-request ratio a/b with its paired 95% interval (bench.stats)."""
    return paired_ratio(zip(a, b, strict=True))


def _segments(phase: str) -> tuple[str, ...]:
    return ("cold", "warm") if phase.startswith(("skewed", "conversation")) else ("all",)


def _segment_indices(items: Sequence[dict[str, Any]], segment: str) -> list[int]:
    """Positions of the phase's requests in `segment` (cold, warm, or all)."""
    return [
        i for i, item in enumerate(items) if segment == "all" or item["warm"] == (segment == "warm")
    ]


# The prompt parts whose cached share the report shows.
SHARE_SEGMENTS = ("system", "history", "passages")


def _segment_shares(records: Sequence[dict[str, Any]], prompt: int) -> list[str]:
    """Per part of the prompt, its cached tokens over all prompt tokens of `records` ("-"
    where the records lack the split: runs before it was reported)."""
    splits = [r.get("usage_cached_by_segment") or {} for r in records]
    if not prompt or not splits or not all(splits):
        return ["-"] * len(SHARE_SEGMENTS)
    return [
        f"{sum(split.get(segment, 0) for split in splits) / prompt:.2f}"
        for segment in SHARE_SEGMENTS
    ]


def _section(
    caption: str, header: list[str], rows: list[list[object]], numeric: tuple[int, ...]
) -> list[str]:
    """A captioned table of the report, or nothing where it has no rows."""
    return ["", caption, "", markdown_table(header, rows, numeric=numeric)] if rows else []


def _prepare_table(rows: list[list[object]]) -> list[str]:
    return _section(
        "The compressor stage's own time (what the layout and its bookkeeping add), median "
        "of the per-request differences, paired:",
        ["phase", "requests", "comparison", "ms, median difference", "95% CI", "n"],
        rows,
        (3, 5),
    )


def _replica_shares(results: dict[str, Any], stage: str = "generator") -> list[str]:
    """The table of each run's `stage` calls per replica, where a run had 2+ replicas."""
    rows = []
    for i, run in enumerate(results["runs"]):
        for phase, calls in (run.get(f"{stage}_calls") or {}).items():
            if len(calls) < 2:
                continue
            total = sum(calls.values())
            shares = sorted((count / total for count in calls.values()), reverse=True)
            counts = " / ".join(str(count) for count in sorted(calls.values(), reverse=True))
            sent = len(run["records"][phase])
            largest = f"{shares[0]:.2f}" if total == sent else f"{shares[0]:.2f} (of {sent} sent)"
            rows.append([f"{i}-{run['setting']}", phase, total, counts, largest])
    return _section(
        f"{stage.capitalize()} calls per replica (Serve's access log):",
        ["run", "phase", f"{stage} calls", "per replica", "largest share"],
        rows,
        (2, 4),
    )


def _continued_table(
    plan: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, list[dict[str, Any]]]]]
) -> list[str]:
    """Per conversation phase and setting, the follow-ups whose prompt continued the ones
    before it (usage.continued_turns > 0), where the records carry it, in all and by
    question: a second question is continued exactly when the replica that prepared the
    first prepares it, later ones also need the window to hold the longer history."""
    rows = []
    for phase, info in plan.items():
        if phase not in CONVERSATION_PHASES:
            continue
        keep = _segment_indices(info["items"], "warm")
        for name, setting_runs in runs.items():
            pairs = [
                (info["items"][i].get("turn", 0), run[phase][i])
                for run in setting_runs
                for i in keep
                if run[phase][i].get("usage_continued_turns") is not None
            ]
            if not pairs:
                continue
            by_turn: dict[int, list[bool]] = defaultdict(list)
            for turn, record in pairs:
                by_turn[turn].append(record["usage_continued_turns"] > 0)
            continued = sum(sum(flags) for flags in by_turn.values())
            turns = ", ".join(
                f"{turn + 1}: {sum(flags)}/{len(flags)}" for turn, flags in sorted(by_turn.items())
            )
            rows.append(
                [phase, name, len(pairs), continued, f"{continued / len(pairs):.2f}", turns]
            )
    return _section(
        "Follow-ups continued (usage.continued_turns > 0: the compressor replica that "
        "prepared an earlier turn prepared this one and remembered it), over every run of "
        "the setting:",
        ["phase", "setting", "follow-ups", "continued", "share", "by question"],
        rows,
        (2, 3, 4),
    )


def _by_question_table(
    plan: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, list[dict[str, Any]]]]]
) -> list[str]:
    """Per conversation phase, comparison and question number, the follow-ups' median
    per-request TTFT ratio with its paired interval, beside each side's mean prompt and
    uncached prompt tokens: a continued prompt grows by each earlier turn's sources, so what
    it saves in uncached tokens and what attending to a longer prompt costs change with
    the question's place in its conversation; and the paired F1 difference where the
    items carry gold answers."""
    from bench.squad_metrics import f1

    rows = []
    for phase, info in plan.items():
        if phase not in CONVERSATION_PHASES:
            continue
        golds = [tuple(item.get("golds") or ()) for item in info["items"]]
        f1s = {
            name: _per_request(setting_runs, phase, _scored(f1, golds)) if all(golds) else None
            for name, setting_runs in runs.items()
        }
        per_request = {name: _ttfts(setting_runs, phase) for name, setting_runs in runs.items()}
        prompt = {name: _tokens(setting_runs, phase, False) for name, setting_runs in runs.items()}
        uncached = {name: _tokens(setting_runs, phase, True) for name, setting_runs in runs.items()}
        turns = sorted({item.get("turn", 0) for item in info["items"]})
        for a, b in COMPARISONS:
            if a not in per_request or b not in per_request:
                continue
            for turn in turns:
                keep = [i for i, item in enumerate(info["items"]) if item.get("turn", 0) == turn]
                interval = ratio_interval(
                    [per_request[a][i] for i in keep], [per_request[b][i] for i in keep]
                )
                f1_a, f1_b = f1s[a], f1s[b]
                answers = "-"
                if f1_a is not None and f1_b is not None:
                    answers = fmt_difference(paired_difference(zip(
                        [f1_a[i] for i in keep], [f1_b[i] for i in keep], strict=True
                    )))  # fmt: skip
                rows.append([
                    phase, turn + 1, f"{a} / {b}", fmt_ratio(interval, len(keep)),
                    0 if interval is None else interval.n,
                    f"{_mean_tokens(prompt[a], keep)} / {_mean_tokens(prompt[b], keep)}",
                    f"{_mean_tokens(uncached[a], keep)} / {_mean_tokens(uncached[b], keep)}",
                    answers,
                ])  # fmt: skip
    return _section(
        "TTFT by question of its conversation (1: the first question), median per-request "
        "ratio with its paired 95% interval, and each side's mean prompt tokens and "
        "uncached prompt tokens (a / b), and F1 a − b paired by request:",
        ["phase", "question", "comparison", "ratio [95% CI]", "n", "prompt tokens",
         "uncached tokens", "F1, a − b"],
        rows,
        (1, 4),
    )  # fmt: skip


def _tokens(
    runs: Sequence[dict[str, list[dict[str, Any]]]], phase: str, uncached: bool
) -> list[float | None]:
    """Per request, its mean prompt tokens over the runs that answered it (less the cached
    ones where `uncached`)."""

    def tokens(record: dict[str, Any]) -> float | None:
        prompt = record.get("usage_prompt_tokens")
        if prompt is None:
            return None
        return prompt - (record.get("usage_cached_prompt_tokens") or 0) if uncached else prompt

    return _per_request(runs, phase, tokens)


def _mean_tokens(values: Sequence[float | None], keep: Sequence[int]) -> str:
    kept = [v for i in keep if (v := values[i]) is not None]
    return f"{sum(kept) / len(kept):.0f}" if kept else "-"


def report(results: dict[str, Any]) -> str:
    """The Markdown report of a saved run (results.json)."""
    plan = {p["name"]: p for p in results["phases"]}
    runs: dict[str, list[dict[str, list[dict[str, Any]]]]] = defaultdict(list)
    for run in results["runs"]:
        runs[run["setting"]].append(run["records"])
    latency, ratios, prepare = [], [], []
    for phase, info in plan.items():
        per_request = {name: _ttfts(setting_runs, phase) for name, setting_runs in runs.items()}
        prepare_ms = {name: _prepare_ms(setting_runs, phase) for name, setting_runs in runs.items()}
        for segment in _segments(phase):
            keep = _segment_indices(info["items"], segment)
            for setting, setting_runs in runs.items():
                records = [run[phase][i] for run in setting_runs for i in keep]
                ok = [r for r in records if r["ok"] and r["ttft_ms"] is not None]
                ttft = [r["ttft_ms"] for r in ok]
                prompt = sum(r["usage_prompt_tokens"] or 0 for r in ok)
                cached = sum(r["usage_cached_prompt_tokens"] or 0 for r in ok)
                latency.append([
                    phase, f"{segment} ({len(keep)})", setting, len(ok),
                    f"{percentile(ttft, 50):.0f}" if ttft else "-",
                    f"{percentile(ttft, 99):.0f}" if ttft else "-",
                    f"{cached / prompt:.2f}" if prompt else "-",
                    *_segment_shares(ok, prompt),
                ])  # fmt: skip
            for a, b in COMPARISONS:
                if a in per_request and b in per_request:
                    interval = ratio_interval(
                        [per_request[a][i] for i in keep], [per_request[b][i] for i in keep]
                    )
                    n = 0 if interval is None else interval.n
                    ratios.append([phase, segment, f"{a} / {b}", fmt_ratio(interval), n])
                    extra = paired_difference(
                        zip(
                            [prepare_ms[a][i] for i in keep],
                            [prepare_ms[b][i] for i in keep],
                            strict=True,
                        ),
                        stat=sample_median,
                    )
                    if extra is not None:
                        prepare.append([
                            phase, segment, f"{a} − {b}", f"{extra.estimate:+.2f}",
                            f"[{extra.low:+.2f}, {extra.high:+.2f}]", extra.n,
                        ])  # fmt: skip
    header = [
        "phase", "requests", "setting", "n ok", "TTFT p50 ms", "TTFT p99 ms", "cached share",
        *(f"of it {segment}" for segment in SHARE_SEGMENTS),
    ]  # fmt: skip
    lines = [
        f"# Passage reuse: {results['machine']}",
        "",
        f"Command: `{results['command']}`. Records: results.json (every request).",
        "",
        markdown_table(header, latency, numeric=(3, 4, 5, 6, 7, 8, 9)),
        "",
        "Median per-request TTFT ratio, paired by request (each side the mean of its runs), "
        "95% bootstrap interval; an interval holding 1 is no detectable difference:",
        "",
        markdown_table(["phase", "requests", "comparison", "ratio [95% CI]", "n"], ratios),
        *_prepare_table(prepare),
        *_answers_table(plan, runs),
        *_continued_table(plan, runs),
        *_by_question_table(plan, runs),
        *_replica_shares(results),
        *_replica_shares(results, "compressor"),
    ]
    return "\n".join(lines) + "\n"


def _answers_table(
    plan: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, list[dict[str, Any]]]]]
) -> list[str]:
    """Where the items carry gold answers (conversations): per segment and setting, mean F1
    and the share of answers holding a gold (each request the mean of its runs), and each
    comparison's paired difference."""
    from bench.squad_metrics import answer_survives, f1

    rows = []
    for phase, info in plan.items():
        golds = [tuple(item.get("golds") or ()) for item in info["items"]]
        if not all(golds):
            continue
        scores = {
            name: {
                metric: _per_request(setting_runs, phase, _scored(score, golds))
                for metric, score in (("f1", f1), ("contains", answer_survives))
            }
            for name, setting_runs in runs.items()
        }
        for segment in _segments(phase):
            keep = _segment_indices(info["items"], segment)
            for name in runs:
                f1s = [scores[name]["f1"][i] for i in keep]
                held = [scores[name]["contains"][i] for i in keep]
                rows.append([phase, segment, name, len(keep), _mean(f1s), _mean(held)])
            for a, b in COMPARISONS:
                if a in scores and b in scores:
                    diffs = [
                        paired_difference(zip([scores[a][m][i] for i in keep],
                                              [scores[b][m][i] for i in keep], strict=True))
                        for m in ("f1", "contains")
                    ]  # fmt: skip
                    rows.append([phase, segment, f"{a} − {b}", len(keep),
                                 *(fmt_difference(d) for d in diffs)])  # fmt: skip
    return _section(
        "Answers against the gold answers (mean over requests, each the mean of its runs; "
        "differences paired by request with a 95% bootstrap interval):",
        ["phase", "requests", "setting", "n", "F1", "answer holds a gold"],
        rows,
        (3,),
    )


def _scored(
    score: Callable[[str, Sequence[str]], float | bool], golds: Sequence[Sequence[str]]
) -> Callable[[dict[str, Any]], float]:
    """A record's answer scored against the golds of its request (by its index)."""
    return lambda record: float(score(record.get("answer", ""), golds[record["index"]]))


def _mean(values: Sequence[float | None]) -> str:
    kept = [v for v in values if v is not None]
    return f"{sum(kept) / len(kept):.3f}" if kept else "-"


def _retrieve(plan: Sequence[Phase], index_dir: Path, top_k: int) -> dict[str, list[list[Any]]]:
    """Each phase's requests' chunks, by the service's default retrieval (hybrid) in process."""
    from retrieval.config import HybridRetrievalConfig
    from retrieval.models import DEFAULT_EMBEDDING_MODEL, resolve_model_reference
    from retrieval.retriever import Retriever

    retriever = Retriever.load(
        index_dir,
        resolve_model_reference(DEFAULT_EMBEDDING_MODEL),
        hybrid=HybridRetrievalConfig().to_params(),
    )
    return {
        phase.name: [list(retriever.retrieve(item.question, top_k).chunks) for item in phase.items]
        for phase in plan
    }


def overlap(plan: Sequence[Phase], index_dir: Path, top_k: int = 5) -> list[list[object]]:
    """Per skewed phase, how much of a warm request's retrieval an earlier request of the
    phase retrieved too (the most any cache of passages could reuse, in any position), by
    the service's default retrieval (hybrid) run in process; rows for OVERLAP_HEADER."""
    skewed = [phase for phase in plan if phase.name.startswith("skewed")]
    retrieved = _retrieve(skewed, index_dir, top_k)
    return [
        [
            phase.name,
            *overlap_row(
                phase.items, [[c.chunk_id for c in chunks] for chunks in retrieved[phase.name]]
            ),
        ]
        for phase in skewed
    ]


def overlap_row(items: Sequence[WorkItem], retrieved: Sequence[Sequence[str]]) -> list[object]:
    """For the warm items: how many, the mean share of their passages that an earlier item
    retrieved, and how often their top passage was an earlier item's top passage."""
    seen: set[str] = set()
    tops: set[str] = set()
    shares: list[float] = []
    top_hits: list[bool] = []
    for item, ids in zip(items, retrieved, strict=True):
        if item.warm and ids:
            shares.append(sum(chunk in seen for chunk in ids) / len(ids))
            top_hits.append(ids[0] in tops)
        seen.update(ids)
        tops.update(ids[:1])
    if not shares:
        return [0, "-", "-"]
    return [
        len(shares),
        f"{sum(shares) / len(shares):.2f}",
        f"{sum(top_hits) / len(top_hits):.2f}",
    ]


OVERLAP_HEADER = [
    "phase",
    "warm requests",
    "share of their passages retrieved before",
    "top passage was an earlier top passage",
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/reuse"))
    parser.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--squad", type=Path, default=DEFAULT_CACHE_DIR / SQUAD_DEV_FILENAME)
    parser.add_argument(
        "--workload",
        choices=("squad", "coqa"),
        default="squad",
        help="squad: the skewed and uniform phases; coqa: conversations (bench.coqa prepare).",
    )
    parser.add_argument("--conversations", type=int, default=24, help="Per conversation phase.")
    parser.add_argument("--turns", type=int, default=4, help="Questions a conversation.")
    parser.add_argument(
        "--reader",
        help="A prepared reader's model id (.models/<id>) served in serve_config.yaml's own "
        "dtype (fastest); default: SmolLM2 in fp32, the stored runs' reader.",
    )
    parser.add_argument(
        "--answer-style",
        choices=("short", "explained"),
        help="The answer style every request asks for (default: the service's).",
    )
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="Tokens an answer.")
    parser.add_argument(
        "--max-model-len",
        type=int,
        help="The generator's context window (generator.max_model_len; default: the config's).",
    )
    parser.add_argument("--requests", type=int, default=100, help="Requests a skewed phase.")
    parser.add_argument("--paragraphs", type=int, default=200)
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent s.")
    parser.add_argument("--uniform", type=int, default=40, help="Requests of the control.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", nargs="+", default=list(ORDER), choices=SETTINGS)
    parser.add_argument(
        "--phases",
        nargs="+",
        default=None,
        choices=PHASES + CONVERSATION_PHASES,
        help="Phases to send (default all); the workload is drawn the same either way.",
    )
    parser.add_argument("--report-only", action="store_true", help="Re-render results.json.")
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="Only print how much of each warm request's retrieval earlier requests shared "
        "(in process, no service).",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "results.json"
    if args.report_only:
        (args.out / "README.md").write_text(report(json.loads(saved.read_text())))
        return 0
    index = DEFAULT_INDEX_DIR
    if args.workload == "coqa":
        index = COQA_INDEX_DIR
        plan = conversation_phases(
            load_coqa(COQA_CACHE_DIR / COQA_FILENAME), args.conversations, args.turns, args.seed
        )
    else:
        plan = phases(
            load_squad(args.squad), args.requests, args.paragraphs, args.zipf, args.uniform,
            args.seed,
        )  # fmt: skip
    plan = [phase for phase in plan if args.phases is None or phase.name in args.phases]
    if args.overlap:
        index = DEFAULT_INDEX_DIR if DEFAULT_INDEX_DIR.is_absolute() else ROOT / DEFAULT_INDEX_DIR
        print(markdown_table(OVERLAP_HEADER, overlap(plan, index), numeric=(1, 2, 3)))
        return 0
    results: dict[str, Any] = {
        "command": "python -m bench.reuse " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "phases": [
            {"name": p.name, "concurrency": p.concurrency, "items": [asdict(i) for i in p.items]}
            for p in plan
        ],
        "runs": [],
    }
    os.environ.update(DEDUP_OFF)
    for run, name in enumerate(args.settings):
        generator = generator_overrides(args.reader, args.max_model_len)
        records, calls = run_setting(
            SETTINGS[name], plan, args.config, args.out, run, index, generator,
            Answers(args.max_tokens, args.answer_style),
        )  # fmt: skip
        results["runs"].append({
            "setting": name,
            "records": records,
            **{f"{stage}_calls": stage_calls for stage, stage_calls in calls.items()},
        })  # fmt: skip
        saved.write_text(json.dumps(results, indent=1))  # kept as it grows
    (args.out / "README.md").write_text(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
