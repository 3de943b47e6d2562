"""Follow-up questions as a user asks them: does an answer end, and does it say again what
the conversation's earlier answers said?

`make run` as shipped (its reader, style, compression and default answer length; nothing in
the request but the question, its history and the collection) over CoQA's stories added as
a collection through the API (bench.unseen). CoQA's conversations are questions a person
asked one after another about one story ("What color was Cotton?" "Where did she live?").
N stories with at least T turns are drawn at random (seed 0); each conversation's first T
questions are asked in order, each with the history a client sends: the earlier questions
and the service's own answers to them.

    python -m bench.followups run --out docs/results/followups [--conversations 25 --turns 4]
        [--set generator.default_max_tokens=256 ...]   # make run with a setting changed
    python -m bench.followups report docs/results/followups
    python -m bench.followups compare BEFORE AFTER   # two runs, paired by conversation turn

Per answer: whether it ended on its own (finish reason `stop`, not the token cap), how
many of its sentences repeat an earlier sentence of the same answer
(bench.squad_metrics.repeated_sentences), whether it restates a sentence of an earlier
answer of the conversation (restated_sentences: word for word or nearly; counted again
with the prompt's refusal sentence left out, since saying "The sources do not say." twice
restates no answer), and whether it holds one of CoQA's gold answers. `report` tallies
first questions and follow-ups apart; `compare` pairs two runs' answers to the same turn of
the same conversation (a change of prompt or defaults, before and after) and gives each
measure's paired difference with its 95% interval, and the TTFT ratio.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

import httpx

from bench import unseen
from bench.client import post_query
from bench.coqa import CoqaStory
from bench.labs import machine, positive_int, utc_now, variant_service, write_json_and_markdown
from bench.quality import without_citations
from bench.squad_metrics import (
    answer_survives,
    repeated_sentences,
    restated_sentences,
    sentences_about_sources,
)
from bench.stats import (
    fmt_difference,
    fmt_interval,
    fmt_ratio,
    one_sample,
    paired_difference,
    paired_ratio,
    sample_mean,
)
from bench.tables import markdown_table
from harness.variant import parse_assignment

logger = logging.getLogger(__name__)

TIMEOUT_S = 180.0
# The reply the short style's prompt prescribes when the sources hold no answer, and the
# explained style's usual wording of its rule 1 ("say that the sources do not say").
REFUSAL = "The sources do not say."
BASE_CONFIG = Path("serve_config.yaml")


def draw_conversations(
    stories: Sequence[CoqaStory], count: int, turns: int, seed: int = 0
) -> list[CoqaStory]:
    """`count` stories of at least `turns` turns, drawn at random with `seed`."""
    long_enough = [story for story in stories if len(story.turns) >= turns]
    return random.Random(seed).sample(long_enough, min(count, len(long_enough)))


def converse(
    client: httpx.Client, story: CoqaStory, turns: int, collection: str
) -> list[dict[str, Any]]:
    """Ask the story's first `turns` questions in order, each with the questions and the
    service's answers before it as history; one record a turn (a failed turn ends the
    conversation: its history would be wrong)."""
    history: list[dict[str, str]] = []
    records: list[dict[str, Any]] = []
    for number, turn in enumerate(story.turns[:turns], start=1):
        body = {"question": turn.question, "history": list(history), "collection": collection}
        outcome = post_query(client, body, TIMEOUT_S)
        record: dict[str, Any] = {
            "story_id": story.story_id, "turn": number, "question": turn.question,
            "gold_answers": list(turn.answers), "client_ms": outcome.client_ms,
            "error": outcome.error,
        }  # fmt: skip
        records.append(record)
        reply = outcome.reply
        if reply is None:
            break
        text = without_citations(reply.answer)
        record.update(
            answer=reply.answer, finish_reason=reply.finish_reason,
            completion_tokens=reply.usage.completion_tokens,
            repeated_sentences=repeated_sentences(reply.answer),
            contains_gold=answer_survives(text, turn.answers),
            ttft_ms=reply.timings_ms.ttft, total_ms=reply.timings_ms.total,
        )  # fmt: skip
        history += [{"role": "user", "content": turn.question},
                    {"role": "assistant", "content": reply.answer}]  # fmt: skip
    return records


def _share(records: Sequence[Mapping[str, Any]], test: Callable[[Mapping[str, Any]], Any]) -> str:
    """`k of n` records passing `test`, and the share's 95% interval where there are two
    records or more."""
    hits = [float(bool(test(r))) for r in records]
    interval = one_sample(hits, sample_mean)
    text = f"{int(sum(hits))} of {len(hits)}"
    return text if interval is None else f"{text}: {interval.text(3)}"


def without_refusal(answer: str) -> str:
    """`answer` without the sentence the prompt tells the reader to give when the sources
    hold no answer: saying it again is not restating an answer."""
    return answer.replace(REFUSAL, " ")


def restatements(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each answered record with `restates` (a sentence of it says again what an earlier
    answer of its conversation said) and `restates_content` (the same, the refusal sentence
    left out on both sides), from the answers as the records keep them."""
    earlier: dict[str, list[str]] = {}
    scored = []
    for record in sorted(records, key=lambda r: (r["story_id"], r["turn"])):
        if record.get("error") is not None:
            continue
        before = earlier.setdefault(record["story_id"], [])
        scored.append({**record,
                       "restates": restated_sentences(record["answer"], before),
                       "restates_content": restated_sentences(
                           without_refusal(record["answer"]),
                           [without_refusal(a) for a in before])})  # fmt: skip
        before.append(record["answer"])
    return scored


# First questions and follow-ups, tallied apart (report and compare), by their turn.
GROUPS: dict[str, Callable[[int], bool]] = {
    "first questions": lambda turn: turn == 1,
    "follow-ups": lambda turn: turn > 1,
}
# Each answer's yes/no measures, by their column name (report and compare).
MEASURES: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "ended on its own": lambda r: r["finish_reason"] == "stop",
    "repeats its own sentence": itemgetter("repeated_sentences"),
    "restates an earlier answer": itemgetter("restates"),
    "the same, refusals left out": itemgetter("restates_content"),
    "a sentence only to cite": lambda r: sentences_about_sources(r["answer"]),
    "contains gold": itemgetter("contains_gold"),
}


def report(doc: Mapping[str, Any]) -> str:
    """First questions and follow-ups apart: answers, each of MEASURES' shares, and the
    median completion tokens, with 95% intervals."""
    answered = restatements(doc["records"])
    groups = {name: [r for r in answered if keep(r["turn"])] for name, keep in GROUPS.items()}
    rows = [
        [name, len(records), *(_share(records, test) for test in MEASURES.values()),
         fmt_interval(one_sample(r["completion_tokens"] for r in records), 0)]
        for name, records in groups.items()
    ]  # fmt: skip
    failed = len(doc["records"]) - len(answered)
    header = ["questions", "answers", *MEASURES, "tokens p50"]
    return markdown_table(header, rows) + f"\nFailed requests: {failed}.\n"


def compare(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """The two runs' answers to the same turn of the same conversation, first questions and
    follow-ups apart: each measure before and after and its paired difference (after minus
    before), the completion tokens' mean difference and the TTFT ratio (after over before),
    each with its 95% interval. A turn answered in one run only is left out."""
    earlier = {(r["story_id"], r["turn"]): r for r in restatements(before["records"])}
    pairs = [(earlier[key], r) for r in restatements(after["records"])
             if (key := (r["story_id"], r["turn"])) in earlier]  # fmt: skip
    rows = []
    for name, keep in GROUPS.items():
        group = [(b, a) for b, a in pairs if keep(a["turn"])]
        for measure, test in MEASURES.items():
            shares = [sum(bool(test(side)) for side in sides) for sides in zip(*group, strict=True)]
            difference = paired_difference(
                (float(bool(test(a))), float(bool(test(b)))) for b, a in group
            )
            rows.append([name, measure, len(group), *shares, fmt_difference(difference)])
        tokens = paired_difference(
            (a["completion_tokens"], b["completion_tokens"]) for b, a in group
        )
        rows.append([name, "completion tokens (mean)", len(group), "", "", fmt_difference(tokens)])
        ttft = paired_ratio((a["ttft_ms"], b["ttft_ms"]) for b, a in group)
        rows.append([name, "TTFT (after / before)", len(group), "", "", fmt_ratio(ttft)])
    header = ["questions", "measure", "n", "before", "after", "after − before (95% CI)"]
    return markdown_table(header, rows)


def run(
    conversations: int, turns: int, out: Path, argv: Sequence[str],
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Serve make run as shipped (with `settings`, dotted keys, laid over it), add the
    stories, hold the conversations, write the run."""
    started_at = utc_now()
    stories = unseen.load_stories()
    chosen = draw_conversations(stories, conversations, turns)
    overrides = {**(settings or {}), "collections.root": str(unseen.COLLECTIONS_ROOT)}
    unseen.empty_collections_root()
    records: list[dict[str, Any]] = []
    with (
        variant_service(BASE_CONFIG, overrides, out, "followups") as url,
        httpx.Client(base_url=url, timeout=60, trust_env=False) as client,
    ):
        unseen.add_collection(client, unseen.COLLECTION, unseen.documents(stories))
        for k, story in enumerate(chosen, start=1):
            records += converse(client, story, turns, unseen.COLLECTION)
            logger.info("conversation %d of %d done", k, len(chosen))
    doc = {"command": "python -m bench.followups " + " ".join(argv), "machine": machine(),
           "started_at": started_at, "ended_at": utc_now(), "conversations": len(chosen),
           "turns": turns, "seed": 0, "settings": dict(settings or {}),
           "records": records}  # fmt: skip
    write_json_and_markdown(out, "followups", doc, report(doc))
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    hold = commands.add_parser("run", help="serve make run, hold the conversations, report")
    hold.add_argument("--conversations", type=positive_int, default=25)
    hold.add_argument("--turns", type=positive_int, default=4)
    hold.add_argument("--out", type=Path, default=Path("docs/results/followups"))
    hold.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=parse_assignment,
        help="a setting over make run's (repeatable)",
    )
    tally = commands.add_parser("report", help="rewrite <folder>/followups.md from its JSON")
    tally.add_argument("folder", type=Path)
    pair = commands.add_parser("compare", help="two runs' answers paired by conversation turn")
    pair.add_argument("before", type=Path)
    pair.add_argument("after", type=Path)
    args = parser.parse_args(args_list)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.command == "compare":
        runs = [
            json.loads((f / "followups.json").read_text("utf-8")) for f in (args.before, args.after)
        ]
        sys.stdout.write(compare(*runs))
        return 0
    if args.command == "run":
        doc = run(args.conversations, args.turns, args.out, args_list, dict(args.settings))
    else:
        doc = json.loads((args.folder / "followups.json").read_text("utf-8"))
        (args.folder / "followups.md").write_text(report(doc), "utf-8")
    sys.stdout.write(report(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
